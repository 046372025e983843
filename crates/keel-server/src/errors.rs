//! The one place runtime errors become JSON-RPC errors.
//!
//! Messages say what happened and what to do. Storage internals (SQL text,
//! file paths of the database) are logged, never sent.

use keel_protocol::rpc::{RpcError, code};
use keel_runtime::RuntimeError;
use keel_store::StoreError;
use serde_json::json;

/// Maps a runtime error to the error object a client receives.
pub fn to_rpc_error(error: &RuntimeError) -> RpcError {
    let (code, kind, retryable, message) = match error {
        RuntimeError::NotFound { .. } => (code::NOT_FOUND, "not_found", false, error.to_string()),
        RuntimeError::InvalidParams(_) => (code::INVALID_PARAMS, "invalid_params", false, error.to_string()),
        RuntimeError::Busy(_) => (code::BUSY, "busy", true, error.to_string()),
        RuntimeError::Conflict(_) => (code::CONFLICT, "conflict", false, error.to_string()),
        RuntimeError::Blocked(_) => (code::BLOCKED, "provider_blocked", false, error.to_string()),
        RuntimeError::Config(_) => (code::INVALID_PARAMS, "config", false, error.to_string()),
        RuntimeError::Outdated(_) => (code::CONFLICT, "session_outdated", false, error.to_string()),
        RuntimeError::ShuttingDown => (code::BUSY, "shutting_down", true, error.to_string()),
        RuntimeError::Store(store) => {
            tracing::error!(error = %store, "store error");
            let message = match store {
                StoreError::Rejected(_) => "the journal refused the change and nothing was applied; see the keel log",
                StoreError::ReadOnly => "the store is read-only",
                StoreError::Closed => "the store is closed; keel is shutting down",
                _ => "storage failed and nothing was applied; see the keel log",
            };
            (code::STORE_FAILED, "store", matches!(store, StoreError::Backend(_)), message.to_string())
        }
    };
    RpcError { code, message, data: Some(json!({ "kind": kind, "retryable": retryable })) }
}

/// A standard error with no data.
pub(crate) fn plain(code: i64, message: impl Into<String>) -> RpcError {
    RpcError { code, message: message.into(), data: None }
}
