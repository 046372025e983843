//! People in the loop, through a real `keel serve`: policies, approvals,
//! grants, expiry, restarts while waiting, and answers that race.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};

use keel_testkit::{MockServer, Reply};
use serde_json::{Value, json};
use support::{Client, Keel};

/// A bundle with coworker `w` (shell and file tools) and `policies`/extra
/// coworker lines.
fn bundle(dir: &Path, coworker_extra: &str) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("keel.toml"),
        format!(
            "[coworkers.w]\nmodel = \"openai-chat:m\"\ninstructions = \"Work.\"\ntools = [\"shell.run\", \"fs.write_file\", \"fs.read_file\"]\n{coworker_extra}\n"
        ),
    )
    .unwrap();
    bundle
}

async fn session(client: &mut Client, workspace: &Path, attended: bool) -> String {
    let created = client
        .ok("session/create", json!({"name": "a", "coworker": "w", "workspace": workspace, "attended": attended}))
        .await
        .unwrap();
    let id = created["session"]["id"].as_str().unwrap().to_string();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    id
}

fn shell(call_id: &str, command: &str) -> Reply {
    Reply::tool_call(call_id, "shell__run", json!({ "command": command }).to_string())
}

fn outputs(snapshot: &Value) -> Vec<String> {
    snapshot["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].as_str().unwrap().to_string())
        .collect()
}

async fn start(client: &mut Client, id: &str, submission: &str) {
    client.ok("turn/start", json!({"session_id": id, "submission_id": submission, "text": "go"})).await.unwrap();
}

async fn respond(client: &mut Client, id: &str, interaction: &str, decision: &str) -> Value {
    client
        .ok("interaction/respond", json!({"session_id": id, "interaction_id": interaction, "decision": decision}))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_risky_call_waits_for_a_person_and_runs_once_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(shell("c1", "echo ran >> effects.txt"));
    mock.push(Reply::text("done"));
    let keel = Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle(dir.path(), ""), &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws, true).await;
    start(&mut client, &id, "s1").await;
    let events = client.events_until("turn_waiting").await.unwrap();
    let asked = events.iter().find(|e| e["kind"] == "interaction_requested").unwrap();
    let interaction = &asked["data"]["interaction"];
    assert_eq!(interaction["request"]["tool"], "shell.run");
    assert_eq!(interaction["request"]["arguments"], r#"{"command":"echo ran >> effects.txt"}"#);
    assert!(interaction["request"]["reason"].as_str().unwrap().contains("side-effecting"), "{interaction}");
    for digest in ["bundle", "tool", "tool_policy", "resource_policy"] {
        assert!(interaction["request"]["digests"][digest].as_str().unwrap().starts_with("sha256:"), "{digest}");
    }
    assert!(!ws.join("effects.txt").exists(), "nothing ran before the answer");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(snapshot["turn"]["status"], "waiting");
    let inbox = client.ok("inbox/list", json!({})).await.unwrap();
    assert_eq!(inbox["interactions"][0]["id"], interaction["id"]);
    let applied = respond(&mut client, &id, interaction["id"].as_str().unwrap(), "allow_once").await;
    assert_eq!(applied["status"], "applied");
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let intended = events.iter().find(|e| e["kind"] == "tool_call_intended").unwrap();
    assert_eq!(intended["data"]["decided_by"]["by"], "person");
    assert_eq!(std::fs::read_to_string(ws.join("effects.txt")).unwrap(), "ran\n");
    // The first answer stands.
    let again = client
        .call("interaction/respond", json!({"session_id": id, "interaction_id": interaction["id"], "decision": "deny"}))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(again.code, -32003);
    assert!(again.message.contains("already answered"), "{}", again.message);
    assert!(client.ok("inbox/list", json!({})).await.unwrap()["interactions"].as_array().unwrap().is_empty());
    // The audit says a person let it run, and how it was confined.
    let audit = client.ok("audit/list", json!({"session_id": id, "decided_by": "person"})).await.unwrap();
    let entry = &audit["entries"][0];
    assert_eq!(entry["tool"], "shell.run");
    assert_eq!(entry["outcome"], "completed");
    assert!(entry["confinement"]["filesystem"].as_str().unwrap().starts_with("landlock"), "{entry}");
}

#[tokio::test]
async fn deny_tells_the_model_and_policies_allow_deny_and_never_match_operators() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    // Allowed by rule, denied by policy, operator sneaks past the rule: asked.
    mock.push(Reply::tool_calls([
        keel_testkit::ToolCall::new("c1", "shell__run", r#"{"command": "ls -a"}"#),
        keel_testkit::ToolCall::new("c2", "fs__write_file", r#"{"path": "x.txt", "content": "no"}"#),
        keel_testkit::ToolCall::new("c3", "shell__run", r#"{"command": "ls; touch pwned"}"#),
    ]));
    mock.push(Reply::text("done"));
    let policies = r#"policies = { "shell.run" = { allow_commands = ["ls"] }, "fs.write_file" = "deny" }"#;
    let keel =
        Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle(dir.path(), policies), &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws, false).await;
    start(&mut client, &id, "s1").await;
    let events = client.events_until("turn_waiting").await.unwrap();
    let interaction =
        events.iter().find(|e| e["kind"] == "interaction_requested").unwrap()["data"]["interaction"].clone();
    assert_eq!(interaction["request"]["call_id"], "c3");
    assert!(interaction["request"]["reason"].as_str().unwrap().contains("`;`"), "{interaction}");
    let unattended = client.ok("inbox/list", json!({"unattended_only": true})).await.unwrap();
    assert_eq!(unattended["interactions"].as_array().unwrap().len(), 1);
    client
        .ok(
            "interaction/respond",
            json!({"session_id": id, "interaction_id": interaction["id"], "decision": "deny", "message": "no chained commands"}),
        )
        .await
        .unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    let outputs = outputs(&snapshot);
    assert!(outputs[0].contains("exit_code\":0"), "ls ran by rule: {}", outputs[0]);
    assert!(outputs[1].contains("the policy denies it"), "{}", outputs[1]);
    assert!(outputs[2].contains("a person denied it: no chained commands"), "{}", outputs[2]);
    assert!(!ws.join("pwned").exists() && !ws.join("x.txt").exists());
    // The model read the refusals in the next request.
    let last = String::from_utf8_lossy(&mock.requests().last().unwrap().body).into_owned();
    assert!(last.contains("no chained commands"));
}

#[tokio::test]
async fn a_grant_lasts_for_the_session_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let bundle = bundle(dir.path(), "");
    let mock = MockServer::start().await.unwrap();
    mock.push(shell("c1", "echo one >> effects.txt"));
    mock.push(Reply::text("done"));
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws, true).await;
    start(&mut client, &id, "s1").await;
    let events = client.events_until("turn_waiting").await.unwrap();
    let interaction =
        events.iter().find(|e| e["kind"] == "interaction_requested").unwrap()["data"]["interaction"]["id"].clone();
    respond(&mut client, &id, interaction.as_str().unwrap(), "allow_for_session").await;
    client.events_until("turn_finished").await.unwrap();
    drop(client);
    keel.kill();
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let seen = client.ok("session/get", json!({"session_id": id})).await.unwrap()["last_seq"].clone();
    client.ok("events/subscribe", json!({"session_id": id, "after_seq": seen})).await.unwrap();
    mock.push(shell("c2", "echo two >> effects.txt"));
    mock.push(Reply::text("done again"));
    start(&mut client, &id, "s2").await;
    let events = client.events_until("turn_finished").await.unwrap();
    assert!(events.iter().all(|e| e["kind"] != "interaction_requested"), "the grant answered");
    let intended = events.iter().rfind(|e| e["kind"] == "tool_call_intended").unwrap();
    assert_eq!(intended["data"]["decided_by"]["by"], "grant");
    assert_eq!(std::fs::read_to_string(ws.join("effects.txt")).unwrap(), "one\ntwo\n");
}

