//! The runtime's error type.

use keel_store::StoreError;

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Why a runtime operation failed. Each variant maps to one JSON-RPC code.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RuntimeError {
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    #[error("{0}")]
    InvalidParams(String),
    /// The session is busy; the same request may succeed later.
    #[error("{0}")]
    Busy(String),
    /// The request does not fit the session's state.
    #[error("{0}")]
    Conflict(String),
    /// A provider blocked the session.
    #[error("{0}")]
    Blocked(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The bundle, provider setup or state directory is wrong.
    #[error("{0}")]
    Config(String),
    /// The session's pinned view no longer matches what keel can run.
    #[error("{0}")]
    Outdated(String),
    #[error("keel is shutting down")]
    ShuttingDown,
}
