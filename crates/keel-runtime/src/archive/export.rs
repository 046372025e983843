//! From a session's journal to archive records, and back to journal events.

use std::collections::HashMap;

use keel_archive::{Checkpoint, Diff, Header, Ownership, Record, RunState, TurnChange};
use keel_protocol::session::{SessionInfo, ToolCallInfo};
use keel_protocol::{
    CompactionRecord, Event, InteractionInfo, InteractionStatus, Item, ToolCallStatus, TurnStatus, Usage,
};
use keel_store::Store;
use serde_json::{Value, json};

use super::{from_archive_owner, to_archive_owner};
use crate::error::{Result, RuntimeError};

/// Every journal event of a session, in order.
pub(crate) async fn all_events(store: &dyn Store, session_id: &str) -> Result<Vec<Event>> {
    let mut all: Vec<Event> = Vec::new();
    loop {
        let after = all.last().map_or(0, |e| e.seq);
        let page = store.events(session_id.to_string(), after, 1_000).await?;
        if page.is_empty() {
            return Ok(all);
        }
        all.extend(page);
    }
}

fn turn_status(kind: &str, data: &Value) -> Option<TurnStatus> {
    match kind {
        "turn_started" | "turn_resumed" => Some(TurnStatus::Running),
        "turn_waiting" => Some(TurnStatus::Waiting),
        "turn_interrupted" => Some(TurnStatus::Interrupted),
        "turn_recoverable" => Some(TurnStatus::Recoverable),
        "turn_finished" => serde_json::from_value(data["status"].clone()).ok(),
        _ => None,
    }
}

/// A session's archive records: header, checkpoint, then a diff per event.
pub async fn archive_records(store: &dyn Store, session_id: &str, keel_version: &str) -> Result<Vec<Record>> {
    let Some(session) = store.session(session_id.to_string()).await? else {
        return Err(RuntimeError::NotFound { what: "session", id: session_id.to_string() });
    };
    let events = all_events(store, session_id).await?;
    let compactions: HashMap<String, CompactionRecord> =
        store.compactions(Some(session_id.to_string()), false).await?.into_iter().map(|c| (c.id.clone(), c)).collect();
    let ledger: HashMap<String, ToolCallInfo> =
        store.tool_calls(session_id.to_string(), None).await?.into_iter().map(|c| (c.call_id.clone(), c)).collect();
    let Some(first) = events.first().filter(|e| e.kind == "session_created") else {
        return Err(RuntimeError::Conflict(format!("the journal of {session_id} does not start with session_created")));
    };
    let created: SessionInfo =
        serde_json::from_value(first.data["session"].clone()).unwrap_or_else(|_| session.clone());
    let creator = created.owner.clone().or(session.owner.clone()).unwrap_or_else(|| keel_protocol::session::Owner {
        machine_id: "unknown".into(),
        process_id: 0,
        instance_id: "unknown".into(),
    });
    let header = Header {
        session_id: session.id.clone(),
        machine_id: creator.machine_id.clone(),
        process_id: creator.process_id,
        instance_id: creator.instance_id.clone(),
        keel_version: keel_version.to_string(),
        created_at_ms: created.created_at_ms,
    };
    let start = SessionInfo { history_len: 0, usage: Usage::default(), current_turn_id: None, ..created };
    let checkpoint = RunState {
        session: start,
        turns: Vec::new(),
        history: Vec::new(),
        usage: Usage::default(),
        interactions: Vec::new(),
        compaction: None,
        tool_calls: Vec::new(),
        owner: Some(to_archive_owner(&creator)),
        seq: first.seq,
    };
    let mut records = vec![Record::from(header), Record::from(Checkpoint { seq: first.seq, state: checkpoint })];
    let mut interactions: HashMap<String, InteractionInfo> = HashMap::new();
    for event in &events[1..] {
        let data = &event.data;
        let mut diff = Diff { seq: event.seq, at_ms: event.at_ms, kind: event.kind.clone(), ..Diff::default() };
        diff.data = Some(data.clone());
        match event.kind.as_str() {
            "item_added" => {
                if let (Some(index), Ok(item)) =
                    (data["index"].as_u64(), serde_json::from_value::<Item>(data["item"].clone()))
                {
                    diff.items.push((index, item));
                }
                let mut rest = data.clone();
                if let Some(object) = rest.as_object_mut() {
                    object.remove("item");
                }
                diff.data = Some(rest);
            }
            "model_attempt_finished" => diff.usage = serde_json::from_value(data["usage"].clone()).ok(),
            "compacted" => {
                let record = data["compaction_id"].as_str().and_then(|id| compactions.get(id)).cloned();
                diff.usage = record.as_ref().map(|r| r.usage);
                diff.compaction = record;
            }
            "interaction_requested" => {
                if let Ok(interaction) = serde_json::from_value::<InteractionInfo>(data["interaction"].clone()) {
                    interactions.insert(interaction.id.clone(), interaction.clone());
                    diff.interaction = Some(interaction);
                }
            }
            "interaction_answered" | "interaction_superseded" => {
                let id = data["interaction_id"].as_str().unwrap_or_default();
                if let Some(interaction) = interactions.get_mut(id) {
                    if event.kind == "interaction_answered" {
                        interaction.status =
                            serde_json::from_value(data["status"].clone()).unwrap_or(InteractionStatus::Answered);
                        interaction.decision = serde_json::from_value(data["decision"].clone()).ok();
                    } else {
                        interaction.status = InteractionStatus::Superseded;
                        interaction.superseded_by = data["superseded_by"].as_str().map(str::to_string);
                    }
                    diff.interaction = Some(interaction.clone());
                }
            }
            "tool_call_intended"
            | "tool_call_started"
            | "tool_call_finished"
            | "tool_call_rejected"
            | "tool_call_interrupted" => {
                let call_id = data["call_id"].as_str().unwrap_or_default();
                if let Some(final_record) = ledger.get(call_id) {
                    let mut call = final_record.clone();
                    let status = match event.kind.as_str() {
                        "tool_call_intended" => Some(ToolCallStatus::Intended),
                        "tool_call_started" => Some(ToolCallStatus::Started),
                        _ => None,
                    };
                    if let Some(status) = status {
                        call.status = status;
                        call.output = None;
                        call.is_error = false;
                        call.finished_at_ms = None;
                    }
                    diff.tool_call = Some(call);
                }
            }
            "ownership_changed" => {
                let from = serde_json::from_value::<keel_protocol::session::Owner>(data["from"].clone());
                let to = serde_json::from_value::<keel_protocol::session::Owner>(data["to"].clone());
                if let (Ok(from), Ok(to)) = (from, to) {
                    records.push(Record::from(Ownership {
                        seq: event.seq,
                        at_ms: event.at_ms,
                        from: to_archive_owner(&from),
                        to: to_archive_owner(&to),
                    }));
                    continue;
                }
            }
            _ => {}
        }
        if let Some(status) = turn_status(&event.kind, data) {
            diff.turn = Some(TurnChange {
                turn_id: data["turn_id"].as_str().unwrap_or_default().to_string(),
                status,
                submission_id: data["submission_id"].as_str().map(str::to_string),
            });
        }
        let withdrawn_turn = (event.kind == "turn_finished").then(|| data["turn_id"].as_str().unwrap_or_default());
        records.push(Record::from(diff));
        // A turn's end withdraws its unanswered questions, without an event.
        if let Some(turn_id) = withdrawn_turn {
            for interaction in interactions.values_mut() {
                if interaction.turn_id == turn_id && interaction.status == InteractionStatus::Pending {
                    interaction.status = InteractionStatus::Withdrawn;
                    records.push(Record::from(Diff {
                        seq: event.seq,
                        at_ms: event.at_ms,
                        kind: "interaction_withdrawn".into(),
                        interaction: Some(interaction.clone()),
                        ..Diff::default()
                    }));
                }
            }
        }
    }
    Ok(records)
}

