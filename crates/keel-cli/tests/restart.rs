//! Crash and restart through the real binary: SIGKILL at chosen moments,
//! reopen the same state directory, check statuses and history, resume.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use keel_testkit::{MockServer, Reply};
use serde_json::json;
use support::Keel;

fn kinds(events: &[serde_json::Value]) -> Vec<String> {
    events.iter().map(|e| e["kind"].as_str().unwrap_or_default().to_string()).collect()
}

#[tokio::test]
async fn a_kill_during_the_model_request_leaves_a_recoverable_turn_that_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("never delivered").delay_first_byte(Duration::from_secs(120)));
    let keel = Keel::start(&state, &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let session = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    client.ok("turn/start", json!({"session_id": session, "submission_id": "s1", "text": "think"})).await.unwrap();
    client.events_until("model_attempt_started").await.unwrap();
    let before = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    keel.kill();

    let mock = MockServer::start().await.unwrap();
    let keel = Keel::start(&state, &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let after = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    assert_eq!(after["turn"]["status"], "recoverable");
    assert_eq!(after["history"], before["history"], "history is intact");
    assert_eq!(after["attempts"][0]["status"], "abandoned");
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    let journal = client.events_until("turn_recoverable").await.unwrap();
    let kinds = kinds(&journal);
    let interrupted = kinds.iter().position(|k| k == "turn_interrupted").unwrap();
    assert!(interrupted < kinds.len() - 1);

    mock.push(Reply::text("resumed answer"));
    let resumed = client.ok("turn/resume", json!({"session_id": session})).await.unwrap();
    assert_eq!(resumed["status"], "running");
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let snapshot = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    let history = snapshot["history"].as_array().unwrap();
    assert_eq!(history.len(), 2);
    assert_eq!(history[1]["content"][0]["text"], "resumed answer");
    // A resumed turn cannot be resumed again.
    let again = client.call("turn/resume", json!({"session_id": session})).await.unwrap().unwrap_err();
    assert_eq!(again.code, -32003);
}

#[tokio::test]
async fn sigterm_interrupts_running_turns_and_a_second_keel_cannot_share_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("slow").delay_first_byte(Duration::from_secs(120)));
    let keel = Keel::start(&state, &mock.base_url()).unwrap();
    let second = Keel::start(&state, &mock.base_url());
    assert!(second.is_err(), "the state directory is locked");
    let mut client = keel.client().await.unwrap();
    let session = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    client.ok("turn/start", json!({"session_id": session, "submission_id": "s1", "text": "x"})).await.unwrap();
    client.events_until("model_attempt_started").await.unwrap();
    keel.terminate();
    keel.wait();
    let db = rusqlite::Connection::open(state.join("runtime.sqlite3")).unwrap();
    let status: String = db.query_row("SELECT status FROM turns", [], |r| r.get(0)).unwrap();
    assert_eq!(status, "interrupted");
    let data: String =
        db.query_row("SELECT data FROM events WHERE kind = 'turn_interrupted'", [], |r| r.get(0)).unwrap();
    assert!(data.contains("\"shutdown\""), "{data}");
}

#[tokio::test]
async fn a_kill_during_a_command_takes_the_command_down_and_recovery_does_not_rerun_it() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let state = dir.path().join("state");
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("keel.toml"),
        "[coworkers.w]\nmodel = \"openai-chat:m\"\ninstructions = \"x\"\ntools = [\"shell.run\"]\npolicies = { \"shell.run\" = \"allow\" }\n",
    )
    .unwrap();
    let mock = MockServer::start().await.unwrap();
    let command = "echo run >> runs.txt; sleep 300 # killed-keel-marker-33e";
    mock.push(Reply::tool_call("c1", "shell__run", json!({ "command": command }).to_string()));
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let created = client.ok("session/create", json!({"name": "k", "coworker": "w", "workspace": ws})).await.unwrap();
    let session = created["session"]["id"].as_str().unwrap().to_string();
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    client.ok("turn/start", json!({"session_id": session, "submission_id": "s1", "text": "go"})).await.unwrap();
    client.events_until("tool_call_started").await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ws.join("runs.txt").exists() {
        assert!(std::time::Instant::now() < deadline, "the command never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    keel.kill();
    // The runner, the command's init and the command die with keel.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while marked("killed-keel-marker-33e") > 0 {
        assert!(std::time::Instant::now() < deadline, "the command outlived keel");
        std::thread::sleep(Duration::from_millis(50));
    }
    // After the restart a person decides about the cut-off command; told to
    // skip it, keel does not run it again.
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let after = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    assert_eq!(after["turn"]["status"], "recoverable");
    let question = after["interactions"].as_array().unwrap().iter().find(|i| i["status"] == "pending").unwrap().clone();
    assert_eq!(question["kind"], "interrupted_call");
    mock.push(Reply::text("noted"));
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    client
        .ok("interaction/respond", json!({"session_id": session, "interaction_id": question["id"], "decision": "skip"}))
        .await
        .unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(std::fs::read_to_string(ws.join("runs.txt")).unwrap(), "run\n", "ran exactly once");
}

fn marked(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker)))
        .count()
}
