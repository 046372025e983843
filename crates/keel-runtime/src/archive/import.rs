//! `keel import`: a run archive into this state directory, journal and all,
//! so the session goes on here. The first change this keel makes to it
//! journals `ownership_changed` (from the archive's last owner to this
//! process), which the next export carries as an `ownership` record.

use std::collections::HashMap;
use std::sync::Arc;

use keel_archive::Archive;
use keel_protocol::session::{SessionInfo, TurnError, TurnInfo};
use keel_protocol::{AttemptStatus, EventKind, TurnStatus, Usage};
use keel_store::{Change, NewEvent, SubmissionRecord};

use super::export::journal_events;
use super::from_archive_owner;
use crate::error::{Result, RuntimeError};
use crate::runtime::Runtime;
use crate::slot::SessionSlot;

impl Runtime {
    /// Loads `archive` as a new session of this runtime. `workspace`
    /// replaces the recorded workspace (which may not exist here). A turn
    /// that was running or waiting when the archive was written becomes
    /// recoverable, as after a restart.
    pub async fn import_archive(&self, archive: &Archive, workspace: Option<&str>) -> Result<SessionInfo> {
        let state =
            archive.fold().map_err(|e| RuntimeError::InvalidParams(format!("the archive cannot be folded: {e}")))?;
        let id = state.session.id.clone();
        if self.slot(&id).is_ok() {
            return Err(RuntimeError::Conflict(format!("session {id} is already in this state directory")));
        }
        let workspace = workspace.map(str::to_string).unwrap_or_else(|| state.session.workspace.clone());
        let workspace = std::path::Path::new(&workspace).canonicalize().map_err(|e| {
            RuntimeError::InvalidParams(format!(
                "the session's workspace {workspace:?} is not usable here ({e}); pass another with --workspace"
            ))
        })?;
        let (events, _) = journal_events(archive);
        let turns = rebuild_turns(&id, &events);
        let mut change = Change::new(id.clone());
        change.new_session = true;
        let info = SessionInfo {
            workspace: workspace.display().to_string(),
            history_len: state.history.len() as u64,
            current_turn_id: turns.last().map(|t| t.id.clone()),
            owner: state.owner.as_ref().map(from_archive_owner),
            ..state.session.clone()
        };
        change.session = Some(info.clone());
        change.turns = turns.clone();
        for event in &events {
            let text = event.data["text"].as_str().unwrap_or_default().to_string();
            if matches!(event.kind.as_str(), "turn_started" | "turn_steered")
                && let (Some(submission), Some(turn)) =
                    (event.data["submission_id"].as_str(), event.data["turn_id"].as_str())
            {
                change.submissions.push(SubmissionRecord {
                    submission_id: submission.into(),
                    turn_id: turn.into(),
                    text,
                });
            }
        }
        change.history = state.history.iter().cloned().enumerate().map(|(i, item)| (i as u64, item)).collect();
        change.tool_calls = state.tool_calls.clone();
        change.interactions = state.interactions.clone();
        change.compaction = state.compaction.clone();
        for event in &events {
            let kind: EventKind =
                serde_json::from_value(serde_json::Value::String(event.kind.clone())).map_err(|_| {
                    RuntimeError::InvalidParams(format!(
                        "the archive holds an event kind this keel does not know ({}); import it with a newer keel",
                        event.kind
                    ))
                })?;
            change.events.push(NewEvent { kind, data: event.data.clone(), at_ms: Some(event.at_ms) });
        }
        self.store().commit(change).await?;
        let current = turns.last().cloned();
        let kept = state
            .interactions
            .iter()
            .filter(|i| crate::approvals::keep(i, current.as_ref().map_or("", |t| &t.id)))
            .cloned()
            .collect();
        let slot =
            Arc::new(SessionSlot::new(info.clone(), current, kept, state.compaction.clone(), self.inner.owner.clone()));
        self.inner.sessions.lock().map_err(|_| RuntimeError::ShuttingDown)?.insert(id.clone(), slot.clone());
        self.settle_imported(&slot).await?;
        Ok(slot.state().info)
    }
}

/// The session's turns as the journal tells them.
fn rebuild_turns(session_id: &str, events: &[keel_protocol::Event]) -> Vec<TurnInfo> {
    let mut turns: Vec<TurnInfo> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut history_len = 0u64;
    for event in events {
        let data = &event.data;
        if event.kind == "item_added" {
            history_len = data["index"].as_u64().map_or(history_len, |i| i + 1);
        }
        let Some(turn_id) = data["turn_id"].as_str() else { continue };
        if event.kind == "turn_started" {
            index.insert(turn_id.to_string(), turns.len());
            turns.push(TurnInfo {
                id: turn_id.to_string(),
                session_id: session_id.to_string(),
                submission_id: data["submission_id"].as_str().unwrap_or_default().to_string(),
                status: TurnStatus::Running,
                steps: 0,
                attempts: 0,
                continuations: 0,
                history_start: history_len,
                error: None,
                usage: Usage::default(),
                created_at_ms: event.at_ms,
                updated_at_ms: event.at_ms,
                pending_steers: Vec::new(),
            });
            continue;
        }
        let Some(turn) = index.get(turn_id).and_then(|&i| turns.get_mut(i)) else { continue };
        turn.updated_at_ms = event.at_ms;
        match event.kind.as_str() {
            "model_attempt_started" => turn.attempts += 1,
            "model_attempt_finished" => {
                if let Ok(usage) = serde_json::from_value::<Usage>(data["usage"].clone()) {
                    turn.usage.add(&usage);
                }
                if data["status"] == serde_json::json!(AttemptStatus::Completed) {
                    turn.steps += 1;
                }
            }
            "turn_finished" => {
                turn.status = serde_json::from_value(data["status"].clone()).unwrap_or(TurnStatus::Failed);
                turn.error = serde_json::from_value::<TurnError>(data["error"].clone()).ok();
            }
            "turn_waiting" => turn.status = TurnStatus::Waiting,
            "turn_interrupted" => turn.status = TurnStatus::Interrupted,
            "turn_recoverable" => turn.status = TurnStatus::Recoverable,
            "turn_resumed" => turn.status = TurnStatus::Running,
            _ => {}
        }
    }
    turns
}
