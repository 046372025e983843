//! The crate's error type. Each message says what happened and what to do
//! about it, because the runtime shows it to a model or a person as it is.
//!
//! A tool that ran and reported failure (`isError: true`) is not an
//! [`McpError`]: that is a normal [`McpCallOutput`](crate::McpCallOutput)
//! the model should read. `McpError` means the call did not produce a result.

use std::time::Duration;

pub type Result<T, E = McpError> = std::result::Result<T, E>;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    #[error("no MCP server is named `{0}`; use one of the servers in the configuration")]
    NoSuchServer(String),

    #[error("MCP server `{server}` has no tool named `{tool}`; call one of the tools it lists now")]
    NoSuchTool { server: String, tool: String },

    #[error("arguments for MCP tool `{tool}` on server `{server}` must be a JSON object, not {found}")]
    InvalidArguments { server: String, tool: String, found: &'static str },

    /// `reason` says why and whether trying again later can help.
    #[error("MCP server `{server}` is not available: {reason}")]
    Unavailable { server: String, reason: String },

    #[error(
        "MCP tool `{tool}` on server `{server}` did not finish within {after:?} and was cancelled; \
         try a smaller request or raise the server's call timeout"
    )]
    Timeout { server: String, tool: String, after: Duration },

    #[error(
        "lost the connection to MCP server `{server}` while calling `{tool}` ({reason}); \
         the call may or may not have run, keel reconnects in the background"
    )]
    Disconnected { server: String, tool: String, reason: String },

    /// The server answered the call with a JSON-RPC error (for example
    /// invalid params), rather than with a tool result.
    #[error("MCP server `{server}` rejected the call to `{tool}` with error {code}: {message}")]
    Call { server: String, tool: String, code: i32, message: String },

    /// The server's answer could not be understood.
    #[error("MCP server `{server}` answered the call to `{tool}` in a way keel does not understand ({detail})")]
    Protocol { server: String, tool: String, detail: String },
}
