//! One attempt to reach a server: spawn or connect, the MCP handshake, the
//! first `tools/list`, all within the server's startup timeout. The result
//! is a [`Connection`] whose supervisor then watches it until it breaks.
//!
//! When a stdio server fails to start, the best explanation is usually how
//! its process ended and what it printed; so whenever the process is gone
//! the error is built from its exit status and stderr rather than from the
//! protocol error that followed.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{NotificationContext, RoleClient, RunningService, ServiceError, serve_client};
use rmcp::{ClientHandler, Peer};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::{HubConfig, McpServerConfig, McpTransport};
use crate::http;
use crate::status::McpToolInfo;
use crate::stdio::{self, Spawned, StdioChild, StdioCommand};

/// How long a process that broke the handshake gets to finish exiting, so
/// the error can say how it ended.
const EXIT_WAIT: Duration = Duration::from_millis(500);

/// The client side of one connection: answers the server's requests (with
/// rmcp's defaults) and passes on what the supervisor must act on.
#[derive(Clone)]
pub(crate) struct ClientEvents {
    pub tools_changed: Arc<Notify>,
}

impl ClientEvents {
    pub fn new() -> ClientEvents {
        ClientEvents { tools_changed: Arc::new(Notify::new()) }
    }
}

impl ClientHandler for ClientEvents {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        // One stored permit coalesces a burst of notifications into one refresh.
        self.tools_changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(ClientCapabilities::default(), Implementation::new("keel", env!("CARGO_PKG_VERSION")))
    }
}

pub(crate) type Service = RunningService<RoleClient, ClientEvents>;

/// A server that completed its handshake.
pub(crate) struct Connection {
    pub service: Service,
    /// The process of a stdio server.
    pub child: Option<StdioChild>,
    pub events: ClientEvents,
}

/// Connects to `config`'s server and lists its tools, within its startup
/// timeout. The error says why, for the server's `Failed` state.
pub(crate) async fn connect(
    config: &McpServerConfig,
    hub: &HubConfig,
) -> Result<(Connection, Vec<McpToolInfo>), String> {
    let deadline = Instant::now() + config.startup_timeout;
    let events = ClientEvents::new();
    let timed_out =
        || format!("it did not complete the MCP handshake and list its tools within {:?}", config.startup_timeout);
    match &config.transport {
        McpTransport::Stdio { command, args, env, cwd } => {
            let spec = StdioCommand {
                server: &config.name,
                command,
                args,
                env,
                cwd: cwd.as_ref(),
                stderr_tail_lines: hub.stderr_tail_lines,
            };
            let Spawned { mut child, stdout, stdin } = stdio::spawn(&spec)?;
            let handshake = handshake(&config.name, events.clone(), (stdout, stdin));
            let result = tokio::select! {
                result = tokio::time::timeout_at(deadline, handshake) => result.unwrap_or_else(|_| Err(timed_out())),
                status = child.wait() => return Err(child.exit_reason(status).await),
            };
            match result {
                Ok((service, tools)) => Ok((Connection { service, child: Some(child), events }, tools)),
                Err(what) => match tokio::time::timeout(EXIT_WAIT, child.wait()).await {
                    Ok(status) => Err(child.exit_reason(status).await),
                    // Still running: `child` is dropped on return, which kills it.
                    Err(_) => Err(child.explain(what).await),
                },
            }
        }
        McpTransport::Http { url, headers } => {
            let transport = http::transport(url, headers)?;
            let handshake = handshake(&config.name, events.clone(), transport);
            match tokio::time::timeout_at(deadline, handshake).await {
                Ok(Ok((service, tools))) => Ok((Connection { service, child: None, events }, tools)),
                Ok(Err(what)) => Err(format!("{url}: {what}")),
                Err(_) => Err(format!("{url}: {}", timed_out())),
            }
        }
    }
}

async fn handshake<T, E, A>(
    server: &str,
    events: ClientEvents,
    transport: T,
) -> Result<(Service, Vec<McpToolInfo>), String>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let service =
        serve_client(events, transport).await.map_err(|error| format!("the MCP handshake failed ({error})"))?;
    let tools =
        list_tools(server, service.peer()).await.map_err(|error| format!("listing its tools failed ({error})"))?;
    Ok((service, tools))
}

/// All the tools a server offers; none if it does not offer tools at all.
pub(crate) async fn list_tools(server: &str, peer: &Peer<RoleClient>) -> Result<Vec<McpToolInfo>, ServiceError> {
    let offers_tools = peer.peer_info().is_none_or(|info| info.capabilities.tools.is_some());
    if !offers_tools {
        return Ok(Vec::new());
    }
    let tools = peer.list_all_tools().await?;
    Ok(tools.into_iter().map(|tool| McpToolInfo::from_mcp(server, tool)).collect())
}

/// Whether an error means the connection itself is gone (as opposed to the
/// server answering with an error).
pub(crate) fn is_connection_lost(error: &ServiceError) -> bool {
    matches!(error, ServiceError::TransportSend(_) | ServiceError::TransportClosed)
}
