//! The keel runtime: hosts sessions, drives turns, and makes every step
//! durable.
//!
//! [`Runtime`] owns the store, the loaded bundles, the model providers and
//! the tool registry. Every state change goes through one path,
//! `SessionSlot::transact`: it builds the new state on a copy, commits the
//! copy and its journal events in one store transaction, and only then makes
//! the copy the state that is served. A failed commit leaves the served
//! state untouched, so what keel serves always equals what is on disk.
//!
//! Turns run as owned tasks (see [`driver`]); the decisions they make come
//! from `keel-core`, and this crate performs them.

mod approvals;
pub mod archive;
pub mod audit;
pub mod bundle;
pub mod bundle_check;
mod compaction;
pub mod config;
mod driver;
pub mod error;
pub mod events;
mod faults;
mod fork;
pub mod images;
pub mod inspect;
pub mod mcp;
pub mod metrics;
mod recovery;
pub mod replay;
pub mod retry;
mod runtime;
pub mod secrets;
mod slot;
pub mod state_dir;
mod telemetry;
pub mod tools;

pub use bundle::{Bundle, CoworkerSpec, Price};
pub use config::{ProviderSet, RuntimeConfig};
pub use error::{Result, RuntimeError};
pub use events::{BusMessage, EventStream};
pub use inspect::Inspector;
pub use metrics::{Metrics, TurnTiming};
pub use runtime::{NewSession, Runtime};

pub use keel_mcp::{ServerState as McpServerState, ServerStatus as McpServerStatus};

/// The qualified names of keel's built-in tools.
pub fn builtin_tool_names() -> Vec<String> {
    keel_tools::builtin_descriptors().into_iter().map(|d| d.name).collect()
}
