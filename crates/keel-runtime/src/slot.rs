//! One session's in-memory state and the single path that changes it.

use std::sync::{Arc, Mutex};

use keel_protocol::EventKind;
use keel_protocol::ids::now_ms;
use keel_protocol::session::{Owner, SessionInfo, TurnInfo};
use keel_protocol::{CompactionRecord, Event, InteractionInfo, Item};
use keel_provider::TokenCounter;
use keel_store::{Change, NewEvent, Store};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::error::{Result, RuntimeError};
use crate::events::BusMessage;

/// Live-event buffer per subscribed session. A subscriber that falls further
/// behind catches up from the store, so this bounds memory, not correctness.
/// Kept small (the buffer is allocated whole and holds recent events) and
/// dropped when the last subscriber leaves: at 1,000 subscribed sessions a
/// 1,024-slot buffer cost 134 KiB each.
const BUS_CAPACITY: usize = 64;

/// The committed state of a session, as served.
#[derive(Debug, Clone)]
pub(crate) struct SessionState {
    pub info: SessionInfo,
    pub turn: Option<TurnInfo>,
    /// Pending interactions, the session's grants (answered
    /// `allow_for_session`), and the current turn's answered ones.
    pub interactions: Vec<InteractionInfo>,
    /// The session's latest compaction: where its outbound view starts.
    pub compaction: Option<Arc<CompactionRecord>>,
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
    bus: Mutex<Option<broadcast::Sender<BusMessage>>>,
    /// Token counts of history items by index, for one counter (history
    /// only grows, so a count never goes stale).
    tokens: Mutex<TokenCache>,
    /// Cancels the compaction in flight, if any (one at a time).
    compacting: Mutex<Option<(u64, CancellationToken)>>,
    /// This keel process: a commit by a process that is not the session's
    /// owner journals the hand-off first.
    owner: Arc<Owner>,
}

#[derive(Default)]
struct TokenCache {
    counter: String,
    counts: Vec<u64>,
}

impl SessionSlot {
    pub fn new(
        info: SessionInfo,
        turn: Option<TurnInfo>,
        interactions: Vec<InteractionInfo>,
        compaction: Option<CompactionRecord>,
        owner: Arc<Owner>,
    ) -> SessionSlot {
        SessionSlot {
            id: info.id.clone(),
            state: Mutex::new(SessionState { info, turn, interactions, compaction: compaction.map(Arc::new) }),
            tokens: Mutex::new(TokenCache::default()),
            compacting: Mutex::new(None),
            owner,
            writer: tokio::sync::Mutex::new(()),
            control: tokio::sync::Mutex::new(()),
            job: Mutex::new(None),
            bus: Mutex::new(None),
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

    /// Token counts of `history`'s items under `counter`, counting only
    /// the items not seen before.
    pub fn item_tokens(&self, history: &[Item], counter: &dyn TokenCounter) -> Vec<u64> {
        let mut cache = self.tokens.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if cache.counter != counter.name() || cache.counts.len() > history.len() {
            cache.counter = counter.name().to_string();
            cache.counts.clear();
        }
        let count = |text: &str| counter.count(text);
        let start = cache.counts.len();
        for item in &history[start..] {
            cache.counts.push(keel_core::compaction::item_tokens(item, &count));
        }
        cache.counts.clone()
    }

    /// The cached token counts of items from index `from` on, summed.
    pub fn cached_tokens_from(&self, from: usize) -> u64 {
        let cache = self.tokens.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        cache.counts.get(from..).map(|counts| counts.iter().sum()).unwrap_or(0)
    }

    /// Registers a compaction in flight, cancelling the one before it (a
    /// stale summary could not commit anyway). The compaction ends when the
    /// returned guard is dropped.
    pub fn begin_compaction(&self, parent: &CancellationToken) -> CompactionGuard<'_> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token = parent.child_token();
        let mut slot = self.compacting.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((_, previous)) = slot.replace((id, token.clone())) {
            previous.cancel();
        }
        CompactionGuard { slot: self, id, token }
    }

    /// Whether a compaction is in flight.
    pub fn is_compacting(&self) -> bool {
        self.compacting.lock().map(|slot| slot.as_ref().is_some_and(|(_, t)| !t.is_cancelled())).unwrap_or(false)
    }

    /// Cancels the compaction in flight, if any.
    pub fn cancel_compaction(&self) {
        if let Ok(mut slot) = self.compacting.lock()
            && let Some((_, token)) = slot.take()
        {
            token.cancel();
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
        if next.info.owner.as_ref() != Some(&*self.owner) {
            let from = next.info.owner.replace((*self.owner).clone());
            change.events.push(NewEvent::new(
                EventKind::OwnershipChanged,
                serde_json::json!({ "from": from, "to": *self.owner }),
            ));
        }
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
        for event in &events {
            crate::faults::hold_if(&event.kind).await;
        }
        committed();
        self.publish_events(&events);
        Ok(events)
    }

    fn publish_events(&self, events: &[Event]) {
        self.with_bus(|bus| {
            for event in events {
                let _ = bus.send(BusMessage::Event(event.clone()));
            }
        });
    }

    /// Publishes a live-only message (streamed text).
    pub fn publish(&self, message: BusMessage) {
        self.with_bus(|bus| {
            let _ = bus.send(message);
        });
    }

    /// Runs `send` on the bus if anyone listens; a bus nobody listens to any
    /// more is dropped with the events it still holds.
    fn with_bus(&self, send: impl FnOnce(&broadcast::Sender<BusMessage>)) {
        let mut bus = self.bus.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match bus.as_ref() {
            Some(sender) if sender.receiver_count() > 0 => send(sender),
            Some(_) => *bus = None,
            None => {}
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<BusMessage> {
        let mut bus = self.bus.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        bus.get_or_insert_with(|| broadcast::channel(BUS_CAPACITY).0).subscribe()
    }
}

/// A compaction in flight; dropping it ends the registration.
pub(crate) struct CompactionGuard<'a> {
    slot: &'a SessionSlot,
    id: u64,
    pub token: CancellationToken,
}

impl Drop for CompactionGuard<'_> {
    fn drop(&mut self) {
        let mut current = self.slot.compacting.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if current.as_ref().is_some_and(|(id, _)| *id == self.id) {
            *current = None;
        }
    }
}
