//! [`McpHub`]: the handle the runtime holds.

use std::sync::{Arc, Mutex, PoisonError};

use rmcp::model::CallToolRequestParams;
use rmcp::service::ServiceError;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::config::{HubConfig, McpServerConfig};
use crate::connection::is_connection_lost;
use crate::error::{McpError, Result};
use crate::output::{McpCallOutput, call_output};
use crate::slot::{NotReady, ServerSlot};
use crate::status::{McpToolInfo, ServerStatus};
use crate::supervisor::Supervisor;

/// Connections to a set of MCP servers, each kept alive by its own task.
///
/// Cheap to clone; every clone is the same hub. When the last clone is
/// dropped the servers' tasks are aborted and every stdio server's process
/// group is killed at once; call [`shutdown`](McpHub::shutdown) instead to
/// let them exit cleanly.
#[derive(Clone)]
pub struct McpHub {
    inner: Arc<HubInner>,
}

struct HubInner {
    servers: Vec<Arc<ServerSlot>>,
    /// Servers refused at start (no task runs them); `shutdown` stops them.
    refused: Vec<Arc<ServerSlot>>,
    changes: Arc<watch::Sender<u64>>,
    shutdown: CancellationToken,
    /// The supervisor tasks, taken by the first `shutdown`. std Mutex:
    /// never held across an await.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for HubInner {
    fn drop(&mut self) {
        self.shutdown.cancel();
        for task in self.tasks.get_mut().unwrap_or_else(PoisonError::into_inner).drain(..) {
            // Dropping a supervisor drops its connection, whose process
            // group is killed synchronously.
            task.abort();
        }
    }
}

impl McpHub {
    /// Starts every server in the background with the default
    /// [`HubConfig`]. See [`start_with`](McpHub::start_with).
    pub fn start(servers: Vec<McpServerConfig>) -> McpHub {
        McpHub::start_with(servers, HubConfig::default())
    }

    /// Starts every server in the background; never fails as a whole. A
    /// server that cannot start is `Failed` and retried with backoff; the
    /// others are unaffected.
    ///
    /// Must be called within a Tokio runtime; outside one, every server is
    /// `Failed` with an error saying so (nothing panics).
    pub fn start_with(servers: Vec<McpServerConfig>, config: HubConfig) -> McpHub {
        let (changes, _) = watch::channel(0u64);
        let changes = Arc::new(changes);
        let shutdown = CancellationToken::new();
        let runtime = tokio::runtime::Handle::try_current();
        let mut slots: Vec<Arc<ServerSlot>> = Vec::with_capacity(servers.len());
        let mut tasks = Vec::with_capacity(servers.len());
        let mut refused = Vec::new();
        for server in servers {
            let duplicate = slots.iter().any(|slot| slot.name() == server.name);
            let slot = Arc::new(ServerSlot::new(server));
            let refusal = if duplicate {
                Some(format!("another MCP server is also named `{}`; give each server its own name", slot.name()))
            } else if runtime.is_err() {
                Some("keel's MCP hub was started outside a Tokio runtime, so no server can run".to_owned())
            } else {
                None
            };
            match (refusal, &runtime) {
                (None, Ok(runtime)) => {
                    let supervisor = Supervisor {
                        slot: slot.clone(),
                        hub: config.clone(),
                        changes: changes.clone(),
                        shutdown: shutdown.clone(),
                    };
                    let span = tracing::info_span!("mcp_server", server = %slot.name());
                    tasks.push(runtime.spawn(supervisor.run().instrument(span)));
                }
                (refusal, _) => {
                    let error = refusal.unwrap_or_default();
                    tracing::error!(server = %slot.name(), "MCP server not started: {error}");
                    // Never retried: nothing would change.
                    slot.set_failed(error, None);
                    refused.push(slot.clone());
                }
            }
            slots.push(slot);
        }
        McpHub { inner: Arc::new(HubInner { servers: slots, refused, changes, shutdown, tasks: Mutex::new(tasks) }) }
    }

