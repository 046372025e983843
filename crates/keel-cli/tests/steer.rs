//! `turn/steer`: a person's message reaches a running turn before its next
//! model request, once, and survives a crash.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use keel_testkit::{MockServer, Reply};
use serde_json::json;
use support::Keel;

#[tokio::test]
async fn a_steer_reaches_the_next_model_request_once() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "fs__list_dir", r#"{"path": "."}"#).delay_first_byte(Duration::from_secs(3)));
    mock.push(Reply::text("done, in French"));
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "list"})).await.unwrap();
    client.events_until("model_attempt_started").await.unwrap();
    let steer = json!({"session_id": id, "submission_id": "m1", "text": "Answer in French, please."});
    let first = client.ok("turn/steer", steer.clone()).await.unwrap();
    assert_eq!(first["duplicate"], false);
    let again = client.ok("turn/steer", steer).await.unwrap();
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["turn_id"], first["turn_id"]);
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let requests = mock.requests();
    let second = String::from_utf8_lossy(&requests[1].body).into_owned();
    assert_eq!(second.matches("Answer in French, please.").count(), 1, "{second}");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    let texts: Vec<&str> = snapshot["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["role"] == "user")
        .map(|i| i["content"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["list", "Answer in French, please."]);
    // No turn to steer once it has ended.
    let late = client
        .call("turn/steer", json!({"session_id": id, "submission_id": "m2", "text": "more"}))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(late.code, -32003);
}

#[tokio::test]
async fn a_steer_accepted_before_a_crash_is_delivered_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("never arrives").delay_first_byte(Duration::from_secs(60)));
    let bundle = support::example_bundle();
    let mut keel =
        Keel::start_with(&state, &mock.base_url(), &bundle, &[("KEEL_CRASH_AFTER", "turn_steered")]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "think"})).await.unwrap();
    client.events_until("model_attempt_started").await.unwrap();
    let _ = client
        .call("turn/steer", json!({"session_id": id, "submission_id": "m1", "text": "Also check the tests."}))
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !keel.exited() {
        assert!(Instant::now() < deadline, "keel did not crash after journaling the steer");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(client);
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("checked"));
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(snapshot["turn"]["pending_steers"][0]["text"], "Also check the tests.");
    client.ok("events/subscribe", json!({"session_id": id, "after_seq": snapshot["last_seq"]})).await.unwrap();
    client.ok("turn/resume", json!({"session_id": id})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let body = String::from_utf8_lossy(&mock.requests()[0].body).into_owned();
    assert!(body.contains("Also check the tests."), "{body}");
    // The duplicate after the restart is still recognised.
    let again = client
        .ok("turn/steer", json!({"session_id": id, "submission_id": "m1", "text": "Also check the tests."}))
        .await
        .unwrap();
    assert_eq!(again["duplicate"], true);
}

#[tokio::test]
async fn a_steer_during_the_final_answer_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("first answer").delay_first_byte(Duration::from_secs(2)));
    mock.push(Reply::text("answer to the steer"));
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "hi"})).await.unwrap();
    client.events_until("model_attempt_started").await.unwrap();
    client.ok("turn/steer", json!({"session_id": id, "submission_id": "m1", "text": "One more thing."})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(mock.requests().len(), 2, "the model was asked again with the message");
    let body = String::from_utf8_lossy(&mock.requests()[1].body).into_owned();
    assert!(body.contains("One more thing."));
}
