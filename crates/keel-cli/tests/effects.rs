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
    let refused = client.call("turn/resume", json!({"session_id": id})).await.unwrap().unwrap_err();
    assert!(refused.message.contains("waits for a person"), "{}", refused.message);
    mock.push(Reply::text("done"));
    client
        .ok("interaction/respond", json!({"session_id": id, "interaction_id": question["id"], "decision": "run_again"}))
        .await
        .unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
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
