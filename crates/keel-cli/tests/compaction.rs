//! Compaction through the API: outbound only, triggered by the threshold or
//! the provider, retried once then parked or trimmed, never committed when
//! stale, cancelled or crashed, and the same view after a restart.
//!
//! The example coworker uses `openai-chat:gpt-4o-mini`, so tokens are
//! counted with `o200k_base`; " apple" is one token there, which makes the
//! sizes below easy to reason about.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use keel_testkit::{MockServer, RecordedRequest, Reply, ScriptedError};
use serde_json::{Value, json};
use support::{Client, Keel};

const TASK: &str = "Original task: preserve the BLUE marker; never deploy anything.";
const SUMMARY: &str = "SUMMARY: the person wants the BLUE marker kept and nothing deployed; two rounds of notes done.";

/// A message of about `n` tokens that starts with `tag`.
fn filler(tag: &str, n: usize) -> String {
    format!("{tag}{}", " apple".repeat(n))
}

fn body(request: &RecordedRequest) -> String {
    String::from_utf8_lossy(&request.body).into_owned()
}

fn is_summary_request(request: &RecordedRequest) -> bool {
    body(request).contains("You compact the early part of a conversation")
}

/// Tokens of the example coworker's instructions and tool declarations:
/// the context a session uses before any history.
async fn fixed_tokens(client: &mut Client, ws: &Path) -> u64 {
    let probe = client.create_session(ws).await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": probe})).await.unwrap();
    assert_eq!(snapshot["context"]["tokenizer"], "tiktoken:o200k_base");
    assert_eq!(snapshot["context"]["cap_tokens"], 128_000, "gpt-4o-mini's window");
    snapshot["context"]["used_tokens"].as_u64().unwrap()
}

/// A session whose cap leaves `room` tokens for history (threshold 100%).
async fn session(client: &mut Client, ws: &Path, room: u64, attended: bool, auto_trim: bool) -> String {
    let fixed = fixed_tokens(client, ws).await;
    let created = client
        .ok(
            "session/create",
            json!({"name": "long", "coworker": "assistant-example", "workspace": ws, "attended": attended,
                   "compaction": {"cap_tokens": fixed + room, "threshold_percent": 100, "auto_trim_on_failure": auto_trim}}),
        )
        .await
        .unwrap();
    created["session"]["id"].as_str().unwrap().to_string()
}

async fn turn(client: &mut Client, session: &str, id: &str, text: &str) -> Vec<Value> {
    client.ok("turn/start", json!({"session_id": session, "submission_id": id, "text": text})).await.unwrap();
    client.events_until("turn_finished").await.unwrap()
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["kind"].as_str().unwrap()).collect()
}

/// The compaction block's text in a request body.
fn block_of(request: &RecordedRequest) -> String {
    let body: Value = serde_json::from_slice(&request.body).unwrap();
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .find(|text| text.starts_with("[keel: context compacted"))
        .expect("no compaction block in the request")
        .to_string()
}

/// Two rounds of long messages, then a third that passes the cap.
async fn two_long_rounds(client: &mut Client, mock: &MockServer, session: &str) {
    mock.push(Reply::text("ok one"));
    mock.push(Reply::text("ok two"));
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    turn(client, session, "s1", &format!("{TASK}{}", filler(" round-one-notes", 600))).await;
    turn(client, session, "s2", &filler("round-two-notes", 600)).await;
}

/// A keel with a session that has had two long rounds.
struct Long {
    dir: tempfile::TempDir,
    keel: Keel,
    client: Client,
    mock: MockServer,
    id: String,
}

/// `room`: a cap leaving that many tokens for history (threshold 100%);
/// `None`: the session's defaults (the model's window).
async fn long_session(room: Option<u64>, attended: bool) -> Long {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = match room {
        Some(room) => session(&mut client, &ws, room, attended, true).await,
        None => client.create_session(&ws).await.unwrap(),
    };
    two_long_rounds(&mut client, &mock, &id).await;
    Long { dir, keel, client, mock, id }
}

