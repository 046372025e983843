//! `keel audit` beside a running `keel serve`: who let each call run, how it
//! ended, in which sandbox, and no secret the model put in its arguments or
//! a tool put in its output.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use keel_testkit::{MockServer, Reply, ToolCall};
use serde_json::{Value, json};
use support::Keel;

const SK: &str = "sk-ant-REDACTME0123456789abcdefghij";
const GHP: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";

fn bundle(dir: &Path) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("keel.toml"),
        "[coworkers.w]\nmodel = \"openai-chat:m\"\ninstructions = \"Work.\"\ntools = [\"shell.run\", \"fs.write_file\"]\npolicies = { \"shell.run\" = { allow_commands = [\"echo\"] } }\n",
    )
    .unwrap();
    bundle
}

/// `keel --state <state> audit <args…>`: its stdout, after checking it
/// succeeded.
fn keel_audit(state: &Path, args: &[&str]) -> String {
    let output =
        Command::new(env!("CARGO_BIN_EXE_keel")).arg("--state").arg(state).arg("audit").args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "keel audit {args:?} failed: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn the_audit_shows_who_decided_each_call_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_calls([ToolCall::new(
        "c1",
        "shell__run",
        json!({"command": format!("echo {SK}")}).to_string(),
    )]));
    mock.push(Reply::tool_calls([ToolCall::new(
        "c2",
        "fs__write_file",
        json!({"path": "a.txt", "content": format!("token {GHP}")}).to_string(),
    )]));
    mock.push(Reply::text("done"));
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle(dir.path()), &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let created = client
        .ok("session/create", json!({"name": "audited", "coworker": "w", "workspace": ws, "attended": true}))
        .await
        .unwrap();
    let id = created["session"]["id"].as_str().unwrap().to_string();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "go"})).await.unwrap();
    let events = client.events_until("turn_waiting").await.unwrap();
    let asked = events.iter().find(|e| e["kind"] == "interaction_requested").unwrap();
    let interaction = asked["data"]["interaction"]["id"].clone();
    client
        .ok("interaction/respond", json!({"session_id": id, "interaction_id": interaction, "decision": "allow_once"}))
        .await
        .unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), format!("token {GHP}"));

    // Beside the running server, read-only.
    let json_out = keel_audit(&state, &[&id, "--json"]);
    let entries: Vec<Value> = serde_json::from_str(&json_out).unwrap();
    assert_eq!(entries.len(), 2, "{json_out}");
    let (shell, write) = (&entries[0], &entries[1]);
    assert_eq!(shell["call_id"], "c1");
    assert_eq!(shell["tool"], "shell.run");
    assert_eq!(shell["outcome"], "completed");
    assert_eq!(shell["decided_by"]["by"], "policy");
    assert_eq!(shell["decided_by"]["rule"], "allow_commands: \"echo\"");
    assert!(shell["confinement"]["filesystem"].as_str().unwrap().starts_with("landlock-v"), "{shell}");
    assert_eq!(shell["arguments"], json!({"command": "echo [redacted]"}));
    assert!(shell["result_preview"].as_str().unwrap().contains("[redacted]"), "{shell}");
    assert_eq!(write["call_id"], "c2");
    assert_eq!(write["tool"], "fs.write_file");
    assert_eq!(write["outcome"], "completed");
    assert_eq!(write["decided_by"]["by"], "person");
    assert_eq!(write["decided_by"]["decision"], "allow_once");
    assert_eq!(write["decided_by"]["interaction_id"], interaction);
    assert_eq!(write["arguments"], json!({"path": "a.txt", "content": "token [redacted]"}));
    assert!(!write["result_preview"].as_str().unwrap().is_empty(), "{write}");
    assert!(shell["seq"].as_u64() < write["seq"].as_u64());

    let human = keel_audit(&state, &["audited"]);
    let lines: Vec<&str> = human.lines().collect();
    assert_eq!(lines.len(), 2, "{human}");
    assert!(lines[0].contains("shell.run") && lines[0].contains("completed"), "{human}");
    assert!(lines[0].contains("policy allow_commands: \"echo\"") && lines[0].contains("landlock-v"), "{human}");
    assert!(lines[0].contains(r#"{"command":"echo [redacted]"}"#), "{human}");
    assert!(lines[1].contains("fs.write_file") && lines[1].contains("person allow_once"), "{human}");

    let by_person = keel_audit(&state, &[&id, "--json", "--by", "person"]);
    let by_person: Vec<Value> = serde_json::from_str(&by_person).unwrap();
    assert_eq!(by_person.len(), 1);
    assert_eq!(by_person[0]["call_id"], "c2");
    let fs_only: Vec<Value> = serde_json::from_str(&keel_audit(&state, &[&id, "--json", "--tool", "fs.*"])).unwrap();
    assert_eq!(fs_only.len(), 1);
    let rejected: Vec<Value> =
        serde_json::from_str(&keel_audit(&state, &[&id, "--json", "--outcome", "rejected"])).unwrap();
    assert!(rejected.is_empty());

    for output in [&json_out, &human] {
        assert!(!output.contains(SK) && !output.contains("REDACTME"), "the Anthropic key leaked: {output}");
        assert!(!output.contains(GHP) && !output.contains("ghp_"), "the GitHub token leaked: {output}");
    }

    // A wrong filter is a usage error, named as such.
    let bad = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--state")
        .arg(&state)
        .args(["audit", &id, "--outcome", "later"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown outcome"), "{bad:?}");
}
