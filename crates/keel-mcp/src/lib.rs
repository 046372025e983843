//! keel's client side of MCP: an [`McpHub`] connects to the configured MCP
//! servers, keeps them running, and lets the runtime list and call their
//! tools. It speaks MCP through [`rmcp`], the official Rust SDK, over stdio
//! (a child process) or streamable HTTP.
//!
//! # Design
//!
//! - **One task per server** (`supervisor.rs`) owns that server's connection
//!   and is the only writer of its state (`slot.rs`): connect, handshake and
//!   list tools within the startup timeout; then watch the connection until
//!   it breaks. Servers are independent: one that hangs or crash-loops never
//!   delays another, and [`McpHub::start`] never fails as a whole.
//! - **Reconnect loop with exponential backoff** ([`Backoff`], 1 s doubling
//!   to 60 s by default). A stdio server's exit is noticed at once (its
//!   process is awaited); an HTTP server's broken session when a call or a
//!   periodic ping finds the connection gone. While a server is down its
//!   tools are absent from [`McpHub::tools`], and calls to it fail fast with
//!   [`McpError::Unavailable`] saying why and when it is retried.
//! - **Calls bypass the supervisor.** A caller copies the connection's peer
//!   handle out of the server's state and calls through it, so calls run
//!   concurrently. Each call has the server's call timeout; a call that
//!   times out (or whose caller drops it) is cancelled with
//!   `notifications/cancelled`, and the connection stays usable.
//! - **Tool lists follow the server**: listed after connecting, and again
//!   on `notifications/tools/list_changed`. Every change of state or tools
//!   bumps [`McpHub::changes`].
//! - **Clean environment, own process group** for stdio servers (`stdio.rs`):
//!   a server sees `PATH`, `HOME`, `LANG` and its configured `env`, never
//!   keel's other variables (API keys). Its stderr goes to the tracing log
//!   (target `keel_mcp`), and its last lines go into the error when it
//!   fails. Every signal goes to its whole process group, and dropping the
//!   hub kills the groups synchronously, so `npx`-style process trees leave
//!   no orphans.
//!
//! What is deliberately absent: sampling, elicitation and roots (keel does
//! not advertise them, so servers do not ask), resources and prompts, and
//! any retry of a failed call: whether a call may run twice is the
//! runtime's decision, not the transport's.

mod config;
mod connection;
mod error;
mod http;
mod hub;
mod output;
mod slot;
mod status;
mod stdio;
mod supervisor;

pub use config::{Backoff, HubConfig, McpServerConfig, McpTransport};
pub use error::{McpError, Result};
pub use hub::McpHub;
pub use output::{McpCallOutput, McpImage};
pub use status::{McpToolInfo, ServerState, ServerStatus};