#[tokio::test]
async fn passing_the_threshold_compacts_the_outbound_view_only_and_it_survives_a_restart() {
    let Long { dir, keel, mut client, mock, id } = long_session(Some(1_500), true).await;
    let state = dir.path().join("state");
    assert!(!mock.requests().iter().any(is_summary_request), "no compaction below the cap");
    mock.push(Reply::text(SUMMARY));
    mock.push(Reply::text("ok three"));
    let events = turn(&mut client, &id, "s3", &filler("round-three-notes", 600)).await;
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let compacted = events.iter().find(|e| e["kind"] == "compacted").expect("compacted event");
    assert_eq!(compacted["data"]["reason"], "threshold");
    assert!(compacted["data"]["tokens_after"].as_u64() < compacted["data"]["tokens_before"].as_u64());

    let requests = mock.requests();
    let summary_request = &requests[requests.len() - 2];
    assert!(is_summary_request(summary_request));
    assert!(body(summary_request).contains("round-two-notes"), "the summarizer reads what it compacts");
    let outbound = &requests[requests.len() - 1];
    let sent = body(outbound);
    let block = block_of(outbound);
    assert!(block.contains(SUMMARY), "{block}");
    assert!(block.contains("never deploy anything"), "the task is kept verbatim: {block}");
    assert!(!sent.contains("round-two-notes"), "compacted history is not sent");
    assert!(sent.contains("round-three-notes"), "history after the boundary is sent as it is: {compacted}");

    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    let history = snapshot["history"].as_array().unwrap();
    assert_eq!(history.len(), 6, "history is never rewritten");
    assert!(history[2]["content"][0]["text"].as_str().unwrap().starts_with("round-two-notes"));
    let record = &snapshot["compaction"];
    assert_eq!(record["boundary"], 4);
    assert_eq!(record["summary"], SUMMARY);
    assert!(record["users"][0].as_str().unwrap().contains("never deploy anything"));
    let context = &snapshot["context"];
    assert_eq!(context["compactions"], 1);
    assert!(context["used_tokens"].as_u64().unwrap() < context["cap_tokens"].as_u64().unwrap());
    assert_eq!(
        context["available_tokens"].as_u64().unwrap(),
        context["cap_tokens"].as_u64().unwrap() - context["used_tokens"].as_u64().unwrap()
    );

    drop(client);
    keel.terminate();
    keel.wait();
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("ok four"));
    let keel = Keel::start(&state, &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let after = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(after["compaction"], snapshot["compaction"], "the record is intact after a restart");
    client.ok("events/subscribe", json!({"session_id": id, "after_seq": after["last_seq"]})).await.unwrap();
    turn(&mut client, &id, "s4", "one more short question").await;
    let requests = mock.requests();
    assert_eq!(requests.len(), 1, "no new compaction was needed");
    assert_eq!(block_of(&requests[0]), block, "the same outbound view after the restart");
}

#[tokio::test]
async fn a_provider_saying_too_long_compacts_and_sends_again() {
    let Long { dir: _dir, keel: _keel, mut client, mock, id } = long_session(None, true).await;
    mock.push(Reply::http_error(ScriptedError::ContextTooLong));
    mock.push(Reply::text(SUMMARY));
    mock.push(Reply::text("ok three"));
    let events = turn(&mut client, &id, "s3", "and now the third part").await;
    assert_eq!(events.last().unwrap()["data"]["status"], "completed", "{:?}", kinds(&events));
    let compacted = events.iter().find(|e| e["kind"] == "compacted").unwrap();
    assert_eq!(compacted["data"]["reason"], "context_too_long");
    let requests = mock.requests();
    let last = body(&requests[requests.len() - 1]);
    assert!(is_summary_request(&requests[requests.len() - 2]));
    // The model's earlier answers are in the summary now; the person's
    // messages are all kept (verbatim in the block, the latest after it).
    assert!(!last.contains("ok one") && last.contains("round-two-notes"), "{last}");
    assert!(last.contains("and now the third part"));
    // The person's latest message stays theirs, after the block.
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(snapshot["compaction"]["boundary"], 4);
}

