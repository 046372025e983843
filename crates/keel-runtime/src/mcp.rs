//! MCP servers' tools as keel tools.
//!
//! The runtime starts one [`McpHub`] for the MCP servers of every bundle it
//! serves (a server name means one server: two bundles may declare it only
//! identically). The hub connects in the background and never fails as a
//! whole: a server that is down is reported by `keel doctor`, in the events
//! of the sessions whose turns would use it, and to the model in the live
//! tool status, while every other tool keeps working.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use keel_mcp::{McpError, McpHub, McpServerConfig, McpToolInfo, McpTransport, ServerState, ServerStatus};
use keel_tools::{BoxFuture, Tool, ToolContext, ToolDescriptor, ToolImage, ToolOutput};
use serde_json::Value;

use crate::bundle::{Bundle, McpServerSpec};
use crate::error::{Result, RuntimeError};

/// The runtime's MCP servers.
/// The runtime's MCP servers (crate-internal handle).
pub(crate) struct McpTools {
    hub: McpHub,
    servers: BTreeMap<String, McpServerSpec>,
}

impl McpTools {
    /// Starts the servers the bundles declare.
    pub(crate) fn start(bundles: &[Bundle]) -> Result<McpTools> {
        let mut servers: BTreeMap<String, McpServerSpec> = BTreeMap::new();
        for bundle in bundles {
            for (name, spec) in &bundle.mcp_servers {
                match servers.get(name) {
                    Some(existing) if existing != spec => {
                        return Err(RuntimeError::Config(format!(
                            "two bundles declare the MCP server {name:?} differently; give one of them another name"
                        )));
                    }
                    _ => {
                        servers.insert(name.clone(), spec.clone());
                    }
                }
            }
        }
        let configs = servers.iter().map(|(name, spec)| config(name, spec)).collect();
        Ok(McpTools { hub: McpHub::start(configs), servers })
    }

    pub(crate) fn is_server(&self, name: &str) -> bool {
        self.servers.contains_key(name)
    }

    /// The tools of every ready server.
    pub(crate) fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.hub
            .tools()
            .into_iter()
            .map(|info| Arc::new(McpTool { info, hub: self.hub.clone() }) as Arc<dyn Tool>)
            .collect()
    }

    /// Why `server` (a declared MCP server) cannot serve now; `None` when
    /// it is ready or not an MCP server.
    pub(crate) fn down_reason(&self, server: &str) -> Option<String> {
        if !self.is_server(server) {
            return None;
        }
        let status = self.hub.status().into_iter().find(|s| s.name == server)?;
        match status.state {
            ServerState::Ready => None,
            ServerState::Starting => Some(format!("the MCP server {server:?} is starting")),
            ServerState::Failed { error, next_retry_ms: u64::MAX } => {
                Some(format!("the MCP server {server:?} is down ({error}) and will not be retried"))
            }
            ServerState::Failed { error, next_retry_ms } => Some(format!(
                "the MCP server {server:?} is down ({error}); keel retries in {} s",
                next_retry_ms.div_ceil(1000)
            )),
            ServerState::Stopped => Some(format!("the MCP server {server:?} was stopped")),
        }
    }

    /// Waits until every server is ready or has failed once.
    pub(crate) async fn settled(&self) {
        self.hub.settled().await;
    }

    pub(crate) fn status(&self) -> Vec<ServerStatus> {
        self.hub.status()
    }

    pub(crate) async fn shutdown(&self) {
        self.hub.shutdown().await;
    }
}

/// Starts the MCP servers of `bundles`, waits until each is ready or has
/// failed once, and reports them (for `keel doctor`). Stops them after.
pub async fn check_servers(bundles: &[Bundle]) -> Result<Vec<ServerStatus>> {
    let tools = McpTools::start(bundles)?;
    tools.settled().await;
    let status = tools.status();
    tools.shutdown().await;
    Ok(status)
}

fn config(name: &str, spec: &McpServerSpec) -> McpServerConfig {
    let transport = match (&spec.command, &spec.url) {
        (Some(command), _) => McpTransport::Stdio {
            command: command.clone(),
            args: spec.args.clone(),
            env: spec.env.clone(),
            cwd: spec.cwd.clone(),
        },
        (None, url) => McpTransport::Http { url: url.clone().unwrap_or_default(), headers: spec.headers.clone() },
    };
    let mut config = McpServerConfig::new(name, transport);
    if let Some(secs) = spec.startup_timeout_secs {
        config.startup_timeout = Duration::from_secs(secs);
    }
    if let Some(secs) = spec.call_timeout_secs {
        config.call_timeout = Duration::from_secs(secs);
    }
    config
}

/// One tool of an MCP server.
struct McpTool {
    info: McpToolInfo,
    hub: McpHub,
}

impl Tool for McpTool {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: format!("{}.{}", self.info.server, self.info.name),
            description: self.info.description.clone(),
            // MCP tools carry no version; the digest of the description and
            // schema notices every change that matters.
            version: "mcp".into(),
            input_schema: self.info.input_schema.clone(),
            // MCP tools' hints are advisory; keel assumes the worst.
            effect: keel_protocol::Effect::SideEffecting,
        }
    }

    fn call<'a>(&'a self, _context: &'a ToolContext, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            match self.hub.call(&self.info.server, &self.info.name, arguments).await {
                Ok(output) => ToolOutput {
                    text: output.text,
                    is_error: output.is_error,
                    images: output
                        .images
                        .into_iter()
                        .map(|image| ToolImage { mime_type: image.mime_type, data: image.data })
                        .collect(),
                    sandbox: None,
                    not_run: false,
                },
                Err(
                    error @ (McpError::NoSuchServer(_)
                    | McpError::NoSuchTool { .. }
                    | McpError::InvalidArguments { .. }
                    | McpError::Unavailable { .. }),
                ) => ToolOutput { not_run: true, ..ToolOutput::error(error.to_string()) },
                Err(error) => ToolOutput::error(error.to_string()),
            }
        })
    }
}
