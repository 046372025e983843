//! The audit view: every tool call of a session, who let it run, and what
//! came of it.
//!
//! An audit is built from the journal alone (the session's events, joined
//! with the effect ledger for outputs) through the [`Store`] trait, so it
//! works on a read-only store beside a running `keel serve` and never
//! changes anything. One [`AuditEntry`] stands for each intent
//! (`tool_call_intended`), and for each call refused before any intent
//! (`tool_call_rejected` without one); a call a person ran again after a
//! crash has two. Arguments, reasons and result previews pass through
//! [`keel_core::redact`], so the view shows what happened without showing
//! secrets the model or a tool put in them.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::str::FromStr;

use keel_core::redact::{redact_json, redact_text};
use keel_protocol::interaction::Decision;
use keel_protocol::session::ToolCallInfo;
use keel_protocol::{DecisionKind, Event, EventKind, InteractionKind};
use keel_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{Result, RuntimeError};

/// How many characters of a call's output an entry shows.
pub const PREVIEW_CHARS: usize = 200;

/// Events read per store round trip.
const PAGE: u32 = 500;

/// How a call ended, as far as the journal knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It ran and returned a result.
    Completed,
    /// It ran and returned an error.
    Error,
    /// It never ran: unknown tool, bad arguments, denied, or no sandbox.
    Rejected,
    /// keel stopped while it ran (or a person skipped it afterwards).
    Interrupted,
    /// Intended or started, no result yet.
    Pending,
}

/// Who let a call run (or refused it): the `by` of an entry's
/// `decided_by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decider {
    Policy,
    Grant,
    Person,
    Keel,
}

macro_rules! wire_names {
    ($type:ident, $what:literal, $($variant:ident => $name:literal),+) => {
        impl $type {
            pub const ALL: &'static [$type] = &[$($type::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($type::$variant => $name),+ }
            }
        }

        impl fmt::Display for $type {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $type {
            type Err = String;

            fn from_str(text: &str) -> std::result::Result<$type, String> {
                $type::ALL.iter().copied().find(|v| v.as_str() == text).ok_or_else(|| {
                    let names: Vec<&str> = $type::ALL.iter().map(|v| v.as_str()).collect();
                    format!(concat!("unknown ", $what, " {:?}; use one of {}"), text, names.join(", "))
                })
            }
        }
    };
}

wire_names!(Outcome, "outcome", Completed => "completed", Error => "error", Rejected => "rejected",
    Interrupted => "interrupted", Pending => "pending");
wire_names!(Decider, "decider", Policy => "policy", Grant => "grant", Person => "person", Keel => "keel");

/// One tool call in the audit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditEntry {
    pub session_id: String,
    pub turn_id: String,
    pub call_id: String,
    /// Qualified name (`shell.run`); for a call refused before its tool was
    /// known, the name the model used.
    pub tool: String,
    /// Redacted; a string when the model's arguments were not JSON.
    pub arguments: Value,
    /// `{"by": "policy", "rule"}`, `{"by": "grant", "interaction_id"}`,
    /// `{"by": "person", "decision", "interaction_id"}`; for a call refused
    /// before any intent `{"by": "person", "decision": "deny", …}` when a
    /// person denied it, else `{"by": "keel"}`, with the refusal as
    /// `reason`. A result a person entered or skipped after a crash adds
    /// `result_by`.
    pub decided_by: Value,
    pub outcome: Outcome,
    /// The first [`PREVIEW_CHARS`] characters of the output, redacted.
    pub result_preview: Option<String>,
    /// The sandbox the call ran in (`tool_call_finished`'s `sandbox`).
    pub confinement: Option<Value>,
    /// The taint check of the call, when keel made one: the intent's
    /// `taint`, or its `decided_by.taint`.
    pub taint: Option<Value>,
    /// When the call was intended (or refused).
    pub at_ms: i64,
    /// The seq of that event.
    pub seq: u64,
}

