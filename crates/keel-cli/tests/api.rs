//! End-to-end tests of the JSON-RPC API: the real `keel serve` binary, a
//! real WebSocket connection, and a local server speaking the OpenAI Chat
//! Completions streaming format.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use keel_testkit::{MockServer, Reply};
use serde_json::{Value, json};
use support::Keel;

use support::workspace;

#[tokio::test]
async fn a_turn_writes_a_file_then_answers() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("call_1", "fs__write_file", r#"{"path":"notes/hello.txt","content":"Hello, keel"}"#));
    mock.push(Reply::text("I wrote notes/hello.txt."));
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let session = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    let started = client
        .ok("turn/start", json!({"session_id": session, "submission_id": "s1", "text": "Write a greeting"}))
        .await
        .unwrap();
    assert_eq!(started["duplicate"], false);
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "session_created",
            "turn_started",
            "item_added",
            "model_attempt_started",
            "model_attempt_finished",
            "item_added",
            "tool_call_intended",
            "tool_call_started",
            "tool_call_finished",
            "item_added",
            "model_attempt_started",
            "model_attempt_finished",
            "item_added",
            "turn_finished"
        ]
    );
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(std::fs::read_to_string(ws.join("notes/hello.txt")).unwrap(), "Hello, keel");

    let snapshot = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    assert_eq!(snapshot["turn"]["status"], "completed");
    assert_eq!(snapshot["turn"]["steps"], 2);
    let history = snapshot["history"].as_array().unwrap();
    let types: Vec<&str> = history.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["message", "function_call", "function_call_output", "message"]);
    assert_eq!(history[3]["content"][0]["text"], "I wrote notes/hello.txt.");
    assert_eq!(snapshot["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(snapshot["tool_calls"][0]["status"], "completed");
    assert!(snapshot["session"]["usage"]["input_tokens"].as_u64().unwrap() > 0);

    // What keel sent: the second request carries the tool result.
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1].json.clone().unwrap()["messages"].as_array().unwrap().clone();
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(messages[3]["role"], "tool");
    assert_eq!(messages[3]["tool_call_id"], "call_1");
    assert_eq!(requests[0].header("authorization"), Some("Bearer sk-test-key"));
}

#[tokio::test]
async fn a_duplicate_submission_returns_the_original_turn_and_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("first"));
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let session = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    let params = json!({"session_id": session, "submission_id": "same", "text": "hi"});
    let first = client.ok("turn/start", params.clone()).await.unwrap();
    client.events_until("turn_finished").await.unwrap();
    let again = client.ok("turn/start", params).await.unwrap();
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["turn_id"], first["turn_id"]);
    let snapshot = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    assert_eq!(snapshot["history"].as_array().unwrap().len(), 2);
    assert_eq!(mock.requests().len(), 1);
}

