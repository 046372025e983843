//! A server's place in the hub: its config and its current state, shared
//! between its supervisor task (the only writer) and callers (readers).
//!
//! The state sits behind a `std::sync::Mutex`: it is held only to read or
//! replace a few fields, never across an `.await`, so an async mutex would
//! only add cost. A caller copies out what it needs (the peer handle, the
//! tool list) and calls the server without holding anything.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rmcp::Peer;
use rmcp::service::RoleClient;
use tokio::sync::mpsc;

use crate::config::McpServerConfig;
use crate::status::{McpToolInfo, ServerState, ServerStatus};

pub(crate) struct ServerSlot {
    pub config: McpServerConfig,
    state: Mutex<SlotState>,
}

struct SlotState {
    phase: Phase,
    restarts: u32,
    last_error: Option<String>,
    /// Reached `Ready`, `Failed` or `Stopped` at least once.
    settled: bool,
}

enum Phase {
    Starting,
    Ready(Active),
    /// `retry_at` is `None` for a server that is never tried again.
    Failed {
        error: String,
        retry_at: Option<Instant>,
    },
    Stopped,
}

/// What a caller needs to use a ready server.
#[derive(Clone)]
pub(crate) struct Active {
    pub peer: Peer<RoleClient>,
    pub tools: Arc<[McpToolInfo]>,
    /// Tells the supervisor that a call found the connection broken. Each
    /// connection has its own channel, so a report about an old connection
    /// can never take down its replacement.
    pub broken: mpsc::Sender<String>,
    pub pid: Option<u32>,
}

/// Why a server cannot take a call now.
pub(crate) enum NotReady {
    Starting,
    /// `retry_in` is `None` when it is never tried again.
    Failed {
        error: String,
        retry_in: Option<Duration>,
    },
    Stopped,
}

impl ServerSlot {
    pub fn new(config: McpServerConfig) -> ServerSlot {
        let state = SlotState { phase: Phase::Starting, restarts: 0, last_error: None, settled: false };
        ServerSlot { config, state: Mutex::new(state) }
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn active(&self) -> Result<Active, NotReady> {
        match &self.lock().phase {
            Phase::Ready(active) => Ok(active.clone()),
            Phase::Starting => Err(NotReady::Starting),
            Phase::Failed { error, retry_at } => Err(NotReady::Failed {
                error: error.clone(),
                retry_in: retry_at.map(|at| at.saturating_duration_since(Instant::now())),
            }),
            Phase::Stopped => Err(NotReady::Stopped),
        }
    }

    pub fn tools(&self) -> Option<Arc<[McpToolInfo]>> {
        match &self.lock().phase {
            Phase::Ready(active) => Some(active.tools.clone()),
            _ => None,
        }
    }

    pub fn is_settled(&self) -> bool {
        self.lock().settled
    }

    pub fn is_stopped(&self) -> bool {
        matches!(self.lock().phase, Phase::Stopped)
    }

    pub fn status(&self) -> ServerStatus {
        let state = self.lock();
        let (phase, tools) = match &state.phase {
            Phase::Starting => (ServerState::Starting, 0),
            Phase::Ready(active) => (ServerState::Ready, active.tools.len()),
            Phase::Failed { error, retry_at } => {
                let next_retry_ms = match retry_at {
                    Some(at) => {
                        u64::try_from(at.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(u64::MAX)
                    }
                    None => u64::MAX,
                };
                (ServerState::Failed { error: error.clone(), next_retry_ms }, 0)
            }
            Phase::Stopped => (ServerState::Stopped, 0),
        };
        ServerStatus {
            name: self.config.name.clone(),
            state: phase,
            tools,
            restarts: state.restarts,
            last_error: state.last_error.clone(),
        }
    }

    pub fn set_starting(&self, restart: bool) {
        let mut state = self.lock();
        if restart {
            state.restarts = state.restarts.saturating_add(1);
        }
        state.phase = Phase::Starting;
    }

    pub fn set_ready(&self, active: Active) {
        let mut state = self.lock();
        state.phase = Phase::Ready(active);
        state.settled = true;
    }

    /// Replaces the tool list of a ready server; does nothing otherwise.
    pub fn set_tools(&self, tools: Arc<[McpToolInfo]>) {
        if let Phase::Ready(active) = &mut self.lock().phase {
            active.tools = tools;
        }
    }

    /// `retry_in: None` means it is never tried again.
    pub fn set_failed(&self, error: String, retry_in: Option<Duration>) {
        let mut state = self.lock();
        state.last_error = Some(error.clone());
        state.phase = Phase::Failed { error, retry_at: retry_in.map(|delay| Instant::now() + delay) };
        state.settled = true;
    }

    pub fn set_stopped(&self) {
        let mut state = self.lock();
        state.phase = Phase::Stopped;
        state.settled = true;
    }

    pub fn pid(&self) -> Option<u32> {
        match &self.lock().phase {
            Phase::Ready(active) => active.pid,
            _ => None,
        }
    }
}
