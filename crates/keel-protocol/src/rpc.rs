//! JSON-RPC 2.0 envelopes and keel's method parameters and results.
//!
//! Methods are named `resource/method`; parameters are `*Params`, results
//! `*Response`, server pushes `*Notification`. Parameters reject unknown
//! fields so a misspelt option is an error rather than silently ignored.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::Event;
use crate::item::Item;
use crate::session::{AttemptInfo, CompactionSettings, SessionInfo, ToolCallInfo, TurnInfo};

/// Standard JSON-RPC error codes, and keel's own in the server range.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    /// The named session, turn or subscription does not exist.
    pub const NOT_FOUND: i64 = -32001;
    /// The session is busy; the same request may succeed later.
    pub const BUSY: i64 = -32002;
    /// The request conflicts with the session's state (for example resuming
    /// a turn that is not recoverable).
    pub const CONFLICT: i64 = -32003;
    /// A provider blocked this session; it accepts no new turns.
    pub const BLOCKED: i64 = -32004;
    /// The durable store refused the change; nothing was applied.
    pub const STORE_FAILED: i64 = -32005;
    /// The request lacked a valid token.
    pub const UNAUTHORIZED: i64 = -32006;
}

/// An incoming request or notification.
#[derive(Debug, Clone, Deserialize)]
pub struct Request {
    pub jsonrpc: String,
    /// Absent for notifications, which get no response.
    #[serde(default, deserialize_with = "present")]
    pub id: Option<Value>,
    pub method: String,
    #[serde(default)]
    pub params: Option<Value>,
}

/// Distinguishes `"id": null` (present) from a missing id (a notification).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// An error object as sent on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// A response: exactly one of `result` and `error`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    pub jsonrpc: String,
    pub id: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RpcError>,
}

impl Response {
    pub fn ok(id: Value, result: Value) -> Response {
        Response { jsonrpc: "2.0".into(), id, result: Some(result), error: None }
    }

    pub fn err(id: Value, error: RpcError) -> Response {
        Response { jsonrpc: "2.0".into(), id, result: None, error: Some(error) }
    }
}

/// A server-to-client notification.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Notification {
    pub jsonrpc: String,
    pub method: String,
    pub params: Value,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SessionCreateParams {
    pub name: String,
    /// A coworker id from one of the server's bundles.
    pub coworker: String,
    /// The directory the session's tools may touch. Must exist.
    pub workspace: String,
    /// Whether a person is watching. Defaults to true.
    #[serde(default)]
    pub attended: Option<bool>,
    #[serde(default)]
    pub compaction: Option<CompactionSettings>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct SessionCreateResponse {
    pub session: SessionInfo,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SessionIdParams {
    pub session_id: String,
}

/// Everything `session/get` knows about a session.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct SessionSnapshot {
    pub session: SessionInfo,
    /// The most recent turn.
    pub turn: Option<TurnInfo>,
    pub history: Vec<Item>,
    pub interactions: Vec<Value>,
    pub attempts: Vec<AttemptInfo>,
    pub tool_calls: Vec<ToolCallInfo>,
    /// The seq of the last journal event.
    pub last_seq: u64,
    /// The session's latest compaction, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<crate::CompactionRecord>,
    /// How full the context is (`None` when the session's model cannot be
    /// resolved in this process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<crate::ContextUsage>,
}

/// `session/fork`: a new session from another's journal point.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SessionForkParams {
    pub session_id: String,
    /// The journal seq to fork after (`keel events` lists them).
    pub at_seq: u64,
}

/// The result of `session/compact`.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct CompactResponse {
    /// `applied` (a record was committed), `waiting` (the summary failed
    /// twice and a person was asked: `interaction`), or `nothing_to_compact`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<crate::CompactionRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction: Option<crate::InteractionInfo>,
    /// The session's context after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<crate::ContextUsage>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct SessionListResponse {
    pub sessions: Vec<SessionSummary>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct SessionSummary {
    pub id: String,
    pub name: String,
    pub coworker: String,
    pub turn_status: Option<crate::TurnStatus>,
    pub updated_at_ms: i64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TurnStartParams {
    pub session_id: String,
    /// Chosen by the client; the same id again returns the original turn.
    pub submission_id: String,
    pub text: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct TurnStartResponse {
    pub turn_id: String,
    pub duplicate: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct TurnControlResponse {
    pub turn_id: String,
    pub status: crate::TurnStatus,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EventsSubscribeParams {
    pub session_id: String,
    /// Replay events with a larger seq first. 0 replays everything.
    #[serde(default)]
    pub after_seq: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct EventsSubscribeResponse {
    pub subscription_id: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EventsUnsubscribeParams {
    pub subscription_id: String,
}

/// `events/event`: one journal event, in seq order per session.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct EventNotification {
    pub subscription_id: String,
    pub event: Event,
}

/// `events/delta`: streamed model text. Not journaled and not replayed; the
/// complete text arrives as an `item_added` event.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct DeltaNotification {
    pub subscription_id: String,
    pub session_id: String,
    pub turn_id: String,
    pub text: String,
}

/// `events/lagged`: the subscriber fell behind and live events were
/// dropped; it should resubscribe with its last seen seq.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct LaggedNotification {
    pub subscription_id: String,
    pub last_seq: u64,
}

/// `interaction/respond`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InteractionRespondParams {
    pub session_id: String,
    pub interaction_id: String,
    pub decision: crate::DecisionKind,
    /// For the model (with `deny`), or the entered result.
    #[serde(default)]
    pub message: Option<String>,
}

/// `inbox/list`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InboxListParams {
    #[serde(default)]
    pub session_id: Option<String>,
    /// Only questions from unattended sessions.
    #[serde(default)]
    pub unattended_only: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct InboxListResponse {
    pub interactions: Vec<crate::InteractionInfo>,
}
