//! What the hub reports about its servers and their tools.

use std::sync::Arc;

use rmcp::model::Tool;

/// A tool offered by a ready server.
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolInfo {
    /// The server's name in keel's configuration.
    pub server: String,
    /// The tool's name as the server spells it.
    pub name: String,
    /// Empty when the server gave none.
    pub description: String,
    /// The JSON Schema of the tool's arguments, as the server sent it.
    pub input_schema: serde_json::Value,
}

impl McpToolInfo {
    pub(crate) fn from_mcp(server: &str, tool: Tool) -> McpToolInfo {
        let input_schema = Arc::unwrap_or_clone(tool.input_schema);
        McpToolInfo {
            server: server.to_owned(),
            name: tool.name.into_owned(),
            description: tool.description.map(|text| text.into_owned()).unwrap_or_default(),
            input_schema: serde_json::Value::Object(input_schema),
        }
    }
}

/// Where a server is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// Spawning or connecting, handshaking, or listing its tools.
    Starting,
    /// Connected; its tools are in [`McpHub::tools`](crate::McpHub::tools).
    Ready,
    /// The last attempt failed or the server went away. `error` says why
    /// (for a stdio server, with the last lines it wrote to stderr); the
    /// next attempt starts in `next_retry_ms` milliseconds, counted from the
    /// moment this status was taken (`u64::MAX`: never, e.g. two servers
    /// share a name).
    Failed { error: String, next_retry_ms: u64 },
    /// The hub was shut down.
    Stopped,
}

/// A snapshot of one server, for `keel doctor` and the like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStatus {
    pub name: String,
    pub state: ServerState,
    /// How many tools it offers now (0 unless ready).
    pub tools: usize,
    /// How many times it was started again after the first start.
    pub restarts: u32,
    /// The most recent failure, kept after the server recovers.
    pub last_error: Option<String>,
}
