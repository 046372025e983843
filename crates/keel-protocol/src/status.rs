//! Status enums. Each is stored and sent as its snake_case name.

use serde::{Deserialize, Serialize};

/// Where a turn is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    /// A driver is working on it.
    Running,
    /// Parked until a person or an external event answers.
    Waiting,
    /// The model answered without tool calls.
    Completed,
    /// Ended by an error; the turn's `error` says which.
    Failed,
    /// The process stopped while the turn was running.
    Interrupted,
    /// Recovery inspected the journal; `turn/resume` can continue it.
    Recoverable,
    /// The model's output limit was hit more often than continuation allows.
    Truncated,
    /// A person stopped it with `turn/interrupt`.
    Cancelled,
}

impl TurnStatus {
    /// A terminal turn never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(self, TurnStatus::Completed | TurnStatus::Failed | TurnStatus::Truncated | TurnStatus::Cancelled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TurnStatus::Running => "running",
            TurnStatus::Waiting => "waiting",
            TurnStatus::Completed => "completed",
            TurnStatus::Failed => "failed",
            TurnStatus::Interrupted => "interrupted",
            TurnStatus::Recoverable => "recoverable",
            TurnStatus::Truncated => "truncated",
            TurnStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(text: &str) -> Option<TurnStatus> {
        ALL_TURN_STATUSES.iter().copied().find(|s| s.as_str() == text)
    }
}

const ALL_TURN_STATUSES: [TurnStatus; 8] = [
    TurnStatus::Running,
    TurnStatus::Waiting,
    TurnStatus::Completed,
    TurnStatus::Failed,
    TurnStatus::Interrupted,
    TurnStatus::Recoverable,
    TurnStatus::Truncated,
    TurnStatus::Cancelled,
];

/// The outcome of one request to a model provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptStatus {
    Running,
    Completed,
    Failed,
    /// The turn was cancelled or the process stopped while it streamed.
    Abandoned,
}

impl AttemptStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Running => "running",
            AttemptStatus::Completed => "completed",
            AttemptStatus::Failed => "failed",
            AttemptStatus::Abandoned => "abandoned",
        }
    }

    pub fn parse(text: &str) -> Option<AttemptStatus> {
        [Self::Running, Self::Completed, Self::Failed, Self::Abandoned].into_iter().find(|s| s.as_str() == text)
    }
}

/// The effect ledger's view of one tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallStatus {
    /// Decided (allowed) and journaled, not yet dispatched: the tool has
    /// certainly not run.
    Intended,
    /// Dispatched to the tool: its effect may have happened.
    Started,
    /// The result is journaled.
    Completed,
    /// The process stopped between intent and result: the effect may or may
    /// not have happened, so the call is never re-run silently.
    Interrupted,
    /// Never executed (for example its arguments were not valid JSON).
    Rejected,
}

impl ToolCallStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCallStatus::Intended => "intended",
            ToolCallStatus::Started => "started",
            ToolCallStatus::Completed => "completed",
            ToolCallStatus::Interrupted => "interrupted",
            ToolCallStatus::Rejected => "rejected",
        }
    }

    pub fn parse(text: &str) -> Option<ToolCallStatus> {
        [Self::Intended, Self::Started, Self::Completed, Self::Interrupted, Self::Rejected]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_through_their_names() {
        for status in ALL_TURN_STATUSES {
            assert_eq!(TurnStatus::parse(status.as_str()), Some(status));
            let json = serde_json::to_string(&status).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
        }
        assert!(TurnStatus::Truncated.is_terminal());
        assert!(!TurnStatus::Recoverable.is_terminal());
    }
}