/// Which entries to return; every field narrows, `None` keeps all.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct AuditFilter {
    /// A qualified tool name, or `server.*` for every tool of a server.
    pub tool: Option<String>,
    pub decided_by: Option<Decider>,
    pub outcome: Option<Outcome>,
    pub turn_id: Option<String>,
    /// Only the most recent `limit` matching entries (still oldest first).
    pub limit: Option<usize>,
}

impl AuditFilter {
    pub fn matches(&self, entry: &AuditEntry) -> bool {
        let tool = match &self.tool {
            None => true,
            Some(pattern) => match pattern.strip_suffix(".*") {
                Some(server) => entry.tool.strip_prefix(server).is_some_and(|rest| rest.starts_with('.')),
                None => &entry.tool == pattern,
            },
        };
        tool && self.decided_by.is_none_or(|by| entry.decided_by["by"].as_str() == Some(by.as_str()))
            && self.outcome.is_none_or(|outcome| entry.outcome == outcome)
            && self.turn_id.as_ref().is_none_or(|turn| &entry.turn_id == turn)
    }
}

/// The audit of one session, oldest call first.
pub async fn audit(store: &dyn Store, session_id: &str, filter: &AuditFilter) -> Result<Vec<AuditEntry>> {
    if store.session(session_id.to_string()).await?.is_none() {
        return Err(RuntimeError::NotFound { what: "session", id: session_id.to_string() });
    }
    let mut journal = Journal::new(session_id);
    let mut after = 0;
    loop {
        let page = store.events(session_id.to_string(), after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        page.iter().for_each(|event| journal.apply(event));
    }
    let ledger = store.tool_calls(session_id.to_string(), filter.turn_id.clone()).await?;
    let mut entries = journal.finish(&ledger);
    entries.retain(|entry| filter.matches(entry));
    if let Some(limit) = filter.limit {
        entries.drain(..entries.len().saturating_sub(limit));
    }
    Ok(entries)
}

/// The audit being read off the journal, one event at a time.
struct Journal {
    session_id: String,
    entries: Vec<AuditEntry>,
    /// `(turn_id, call_id)` → its latest entry. Call ids are only unique
    /// within a turn.
    latest: HashMap<(String, String), usize>,
    /// Entries of calls refused before any intent: their tool, arguments
    /// and reason come from the ledger.
    refused: HashSet<usize>,
    /// Interactions asked, in order.
    asked: Vec<Asked>,
    /// Answers by interaction id.
    answers: HashMap<String, Decision>,
}

/// What an `interaction_requested` event asked about.
struct Asked {
    id: String,
    turn_id: String,
    call_id: String,
    tool: String,
    kind: Option<InteractionKind>,
}

impl Asked {
    fn about(&self, (turn_id, call_id): &(String, String)) -> bool {
        &self.turn_id == turn_id && &self.call_id == call_id
    }
}

/// The kinds an audit reads; every other event is skipped.
const READ: [EventKind; 6] = [
    EventKind::ToolCallIntended,
    EventKind::ToolCallFinished,
    EventKind::ToolCallRejected,
    EventKind::ToolCallInterrupted,
    EventKind::InteractionRequested,
    EventKind::InteractionAnswered,
];

impl Journal {
    fn new(session_id: &str) -> Journal {
        Journal {
            session_id: session_id.to_string(),
            entries: Vec::new(),
            latest: HashMap::new(),
            refused: HashSet::new(),
            asked: Vec::new(),
            answers: HashMap::new(),
        }
    }

    fn apply(&mut self, event: &Event) {
        let Some(kind) = READ.iter().copied().find(|k| k.as_str() == event.kind) else { return };
        let data = &event.data;
        let text = |value: &Value| value.as_str().unwrap_or_default().to_string();
        let key = (text(&data["turn_id"]), text(&data["call_id"]));
        let open = self.latest.get(&key).copied();
        match kind {
            EventKind::ToolCallIntended => {
                let tool = Some(text(&data["tool"])).filter(|t| !t.is_empty()).unwrap_or_else(|| text(&data["name"]));
                // The taint check is journaled inside `decided_by`; the entry
                // shows it on its own.
                let mut decided_by = redact_json(&data["decided_by"]);
                let inner = decided_by.as_object_mut().and_then(|map| map.remove("taint"));
                let taint = data.get("taint").cloned().or(inner).filter(|t| !t.is_null());
                let entry = AuditEntry {
                    tool,
                    arguments: arguments(data["arguments"].as_str().unwrap_or_default()),
                    decided_by,
                    taint,
                    ..self.entry(event, &key, Outcome::Pending)
                };
                self.push(key, entry);
            }
            EventKind::ToolCallFinished => {
                let Some(entry) = open.and_then(|i| self.entries.get_mut(i)) else { return };
                let is_error = data["is_error"].as_bool().unwrap_or(false);
                entry.outcome = if is_error { Outcome::Error } else { Outcome::Completed };
                if let Some(sandbox) = data.get("sandbox") {
                    entry.confinement = Some(sandbox.clone());
                }
                // A person entered (or skipped) the result of an interrupted call.
                if let Some(by) = data.get("decided_by") {
                    let answer = by["interaction_id"].as_str().and_then(|id| self.answers.get(id));
                    if answer.is_some_and(|a| a.decision == DecisionKind::Skip) {
                        entry.outcome = Outcome::Interrupted;
                    }
                    let mut result_by = redact_json(by);
                    if let (Some(answer), Some(map)) = (answer, result_by.as_object_mut()) {
                        map.insert("decision".into(), json!(answer.decision));
                    }
                    if let Some(map) = entry.decided_by.as_object_mut() {
                        map.insert("result_by".into(), result_by);
                    }
                }
            }
            EventKind::ToolCallRejected => {
                // Refused after its intent: the sandbox could not be set up.
                if let Some(entry) =
                    open.and_then(|i| self.entries.get_mut(i)).filter(|e| e.outcome == Outcome::Pending)
                {
                    entry.outcome = Outcome::Rejected;
                    return;
                }
                let approvals =
                    self.asked.iter().rev().filter(|a| a.about(&key) && a.kind == Some(InteractionKind::Approval));
                let tool = approvals.clone().next().map(|a| a.tool.clone()).unwrap_or_default();
                let denial = approvals
                    .filter_map(|a| self.answers.get(&a.id).filter(|d| !d.decision.allows()).map(|d| (&a.id, d)))
                    .next();
                let decided_by = match denial {
                    Some((id, answer)) => json!({ "by": answer.by, "decision": answer.decision, "interaction_id": id }),
                    None => json!({ "by": Decider::Keel }),
                };
                let entry = AuditEntry { tool, decided_by, ..self.entry(event, &key, Outcome::Rejected) };
                let index = self.push(key, entry);
                self.refused.insert(index);
            }
            EventKind::ToolCallInterrupted => {
                if let Some(entry) = open.and_then(|i| self.entries.get_mut(i)) {
                    entry.outcome = Outcome::Interrupted;
                }
            }
            EventKind::InteractionRequested => {
                let interaction = &data["interaction"];
                let kind = serde_json::from_value(interaction["kind"].clone()).ok();
                self.asked.push(Asked {
                    id: text(&interaction["id"]),
                    turn_id: text(&interaction["turn_id"]),
                    call_id: text(&interaction["request"]["call_id"]),
                    tool: text(&interaction["request"]["tool"]),
                    kind,
                });
            }
            EventKind::InteractionAnswered => {
                if let Ok(decision) = serde_json::from_value::<Decision>(data["decision"].clone()) {
                    self.answers.insert(text(&data["interaction_id"]), decision);
                }
            }
            _ => {}
        }
    }

    /// A bare entry for the call `key`, recorded by `event`.
    fn entry(&self, event: &Event, key: &(String, String), outcome: Outcome) -> AuditEntry {
        AuditEntry {
            session_id: self.session_id.clone(),
            turn_id: key.0.clone(),
            call_id: key.1.clone(),
            tool: String::new(),
            arguments: Value::Null,
            decided_by: Value::Null,
            outcome,
            result_preview: None,
            confinement: None,
            taint: None,
            at_ms: event.at_ms,
            seq: event.seq,
        }
    }

    /// Appends `entry` as the latest of its call; returns its index.
    fn push(&mut self, key: (String, String), entry: AuditEntry) -> usize {
        self.entries.push(entry);
        let index = self.entries.len() - 1;
        self.latest.insert(key, index);
        index
    }

    /// Joins the ledger: each call's output goes to its latest entry.
    fn finish(mut self, ledger: &[ToolCallInfo]) -> Vec<AuditEntry> {
        let rows: HashMap<(&str, &str), &ToolCallInfo> =
            ledger.iter().map(|row| ((row.turn_id.as_str(), row.call_id.as_str()), row)).collect();
        for ((turn, call), index) in &self.latest {
            let (Some(row), Some(entry)) = (rows.get(&(turn.as_str(), call.as_str())), self.entries.get_mut(*index))
            else {
                continue;
            };
            let output = row.output.as_deref().unwrap_or_default();
            entry.result_preview = row.output.as_deref().map(preview);
            if self.refused.contains(index) {
                if entry.tool.is_empty() {
                    entry.tool = row.name.clone();
                }
                entry.arguments = arguments(&row.arguments);
                if let Some(map) = entry.decided_by.as_object_mut() {
                    map.insert("reason".into(), Value::String(redact_text(output)));
                }
            }
        }
        self.entries
    }
}

/// The model's arguments, redacted: parsed when they are JSON, else the
/// redacted text as a JSON string.
fn arguments(raw: &str) -> Value {
    match serde_json::from_str::<Value>(raw) {
        Ok(parsed) => redact_json(&parsed),
        Err(_) => Value::String(redact_text(raw)),
    }
}

/// The first [`PREVIEW_CHARS`] characters of `output` after redaction.
/// Redaction sees a wider window than it keeps, so a token that crosses
/// the cut is still recognised whole.
fn preview(output: &str) -> String {
    let window: String = output.chars().take(PREVIEW_CHARS * 8).collect();
    redact_text(&window).chars().take(PREVIEW_CHARS).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use keel_protocol::session::SessionInfo;
    use keel_protocol::{CompactionSettings, ToolCallStatus};
    use keel_store::Change;
    use keel_store_sqlite::SqliteStore;

    use super::*;

    const SK: &str = "sk-ant-REDACTME0123456789abcdefghij";
    const GHP: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";

    fn call(turn: &str, call_id: &str, name: &str, arguments: &str) -> ToolCallInfo {
        ToolCallInfo {
            session_id: "s1".into(),
            call_id: call_id.into(),
            turn_id: turn.into(),
            name: name.into(),
            arguments: arguments.into(),
            status: ToolCallStatus::Intended,
            output: None,
            is_error: false,
            started_at_ms: 1,
            finished_at_ms: None,
        }
    }

    fn done(mut row: ToolCallInfo, status: ToolCallStatus, output: &str, is_error: bool) -> ToolCallInfo {
        row.status = status;
        row.output = Some(output.into());
        row.is_error = is_error;
        row
    }

    fn intended(turn: &str, row: &ToolCallInfo, tool: &str, decided_by: Value) -> Change {
        let mut change = Change::new("s1").event(
            EventKind::ToolCallIntended,
            json!({"turn_id": turn, "call_id": row.call_id, "name": row.name, "tool": tool, "arguments": row.arguments, "decided_by": decided_by}),
        );
        change.tool_calls.push(row.clone());
        change.event(EventKind::ToolCallStarted, json!({"turn_id": turn, "call_id": row.call_id, "tool": tool}))
    }

    fn ended(kind: EventKind, row: ToolCallInfo, data: Value) -> Change {
        let mut change = Change::new("s1").event(kind, data);
        change.tool_calls.push(row);
        change
    }

    fn interaction(id: &str, call_id: &str, tool: &str, kind: &str) -> Value {
        json!({"interaction": {"id": id, "session_id": "s1", "turn_id": "t1", "kind": kind, "status": "pending",
            "request": {"call_id": call_id, "tool": tool, "name": tool.replace('.', "__"), "arguments": "{}", "reason": "asked",
                "digests": {"bundle": "sha256:0", "tool": "sha256:0", "tool_policy": "sha256:0", "resource_policy": "sha256:0"}},
            "attended": true, "created_at_ms": 1}})
    }

    fn answered(id: &str, decision: &str) -> Value {
        json!({"interaction_id": id, "turn_id": "t1", "status": "answered", "decision": {"decision": decision, "by": "person", "at_ms": 2}})
    }

    /// A session whose journal holds one call of every kind of ending.
    async fn journal() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        let info: SessionInfo = serde_json::from_value(json!({
            "id": "s1", "name": "n", "coworker": "c", "bundle_path": "/b", "bundle_digest": "sha256:0",
            "coworker_spec": {}, "workspace": "/w", "attended": true,
            "compaction": serde_json::to_value(CompactionSettings::default()).unwrap(),
            "created_at_ms": 1, "updated_at_ms": 1, "history_len": 0
        }))
        .unwrap();
        let mut create = Change::new("s1").event(EventKind::SessionCreated, json!({}));
        create.session = Some(info);
        create.new_session = true;
        let shell = call("t1", "c1", "shell__run", &json!({"command": format!("echo {SK}")}).to_string());
        let write = call("t1", "c2", "fs__write_file", &json!({"path": "a.txt", "content": GHP}).to_string());
        let denied = call("t1", "c3", "shell__run", r#"{"command": "rm -rf /"}"#);
        let unknown = call("t1", "c4", "nope__x", &format!("not json {SK}"));
        let hanging = call("t1", "c5", "shell__run", r#"{"command": "sleep 9"}"#);
        let crashed = call("t1", "c6", "fs__write_file", r#"{"path": "b.txt", "content": "y"}"#);
        let later = call("t2", "c7", "mcp__search", r#"{"q": "x", "api_key": "plain-secret"}"#);
        let sandbox = json!({"filesystem": "landlock-v7", "network": "isolated", "environment": "clean"});
        let changes = vec![
            create,
            intended(
                "t1",
                &shell,
                "shell.run",
                json!({"by": "policy", "rule": "allow_commands: \"echo\"", "taint": null}),
            ),
            ended(
                EventKind::ToolCallFinished,
                done(shell, ToolCallStatus::Completed, &format!(r#"{{"stdout":"{SK}\n","exit_code":0}}"#), false),
                json!({"turn_id": "t1", "call_id": "c1", "is_error": false, "sandbox": sandbox}),
            ),
            Change::new("s1")
                .event(EventKind::InteractionRequested, interaction("int_a", "c2", "fs.write_file", "approval")),
            Change::new("s1").event(EventKind::InteractionAnswered, answered("int_a", "allow_once")),
            intended(
                "t1",
                &write,
                "fs.write_file",
                json!({"by": "person", "decision": "allow_once", "interaction_id": "int_a"}),
            ),
            ended(
                EventKind::ToolCallFinished,
                done(write, ToolCallStatus::Completed, "wrote 1 line to a.txt", false),
                json!({"turn_id": "t1", "call_id": "c2", "is_error": false, "sandbox": sandbox}),
            ),
            Change::new("s1")
                .event(EventKind::InteractionRequested, interaction("int_b", "c3", "shell.run", "approval")),
            Change::new("s1").event(EventKind::InteractionAnswered, answered("int_b", "deny")),
            ended(
                EventKind::ToolCallRejected,
                done(denied, ToolCallStatus::Rejected, "the call was not run: a person denied it", true),
                json!({"turn_id": "t1", "call_id": "c3", "is_error": true}),
            ),
            ended(
                EventKind::ToolCallRejected,
                done(
                    unknown,
                    ToolCallStatus::Rejected,
                    "the call was not run: there is no tool named \"nope__x\"",
                    true,
                ),
                json!({"turn_id": "t1", "call_id": "c4", "is_error": true}),
            ),
            intended("t1", &hanging, "shell.run", json!({"by": "grant", "interaction_id": "int_g"})),
            intended("t1", &crashed, "fs.write_file", json!({"by": "policy", "rule": "policy fs.write_file = allow"})),
            Change::new("s1")
                .event(
                    EventKind::ToolCallInterrupted,
                    json!({"turn_id": "t1", "call_id": "c6", "interaction_id": "int_r"}),
                )
                .event(
                    EventKind::InteractionRequested,
                    interaction("int_r", "c6", "fs.write_file", "interrupted_call"),
                ),
            {
                let mut change = ended(
                    EventKind::ToolCallFinished,
                    done(crashed, ToolCallStatus::Interrupted, "interrupted; a person chose not to run it again", true),
                    json!({"turn_id": "t1", "call_id": "c6", "is_error": true, "decided_by": {"by": "person", "interaction_id": "int_r"}}),
                );
                change
                    .events
                    .insert(0, keel_store::NewEvent::new(EventKind::InteractionAnswered, answered("int_r", "skip")));
                change
            },
            intended(
                "t2",
                &later,
                "mcp.search",
                json!({"by": "policy", "rule": "policy mcp.search = allow", "taint": {"context": "internal", "clearance": "internal", "violation": false}}),
            ),
            ended(
                EventKind::ToolCallFinished,
                done(later, ToolCallStatus::Completed, "boom", true),
                json!({"turn_id": "t2", "call_id": "c7", "is_error": true}),
            ),
        ];
        for change in changes {
            store.commit(change).await.unwrap();
        }
        (dir, store)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_call_appears_once_in_order_with_who_decided_and_how_it_ended() {
        let (_dir, store) = journal().await;
        let entries = audit(&store, "s1", &AuditFilter::default()).await.unwrap();
        let summary: Vec<(&str, &str, Outcome, &str)> = entries
            .iter()
            .map(|e| (e.call_id.as_str(), e.tool.as_str(), e.outcome, e.decided_by["by"].as_str().unwrap()))
            .collect();
        assert_eq!(
            summary,
            [
                ("c1", "shell.run", Outcome::Completed, "policy"),
                ("c2", "fs.write_file", Outcome::Completed, "person"),
                ("c3", "shell.run", Outcome::Rejected, "person"),
                ("c4", "nope__x", Outcome::Rejected, "keel"),
                ("c5", "shell.run", Outcome::Pending, "grant"),
                ("c6", "fs.write_file", Outcome::Interrupted, "policy"),
                ("c7", "mcp.search", Outcome::Error, "policy"),
            ]
        );
        assert!(entries.windows(2).all(|w| w[0].seq < w[1].seq));
        let [shell, write, denied, unknown, hanging, crashed, later] = entries.as_slice() else { unreachable!() };
        assert_eq!(shell.decided_by["rule"], "allow_commands: \"echo\"");
        assert_eq!(shell.confinement.as_ref().unwrap()["filesystem"], "landlock-v7");
        assert_eq!(shell.arguments, json!({"command": "echo [redacted]"}));
        assert_eq!(shell.result_preview.as_deref(), Some("{\"stdout\":\"[redacted]\\n\",\"exit_code\":0}"));
        assert_eq!(write.decided_by["decision"], "allow_once");
        assert_eq!(write.arguments, json!({"path": "a.txt", "content": "[redacted]"}));
        assert_eq!(denied.decided_by["decision"], "deny");
        assert_eq!(denied.decided_by["interaction_id"], "int_b");
        assert_eq!(denied.decided_by["reason"], "the call was not run: a person denied it");
        assert_eq!(unknown.arguments, json!("not json [redacted]"));
        assert!(unknown.decided_by["reason"].as_str().unwrap().contains("no tool named"));
        assert_eq!(hanging.result_preview, None);
        assert_eq!(
            crashed.decided_by["result_by"],
            json!({"by": "person", "interaction_id": "int_r", "decision": "skip"})
        );
        assert_eq!(later.arguments["api_key"], "[redacted]");
        assert_eq!(later.taint.as_ref().unwrap()["context"], "internal");
        assert_eq!(later.decided_by, json!({"by": "policy", "rule": "policy mcp.search = allow"}));
        assert_eq!(shell.taint, None);
        assert!(shell.decided_by.get("taint").is_none());
        let all = serde_json::to_string(&entries).unwrap();
        assert!(!all.contains(SK) && !all.contains(GHP) && !all.contains("plain-secret"), "{all}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn filters_narrow_by_tool_decider_outcome_turn_and_limit() {
        let (_dir, store) = journal().await;
        let ids = |entries: Vec<AuditEntry>| entries.into_iter().map(|e| e.call_id).collect::<Vec<_>>();
        let run = |filter: AuditFilter| {
            let store = store.clone();
            async move { ids(audit(&store, "s1", &filter).await.unwrap()) }
        };
        assert_eq!(run(AuditFilter { tool: Some("fs.*".into()), ..Default::default() }).await, ["c2", "c6"]);
        assert_eq!(run(AuditFilter { tool: Some("shell.run".into()), ..Default::default() }).await, ["c1", "c3", "c5"]);
        assert_eq!(run(AuditFilter { tool: Some("fs".into()), ..Default::default() }).await, Vec::<String>::new());
        assert_eq!(run(AuditFilter { decided_by: Some(Decider::Person), ..Default::default() }).await, ["c2", "c3"]);
        assert_eq!(run(AuditFilter { decided_by: Some(Decider::Keel), ..Default::default() }).await, ["c4"]);
        assert_eq!(run(AuditFilter { outcome: Some(Outcome::Rejected), ..Default::default() }).await, ["c3", "c4"]);
        assert_eq!(run(AuditFilter { turn_id: Some("t2".into()), ..Default::default() }).await, ["c7"]);
        assert_eq!(run(AuditFilter { limit: Some(2), ..Default::default() }).await, ["c6", "c7"]);
        let missing = audit(&store, "nope", &AuditFilter::default()).await.unwrap_err();
        assert!(matches!(missing, RuntimeError::NotFound { what: "session", .. }), "{missing}");
    }

    #[test]
    fn outcomes_and_deciders_read_their_wire_names() {
        for outcome in Outcome::ALL {
            assert_eq!(outcome.as_str().parse::<Outcome>(), Ok(*outcome));
            assert_eq!(serde_json::to_value(outcome).unwrap(), json!(outcome.as_str()));
        }
        for decider in Decider::ALL {
            assert_eq!(decider.as_str().parse::<Decider>(), Ok(*decider));
        }
        let error = "later".parse::<Outcome>().unwrap_err();
        assert_eq!(error, "unknown outcome \"later\"; use one of completed, error, rejected, interrupted, pending");
    }

    #[test]
    fn a_preview_is_cut_after_redaction_so_a_token_across_the_cut_stays_hidden() {
        // Cut first, the preview would end in `sk-ant-REDACTME01234`, too
        // short to recognise.
        let output = format!("{}{SK} {}", "x ".repeat(90), "y".repeat(50));
        let shown = preview(&output);
        assert_eq!(shown.chars().count(), PREVIEW_CHARS);
        assert!(!shown.contains("REDACTME") && shown.contains("[redacted]"), "{shown}");
    }
}
