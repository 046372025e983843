//! The durable store: the trait every backend implements, and the shape of
//! one atomic change.
//!
//! A [`Change`] carries row upserts and the journal events that record them;
//! a backend commits all of it in one transaction or none of it. The runtime
//! only updates what it serves after the commit is acknowledged, so what it
//! serves always equals what is on disk.

use std::future::Future;
use std::pin::Pin;

use keel_protocol::session::{AttemptInfo, SessionInfo, ToolCallInfo, TurnInfo};
use keel_protocol::{CompactionRecord, Event, EventKind, InteractionInfo, Item, TurnStatus};
use serde_json::Value;

/// A boxed future, so the trait stays usable as `dyn Store`.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Why the store could not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The change broke a rule of the journal (a constraint or a trigger);
    /// nothing of it was applied.
    #[error("the journal refused the change, nothing was applied: {0}")]
    Rejected(String),
    /// The database failed (disk full, I/O error, locked).
    #[error("storage failed: {0}")]
    Backend(String),
    /// A stored row could not be decoded.
    #[error("corrupt record in {table}: {message}")]
    Corrupt { table: &'static str, message: String },
    /// The store was opened read-only.
    #[error("the store is open read-only; use the keel process that owns the state directory")]
    ReadOnly,
    /// The store has shut down.
    #[error("the store is closed")]
    Closed,
}

/// A submission accepted into a session.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmissionRecord {
    pub submission_id: String,
    pub turn_id: String,
    pub text: String,
}

/// One event to append; the store assigns its seq and timestamp.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub kind: EventKind,
    pub data: Value,
    /// When it happened; `None` (the default) is the commit's time. Set
    /// only when importing a journal written elsewhere.
    pub at_ms: Option<i64>,
}

impl NewEvent {
    pub fn new(kind: EventKind, data: Value) -> NewEvent {
        NewEvent { kind, data, at_ms: None }
    }
}

/// Everything one state transition writes, committed atomically.
#[derive(Debug, Clone, Default)]
pub struct Change {
    pub session_id: String,
    /// The session row: inserted when `new_session`, else its mutable fields
    /// (name, flags, counters, usage) are updated.
    pub session: Option<SessionInfo>,
    pub new_session: bool,
    /// Also rewrite the pinned fields (coworker definition, bundle digest
    /// and path): set only by a person's `session/upgrade`.
    pub repin: bool,
    pub turns: Vec<TurnInfo>,
    /// Submissions accepted (one for `turn/start`, or many on import).
    pub submissions: Vec<SubmissionRecord>,
    /// `(index, item)` appended to history; an index that exists already
    /// makes the whole change fail.
    pub history: Vec<(u64, Item)>,
    pub attempt: Option<AttemptInfo>,
    pub tool_calls: Vec<ToolCallInfo>,
    /// Interactions inserted or updated (by id).
    pub interactions: Vec<InteractionInfo>,
    /// A compaction record to insert (its `number` must be new for the
    /// session).
    pub compaction: Option<CompactionRecord>,
    pub events: Vec<NewEvent>,
}

impl Change {
    pub fn new(session_id: impl Into<String>) -> Change {
        Change { session_id: session_id.into(), ..Change::default() }
    }

    pub fn event(mut self, kind: EventKind, data: Value) -> Change {
        self.events.push(NewEvent::new(kind, data));
        self
    }
}

/// A durable store for sessions, turns, history and the journal.
///
/// Every method is safe to call concurrently; writes from many sessions are
/// committed together (group commit) without mixing their outcomes.
pub trait Store: Send + Sync + 'static {
    /// Commits `change` atomically and returns its events with their seqs.
    fn commit(&self, change: Change) -> StoreFuture<'_, Vec<Event>>;
    /// Every session, oldest first.
    fn sessions(&self) -> StoreFuture<'_, Vec<SessionInfo>>;
    fn session(&self, session_id: String) -> StoreFuture<'_, Option<SessionInfo>>;
    fn turn(&self, turn_id: String) -> StoreFuture<'_, Option<TurnInfo>>;
    /// The current (most recently started) turn of every session that has one.
    fn current_turns(&self) -> StoreFuture<'_, Vec<TurnInfo>>;
    /// Turns in any of `statuses`, across sessions, oldest first.
    fn turns_with_status(&self, statuses: Vec<TurnStatus>) -> StoreFuture<'_, Vec<TurnInfo>>;
    /// The turn a submission started, if the session accepted it.
    fn submission(&self, session_id: String, submission_id: String) -> StoreFuture<'_, Option<String>>;
    /// History items from index `from` on.
    fn history(&self, session_id: String, from: u64) -> StoreFuture<'_, Vec<Item>>;
    /// Up to `limit` events with seq greater than `after_seq`, in order.
    fn events(&self, session_id: String, after_seq: u64, limit: u32) -> StoreFuture<'_, Vec<Event>>;
    fn attempts(&self, session_id: String) -> StoreFuture<'_, Vec<AttemptInfo>>;
    /// The effect ledger of a session, or of one turn.
    fn tool_calls(&self, session_id: String, turn_id: Option<String>) -> StoreFuture<'_, Vec<ToolCallInfo>>;
    /// The seq of the session's last event (0 when it has none).
    fn last_seq(&self, session_id: String) -> StoreFuture<'_, u64>;
    /// Interactions of one session (or all), oldest first; only pending ones
    /// when `pending_only`.
    fn interactions(&self, session_id: Option<String>, pending_only: bool) -> StoreFuture<'_, Vec<InteractionInfo>>;
    /// Compaction records of one session (or all), oldest first; only each
    /// session's latest when `latest_only`.
    fn compactions(&self, session_id: Option<String>, latest_only: bool) -> StoreFuture<'_, Vec<CompactionRecord>>;
}