#[tokio::test]
async fn a_summary_that_fails_twice_parks_an_attended_turn_until_a_person_trims() {
    let Long { dir: _dir, keel: _keel, mut client, mock, id } = long_session(Some(1_500), true).await;
    mock.push(Reply::http_error(ScriptedError::ServerError));
    mock.push(Reply::http_error(ScriptedError::ServerError));
    client
        .ok("turn/start", json!({"session_id": id, "submission_id": "s3", "text": filler("round-three-notes", 600)}))
        .await
        .unwrap();
    let events = client.events_until("turn_waiting").await.unwrap();
    assert_eq!(mock.requests().iter().filter(|r| is_summary_request(r)).count(), 2, "retried once");
    let failed = events.iter().find(|e| e["kind"] == "compaction_failed").unwrap();
    assert_eq!(failed["data"]["action"], "asked");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(snapshot.get("compaction").is_none());
    let question = snapshot["interactions"].as_array().unwrap().iter().find(|i| i["kind"] == "compaction").unwrap();
    assert_eq!(question["status"], "pending");
    let wrong = client
        .call(
            "interaction/respond",
            json!({"session_id": id, "interaction_id": question["id"], "decision": "allow_once"}),
        )
        .await
        .unwrap()
        .unwrap_err();
    assert!(wrong.message.contains("retry or trim"), "{}", wrong.message);

    mock.push(Reply::text("ok three"));
    client
        .ok("interaction/respond", json!({"session_id": id, "interaction_id": question["id"], "decision": "trim"}))
        .await
        .unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(snapshot["compaction"]["trimmed"], true);
    assert_eq!(snapshot["compaction"]["summary"], "");
    let block = block_of(mock.requests().last().unwrap());
    assert!(block.contains("No summary") && block.contains("never deploy anything"), "{block}");
}