/// The window between a turn's end being journaled and its driver letting
/// go of the session, held open for 1.5 s (`KEEL_HOLD_AT=turn_finished`):
/// a submission that lands there is refused retryably and not recorded, and
/// the same submission id is accepted and run once the session is free. It
/// is never accepted and left without a driver.
#[tokio::test]
async fn a_submission_between_a_turns_end_and_its_release_is_refused_retryably_then_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("first"));
    let keel = Keel::start_with(
        &dir.path().join("state"),
        &mock.base_url(),
        &support::example_bundle(),
        &[("KEEL_HOLD_AT", "turn_finished:1500")],
    )
    .unwrap();
    let mut client = keel.client().await.unwrap();
    let session = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    client.ok("turn/start", json!({"session_id": session, "submission_id": "a", "text": "one"})).await.unwrap();
    // The turn's end is committed (and served) while its driver is held.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let snapshot = client.ok("session/get", json!({"session_id": session})).await.unwrap();
        if snapshot["turn"]["status"] == "completed" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the first turn never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Inside the held window.
    let refused = client
        .call("turn/start", json!({"session_id": session, "submission_id": "b", "text": "two"}))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code, -32002, "{}", refused.message);
    assert_eq!(refused.data["retryable"], true);
    assert!(refused.message.contains("still checkpointing"), "{}", refused.message);
    let snapshot = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    assert_eq!(snapshot["turn"]["submission_id"], "a", "b was not recorded");
    assert_eq!(snapshot["history"].as_array().unwrap().len(), 2);
    // Retrying the same submission until the window closes: accepted once,
    // and it runs to its end.
    mock.push(Reply::text("second"));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let accepted = loop {
        match client
            .call("turn/start", json!({"session_id": session, "submission_id": "b", "text": "two"}))
            .await
            .unwrap()
        {
            Ok(accepted) => break accepted,
            Err(e) => {
                assert_eq!(e.code, -32002, "{}", e.message);
                assert!(std::time::Instant::now() < deadline, "the session never became free");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(accepted["duplicate"], false);
    client.events_until("turn_finished").await.unwrap(); // the first turn's
    let events = client.events_until("turn_finished").await.unwrap();
    let last = events.last().unwrap();
    assert_eq!(last["data"]["turn_id"], accepted["turn_id"]);
    assert_eq!(last["data"]["status"], "completed");
    assert_eq!(mock.requests().len(), 2, "the accepted submission ran");
}

#[tokio::test]
async fn a_submission_while_a_turn_runs_is_refused_retryably_and_not_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("slow answer").delay_first_byte(Duration::from_secs(60)));
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let session = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    client.ok("turn/start", json!({"session_id": session, "submission_id": "a", "text": "one"})).await.unwrap();
    client.events_until("model_attempt_started").await.unwrap();
    // The slow reply must be taken by this turn's request, not the next one's.
    mock.wait_for_requests(1).await.unwrap();
    let refused = client
        .call("turn/start", json!({"session_id": session, "submission_id": "b", "text": "two"}))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code, -32002);
    assert_eq!(refused.data["retryable"], true);
    assert!(refused.message.contains("wait for it to finish"), "{}", refused.message);

    // Interrupting cancels at once, without waiting for the slow provider.
    let stopped = client.ok("turn/interrupt", json!({"session_id": session})).await.unwrap();
    assert_eq!(stopped["status"], "cancelled");
    let snapshot = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    assert_eq!(snapshot["attempts"][0]["status"], "abandoned");
    assert_eq!(snapshot["history"].as_array().unwrap().len(), 1, "the refused submission left nothing");
    // `b` was never recorded, so it is accepted now as a new turn.
    mock.push(Reply::text("two done"));
    let second =
        client.ok("turn/start", json!({"session_id": session, "submission_id": "b", "text": "two"})).await.unwrap();
    assert_eq!(second["duplicate"], false);
    client.events_until("turn_finished").await.unwrap();
    client.events_until("turn_finished").await.unwrap();
}

#[tokio::test]
async fn a_failed_event_insert_rolls_back_the_whole_change() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(&dir);
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    let keel = Keel::start(&state, &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let session = client.create_session(&ws).await.unwrap();
    let db = rusqlite::Connection::open(state.join("runtime.sqlite3")).unwrap();
    db.execute_batch(
        "CREATE TRIGGER fail_start BEFORE INSERT ON events WHEN NEW.kind='turn_started' BEGIN SELECT RAISE(ABORT,'x'); END;",
    )
    .unwrap();
    let before = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    let failure = client
        .call("turn/start", json!({"session_id": session, "submission_id": "s1", "text": "hello"}))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(failure.code, -32005);
    assert!(!failure.message.contains("RAISE"), "internals stay in the log: {}", failure.message);
    let after = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    assert_eq!(after, before, "what keel serves did not change");
    let on_disk = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(on_disk("SELECT COUNT(*) FROM submissions"), 0);
    assert_eq!(on_disk("SELECT COUNT(*) FROM turns"), 0);
    assert_eq!(on_disk("SELECT COUNT(*) FROM history"), 0);
    assert_eq!(on_disk("SELECT MAX(seq) FROM events"), 1);
    assert_eq!(on_disk("SELECT history_len FROM sessions"), 0);
    db.execute_batch("DROP TRIGGER fail_start").unwrap();
    mock.push(Reply::text("ok"));
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    let started =
        client.ok("turn/start", json!({"session_id": session, "submission_id": "s1", "text": "hello"})).await.unwrap();
    assert_eq!(started["duplicate"], false, "the refused submission was never recorded");
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events[1]["seq"], 2, "no seq was burnt by the rolled-back change");
}

