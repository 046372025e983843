//! One session's in-memory state and the single path that changes it.

use std::sync::{Mutex, OnceLock};

use keel_protocol::ids::now_ms;
use keel_protocol::session::{SessionInfo, TurnInfo};
use keel_protocol::{Event, InteractionInfo};
use keel_store::{Change, Store};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::error::{Result, RuntimeError};
use crate::events::BusMessage;

/// Live-event buffer per subscribed session. A subscriber that falls further
/// behind catches up from the store, so this bounds memory, not correctness.
const BUS_CAPACITY: usize = 1024;

/// The committed state of a session, as served.
#[derive(Debug, Clone)]
pub(crate) struct SessionState {
    pub info: SessionInfo,
    pub turn: Option<TurnInfo>,
    /// Pending interactions, the session's grants (answered
    /// `allow_for_session`), and the current turn's answered ones.
    pub interactions: Vec<InteractionInfo>,
}

/// A running turn's driver.
pub(crate) struct Job {
    pub turn_id: String,
    pub cancel: CancellationToken,
    /// Becomes true when the driver has finished its last commit.
    pub done: watch::Receiver<bool>,
}

/// A session held by the runtime.
pub(crate) struct SessionSlot {
    pub id: String,
    state: Mutex<SessionState>,
    /// Serializes commits of this session so its events publish in seq order
    /// and read-modify-write never loses an update.
    writer: tokio::sync::Mutex<()>,
    /// Serializes control requests (start, interrupt, resume).
    pub control: tokio::sync::Mutex<()>,
    pub job: Mutex<Option<Job>>,
    bus: OnceLock<broadcast::Sender<BusMessage>>,
}

impl SessionSlot {
    pub fn new(info: SessionInfo, turn: Option<TurnInfo>, interactions: Vec<InteractionInfo>) -> SessionSlot {
        SessionSlot {
            id: info.id.clone(),
            state: Mutex::new(SessionState { info, turn, interactions }),
            writer: tokio::sync::Mutex::new(()),
            control: tokio::sync::Mutex::new(()),
            job: Mutex::new(None),
            bus: OnceLock::new(),
        }
    }

    /// A copy of the committed state.
    pub fn state(&self) -> SessionState {
        // A poisoned lock means a panic mid-update of plain data that is only
        // ever replaced whole; the value is still the last committed one.
        match self.state.lock() {
            Ok(state) => state.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Reads the committed state without copying it.
    pub fn peek<R>(&self, read: impl FnOnce(&SessionState) -> R) -> R {
        match self.state.lock() {
            Ok(state) => read(&state),
            Err(poisoned) => read(&poisoned.into_inner()),
        }
    }

    /// Completed model round trips of the current turn.
    pub fn turn_steps(&self) -> u32 {
        match self.state.lock() {
            Ok(state) => state.turn.as_ref().map(|t| t.steps).unwrap_or(0),
            Err(poisoned) => poisoned.into_inner().turn.as_ref().map(|t| t.steps).unwrap_or(0),
        }
    }

    fn replace_state(&self, next: SessionState) {
        match self.state.lock() {
            Ok(mut state) => *state = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
    }

    /// The id and done-signal of the running driver, if any.
    pub fn job_turn(&self) -> Option<(String, CancellationToken, watch::Receiver<bool>)> {
        let job = self.job.lock().ok()?;
        job.as_ref().map(|j| (j.turn_id.clone(), j.cancel.clone(), j.done.clone()))
    }

    /// Forgets the driver of `turn_id`: its turn has ended durably.
    pub fn release_job(&self, turn_id: &str) {
        if let Ok(mut job) = self.job.lock()
            && job.as_ref().is_some_and(|j| j.turn_id == turn_id)
        {
            *job = None;
        }
    }

    pub fn has_job(&self) -> bool {
        self.job.lock().map(|j| j.is_some()).unwrap_or(true)
    }

    /// Applies `build` to a copy of the state, commits the copy with the
    /// change `build` returns, and serves the copy only if the commit
    /// succeeded.
    pub async fn transact<F>(&self, store: &dyn Store, build: F) -> Result<Vec<Event>>
    where
        F: FnOnce(&mut SessionState, &mut Change) -> Result<()>,
    {
        self.transact_then(store, build, || {}).await
    }

    /// [`Self::transact`], running `committed` after the commit succeeds and
    /// before its events are published.
    pub async fn transact_then<F, C>(&self, store: &dyn Store, build: F, committed: C) -> Result<Vec<Event>>
    where
        F: FnOnce(&mut SessionState, &mut Change) -> Result<()>,
        C: FnOnce(),
    {
        let _writer = self.writer.lock().await;
        let mut next = self.state();
        let mut change = Change::new(self.id.clone());
        build(&mut next, &mut change)?;
        let now = now_ms();
        next.info.updated_at_ms = now;
        if let Some(turn) = next.turn.as_mut() {
            turn.updated_at_ms = now;
            change.turns.push(turn.clone());
        }
        change.session = Some(next.info.clone());
        let events = store.commit(change).await.map_err(RuntimeError::Store)?;
        for event in &events {
            crate::faults::crash_if(&event.kind);
        }
        self.replace_state(next);
        committed();
        self.publish_events(&events);
        Ok(events)
    }

    fn publish_events(&self, events: &[Event]) {
        if let Some(bus) = self.bus.get() {
            for event in events {
                let _ = bus.send(BusMessage::Event(event.clone()));
            }
        }
    }

    /// Publishes a live-only message (streamed text).
    pub fn publish(&self, message: BusMessage) {
        if let Some(bus) = self.bus.get() {
            let _ = bus.send(message);
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<BusMessage> {
        self.bus.get_or_init(|| broadcast::channel(BUS_CAPACITY).0).subscribe()
    }
}
