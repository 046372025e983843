//! Session-level settings and token usage.

use serde::{Deserialize, Serialize};

/// How a session's context is kept under its cap (used by compaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompactionSettings {
    /// The context cap in tokens; unset means the model's context window.
    #[serde(default)]
    pub cap_tokens: Option<u64>,
    /// In an unattended session, trim mechanically when a summary fails.
    #[serde(default)]
    pub auto_trim_on_failure: bool,
    /// Compact when the next request would pass this percentage of the cap
    /// (default 80, clamped to 10..=100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_percent: Option<u8>,
}

impl CompactionSettings {
    /// The threshold as a percentage, 80 unless set (clamped to 10..=100).
    pub fn threshold_percent(&self) -> u64 {
        u64::from(self.threshold_percent.unwrap_or(80).clamp(10, 100))
    }
}

impl Default for CompactionSettings {
    fn default() -> Self {
        CompactionSettings { cap_tokens: None, auto_trim_on_failure: true, threshold_percent: None }
    }
}

/// Token counts reported by a provider. Missing counts stay zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cached_input_tokens: u64,
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// Cost in millionths of a US dollar, from the bundle's price table
    /// (0 when the model has no price).
    #[serde(default)]
    pub cost_micro_usd: u64,
}

impl Usage {
    /// Adds `other`'s counts. Sums saturate at `u64::MAX`: counts come from
    /// providers and archives, which may send any number.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_input_tokens = self.cached_input_tokens.saturating_add(other.cached_input_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
        self.cost_micro_usd = self.cost_micro_usd.saturating_add(other.cost_micro_usd);
    }
}

/// A session as stored and as shown by `session/get` and `session/list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub id: String,
    pub name: String,
    pub coworker: String,
    /// The bundle directory the coworker came from.
    pub bundle_path: String,
    /// Digest of the coworker definition pinned at creation.
    pub bundle_digest: String,
    /// The coworker definition pinned at creation: later edits to the bundle
    /// on disk do not change a session that already exists.
    pub coworker_spec: std::sync::Arc<serde_json::Value>,
    pub workspace: String,
    pub attended: bool,
    pub compaction: CompactionSettings,
    /// Set when a provider refused on safety grounds; new turns are refused.
    #[serde(default)]
    pub provider_blocked: bool,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// The turn that was started last, if any.
    #[serde(default)]
    pub current_turn_id: Option<String>,
    /// Number of history items.
    pub history_len: u64,
    /// Tokens used by every attempt of every turn.
    #[serde(default)]
    pub usage: Usage,
    /// Sensitivity of history items above `public`, by index, set by the
    /// runtime from where the data came from (never by the model).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub labels: std::collections::BTreeMap<u64, Sensitivity>,
    /// The keel process that last changed the session. When another one
    /// goes on with it (after a restart, or on another machine after an
    /// import) it journals `ownership_changed` first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
}

/// A keel process, as run archives and ownership records name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// Stable per state directory (`<state>/machine-id`, made once).
    pub machine_id: String,
    pub process_id: u32,
    /// Random per process start.
    pub instance_id: String,
}

/// How sensitive a piece of the context is. Ordered: `public < internal <
/// private`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Sensitivity {
    #[default]
    Public,
    Internal,
    Private,
}

/// Why a turn failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnError {
    /// A stable machine-readable class, such as `provider` or `step_limit`.
    pub kind: String,
    pub message: String,
}

/// A turn as stored and shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnInfo {
    pub id: String,
    pub session_id: String,
    pub submission_id: String,
    pub status: crate::TurnStatus,
    /// Model round trips that completed in this turn.
    pub steps: u32,
    /// Requests sent to providers in this turn, failed ones included.
    #[serde(default)]
    pub attempts: u32,
    /// Answers continued after hitting the output limit.
    #[serde(default)]
    pub continuations: u32,
    /// History length when the turn started: its items follow this index.
    pub history_start: u64,
    #[serde(default)]
    pub error: Option<TurnError>,
    #[serde(default)]
    pub usage: Usage,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// A person's messages for this turn (`turn/steer`) not yet delivered:
    /// the driver adds them to history before its next model request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_steers: Vec<Steer>,
}

/// A person's message for a running turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Steer {
    pub submission_id: String,
    pub text: String,
    pub at_ms: i64,
}

/// One request to a model provider, kept apart from history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptInfo {
    pub id: String,
    pub session_id: String,
    pub turn_id: String,
    /// Which model round trip of the turn this belongs to (from 1).
    pub step: u32,
    /// Which try of that round trip (from 1).
    pub attempt: u32,
    pub model: String,
    pub status: crate::AttemptStatus,
    /// Text streamed by the attempt, kept even when it failed. A failed
    /// attempt's text never enters history.
    pub text: String,
    #[serde(default)]
    pub usage: Usage,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    pub started_at_ms: i64,
    #[serde(default)]
    pub finished_at_ms: Option<i64>,
}

/// The effect ledger's record of one tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallInfo {
    pub session_id: String,
    pub call_id: String,
    pub turn_id: String,
    pub name: String,
    pub arguments: String,
    pub status: crate::ToolCallStatus,
    #[serde(default)]
    pub output: Option<String>,
    #[serde(default)]
    pub is_error: bool,
    pub started_at_ms: i64,
    #[serde(default)]
    pub finished_at_ms: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzzing `keel_archive`: an archive whose checkpoint holds a
    /// count near `u64::MAX` made folding a diff panic in debug builds.
    #[test]
    fn usage_sums_saturate_instead_of_overflowing() {
        let mut usage = Usage { input_tokens: u64::MAX - 1, cost_micro_usd: u64::MAX, ..Usage::default() };
        usage.add(&Usage { input_tokens: 5, output_tokens: 2, cost_micro_usd: 1, ..Usage::default() });
        assert_eq!(
            usage,
            Usage { input_tokens: u64::MAX, output_tokens: 2, cost_micro_usd: u64::MAX, ..Usage::default() }
        );
    }
}