#[tokio::test]
async fn an_unattended_session_trims_when_the_summary_fails_twice() {
    let Long { dir: _dir, keel: _keel, mut client, mock, id } = long_session(Some(1_500), false).await;
    mock.push(Reply::http_error(ScriptedError::ServerError));
    mock.push(Reply::text(""));
    mock.push(Reply::text("ok three"));
    let events = turn(&mut client, &id, "s3", &filler("round-three-notes", 600)).await;
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let failed = events.iter().find(|e| e["kind"] == "compaction_failed").unwrap();
    assert_eq!(failed["data"]["action"], "trimmed");
    assert!(failed["data"]["errors"][1].as_str().unwrap().contains("empty summary"));
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(snapshot["compaction"]["trimmed"], true);
    assert!(snapshot["interactions"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn a_manual_compaction_that_fails_waits_and_a_retry_applies_it() {
    let Long { dir: _dir, keel: _keel, mut client, mock, id } = long_session(None, true).await;
    mock.push(Reply::http_error(ScriptedError::ServerError));
    mock.push(Reply::http_error(ScriptedError::ServerError));
    let waiting = client.ok("session/compact", json!({"session_id": id})).await.unwrap();
    assert_eq!(waiting["status"], "waiting");
    let question = waiting["interaction"]["id"].clone();
    let inbox = client.ok("inbox/list", json!({})).await.unwrap();
    assert_eq!(inbox["interactions"][0]["id"], question);
    mock.push(Reply::text(SUMMARY));
    let answered = client
        .ok("interaction/respond", json!({"session_id": id, "interaction_id": question, "decision": "retry"}))
        .await
        .unwrap();
    assert_eq!(answered["status"], "applied");
    let compacted = client.events_until("compacted").await.unwrap();
    assert_eq!(compacted.last().unwrap()["data"]["reason"], "manual");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(snapshot["compaction"]["summary"], SUMMARY);
    // A manual compaction keeps the person's last message after the block.
    assert_eq!(snapshot["compaction"]["boundary"], 2);
    let again = client.ok("session/compact", json!({"session_id": id})).await.unwrap();
    assert_eq!(again["status"], "nothing_to_compact");
}

#[tokio::test]
async fn a_summary_written_while_history_changed_is_discarded() {
    let Long { dir: _dir, keel, mut client, mock, id } = long_session(None, true).await;
    let mut other = keel.client().await.unwrap();
    mock.push(Reply::text(SUMMARY).delay_first_byte(Duration::from_secs(2)));
    mock.push(Reply::text("ok three"));
    let compact = async {
        let result = other.call("session/compact", json!({"session_id": id})).await.unwrap();
        result.unwrap_err()
    };
    let change = async {
        mock.wait_for_requests(3).await.unwrap();
        turn(&mut client, &id, "s3", "a new instruction").await
    };
    let (refused, events) = tokio::join!(compact, change);
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(refused.code, -32003, "{}", refused.message);
    assert!(refused.message.contains("discarded"), "{}", refused.message);
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(snapshot.get("compaction").is_none());
    let events = client.events_until("compaction_discarded").await.unwrap();
    assert!(!kinds(&events).contains(&"compacted"));
}

#[tokio::test]
async fn an_interrupted_compaction_drops_the_summarizer_and_commits_nothing() {
    let Long { dir: _dir, keel, mut client, mock, id } = long_session(Some(1_500), true).await;
    let mut other = keel.client().await.unwrap();
    // In a turn: the interrupt cancels the turn and its compaction.
    mock.push(Reply::text(SUMMARY).delay_first_byte(Duration::from_secs(60)));
    client
        .ok("turn/start", json!({"session_id": id, "submission_id": "s3", "text": filler("round-three-notes", 600)}))
        .await
        .unwrap();
    mock.wait_for_requests(3).await.unwrap();
    let started = Instant::now();
    let stopped = client.ok("turn/interrupt", json!({"session_id": id})).await.unwrap();
    assert_eq!(stopped["status"], "cancelled");
    assert!(started.elapsed() < Duration::from_secs(10));
    // By hand: `turn/interrupt` cancels it too.
    mock.push(Reply::text(SUMMARY).delay_first_byte(Duration::from_secs(60)));
    let compact = async { other.call("session/compact", json!({"session_id": id})).await.unwrap().unwrap_err() };
    let interrupt = async {
        mock.wait_for_requests(4).await.unwrap();
        client.ok("turn/interrupt", json!({"session_id": id})).await.unwrap()
    };
    let started = Instant::now();
    let (refused, _) = tokio::join!(compact, interrupt);
    assert!(refused.message.contains("cancelled"), "{}", refused.message);
    assert!(started.elapsed() < Duration::from_secs(10));
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(snapshot.get("compaction").is_none());
}

#[tokio::test]
async fn a_failed_compacted_event_leaves_nothing_of_the_compaction() {
    let Long { dir, keel: _keel, mut client, mock, id } = long_session(None, true).await;
    let state = dir.path().join("state");
    let db = rusqlite::Connection::open(state.join("runtime.sqlite3")).unwrap();
    db.execute_batch(
        "CREATE TRIGGER fail_compaction BEFORE INSERT ON events WHEN NEW.kind='compacted' BEGIN SELECT RAISE(ABORT,'injected'); END;",
    )
    .unwrap();
    let before = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    mock.push(Reply::text(SUMMARY));
    let failure = client.call("session/compact", json!({"session_id": id})).await.unwrap().unwrap_err();
    assert_eq!(failure.code, -32005, "{}", failure.message);
    let after = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(after.get("compaction").is_none());
    assert_eq!(after["history"], before["history"]);
    assert_eq!(after["last_seq"], before["last_seq"]);
    let rows: i64 = db.query_row("SELECT COUNT(*) FROM compactions", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 0);
}

/// Runs a third round that needs compaction in a keel that dies during the
/// summary (`crash`: the crash point, or `None` to SIGKILL it while the
/// summary request is open); then checks nothing of it remains and that the
/// resumed turn compacts and completes.
async fn crash_during_compaction(crash: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let bundle = support::example_bundle();
    let mock = MockServer::start().await.unwrap();
    let env: Vec<(&str, &str)> = crash.map(|point| ("KEEL_CRASH_AFTER", point)).into_iter().collect();
    let mut keel = Keel::start_with(&state, &mock.base_url(), &bundle, &env).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws, 1_500, true, true).await;
    two_long_rounds(&mut client, &mock, &id).await;
    let summary = if crash.is_some() {
        Reply::text(SUMMARY)
    } else {
        Reply::text(SUMMARY).delay_first_byte(Duration::from_secs(60))
    };
    mock.push(summary);
    client
        .ok("turn/start", json!({"session_id": id, "submission_id": "s3", "text": filler("round-three-notes", 600)}))
        .await
        .unwrap();
    mock.wait_for_requests(3).await.unwrap();
    if crash.is_none() {
        keel.kill();
    } else {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !keel.exited() {
            assert!(Instant::now() < deadline, "keel did not reach the crash point");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    drop(client);
    let mock = MockServer::start().await.unwrap();
    let keel = Keel::start(&state, &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(snapshot.get("compaction").is_none(), "nothing of the compaction was committed");
    assert_eq!(snapshot["turn"]["status"], "recoverable");
    mock.push(Reply::text(SUMMARY));
    mock.push(Reply::text("ok three"));
    client.ok("events/subscribe", json!({"session_id": id, "after_seq": snapshot["last_seq"]})).await.unwrap();
    client.ok("turn/resume", json!({"session_id": id})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(kinds(&events).iter().filter(|k| **k == "compacted").count(), 1);
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(snapshot["compaction"]["number"], 1);
}

#[tokio::test]
async fn a_kill_during_the_summary_request_commits_nothing_and_resume_compacts() {
    crash_during_compaction(None).await;
}

#[tokio::test]
async fn a_crash_after_the_summary_before_its_commit_commits_nothing() {
    crash_during_compaction(Some("summary_returned")).await;
}

/// One restart with three kinds of parked work at once, as the reference
/// suite does: a turn whose failed attempt left partial text in the ledger
/// (killed during the retry), a compaction question parked in another
/// session, and a pending approval in a third. After SIGKILL and restart all
/// three are intact (ledger text, question id, approval id and digests), the
/// turns are recoverable, and answering each continues correctly.
#[tokio::test]
async fn a_restart_keeps_a_partial_attempt_a_compaction_question_and_an_approval_together() {
    let Long { dir, keel, mut client, mock, id: compacting } = long_session(Some(1_500), true).await;
    let state = dir.path().join("state");
    // 1. The compaction question.
    mock.push(Reply::http_error(ScriptedError::ServerError));
    mock.push(Reply::http_error(ScriptedError::ServerError));
    client
        .ok(
            "turn/start",
            json!({"session_id": compacting, "submission_id": "s3", "text": filler("round-three-notes", 600)}),
        )
        .await
        .unwrap();
    client.events_until("turn_waiting").await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": compacting})).await.unwrap();
    let compaction_q =
        snapshot["interactions"].as_array().unwrap().iter().find(|i| i["kind"] == "compaction").unwrap().clone();

    // 2. The approval, in a second session (the example coworker asks
    // before commands outside its read-only list).
    let ws2 = dir.path().join("ws2");
    std::fs::create_dir_all(&ws2).unwrap();
    let approving = client.create_session(&ws2).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": approving})).await.unwrap();
    mock.push(Reply::tool_call("call_1", "shell__run", json!({"command": "echo approved >> done.txt"}).to_string()));
    client.ok("turn/start", json!({"session_id": approving, "submission_id": "a1", "text": "go"})).await.unwrap();
    client.events_until("turn_waiting").await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": approving})).await.unwrap();
    let approval =
        snapshot["interactions"].as_array().unwrap().iter().find(|i| i["kind"] == "approval").unwrap().clone();
    assert_eq!(approval["status"], "pending");

    // 3. A failed attempt with partial text, then a retry that hangs: the
    // kill lands during it.
    let ws3 = dir.path().join("ws3");
    std::fs::create_dir_all(&ws3).unwrap();
    let partial = client.create_session(&ws3).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": partial})).await.unwrap();
    let requests_before = mock.requests().len();
    mock.push(Reply::text("partial words before the cut").cut_after(2));
    mock.push(Reply::text("never arrives").delay_first_byte(Duration::from_secs(120)));
    client.ok("turn/start", json!({"session_id": partial, "submission_id": "p1", "text": "go"})).await.unwrap();
    client.events_until("model_retrying").await.unwrap();
    mock.wait_for_requests(requests_before as u64 + 2).await.unwrap();
    let before = client.ok("session/get", json!({"session_id": partial})).await.unwrap();
    let partial_text = before["attempts"][0]["text"].as_str().unwrap().to_string();
    assert!(partial_text.starts_with("partial"), "{partial_text}");

    drop(client);
    keel.kill();
    let keel = Keel::start(&state, &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();

    // All three intact.
    let a = client.ok("session/get", json!({"session_id": compacting})).await.unwrap();
    assert_eq!(a["turn"]["status"], "recoverable");
    let q = a["interactions"].as_array().unwrap().iter().find(|i| i["id"] == compaction_q["id"]).unwrap();
    assert_eq!(q["status"], "pending");
    assert_eq!(q["kind"], "compaction");
    let b = client.ok("session/get", json!({"session_id": approving})).await.unwrap();
    assert_eq!(b["turn"]["status"], "recoverable");
    let q = b["interactions"].as_array().unwrap().iter().find(|i| i["id"] == approval["id"]).unwrap();
    assert_eq!(q["status"], "pending");
    assert_eq!(q["request"]["digests"], approval["request"]["digests"]);
    assert_eq!(q["request"]["call_id"], approval["request"]["call_id"]);
    let c = client.ok("session/get", json!({"session_id": partial})).await.unwrap();
    assert_eq!(c["turn"]["status"], "recoverable");
    assert_eq!(c["attempts"][0]["status"], "failed");
    assert_eq!(c["attempts"][0]["text"], partial_text.as_str(), "the ledger kept the partial text");
    assert_eq!(c["attempts"][1]["status"], "abandoned");
    assert!(!c["history"].to_string().contains("partial words"), "never in history");
    let inbox = client.ok("inbox/list", json!({})).await.unwrap();
    let mut ids: Vec<&str> =
        inbox["interactions"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap()).collect();
    ids.sort();
    let mut expected = vec![compaction_q["id"].as_str().unwrap(), approval["id"].as_str().unwrap()];
    expected.sort();
    assert_eq!(ids, expected);

    // Answering each continues it.
    for session in [&compacting, &approving, &partial] {
        let last = client.ok("session/get", json!({"session_id": session})).await.unwrap()["last_seq"].clone();
        client.ok("events/subscribe", json!({"session_id": session, "after_seq": last})).await.unwrap();
    }
    mock.push(Reply::text("ok three"));
    client
        .ok(
            "interaction/respond",
            json!({"session_id": compacting, "interaction_id": compaction_q["id"], "decision": "trim"}),
        )
        .await
        .unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(events.last().unwrap()["session_id"], compacting.as_str());

    mock.push(Reply::text("approved and done"));
    client
        .ok(
            "interaction/respond",
            json!({"session_id": approving, "interaction_id": approval["id"], "decision": "allow_once"}),
        )
        .await
        .unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(std::fs::read_to_string(ws2.join("done.txt")).unwrap(), "approved\n", "ran once, after the answer");

    mock.push(Reply::text("resumed answer"));
    client.ok("turn/resume", json!({"session_id": partial})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let c = client.ok("session/get", json!({"session_id": partial})).await.unwrap();
    assert!(c["history"].to_string().contains("resumed answer"));
    assert!(!c["history"].to_string().contains("partial words"));
}
