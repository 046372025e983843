//! One task per server keeps it running: connect, serve until the
//! connection breaks, wait out the backoff, connect again; until shutdown.
//!
//! The task is the only writer of its server's [`ServerSlot`] and bumps the
//! hub's change counter after every write. While the server is ready it
//! watches, all at once: the process exiting (stdio), the connection
//! closing, a `notifications/tools/list_changed` (list again), a call that
//! found the connection broken, a periodic ping (HTTP), and shutdown.
//! Tool calls do not go through this task: callers use the connection's
//! peer directly, so calls run concurrently and a slow call holds up
//! nothing else.

use std::sync::Arc;
use std::time::Duration;

use rmcp::Peer;
use rmcp::model::{ClientRequest, PingRequest};
use rmcp::service::RoleClient;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::config::{HubConfig, McpTransport};
use crate::connection::{self, Connection, is_connection_lost};
use crate::slot::{Active, ServerSlot};
use crate::status::McpToolInfo;
use crate::stdio::StdioChild;

/// How long a ping may take.
const PING_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a process whose connection closed gets to finish exiting, so
/// the error can say how it ended.
const EXIT_WAIT: Duration = Duration::from_millis(500);

pub(crate) struct Supervisor {
    pub slot: Arc<ServerSlot>,
    pub hub: HubConfig,
    pub changes: Arc<watch::Sender<u64>>,
    pub shutdown: CancellationToken,
}

impl Supervisor {
    fn changed(&self) {
        self.changes.send_modify(|generation| *generation = generation.wrapping_add(1));
    }

    pub async fn run(self) {
        let mut attempt: u32 = 0;
        let mut restart = false;
        loop {
            self.slot.set_starting(restart);
            self.changed();
            restart = true;
            let connected = tokio::select! {
                () = self.shutdown.cancelled() => break,
                connected = connection::connect(&self.slot.config, &self.hub) => connected,
            };
            let retry_at = match connected {
                Ok((connection, tools)) => match self.serve(connection, tools, &mut attempt).await {
                    Some(retry_at) => retry_at,
                    None => break,
                },
                Err(error) => self.fail(error, &mut attempt),
            };
            tokio::select! {
                () = self.shutdown.cancelled() => break,
                () = tokio::time::sleep_until(retry_at) => {}
            }
        }
        self.slot.set_stopped();
        self.changed();
        tracing::debug!(server = %self.slot.name(), "MCP server stopped");
    }

    /// Records a failure; returns when to try again.
    fn fail(&self, error: String, attempt: &mut u32) -> Instant {
        let delay = self.hub.backoff.delay(*attempt);
        *attempt = attempt.saturating_add(1);
        tracing::warn!(server = %self.slot.name(), retry_in = ?delay, "MCP server failed: {error}");
        self.slot.set_failed(error, Some(delay));
        self.changed();
        Instant::now() + delay
    }