#[tokio::test]
async fn malformed_requests_get_standard_errors_and_the_connection_survives() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start().await.unwrap();
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let cases: Vec<(&str, i64)> = vec![
        ("{not json", -32700),
        ("[]", -32600),
        ("42", -32600),
        (r#"{"jsonrpc":"1.0","id":1,"method":"session/list"}"#, -32600),
        (r#"{"jsonrpc":"2.0","id":{"x":1},"method":"session/list"}"#, -32600),
        (r#"{"jsonrpc":"2.0","id":2,"method":"no/such"}"#, -32601),
        (r#"{"jsonrpc":"2.0","id":3,"method":"turn/start","params":{"session_id":"x"}}"#, -32602),
        (r#"{"jsonrpc":"2.0","id":4,"method":"session/get","params":{"session_id":"x","extra":1}}"#, -32602),
        (r#"{"jsonrpc":"2.0","id":5,"method":"session/get","params":{"session_id":"ses_missing"}}"#, -32001),
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"session/create","params":{"name":"n","coworker":"nobody","workspace":"/tmp"}}"#,
            -32602,
        ),
    ];
    for (text, code) in cases {
        client.send_text(text).await.unwrap();
        let response = client.recv_response().await.unwrap();
        assert_eq!(response["error"]["code"], code, "{text} -> {response}");
        assert!(response["error"]["message"].as_str().unwrap().len() > 5);
    }
    // A notification gets no response; a batch gets one per request.
    client.send_text(r#"{"jsonrpc":"2.0","method":"session/list"}"#).await.unwrap();
    client
        .send_text(r#"[{"jsonrpc":"2.0","id":"a","method":"session/list"},{"jsonrpc":"2.0","method":"session/list"},{"jsonrpc":"2.0","id":"b","method":"bad"}]"#)
        .await
        .unwrap();
    let batch = client.recv_response().await.unwrap();
    let batch = batch.as_array().unwrap();
    assert_eq!(batch.len(), 2);
    assert_eq!(batch[0]["id"], "a");
    assert!(batch[0]["result"]["sessions"].is_array());
    assert_eq!(batch[1]["error"]["code"], -32601);
    assert!(client.ok("session/list", json!({})).await.unwrap()["sessions"].is_array());
}

#[tokio::test]
async fn the_websocket_refuses_clients_without_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start().await.unwrap();
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let wrong = support::Client::connect(&keel.url, "wrong-token").await;
    let message = format!("{:#}", wrong.err().expect("refused"));
    assert!(message.contains("401"), "{message}");
    let mode = std::fs::metadata(dir.path().join("state/token")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);
}

#[tokio::test]
async fn a_reconnecting_subscriber_misses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ws = workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let session = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": session, "after_seq": 0})).await.unwrap();
    mock.push(Reply::text("one"));
    client.ok("turn/start", json!({"session_id": session, "submission_id": "1", "text": "one"})).await.unwrap();
    let first = client.events_until("turn_finished").await.unwrap();
    let last_seen = first.last().unwrap()["seq"].as_u64().unwrap();
    drop(client);

    // While nobody listens, two more turns run.
    let mut other = keel.client().await.unwrap();
    other.ok("events/subscribe", json!({"session_id": session, "after_seq": last_seen})).await.unwrap();
    for n in 2..=3 {
        mock.push(Reply::tool_call(format!("c{n}"), "fs__list_dir", r#"{"path":"."}"#));
        mock.push(Reply::text("done"));
        other
            .ok("turn/start", json!({"session_id": session, "submission_id": n.to_string(), "text": "go"}))
            .await
            .unwrap();
        other.events_until("turn_finished").await.unwrap();
    }
    let mut client = keel.client().await.unwrap();
    client.ok("events/subscribe", json!({"session_id": session, "after_seq": last_seen})).await.unwrap();
    let mut rest = client.events_until("turn_finished").await.unwrap();
    rest.extend(client.events_until("turn_finished").await.unwrap());
    let seqs: Vec<u64> = rest.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    let expected: Vec<u64> = (last_seen + 1..=last_seen + seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "contiguous, no duplicates");
    let db = rusqlite::Connection::open(dir.path().join("state/runtime.sqlite3")).unwrap();
    let max: i64 = db.query_row("SELECT MAX(seq) FROM events", [], |r| r.get(0)).unwrap();
    assert_eq!(*seqs.last().unwrap(), max as u64, "everything in the journal arrived");
    let all: Vec<Value> = first.into_iter().chain(rest).collect();
    assert_eq!(all.iter().filter(|e| e["kind"] == "turn_finished").count(), 3);
    let ahead = client
        .call("events/subscribe", json!({"session_id": session, "after_seq": max + 5}))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(ahead.code, -32602);
}

/// A workspace inside the state directory would hand a coworker's tools
/// every session's scratch space (HOME, TMPDIR), the journal and the token:
/// refused, like a workspace that contains the state directory. A sibling
/// folder is the positive control.
#[tokio::test]
async fn a_workspace_inside_the_state_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let keel = Keel::start(&state, "http://127.0.0.1:9/v1").unwrap();
    let mut client = keel.client().await.unwrap();
    for inside in [state.join("scratch"), state.join("builtin"), state.clone(), dir.path().to_path_buf()] {
        std::fs::create_dir_all(&inside).unwrap();
        let refused = client
            .call("session/create", json!({"name": "x", "coworker": "assistant-example", "workspace": inside}))
            .await
            .unwrap()
            .unwrap_err();
        assert_eq!(refused.code, -32602, "{}: {}", inside.display(), refused.message);
        assert!(refused.message.contains("state directory"), "{}", refused.message);
    }
    let sibling = workspace(&dir);
    client.create_session(&sibling).await.unwrap();
}

/// The state directory is the owner's alone: the directory 0700, the
/// database, its WAL and the token 0600, whatever the umask.
#[tokio::test]
async fn the_state_directory_and_its_files_are_the_owners_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("hi"));
    let keel = Keel::start(&state, &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let session = client.create_session(&workspace(&dir)).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    client.ok("turn/start", json!({"session_id": session, "submission_id": "a", "text": "one"})).await.unwrap();
    client.events_until("turn_finished").await.unwrap();
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state), 0o700, "state directory");
    for file in ["runtime.sqlite3", "runtime.sqlite3-wal", "token", "keel.lock", "machine-id"] {
        let path = state.join(file);
        assert!(path.exists(), "{file}");
        assert_eq!(mode(&path), 0o600, "{file}");
    }
}

/// A turn text over the limit is refused with the limit named and nothing
/// recorded; one at the limit is accepted (the positive control).
#[tokio::test]
async fn a_turn_text_over_the_limit_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("read it"));
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let session = client.create_session(&workspace(&dir)).await.unwrap();
    let limit = 1024 * 1024;
    let refused = client
        .call("turn/start", json!({"session_id": session, "submission_id": "big", "text": "x".repeat(limit + 1)}))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code, -32602);
    assert!(refused.message.contains(&format!("limit of {limit} bytes")), "{}", refused.message);
    let snapshot = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    assert_eq!(snapshot["history"], json!([]));
    assert!(snapshot["turn"].is_null());
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    client
        .ok("turn/start", json!({"session_id": session, "submission_id": "fits", "text": "x".repeat(limit)}))
        .await
        .unwrap();
    client.events_until("turn_finished").await.unwrap();
}

/// A JSON-RPC batch over the cap is refused whole with the cap named, and
/// the connection goes on.
#[tokio::test]
async fn a_batch_over_the_cap_is_refused_whole() {
    let dir = tempfile::tempdir().unwrap();
    let keel = Keel::start(&dir.path().join("state"), "http://127.0.0.1:9/v1").unwrap();
    let mut client = keel.client().await.unwrap();
    let one = json!({"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}});
    client.send_text(&Value::Array(vec![one; 101]).to_string()).await.unwrap();
    let reply = client.recv_response().await.unwrap();
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert!(reply["error"]["message"].as_str().unwrap().contains("limit of 100"), "{reply}");
    client.ok("session/list", json!({})).await.unwrap();
}
