//! Interactions: questions a turn parks on until a person answers.
//!
//! An approval holds the call it is about and the digests of everything the
//! person's decision depends on (the session's bundle, the tool's
//! descriptor, the tool's policy, the resource policy). A decision is
//! applied only while those digests still match; otherwise keel asks again.

use serde::{Deserialize, Serialize};

/// What is being asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InteractionKind {
    /// May this tool call run?
    Approval,
    /// A side-effecting call started before a crash and has no result: run
    /// it again, skip it, or enter its result?
    InterruptedCall,
    /// A compaction's summary failed twice in an attended session: try the
    /// summary again, or trim the oldest part without one? The request's
    /// `tool` is `keel.compaction`, its `arguments` say why and where.
    Compaction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InteractionStatus {
    Pending,
    Answered,
    /// Nobody answered in time; counted as denied.
    Expired,
    /// The policy or bundle changed before the answer; a new interaction
    /// asks again.
    Superseded,
    /// Its turn ended (cancelled) before anyone answered.
    Withdrawn,
}

/// A person's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    AllowOnce,
    /// Allow, and grant the tool under this policy for the rest of the
    /// session (journaled; survives restarts).
    AllowForSession,
    Deny,
    /// For an interrupted call: run it again.
    RunAgain,
    /// For an interrupted call: do not run it; the model is told.
    Skip,
    /// For an interrupted call: the person says what its result was.
    EnterResult,
    /// For a failed compaction: ask the model for the summary again.
    Retry,
    /// For a failed compaction: drop the oldest part without a summary
    /// (the person's messages and the working state are kept).
    Trim,
}

impl DecisionKind {
    pub fn allows(self) -> bool {
        matches!(self, DecisionKind::AllowOnce | DecisionKind::AllowForSession | DecisionKind::RunAgain)
    }

    /// Whether the decision answers an interaction of `kind`.
    pub fn fits(self, kind: InteractionKind) -> bool {
        match kind {
            InteractionKind::Approval => {
                matches!(self, DecisionKind::AllowOnce | DecisionKind::AllowForSession | DecisionKind::Deny)
            }
            InteractionKind::InterruptedCall => {
                matches!(self, DecisionKind::RunAgain | DecisionKind::Skip | DecisionKind::EnterResult)
            }
            InteractionKind::Compaction => matches!(self, DecisionKind::Retry | DecisionKind::Trim),
        }
    }
}

/// The digests a decision is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digests {
    pub bundle: String,
    pub tool: String,
    pub tool_policy: String,
    pub resource_policy: String,
}

/// The call an interaction is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallRequest {
    pub call_id: String,
    /// Qualified name, `server.tool`.
    pub tool: String,
    /// The name the model used.
    pub name: String,
    /// The arguments exactly as the model wrote them.
    pub arguments: String,
    /// Why keel asks (the policy rule), in words.
    pub reason: String,
    pub digests: Digests,
}

/// A recorded answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub decision: DecisionKind,
    /// For the model (deny, skip), or the entered result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Who answered: `person`, or `keel` for an expiry.
    pub by: String,
    pub at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InteractionInfo {
    pub id: String,
    pub session_id: String,
    pub turn_id: String,
    pub kind: InteractionKind,
    pub status: InteractionStatus,
    pub request: CallRequest,
    /// Whether a person was watching the session when it was asked.
    pub attended: bool,
    pub created_at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// The interaction that asked again in this one's place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
}
