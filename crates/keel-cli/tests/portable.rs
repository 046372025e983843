//! Portable runs: forking a session at any journal point, exporting a run
//! as an archive and importing it elsewhere, replaying it, and showing any
//! point of it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use keel_testkit::{MockServer, Reply};
use serde_json::{Value, json};
use support::{Client, Keel};

/// Two turns: the first writes a file (a tool call), the second answers.
async fn two_turns(client: &mut Client, mock: &MockServer, session: &str) -> Vec<Value> {
    mock.push(Reply::tool_call("c1", "fs__write_file", r#"{"path":"plan.md","content":"step one"}"#));
    mock.push(Reply::text("wrote the plan"));
    mock.push(Reply::text("second answer"));
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    let mut events = Vec::new();
    for (id, text) in [("s1", "write the plan"), ("s2", "and now?")] {
        client.ok("turn/start", json!({"session_id": session, "submission_id": id, "text": text})).await.unwrap();
        events.extend(client.events_until("turn_finished").await.unwrap());
    }
    events
}

fn seq_of(events: &[Value], pick: impl Fn(&Value) -> bool) -> u64 {
    events.iter().find(|e| pick(e)).map(|e| e["seq"].as_u64().unwrap()).expect("event")
}

#[tokio::test]
async fn a_fork_starts_from_any_journal_point_and_goes_its_own_way() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    let keel = Keel::start(&dir.path().join("state"), &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    let events = two_turns(&mut client, &mock, &id).await;
    let original = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(original["history"].as_array().unwrap().len(), 6);

    // After the first turn: its four items, nothing of the second.
    let first_end = seq_of(&events, |e| e["kind"] == "turn_finished");
    let fork = client.ok("session/fork", json!({"session_id": id, "at_seq": first_end})).await.unwrap();
    let fork_id = fork["session"]["id"].as_str().unwrap().to_string();
    assert_ne!(fork_id, id);
    let forked = client.ok("session/get", json!({"session_id": fork_id})).await.unwrap();
    assert_eq!(forked["history"], json!(original["history"].as_array().unwrap()[..4]));
    assert!(forked["turn"].is_null());

    // The fork goes its own way; the original is untouched.
    mock.push(Reply::text("a different second answer"));
    client.ok("events/subscribe", json!({"session_id": fork_id})).await.unwrap();
    client
        .ok("turn/start", json!({"session_id": fork_id, "submission_id": "f1", "text": "try another way"}))
        .await
        .unwrap();
    let finished = client.events_until("turn_finished").await.unwrap();
    assert_eq!(finished.last().unwrap()["data"]["status"], "completed");
    let body = String::from_utf8_lossy(&mock.requests().last().unwrap().body).into_owned();
    assert!(body.contains("wrote the plan") && !body.contains("second answer"), "{body}");
    let after = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(after["history"], original["history"]);

    // In the middle of a tool call: the call gets an output saying so.
    let call_seq = seq_of(&events, |e| e["kind"] == "item_added" && e["data"]["item"]["type"] == "function_call");
    let mid = client.ok("session/fork", json!({"session_id": id, "at_seq": call_seq})).await.unwrap();
    let mid = client.ok("session/get", json!({"session_id": mid["session"]["id"]})).await.unwrap();
    let history = mid["history"].as_array().unwrap();
    assert_eq!(history.len(), 3);
    assert_eq!(history[2]["type"], "function_call_output");
    assert!(history[2]["output"].as_str().unwrap().contains("forked"));

    let outside = client.call("session/fork", json!({"session_id": id, "at_seq": 10_000})).await.unwrap().unwrap_err();
    assert_eq!(outside.code, -32602, "{}", outside.message);
}

fn keel_cli(state: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_keel")).arg("--state").arg(state).args(args).output().unwrap()
}

#[tokio::test]
async fn a_recorded_session_replays_to_the_same_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    let keel =
        Keel::start_with(&state, &mock.base_url(), &support::example_bundle(), &[("KEEL_RETRY_BASE_MS", "5")]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    // Turn 1: a retried request, an allowed write, and a command a person
    // approves; turn 2: a denied command.
    mock.push(Reply::openai_error(429, "rate_limit_exceeded", "slow down"));
    mock.push(Reply::tool_call("c1", "fs__write_file", r#"{"path":"plan.md","content":"step one"}"#));
    mock.push(Reply::tool_call("c2", "shell__run", r#"{"command":"touch done.txt"}"#));
    mock.push(Reply::text("all done"));
    mock.push(Reply::tool_call("c3", "shell__run", r#"{"command":"rm plan.md"}"#));
    mock.push(Reply::text("left it alone"));
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "plan it"})).await.unwrap();
    let waiting = client.events_until("turn_waiting").await.unwrap();
    let question = waiting.last().unwrap()["data"]["interaction_id"].clone();
    client
        .ok("interaction/respond", json!({"session_id": id, "interaction_id": question, "decision": "allow_once"}))
        .await
        .unwrap();
    client.events_until("turn_finished").await.unwrap();
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s2", "text": "clean up"})).await.unwrap();
    let waiting = client.events_until("turn_waiting").await.unwrap();
    let question = waiting.last().unwrap()["data"]["interaction_id"].clone();
    client
        .ok(
            "interaction/respond",
            json!({"session_id": id, "interaction_id": question, "decision": "deny", "message": "keep the plan"}),
        )
        .await
        .unwrap();
    client.events_until("turn_finished").await.unwrap();
    let requests_before = mock.requests().len();
    let files = |ws: &std::path::Path| -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(ws).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    };
    let before = files(&ws);
    assert_eq!(before, ["done.txt", "plan.md"], "the approved command ran, the denied one did not");

    let output = keel_cli(&state, &["replay", &id, "--json"]);
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&output.stderr)));
    assert!(output.status.success(), "{report:#}");
    assert_eq!(report["matched"], true);
    let turns = report["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2);
    assert!(turns.iter().all(|t| t["result"] == "matched"), "{report:#}");
    let calls = &turns[0]["recorded"]["calls"];
    assert_eq!(calls[0]["by"], "policy");
    assert_eq!(calls[1]["by"], "person");
    assert_eq!(turns[1]["recorded"]["calls"][0]["outcome"], "rejected");
    assert_eq!(mock.requests().len(), requests_before, "a replay sends nothing to the provider");
    assert_eq!(files(&ws), before, "a replay runs no tool");

    // A journal that says otherwise is caught.
    let db = rusqlite::Connection::open(state.join("runtime.sqlite3")).unwrap();
    db.execute(
        "UPDATE events SET data = json_set(data, '$.status', 'failed') WHERE session_id = ?1 AND kind = 'turn_finished' AND seq = (SELECT MAX(seq) FROM events WHERE session_id = ?1 AND kind = 'turn_finished')",
        [&id],
    )
    .unwrap();
    let output = keel_cli(&state, &["replay", &id]);
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(text.contains("mismatched") && text.contains("decisions differ"), "{text}");
}

#[tokio::test]
async fn an_exported_run_continues_in_another_state_directory_with_its_ownership_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    let keel = Keel::start(&state, &mock.base_url()).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    let events = two_turns(&mut client, &mock, &id).await;
    let original = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    let file = dir.path().join("run.keelarc");
    let exported = keel_cli(&state, &["export", &id, file.to_str().unwrap()]);
    assert!(exported.status.success(), "{}", String::from_utf8_lossy(&exported.stderr));
    let archive = keel_archive::Archive::read(&file).unwrap();
    assert_eq!(archive.header.session_id, id);
    assert_eq!(archive.header.machine_id, std::fs::read_to_string(state.join("machine-id")).unwrap().trim());
    assert_eq!(archive.fold().unwrap().history.len(), 6);
    let text = String::from_utf8_lossy(&std::fs::read(&file).unwrap()).into_owned();
    assert!(!text.contains("sk-test-key"), "no secret in the archive");

    // Every point can be shown; the first turn's end has its four items.
    let first_end = seq_of(&events, |e| e["kind"] == "turn_finished");
    let at = keel_cli(&state, &["show", &id, "--at", &first_end.to_string(), "--json"]);
    let point: Value = serde_json::from_slice(&at.stdout).unwrap();
    assert_eq!(point["history"].as_array().unwrap().len(), 4);
    assert_eq!(point["turns"][0]["status"], "completed");

    // Import into a fresh state directory, on "another machine".
    let other = dir.path().join("other");
    let other_ws = dir.path().join("other-ws");
    std::fs::create_dir_all(&other_ws).unwrap();
    let imported = keel_cli(&other, &["import", file.to_str().unwrap(), "--workspace", other_ws.to_str().unwrap()]);
    assert!(imported.status.success(), "{}", String::from_utf8_lossy(&imported.stderr));
    let mock2 = MockServer::start().await.unwrap();
    mock2.push(Reply::text("third answer, elsewhere"));
    let keel2 = Keel::start(&other, &mock2.base_url()).unwrap();
    let mut client2 = keel2.client().await.unwrap();
    let there = client2.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(there["history"], original["history"]);
    assert_eq!(there["last_seq"], original["last_seq"]);
    assert_eq!(there["session"]["usage"], original["session"]["usage"]);
    client2.ok("events/subscribe", json!({"session_id": id, "after_seq": there["last_seq"]})).await.unwrap();
    client2.ok("turn/start", json!({"session_id": id, "submission_id": "s3", "text": "go on"})).await.unwrap();
    let went_on = client2.events_until("turn_finished").await.unwrap();
    assert_eq!(went_on.first().unwrap()["kind"], "ownership_changed");
    assert_eq!(went_on.last().unwrap()["data"]["status"], "completed");
    let duplicate = client2
        .ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "write the plan"}))
        .await
        .unwrap();
    assert_eq!(duplicate["duplicate"], true, "submissions came along");
    let body = String::from_utf8_lossy(&mock2.requests()[0].body).into_owned();
    assert!(body.contains("second answer"), "the model sees the whole history");

    let again = dir.path().join("again.keelarc");
    let exported = keel_cli(&other, &["export", &id, again.to_str().unwrap()]);
    assert!(exported.status.success(), "{}", String::from_utf8_lossy(&exported.stderr));
    let archive = keel_archive::Archive::read(&again).unwrap();
    let owners = archive.owners();
    assert_eq!(owners.len(), 2, "{owners:?}");
    assert_eq!(owners[1].machine_id, std::fs::read_to_string(other.join("machine-id")).unwrap().trim());
    assert_ne!(owners[0].machine_id, owners[1].machine_id);
    assert_eq!(archive.fold().unwrap().history.len(), 8);

    // The same run replays from the archive.
    let replayed = keel_cli(&other, &["replay", again.to_str().unwrap()]);
    let report = String::from_utf8_lossy(&replayed.stdout).into_owned();
    assert!(replayed.status.success(), "{report}{}", String::from_utf8_lossy(&replayed.stderr));
    assert!(report.contains("every decision matches"), "{report}");

    // A torn tail: every complete record is still read.
    let bytes = std::fs::read(&again).unwrap();
    let torn = dir.path().join("torn.keelarc");
    std::fs::write(&torn, &bytes[..bytes.len() - 7]).unwrap();
    let shown = keel_cli(&other, &["show", torn.to_str().unwrap(), "--json"]);
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    assert!(String::from_utf8_lossy(&shown.stderr).contains("torn"));
    let point: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert!(point["history"].as_array().unwrap().len() >= 7);
    // A damaged middle is refused with its offset, not misread.
    let mut damaged = bytes.clone();
    damaged[40] ^= 0xff;
    let bad = dir.path().join("bad.keelarc");
    std::fs::write(&bad, &damaged).unwrap();
    let refused = keel_cli(&other, &["show", bad.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("offset")
            || String::from_utf8_lossy(&refused.stderr).contains("byte"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