#[tokio::test]
async fn a_pending_question_survives_a_kill_and_the_turn_continues_after_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let bundle = bundle(dir.path(), "");
    let mock = MockServer::start().await.unwrap();
    mock.push(shell("c1", "echo ran >> effects.txt"));
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws, false).await;
    start(&mut client, &id, "s1").await;
    let events = client.events_until("turn_waiting").await.unwrap();
    let before = events.iter().find(|e| e["kind"] == "interaction_requested").unwrap()["data"]["interaction"].clone();
    drop(client);
    keel.kill();
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(snapshot["turn"]["status"], "recoverable");
    let inbox = client.ok("inbox/list", json!({})).await.unwrap();
    assert_eq!(inbox["interactions"][0], before, "same id, same content");
    let refused = client.call("turn/resume", json!({"session_id": id})).await.unwrap().unwrap_err();
    assert!(refused.message.contains("waits for a person"), "{}", refused.message);
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    mock.push(Reply::text("done"));
    respond(&mut client, &id, before["id"].as_str().unwrap(), "allow_once").await;
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(std::fs::read_to_string(ws.join("effects.txt")).unwrap(), "ran\n");
}

#[tokio::test]
async fn a_changed_policy_makes_keel_ask_again_instead_of_acting() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(shell("c1", "echo ran >> effects.txt"));
    mock.push(Reply::text("done"));
    let bundle = bundle(dir.path(), "");
    let keel = Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws, true).await;
    start(&mut client, &id, "s1").await;
    let events = client.events_until("turn_waiting").await.unwrap();
    let first = events.iter().find(|e| e["kind"] == "interaction_requested").unwrap()["data"]["interaction"].clone();
    // The person edits the policy and upgrades the session while it waits.
    let toml = std::fs::read_to_string(bundle.join("keel.toml")).unwrap();
    std::fs::write(
        bundle.join("keel.toml"),
        toml.replace("Work.", "Work.\\nBe careful.") + "approval_timeout_secs = 3600\n",
    )
    .unwrap();
    client.ok("session/upgrade", json!({"session_id": id})).await.unwrap();
    let outcome = respond(&mut client, &id, first["id"].as_str().unwrap(), "allow_once").await;
    assert_eq!(outcome["status"], "reasked");
    let second = outcome["interaction"].clone();
    assert_ne!(second["id"], first["id"]);
    assert_ne!(second["request"]["digests"]["bundle"], first["request"]["digests"]["bundle"]);
    assert!(!ws.join("effects.txt").exists(), "the stale answer did nothing");
    let stale = client
        .call("interaction/respond", json!({"session_id": id, "interaction_id": first["id"], "decision": "allow_once"}))
        .await
        .unwrap()
        .unwrap_err();
    assert!(stale.message.contains("asked again"), "{}", stale.message);
    respond(&mut client, &id, second["id"].as_str().unwrap(), "allow_once").await;
    client.events_until("turn_finished").await.unwrap();
    assert_eq!(std::fs::read_to_string(ws.join("effects.txt")).unwrap(), "ran\n");
}

