//! Token accounting and compaction records.
//!
//! Compaction never rewrites history. It records a *boundary*: the model is
//! sent the coworker's instructions, then one compaction block (a summary,
//! the person's own earlier messages verbatim, and a mechanical working
//! state), then the history items from the boundary on. The record is
//! journaled with a `compacted` event in one commit; history itself is
//! untouched, so the full conversation stays inspectable and exportable.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::session::Usage;

/// Why a compaction ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactionReason {
    /// The next request would have passed the session's threshold.
    Threshold,
    /// The provider said the request was longer than its context window.
    ContextTooLong,
    /// A person asked for it (`session/compact`).
    Manual,
}

impl CompactionReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionReason::Threshold => "threshold",
            CompactionReason::ContextTooLong => "context_too_long",
            CompactionReason::Manual => "manual",
        }
    }
}

/// What the coworker did before the boundary, read mechanically from the
/// tool calls in history (never from the model's summary).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkingState {
    /// Paths written or edited, first write first, each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_written: Vec<String>,
    /// Paths read, each once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files_read: Vec<String>,
    /// Commands run, oldest first (the most recent ones when capped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub commands_run: Vec<String>,
    /// How many commands were left out of `commands_run` by the cap.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub commands_dropped: u32,
    /// Calls per tool (model-visible name).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_calls: BTreeMap<String, u32>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A committed compaction: where the outbound view starts and what stands
/// in for the history before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionRecord {
    pub id: String,
    pub session_id: String,
    /// 1 for the session's first compaction, then 2, ...
    pub number: u32,
    /// History items with an index below this are represented by this
    /// record in the outbound view; items from it on are sent as they are.
    pub boundary: u64,
    /// The model's summary of everything before the boundary (including the
    /// previous compaction's summary). Empty when `trimmed`.
    pub summary: String,
    /// The person's own messages before the boundary, verbatim, oldest
    /// first. When they exceed the cap the first one (the original task)
    /// and the most recent ones are kept.
    pub users: Vec<String>,
    /// How many of the person's messages the cap left out.
    #[serde(default)]
    pub dropped_users: u32,
    pub working_state: WorkingState,
    /// True when no summary could be written and the oldest part was
    /// dropped mechanically (the person's messages and the working state
    /// are still kept).
    #[serde(default)]
    pub trimmed: bool,
    pub reason: CompactionReason,
    /// Estimated size of the outbound view before and after, in tokens.
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// The model that wrote the summary (`provider:model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Tokens the summary requests used.
    #[serde(default)]
    pub usage: Usage,
    /// History length the summary was written against.
    pub history_len: u64,
    pub created_at_ms: i64,
    /// Wall time from the start of the compaction to its commit.
    pub duration_ms: u64,
}

/// How full a session's context is, as shown by `session/get`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextUsage {
    /// Tokens of the outbound view (instructions, tool declarations,
    /// compaction block, history after the boundary), counted with
    /// `tokenizer`.
    pub used_tokens: u64,
    /// The session's cap: `compaction.cap_tokens`, else the model's
    /// context window.
    pub cap_tokens: u64,
    /// `cap_tokens - used_tokens` (0 when over).
    pub available_tokens: u64,
    /// Compaction starts when a request would pass this.
    pub threshold_tokens: u64,
    /// How tokens were counted: `tiktoken:o200k_base`, `llama.cpp`, or
    /// `estimate` (about 4 bytes a token) when the model's tokenizer is not
    /// available.
    pub tokenizer: String,
    /// Compactions committed in this session.
    pub compactions: u32,
    /// Where the outbound view's history starts.
    pub boundary: u64,
}
