//! Journal events: the append-only record of everything that happened.
//!
//! Every state change commits together with at least one event. Events are
//! numbered per session from 1 with no gaps, so a subscriber that remembers
//! the last `seq` it saw can resume without losing or repeating anything.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What an event records. Stored and sent as its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    SessionCreated,
    SessionUpgraded,
    TurnStarted,
    ItemAdded,
    ModelAttemptStarted,
    ModelAttemptFinished,
    ModelRetrying,
    ModelSwitched,
    ToolCallStarted,
    ToolCallFinished,
    ToolCallRejected,
    ToolCallInterrupted,
    /// A pinned tool's server (an MCP server) is down: its tools are left
    /// out of this turn's requests.
    ToolServerUnavailable,
    /// A tool call's intent: decided and about to be dispatched (ledger
    /// status `intended`).
    ToolCallIntended,
    /// A turn parked on a question for a person.
    InteractionRequested,
    /// A person (or an expiry) answered.
    InteractionAnswered,
    /// The policy or bundle changed before the answer; asked again.
    InteractionSuperseded,
    /// A turn was parked waiting for a person.
    TurnWaiting,
    /// A person's message for a running turn, accepted.
    TurnSteered,
    TurnFinished,
    TurnInterrupted,
    TurnRecoverable,
    TurnResumed,
    /// A compaction record was committed (outbound view only; history is
    /// unchanged).
    Compacted,
    /// A compaction's summary failed twice; what keel did next (parked a
    /// question, or trimmed) commits with it.
    CompactionFailed,
    /// A summary was thrown away: history changed while it was written.
    CompactionDiscarded,
    /// Another keel process goes on with the session (`{from, to}`).
    OwnershipChanged,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::SessionCreated => "session_created",
            EventKind::SessionUpgraded => "session_upgraded",
            EventKind::TurnStarted => "turn_started",
            EventKind::ItemAdded => "item_added",
            EventKind::ModelAttemptStarted => "model_attempt_started",
            EventKind::ModelAttemptFinished => "model_attempt_finished",
            EventKind::ModelRetrying => "model_retrying",
            EventKind::ModelSwitched => "model_switched",
            EventKind::ToolCallStarted => "tool_call_started",
            EventKind::ToolCallFinished => "tool_call_finished",
            EventKind::ToolCallRejected => "tool_call_rejected",
            EventKind::ToolCallInterrupted => "tool_call_interrupted",
            EventKind::ToolServerUnavailable => "tool_server_unavailable",
            EventKind::ToolCallIntended => "tool_call_intended",
            EventKind::InteractionRequested => "interaction_requested",
            EventKind::InteractionAnswered => "interaction_answered",
            EventKind::InteractionSuperseded => "interaction_superseded",
            EventKind::TurnWaiting => "turn_waiting",
            EventKind::TurnSteered => "turn_steered",
            EventKind::TurnFinished => "turn_finished",
            EventKind::TurnInterrupted => "turn_interrupted",
            EventKind::TurnRecoverable => "turn_recoverable",
            EventKind::TurnResumed => "turn_resumed",
            EventKind::Compacted => "compacted",
            EventKind::CompactionFailed => "compaction_failed",
            EventKind::CompactionDiscarded => "compaction_discarded",
            EventKind::OwnershipChanged => "ownership_changed",
        }
    }
}

/// One committed journal entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub session_id: String,
    pub seq: u64,
    /// The kind's name. Kept as text so a reader never fails on a kind that a
    /// newer keel wrote.
    pub kind: String,
    pub data: Value,
    pub at_ms: i64,
}
