//! The effect ledger under crashes: keel is killed at every step of a tool
//! call (`KEEL_CRASH_AFTER`), restarted, and the number of times the effect
//! happened is counted. A side-effecting call never runs twice without a
//! person saying so; an idempotent one is simply run again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keel_testkit::{MockServer, Reply};
use serde_json::{Value, json};
use support::{Client, Keel};

fn bundle(dir: &Path) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("keel.toml"),
        "[coworkers.w]\nmodel = \"openai-chat:m\"\ninstructions = \"x\"\ntools = [\"shell.run\", \"fs.write_file\"]\npolicies = { \"shell.run\" = \"allow\", \"fs.write_file\" = \"allow\" }\n",
    )
    .unwrap();
    bundle
}

fn count(ws: &Path) -> usize {
    std::fs::read_to_string(ws.join("count.txt")).map(|t| t.lines().count()).unwrap_or(0)
}

/// Starts a turn whose one call appends a line to count.txt, with keel set to
/// crash at `point`; waits for the crash; restarts keel; returns the new keel,
/// a client and the session's snapshot.
async fn crash_at(point: &str, dir: &Path, mock: &MockServer) -> (Keel, Client, String, Value) {
    let ws = dir.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let state = dir.join("state");
    let bundle = bundle(dir);
    mock.push(Reply::tool_call("c1", "shell__run", r#"{"command": "echo effect >> count.txt"}"#));
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[("KEEL_CRASH_AFTER", point)]).unwrap();
    let mut client = keel.client().await.unwrap();
    let created = client.ok("session/create", json!({"name": "e", "coworker": "w", "workspace": ws})).await.unwrap();
    let id = created["session"]["id"].as_str().unwrap().to_string();
    client.call("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "go"})).await.unwrap().unwrap();
    let mut keel = keel;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !keel.exited() {
        assert!(Instant::now() < deadline, "keel did not reach the crash point {point}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(client);
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": id, "after_seq": snapshot["last_seq"]})).await.unwrap();
    (keel, client, id, snapshot)
}

fn pending_question(snapshot: &Value) -> Option<Value> {
    snapshot["interactions"].as_array().unwrap().iter().find(|i| i["status"] == "pending").cloned()
}

/// A person's answer to an interrupted call: `turn/resume` is refused while
/// the question waits, then the answer (with `reply` queued for the model)
/// continues the turn to a completed end.
async fn answer_interrupted_call(
    client: &mut Client,
    mock: &MockServer,
    id: &str,
    question: &Value,
    decision: &str,
    reply: &str,
) {
    let refused = client.call("turn/resume", json!({"session_id": id})).await.unwrap().unwrap_err();
    assert!(refused.message.contains("waits for a person"), "{}", refused.message);
    mock.push(Reply::text(reply));
    client
        .ok("interaction/respond", json!({"session_id": id, "interaction_id": question["id"], "decision": decision}))
        .await
        .unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
}

#[tokio::test]
async fn a_crash_after_the_intent_runs_the_call_once_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start().await.unwrap();
    let (_keel, mut client, id, snapshot) = crash_at("tool_call_intended", dir.path(), &mock).await;
    let ws = dir.path().join("ws");
    assert_eq!(count(&ws), 0, "never dispatched");
    assert_eq!(snapshot["turn"]["status"], "recoverable");
    assert!(pending_question(&snapshot).is_none(), "nothing to ask: it never started");
    mock.push(Reply::text("done"));
    client.ok("turn/resume", json!({"session_id": id})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(count(&ws), 1);
}

#[tokio::test]
async fn a_crash_after_dispatch_asks_a_person_and_runs_again_only_when_told() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start().await.unwrap();
    let (_keel, mut client, id, snapshot) = crash_at("tool_call_started", dir.path(), &mock).await;
    let ws = dir.path().join("ws");
    let before = count(&ws);
    assert!(before <= 1);
    let question = pending_question(&snapshot).expect("a person is asked");
    assert_eq!(question["kind"], "interrupted_call");
    answer_interrupted_call(&mut client, &mock, &id, &question, "run_again", "done").await;
    assert_eq!(count(&ws), before + 1, "ran again once, because a person said so");
}

#[tokio::test]
async fn a_crash_after_the_effect_never_repeats_it_and_the_model_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start().await.unwrap();
    let (_keel, mut client, id, snapshot) = crash_at("tool_returned", dir.path(), &mock).await;
    let ws = dir.path().join("ws");
    assert_eq!(count(&ws), 1, "the effect happened before the crash");
    let question = pending_question(&snapshot).expect("a person is asked");
    mock.push(Reply::text("understood"));
    client
        .ok(
            "interaction/respond",
            json!({"session_id": id, "interaction_id": question["id"], "decision": "skip", "message": "it already ran"}),
        )
        .await
        .unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(count(&ws), 1, "not run twice");
    let last = String::from_utf8_lossy(&mock.requests().last().unwrap().body).into_owned();
    assert!(last.contains("a person chose not to run it again: it already ran"), "{last}");
}

#[tokio::test]
async fn a_crash_after_the_result_needs_no_one_and_does_not_repeat() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start().await.unwrap();
    let (_keel, mut client, id, snapshot) = crash_at("tool_call_finished", dir.path(), &mock).await;
    let ws = dir.path().join("ws");
    assert_eq!(count(&ws), 1);
    assert!(pending_question(&snapshot).is_none());
    mock.push(Reply::text("done"));
    client.ok("turn/resume", json!({"session_id": id})).await.unwrap();
    client.events_until("turn_finished").await.unwrap();
    assert_eq!(count(&ws), 1);
}

#[tokio::test]
async fn an_idempotent_call_cut_off_after_its_effect_is_simply_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let state = dir.path().join("state");
    let bundle = bundle(dir.path());
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "fs__write_file", r#"{"path": "same.txt", "content": "same"}"#));
    let mut keel =
        Keel::start_with(&state, &mock.base_url(), &bundle, &[("KEEL_CRASH_AFTER", "tool_returned")]).unwrap();
    let mut client = keel.client().await.unwrap();
    let created = client.ok("session/create", json!({"name": "e", "coworker": "w", "workspace": ws})).await.unwrap();
    let id = created["session"]["id"].as_str().unwrap().to_string();
    client.call("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "go"})).await.unwrap().unwrap();
    while !keel.exited() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(client);
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(pending_question(&snapshot).is_none(), "idempotent: nobody needs asking");
    client.ok("events/subscribe", json!({"session_id": id, "after_seq": snapshot["last_seq"]})).await.unwrap();
    mock.push(Reply::text("done"));
    client.ok("turn/resume", json!({"session_id": id})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert!(events.iter().any(|e| e["kind"] == "tool_call_started"), "run again");
    assert_eq!(std::fs::read_to_string(ws.join("same.txt")).unwrap(), "same");
}

/// Found from outside: an OpenAI-compatible server numbered its calls per
/// response, so turn 2's side-effecting `call_1` collided with turn 1's in
/// the ledger; after a SIGKILL mid-call recovery saw no dispatched call and
/// ran it again. keel's own call ids make the second call its own row: the
/// restart asks a person, and nothing runs twice.
#[tokio::test]
async fn a_provider_reusing_call_ids_across_turns_cannot_make_a_call_run_twice() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let state = dir.path().join("state");
    let bundle = bundle(dir.path());
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("call_1", "shell__run", r#"{"command": "echo x >> count.txt"}"#));
    mock.push(Reply::text("turn one done"));
    mock.push(Reply::tool_call("call_1", "shell__run", r#"{"command": "echo y >> count.txt"}"#));
    // The second time a tool returns (turn 2's call), keel dies before the
    // result is journaled.
    let mut keel =
        Keel::start_with(&state, &mock.base_url(), &bundle, &[("KEEL_CRASH_AFTER", "tool_returned@2")]).unwrap();
    let mut client = keel.client().await.unwrap();
    let created = client.ok("session/create", json!({"name": "e", "coworker": "w", "workspace": ws})).await.unwrap();
    let id = created["session"]["id"].as_str().unwrap().to_string();
    client.ok("events/subscribe", json!({"session_id": id, "after_seq": 0})).await.unwrap();
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "one"})).await.unwrap();
    client.events_until("turn_finished").await.unwrap();
    client.call("turn/start", json!({"session_id": id, "submission_id": "s2", "text": "two"})).await.unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !keel.exited() {
        assert!(Instant::now() < deadline, "keel did not crash in turn 2's call");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(client);
    assert_eq!(std::fs::read_to_string(ws.join("count.txt")).unwrap(), "x\ny\n");

    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    let question = pending_question(&snapshot).expect("the dispatched call is put to a person");
    assert_eq!(question["kind"], "interrupted_call", "{question}");
    // Two ledger rows, one per call, each its turn's.
    let ledger = snapshot["tool_calls"].as_array().unwrap();
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    assert_ne!(ledger[0]["turn_id"], ledger[1]["turn_id"]);
    assert_eq!(ledger.iter().filter(|c| c["status"] != "completed").count(), 1, "{ledger:?}");
    client.ok("events/subscribe", json!({"session_id": id, "after_seq": snapshot["last_seq"]})).await.unwrap();
    answer_interrupted_call(&mut client, &mock, &id, &question, "skip", "ok").await;
    assert_eq!(std::fs::read_to_string(ws.join("count.txt")).unwrap(), "x\ny\n", "nothing ran twice");
    // The renamed call went on the wire under keel's id, paired with its output.
    let last = String::from_utf8_lossy(&mock.requests().last().unwrap().body).into_owned();
    let body: Value = serde_json::from_str(&last).unwrap();
    let messages = body["messages"].as_array().unwrap();
    let call_ids: Vec<&str> =
        messages.iter().filter_map(|m| m["tool_calls"].as_array()).flatten().filter_map(|c| c["id"].as_str()).collect();
    assert_eq!(call_ids.len(), 2, "{call_ids:?}");
    assert_ne!(call_ids[0], call_ids[1], "distinct on the wire too");
    for id in &call_ids {
        assert!(messages.iter().any(|m| m["tool_call_id"] == *id), "call {id} has its output");
    }
}

/// One response with the same id on two side-effecting calls: both run, each
/// with its own ledger row and output.
#[tokio::test]
async fn repeated_call_ids_within_one_response_are_two_calls() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let state = dir.path().join("state");
    let bundle = bundle(dir.path());
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_calls([
        keel_testkit::ToolCall::new("call_1", "shell__run", r#"{"command": "echo a >> count.txt"}"#),
        keel_testkit::ToolCall::new("call_1", "shell__run", r#"{"command": "echo b >> count.txt"}"#),
    ]));
    mock.push(Reply::text("done"));
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let created = client.ok("session/create", json!({"name": "e", "coworker": "w", "workspace": ws})).await.unwrap();
    let id = created["session"]["id"].as_str().unwrap().to_string();
    client.ok("events/subscribe", json!({"session_id": id, "after_seq": 0})).await.unwrap();
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "go"})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(std::fs::read_to_string(ws.join("count.txt")).unwrap(), "a\nb\n");
    let finished: Vec<&Value> = events.iter().filter(|e| e["kind"] == "tool_call_finished").collect();
    assert_eq!(finished.len(), 2);
    let renamed = events
        .iter()
        .find_map(|e| e["data"]["renamed_calls"].as_array().cloned())
        .expect("the rename is journaled with the attempt");
    assert_eq!(renamed.len(), 1);
    assert_eq!(renamed[0]["provider_call_id"], "call_1");
}
