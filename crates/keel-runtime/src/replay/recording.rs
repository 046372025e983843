//! Reading a session's journal as a recording: what the model answered at
//! each step, what each tool returned, what people decided, and the
//! decisions keel made (each call's outcome and who allowed it, each turn's
//! status).
//!
//! The same reader parses the original journal and the replay's, so the two
//! are compared with one definition of "a decision".

use std::collections::{HashMap, HashSet};

use keel_protocol::session::SessionInfo;
use keel_protocol::{CompactionRecord, DecisionKind, Event, Item, Usage};
use keel_provider::{FailureKind, FinishReason};
use serde::Serialize;

/// A session's journal, read for replay.
#[derive(Debug, Clone)]
pub struct Recording {
    pub session: SessionInfo,
    pub turns: Vec<RecordedTurn>,
    /// Summaries of the session's compactions, oldest first (a trimmed one
    /// has none).
    pub summaries: Vec<String>,
}

/// One turn of a recording.
#[derive(Debug, Clone)]
pub struct RecordedTurn {
    pub turn_id: String,
    pub submission_id: String,
    pub text: String,
    /// Every model attempt, in order.
    pub responses: Vec<Response>,
    /// Outputs of the calls that ran, by qualified tool name, in order.
    pub tool_outputs: Vec<(String, String, bool)>,
    /// What people answered, by call id.
    pub answers: HashMap<String, (DecisionKind, Option<String>)>,
    pub decisions: Decisions,
    /// Why the turn cannot be replayed (a crash cut it, a person steered
    /// it), if so.
    pub not_replayable: Option<String>,
}

/// One recorded model attempt.
#[derive(Debug, Clone)]
pub enum Response {
    Completed { items: Vec<Item>, finish: FinishReason, usage: Usage },
    Failed { kind: FailureKind, message: String },
}

/// What keel decided in a turn.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Decisions {
    /// The turn's final status (`completed`, `failed`, ...), empty if it
    /// never ended.
    pub status: String,
    pub calls: Vec<CallDecision>,
}

/// What became of one tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CallDecision {
    pub call_id: String,
    pub name: String,
    /// `completed`, `rejected` or `interrupted`.
    pub outcome: String,
    /// Who let it run or stopped it: `policy`, `grant`, `person`, `keel`.
    pub by: String,
}

fn failure_kind(text: &str) -> FailureKind {
    match text.split(':').next().unwrap_or_default().trim() {
        "rate_limited" => FailureKind::RateLimited,
        "transient" => FailureKind::Transient,
        "transport" => FailureKind::Transport,
        "context_too_long" => FailureKind::ContextTooLong,
        "auth" => FailureKind::Auth,
        "safety_blocked" => FailureKind::SafetyBlocked,
        _ => FailureKind::BadRequest,
    }
}

fn finish_reason(text: &str) -> FinishReason {
    match text {
        "stop" => FinishReason::Stop,
        "tool_calls" => FinishReason::ToolCalls,
        "length" => FinishReason::Length,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_string()),
    }
}

/// Items a model wrote (keel's own notices and the person's messages are
/// not part of a response).
fn from_model(item: &Item) -> bool {
    match item {
        Item::Message { role, runtime_notice, .. } => {
            runtime_notice.is_none() && *role == keel_protocol::Role::Assistant
        }
        Item::FunctionCall { .. } => true,
        Item::FunctionCallOutput { .. } => false,
    }
}