#[tokio::test]
async fn two_answers_at_once_apply_exactly_one() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(shell("c1", "echo ran >> effects.txt"));
    mock.push(Reply::text("done"));
    let keel = Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle(dir.path(), ""), &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let mut other = keel.client().await.unwrap();
    let id = session(&mut client, &ws, true).await;
    start(&mut client, &id, "s1").await;
    let events = client.events_until("turn_waiting").await.unwrap();
    let interaction =
        events.iter().find(|e| e["kind"] == "interaction_requested").unwrap()["data"]["interaction"]["id"].clone();
    let allow = json!({"session_id": id, "interaction_id": interaction, "decision": "allow_once"});
    let deny = json!({"session_id": id, "interaction_id": interaction, "decision": "deny"});
    let (a, b) = tokio::join!(client.call("interaction/respond", allow), other.call("interaction/respond", deny));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!([a.is_ok(), b.is_ok()].iter().filter(|ok| **ok).count(), 1, "{a:?} {b:?}");
    let loser = a.err().or(b.err()).unwrap();
    assert_eq!(loser.code, -32003);
    client.events_until("turn_finished").await.unwrap();
}

#[tokio::test]
async fn an_unanswered_question_expires_as_denied_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(shell("c1", "echo ran >> effects.txt"));
    mock.push(Reply::text("done"));
    let keel = Keel::start_with(
        &dir.path().join("state"),
        &mock.base_url(),
        &bundle(dir.path(), "approval_timeout_secs = 1"),
        &[],
    )
    .unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws, false).await;
    start(&mut client, &id, "s1").await;
    let events = client.events_until("turn_finished").await.unwrap();
    let answered = events.iter().find(|e| e["kind"] == "interaction_answered").unwrap();
    assert_eq!(answered["data"]["status"], "expired");
    assert_eq!(answered["data"]["decision"]["by"], "keel");
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(outputs(&snapshot)[0].contains("in time"), "{:?}", outputs(&snapshot));
    assert!(!ws.join("effects.txt").exists());
    let late = client
        .call(
            "interaction/respond",
            json!({"session_id": id, "interaction_id": answered["data"]["interaction_id"], "decision": "allow_once"}),
        )
        .await
        .unwrap()
        .unwrap_err();
    assert!(late.message.contains("expired"), "{}", late.message);
}