    /// Waits until every server has been ready or has failed at least once
    /// (each attempt is bounded by the server's startup timeout), or the hub
    /// shut down.
    pub async fn settled(&self) {
        let mut changes = self.inner.changes.subscribe();
        while !self.inner.servers.iter().all(|slot| slot.is_settled()) {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// The tools of every ready server, in configuration order.
    pub fn tools(&self) -> Vec<McpToolInfo> {
        let mut tools = Vec::new();
        for slot in &self.inner.servers {
            if let Some(offered) = slot.tools() {
                tools.extend(offered.iter().cloned());
            }
        }
        tools
    }

    /// Calls `tool` on `server` with `arguments` (a JSON object, or null for
    /// none), within the server's call timeout. A call that times out is
    /// abandoned and the server is sent `notifications/cancelled` for it.
    pub async fn call(&self, server: &str, tool: &str, arguments: Value) -> Result<McpCallOutput> {
        let slot = self.slot(server)?;
        let unavailable = |reason: String| McpError::Unavailable { server: server.to_owned(), reason };
        if self.inner.shutdown.is_cancelled() {
            return Err(unavailable("keel's MCP hub is shutting down".to_owned()));
        }
        let active = slot.active().map_err(|not_ready| unavailable(describe(not_ready)))?;
        if !active.tools.iter().any(|known| known.name == tool) {
            return Err(McpError::NoSuchTool { server: server.to_owned(), tool: tool.to_owned() });
        }
        let mut params = CallToolRequestParams::new(tool.to_owned());
        match arguments {
            Value::Object(arguments) => params = params.with_arguments(arguments),
            Value::Null => {}
            other => {
                let found = json_kind(&other);
                return Err(McpError::InvalidArguments { server: server.to_owned(), tool: tool.to_owned(), found });
            }
        }
        let after = slot.config.call_timeout;
        // Dropping the call future (on timeout, or when our caller gives up)
        // makes rmcp send `notifications/cancelled` for the request.
        let result = match tokio::time::timeout(after, active.peer.call_tool(params)).await {
            Ok(result) => result,
            Err(_) => return Err(McpError::Timeout { server: server.to_owned(), tool: tool.to_owned(), after }),
        };
        result.map(call_output).map_err(|error| {
            if is_connection_lost(&error) {
                let reason = error.to_string();
                // Full means a report is already pending: one is enough.
                let _ = active.broken.try_send(format!("the connection was lost during a call ({reason})"));
                return McpError::Disconnected { server: server.to_owned(), tool: tool.to_owned(), reason };
            }
            match error {
                ServiceError::McpError(error) => McpError::Call {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                    code: error.code.0,
                    message: error.message.into_owned(),
                },
                ServiceError::Timeout { timeout } => {
                    McpError::Timeout { server: server.to_owned(), tool: tool.to_owned(), after: timeout }
                }
                other => {
                    McpError::Protocol { server: server.to_owned(), tool: tool.to_owned(), detail: other.to_string() }
                }
            }
        })
    }

    /// A snapshot of every server, in configuration order.
    pub fn status(&self) -> Vec<ServerStatus> {
        self.inner.servers.iter().map(|slot| slot.status()).collect()
    }

    /// A receiver whose value is bumped whenever a server's state or its
    /// tool list changes. Re-read [`tools`](McpHub::tools) or
    /// [`status`](McpHub::status) when it does.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Closes every connection and ends every stdio server (stdin closed,
    /// then SIGTERM, then SIGKILL to its process group, each after
    /// [`HubConfig::exit_grace`]). Returns when all servers are stopped.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        for slot in &self.inner.refused {
            slot.set_stopped();
        }
        self.inner.changes.send_modify(|generation| *generation = generation.wrapping_add(1));
        let tasks = std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        for task in tasks {
            let _ = task.await;
        }
        // A concurrent `shutdown` that took the tasks first may still be
        // waiting for them: wait for the servers themselves.
        let mut changes = self.inner.changes.subscribe();
        while !self.inner.servers.iter().all(|slot| slot.is_stopped()) {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// The process id of a ready stdio server. For tests that kill servers.
    #[doc(hidden)]
    pub fn server_pid(&self, server: &str) -> Option<u32> {
        self.slot(server).ok()?.pid()
    }

    fn slot(&self, server: &str) -> Result<&Arc<ServerSlot>> {
        self.inner
            .servers
            .iter()
            .find(|slot| slot.name() == server)
            .ok_or_else(|| McpError::NoSuchServer(server.to_owned()))
    }
}

impl std::fmt::Debug for McpHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHub").field("servers", &self.status()).finish()
    }
}

fn describe(not_ready: NotReady) -> String {
    match not_ready {
        NotReady::Starting => "it is starting; try again in a moment".to_owned(),
        NotReady::Failed { error, retry_in: Some(retry_in) } => {
            format!("it failed: {error}; keel tries again in {} s", retry_in.as_secs_f64().ceil())
        }
        NotReady::Failed { error, retry_in: None } => format!("it failed and is not retried: {error}"),
        NotReady::Stopped => "keel's MCP hub has shut down".to_owned(),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