impl Recording {
    /// Reads `events` (the whole journal of `session`, in order);
    /// `compactions` are the session's records, for their summaries.
    pub fn read(session: SessionInfo, events: &[Event], compactions: &[CompactionRecord]) -> Recording {
        let mut turns: Vec<RecordedTurn> = Vec::new();
        let mut by_turn: HashMap<String, usize> = HashMap::new();
        // call id -> (model-visible name, qualified tool, who allowed it)
        let mut intents: HashMap<String, (String, String, String)> = HashMap::new();
        let mut asked: HashMap<String, String> = HashMap::new();
        let mut answered_calls: HashSet<String> = HashSet::new();
        // After a completed attempt, its items follow in the same commit.
        let mut collecting = false;
        // After a finished call, its output item follows.
        let mut output_of: Option<String> = None;
        let mut summaries = Vec::new();
        for event in events {
            let data = &event.data;
            let turn = data["turn_id"].as_str().and_then(|id| by_turn.get(id).copied());
            if event.kind != "item_added" {
                collecting = false;
            }
            match event.kind.as_str() {
                "turn_started" => {
                    let turn_id = data["turn_id"].as_str().unwrap_or_default().to_string();
                    by_turn.insert(turn_id.clone(), turns.len());
                    turns.push(RecordedTurn {
                        turn_id,
                        submission_id: data["submission_id"].as_str().unwrap_or_default().to_string(),
                        text: data["text"].as_str().unwrap_or_default().to_string(),
                        responses: Vec::new(),
                        tool_outputs: Vec::new(),
                        answers: HashMap::new(),
                        decisions: Decisions::default(),
                        not_replayable: None,
                    });
                }
                "model_attempt_finished" => {
                    let Some(turn) = turn.and_then(|i| turns.get_mut(i)) else { continue };
                    match data["status"].as_str() {
                        Some("completed") => {
                            turn.responses.push(Response::Completed {
                                items: Vec::new(),
                                finish: finish_reason(data["finish_reason"].as_str().unwrap_or("stop")),
                                usage: serde_json::from_value(data["usage"].clone()).unwrap_or_default(),
                            });
                            collecting = true;
                        }
                        Some("failed") => {
                            let error = data["error"].as_str().unwrap_or_default();
                            let message = error.split_once(':').map(|(_, m)| m.trim()).unwrap_or(error);
                            turn.responses
                                .push(Response::Failed { kind: failure_kind(error), message: message.to_string() });
                        }
                        _ => {
                            turn.not_replayable = Some("a model request was cut off (a crash or an interrupt)".into());
                        }
                    }
                }
                "item_added" => {
                    let Ok(item) = serde_json::from_value::<Item>(data["item"].clone()) else { continue };
                    let Some(turn) = turn.and_then(|i| turns.get_mut(i)) else { continue };
                    if collecting
                        && from_model(&item)
                        && let Some(Response::Completed { items, .. }) = turn.responses.last_mut()
                    {
                        items.push(item);
                        continue;
                    }
                    if let (Some(call_id), Item::FunctionCallOutput { call_id: of, output, .. }) = (&output_of, &item)
                        && call_id == of
                        && let Some((_, tool, _)) = intents.get(call_id)
                    {
                        let is_error = output.starts_with("{\"error\"");
                        turn.tool_outputs.push((tool.clone(), output.clone(), is_error));
                    }
                    output_of = None;
                }
                "tool_call_intended" => {
                    let call_id = data["call_id"].as_str().unwrap_or_default().to_string();
                    let by = data["decided_by"]["by"].as_str().unwrap_or("policy").to_string();
                    let name = data["name"].as_str().unwrap_or_default().to_string();
                    intents.insert(call_id, (name, data["tool"].as_str().unwrap_or_default().to_string(), by));
                }
                "tool_call_finished" | "tool_call_rejected" | "tool_call_interrupted" => {
                    let Some(turn) = turn.and_then(|i| turns.get_mut(i)) else { continue };
                    let call_id = data["call_id"].as_str().unwrap_or_default().to_string();
                    let (name, by) = match intents.get(&call_id) {
                        Some((name, _, by)) => (name.clone(), by.clone()),
                        None if answered_calls.contains(&call_id) => (String::new(), "person".into()),
                        None => (String::new(), "keel".into()),
                    };
                    let outcome = match event.kind.as_str() {
                        "tool_call_finished" => "completed",
                        "tool_call_rejected" => "rejected",
                        _ => {
                            turn.not_replayable = Some("a tool call was cut off by a crash".into());
                            "interrupted"
                        }
                    };
                    if event.kind == "tool_call_finished" && data["decided_by"]["by"] != "person" {
                        output_of = Some(call_id.clone());
                    }
                    turn.decisions.calls.retain(|c| c.call_id != call_id);
                    turn.decisions.calls.push(CallDecision { call_id, name, outcome: outcome.into(), by });
                }
                "interaction_requested" => {
                    let interaction = &data["interaction"];
                    if let (Some(id), Some(call)) =
                        (interaction["id"].as_str(), interaction["request"]["call_id"].as_str())
                    {
                        asked.insert(id.to_string(), call.to_string());
                    }
                }
                "interaction_answered" => {
                    let call = data["interaction_id"].as_str().and_then(|id| asked.get(id)).cloned();
                    let decision =
                        serde_json::from_value::<keel_protocol::interaction::Decision>(data["decision"].clone());
                    if let (Some(call), Ok(decision), Some(turn)) =
                        (call, decision, turn.and_then(|i| turns.get_mut(i)))
                    {
                        answered_calls.insert(call.clone());
                        turn.answers.insert(call, (decision.decision, decision.message));
                    }
                }
                "turn_steered" => {
                    if let Some(turn) = turn.and_then(|i| turns.get_mut(i)) {
                        turn.not_replayable = Some("a person steered it mid-turn".into());
                    }
                }
                "turn_interrupted" => {
                    if let Some(turn) = turn.and_then(|i| turns.get_mut(i)) {
                        turn.not_replayable = Some("keel stopped while it ran".into());
                    }
                }
                "turn_finished" => {
                    if let Some(turn) = turn.and_then(|i| turns.get_mut(i)) {
                        turn.decisions.status = data["status"].as_str().unwrap_or_default().to_string();
                    }
                }
                "compacted" => {
                    let id = data["compaction_id"].as_str().unwrap_or_default();
                    if let Some(record) = compactions.iter().find(|c| c.id == id).filter(|c| !c.trimmed) {
                        summaries.push(record.summary.clone());
                    }
                }
                _ => {}
            }
        }
        for turn in &mut turns {
            if turn.decisions.status == "cancelled" && turn.not_replayable.is_none() {
                turn.not_replayable = Some("a person cancelled it".into());
            }
        }
        Recording { session, turns, summaries }
    }
}