fn keel_cli(state: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_keel")).arg("--state").arg(state).args(args).output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_the_inbox_and_answers_through_the_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    mock.push(shell("c1", "echo first >> effects.txt"));
    mock.push(shell("c2", "echo second >> effects.txt"));
    mock.push(Reply::text("done"));
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle(dir.path(), ""), &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws, false).await;
    start(&mut client, &id, "s1").await;
    client.events_until("turn_waiting").await.unwrap();
    let inbox = keel_cli(&state, &["inbox", "--json"]);
    assert!(inbox.status.success(), "{}", String::from_utf8_lossy(&inbox.stderr));
    let pending: Value = serde_json::from_slice(&inbox.stdout).unwrap();
    let first = pending[0]["id"].as_str().unwrap().to_string();
    let human = String::from_utf8_lossy(&keel_cli(&state, &["inbox"]).stdout).into_owned();
    assert!(human.contains(&first) && human.contains("shell.run"), "{human}");
    let approved = keel_cli(&state, &["approve", &id, &first]);
    assert!(approved.status.success(), "{}", String::from_utf8_lossy(&approved.stderr));
    // The second call asks again (allow_once is not a grant); deny it.
    let events = client.events_until("turn_waiting").await.unwrap();
    let second = events.iter().rfind(|e| e["kind"] == "interaction_requested").unwrap()["data"]["interaction"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(second, first);
    let denied = keel_cli(&state, &["deny", &id, &second, "--message", "once is enough"]);
    assert!(denied.status.success(), "{}", String::from_utf8_lossy(&denied.stderr));
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(std::fs::read_to_string(ws.join("effects.txt")).unwrap(), "first\n");
    // Answering twice from the CLI fails clearly.
    let twice = keel_cli(&state, &["approve", &id, &first]);
    assert!(!twice.status.success());
    assert!(String::from_utf8_lossy(&twice.stderr).contains("already answered"));
    // No running turn to message.
    let msg = keel_cli(&state, &["msg", &id, "hello"]);
    assert!(!msg.status.success());
    assert!(String::from_utf8_lossy(&msg.stderr).contains("no unfinished turn"));
}

#[tokio::test]
async fn taint_stops_an_outbound_call_after_a_private_read() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    std::fs::write(ws.join("salaries.txt"), "alice 100").unwrap();
    let mock = MockServer::start().await.unwrap();
    mock.push(shell("c1", "echo before"));
    mock.push(Reply::tool_call("c2", "fs__read_file", r#"{"path": "salaries.txt"}"#));
    mock.push(shell("c3", "echo after"));
    mock.push(Reply::text("done"));
    let taint = r#"policies = { "shell.run" = "allow" }

[coworkers.w.taint]
sources = { "fs.read_file" = "private" }
outbound = { "shell.run" = "internal" }
on_violation = "ask""#;
    let keel = Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle(dir.path(), taint), &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws, true).await;
    start(&mut client, &id, "s1").await;
    let events = client.events_until("turn_waiting").await.unwrap();
    // Before the private read the outbound call ran, and that was journaled.
    let first = events.iter().find(|e| e["kind"] == "tool_call_intended").unwrap();
    assert_eq!(first["data"]["decided_by"]["taint"]["violation"], false);
    let asked = events.iter().find(|e| e["kind"] == "interaction_requested").unwrap()["data"]["interaction"].clone();
    assert_eq!(asked["request"]["call_id"], "c3");
    let reason = asked["request"]["reason"].as_str().unwrap();
    assert!(reason.contains("taint: the context holds private data"), "{reason}");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(snapshot["session"]["labels"].as_object().unwrap().values().any(|l| l == "private"), "{snapshot}");
    client
        .ok(
            "interaction/respond",
            json!({"session_id": id, "interaction_id": asked["id"], "decision": "deny", "message": "private data stays here"}),
        )
        .await
        .unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(outputs(&snapshot)[2].contains("private data stays here"));
}