    /// Publishes a ready connection and watches it until it breaks (then
    /// returns when to try again) or the hub shuts down (then `None`). The
    /// connection is closed either way; a broken one is marked failed first,
    /// so callers stop using it while it closes.
    async fn serve(&self, connection: Connection, tools: Vec<McpToolInfo>, attempt: &mut u32) -> Option<Instant> {
        let Connection { service, mut child, events } = connection;
        let server = self.slot.name();
        let peer = service.peer().clone();
        let (broken, mut broken_reports) = mpsc::channel(1);
        let pid = child.as_ref().and_then(StdioChild::pid);
        tracing::info!(server = %server, tools = tools.len(), pid, "MCP server ready");
        self.slot.set_ready(Active { peer: peer.clone(), tools: tools.into(), broken, pid });
        self.changed();
        let ready_at = Instant::now();

        let cancel = service.cancellation_token();
        let quit = service.waiting();
        tokio::pin!(quit);
        let mut quit_done = false;
        let mut ping = self.ping_interval();
        let broke = loop {
            tokio::select! {
                () = self.shutdown.cancelled() => break None,
                _ = &mut quit => {
                    quit_done = true;
                    break Some(lost_reason(child.as_mut(), "the connection to the server closed".to_owned()).await);
                }
                status = wait_for_exit(child.as_mut()) => {
                    let reason = match child.as_mut() {
                        Some(child) => child.exit_reason(status).await,
                        None => "the server process ended".to_owned(),
                    };
                    break Some(reason);
                }
                () = events.tools_changed.notified() => {
                    if let Err(reason) = self.refresh_tools(&peer).await {
                        break Some(lost_reason(child.as_mut(), reason).await);
                    }
                }
                Some(reason) = broken_reports.recv() => break Some(lost_reason(child.as_mut(), reason).await),
                () = tick(ping.as_mut()) => {
                    if let Err(reason) = ping_server(&peer).await {
                        break Some(lost_reason(child.as_mut(), reason).await);
                    }
                }
            }
        };
        let retry_at = broke.map(|reason| {
            if ready_at.elapsed() > self.hub.backoff.max {
                *attempt = 0;
            }
            self.fail(reason, attempt)
        });

        // Close: the transport first (which closes a stdio server's stdin,
        // the MCP way to ask it to exit), then the process.
        cancel.cancel();
        if !quit_done {
            let _ = tokio::time::timeout(self.hub.exit_grace, &mut quit).await;
        }
        if let Some(child) = child {
            child.stop(self.hub.exit_grace).await;
        }
        retry_at
    }

    /// Lists the tools again after the server said they changed. Only a
    /// lost connection or a hung server breaks the connection; an error
    /// answer keeps the previous list.
    async fn refresh_tools(&self, peer: &Peer<RoleClient>) -> Result<(), String> {
        let server = self.slot.name();
        let timeout = self.slot.config.call_timeout;
        match tokio::time::timeout(timeout, connection::list_tools(server, peer)).await {
            Ok(Ok(tools)) => {
                tracing::info!(server = %server, tools = tools.len(), "MCP server's tools changed");
                self.slot.set_tools(tools.into());
                self.changed();
                Ok(())
            }
            Ok(Err(error)) if is_connection_lost(&error) => {
                Err(format!("the connection was lost while listing its tools ({error})"))
            }
            Ok(Err(error)) => {
                tracing::warn!(server = %server, "listing changed tools failed, keeping the previous list: {error}");
                Ok(())
            }
            Err(_) => Err(format!("it did not answer tools/list within {timeout:?}")),
        }
    }

    fn ping_interval(&self) -> Option<Interval> {
        let period = self.hub.http_ping_interval?;
        if !matches!(self.slot.config.transport, McpTransport::Http { .. }) || period.is_zero() {
            return None;
        }
        let mut interval = tokio::time::interval_at(Instant::now() + period, period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Some(interval)
    }
}

/// Any answer, even an error, shows the server is there.
async fn ping_server(peer: &Peer<RoleClient>) -> Result<(), String> {
    let ping = peer.send_request(ClientRequest::PingRequest(PingRequest::default()));
    match tokio::time::timeout(PING_TIMEOUT, ping).await {
        Err(_) => Err(format!("it did not answer a ping within {PING_TIMEOUT:?}")),
        Ok(Err(error)) if is_connection_lost(&error) => Err(format!("the connection was lost ({error})")),
        Ok(_) => Ok(()),
    }
}

/// Why a connection was lost: for a stdio server whose process ended, how
/// it ended (which explains the loss best); otherwise `reason`, with the
/// server's last stderr lines.
async fn lost_reason(child: Option<&mut StdioChild>, reason: String) -> String {
    let Some(child) = child else {
        return reason;
    };
    match tokio::time::timeout(EXIT_WAIT, child.wait()).await {
        Ok(status) => child.exit_reason(status).await,
        Err(_) => child.explain(reason).await,
    }
}

async fn wait_for_exit(child: Option<&mut StdioChild>) -> std::io::Result<std::process::ExitStatus> {
    match child {
        Some(child) => child.wait().await,
        None => std::future::pending().await,
    }
}

async fn tick(interval: Option<&mut Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}