/// The journal events an archive's records stand for, in order, and the
/// compaction records they name. Derived diffs (no `data`) are skipped.
pub fn journal_events(archive: &keel_archive::Archive) -> (Vec<Event>, Vec<CompactionRecord>) {
    let session_id = archive.header.session_id.clone();
    let mut events = Vec::new();
    let mut compactions = Vec::new();
    for record in &archive.records {
        let (seq, at_ms, kind, data) = match record {
            Record::Checkpoint(checkpoint) => {
                let session = serde_json::to_value(&checkpoint.state.session).unwrap_or_default();
                (
                    checkpoint.seq,
                    checkpoint.state.session.created_at_ms,
                    "session_created".to_string(),
                    json!({ "session": session }),
                )
            }
            Record::Diff(diff) => {
                let Some(mut data) = diff.data.clone() else { continue };
                if let (Some((_, item)), Some(object)) = (diff.items.first(), data.as_object_mut()) {
                    object.insert("item".into(), serde_json::to_value(item).unwrap_or_default());
                }
                if let Some(record) = &diff.compaction {
                    compactions.push(record.clone());
                }
                (diff.seq, diff.at_ms, diff.kind.clone(), data)
            }
            Record::Ownership(ownership) => {
                let from = from_archive_owner(&ownership.from);
                let to = from_archive_owner(&ownership.to);
                (ownership.seq, ownership.at_ms, "ownership_changed".to_string(), json!({ "from": from, "to": to }))
            }
            Record::Header(_) => continue,
        };
        events.push(Event { session_id: session_id.clone(), seq, kind, data, at_ms });
    }
    (events, compactions)
}