#[tokio::test]
async fn taint_can_deny_outright() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    std::fs::write(ws.join("salaries.txt"), "alice 100").unwrap();
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "fs__read_file", r#"{"path": "salaries.txt"}"#));
    mock.push(shell("c2", "echo leak"));
    mock.push(Reply::text("done"));
    let taint = r#"policies = { "shell.run" = "allow" }

[coworkers.w.taint]
sources = { "fs.*" = "private" }
outbound = { "shell.run" = "public" }
on_violation = "deny""#;
    let keel = Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle(dir.path(), taint), &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws, false).await;
    start(&mut client, &id, "s1").await;
    let events = client.events_until("turn_finished").await.unwrap();
    assert!(events.iter().all(|e| e["kind"] != "interaction_requested"));
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(outputs(&snapshot)[1].contains("denied by taint tracking"), "{:?}", outputs(&snapshot));
}

/// Questions a turn leaves unanswered are withdrawn when it ends: the
/// `turn_finished` event lists them, the inbox drops them, the snapshot
/// shows them withdrawn, and a late answer is refused. Both while keel runs
/// and for a turn cancelled after a restart.
#[tokio::test]
async fn questions_of_a_cancelled_turn_are_withdrawn_in_the_journal_and_the_inbox() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let bundle = bundle(dir.path(), "");
    let mock = MockServer::start().await.unwrap();
    mock.push(shell("c1", "echo one >> effects.txt"));
    mock.push(shell("c2", "echo two >> effects.txt"));
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws, true).await;

    async fn pending_id(client: &mut Client, id: &str) -> String {
        let events = client.events_until("turn_waiting").await.unwrap();
        let asked = events.iter().find(|e| e["kind"] == "interaction_requested").unwrap();
        let question = asked["data"]["interaction"]["id"].as_str().unwrap().to_string();
        let inbox = client.ok("inbox/list", json!({"session_id": id})).await.unwrap();
        assert_eq!(inbox["interactions"][0]["id"], question.as_str());
        question
    }
    async fn check_withdrawn(client: &mut Client, id: &str, question: &str, finished: &Value) {
        assert_eq!(finished["data"]["status"], "cancelled");
        assert_eq!(finished["data"]["withdrawn"], json!([question]), "{finished}");
        let inbox = client.ok("inbox/list", json!({"session_id": id})).await.unwrap();
        assert_eq!(inbox["interactions"], json!([]), "gone from the inbox");
        let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
        let record = snapshot["interactions"].as_array().unwrap().iter().find(|i| i["id"] == question).unwrap();
        assert_eq!(record["status"], "withdrawn");
        let late = client
            .call(
                "interaction/respond",
                json!({"session_id": id, "interaction_id": question, "decision": "allow_once"}),
            )
            .await
            .unwrap()
            .unwrap_err();
        assert!(late.message.contains("withdrawn"), "{}", late.message);
    }

    // Cancelled while keel waits on the question.
    start(&mut client, &id, "s1").await;
    let question = pending_id(&mut client, &id).await;
    client.ok("turn/interrupt", json!({"session_id": id})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    check_withdrawn(&mut client, &id, &question, events.last().unwrap()).await;

    // Cancelled after a restart left the turn recoverable with its question.
    start(&mut client, &id, "s2").await;
    let question = pending_id(&mut client, &id).await;
    drop(client);
    keel.kill();
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert_eq!(snapshot["turn"]["status"], "recoverable");
    client.ok("events/subscribe", json!({"session_id": id, "after_seq": snapshot["last_seq"]})).await.unwrap();
    client.ok("turn/interrupt", json!({"session_id": id})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    check_withdrawn(&mut client, &id, &question, events.last().unwrap()).await;
    assert!(!ws.join("effects.txt").exists(), "nothing ran");
}
