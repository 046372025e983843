//! Tools through a real `keel serve`: built-ins in the sandboxed runner,
//! and a real MCP server from npm, driven by a scripted model.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keel_testkit::{MockServer, Reply};
use serde_json::{Value, json};
use support::{Client, Keel};

use keel_testkit::mcp_servers::everything_js;

/// These tests are about tools, not approvals: every tool is allowed.
const ALLOW_ALL: &str = r#"policies = { "shell.run" = "allow", "fs.write_file" = "allow", "everything.*" = "allow", "remote.*" = "allow" }"#;

/// A bundle with coworker `w` on the mock's chat API, listing `tools`, plus
/// extra TOML (MCP servers).
fn bundle(dir: &Path, tools: &str, extra: &str) -> PathBuf {
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("keel.toml"),
        format!(
            "[coworkers.w]\nmodel = \"openai-chat:m\"\ninstructions = \"Work.\"\ntools = [{tools}]\n{ALLOW_ALL}\n{extra}"
        ),
    )
    .unwrap();
    bundle
}

async fn session(client: &mut Client, workspace: &Path) -> String {
    let created =
        client.ok("session/create", json!({"name": "t", "coworker": "w", "workspace": workspace})).await.unwrap();
    let id = created["session"]["id"].as_str().unwrap().to_string();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    id
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

/// Processes whose command line holds `marker`, after up to 5 s for the
/// kernel to finish killing a tree.
fn leftovers(marker: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| {
                std::fs::read(e.path().join("cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
            })
            .count();
        if n == 0 || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn shell_commands_run_sandboxed_and_the_journal_records_the_confinement() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    let command = format!("echo made > made.txt; cat '{}/token'; env", state.display());
    mock.push(Reply::tool_call("c1", "shell__run", json!({ "command": command }).to_string()));
    mock.push(Reply::text("done"));
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle(dir.path(), "\"shell.run\"", ""), &[]).unwrap();
    let token = keel.token().unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws).await;
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "go"})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(std::fs::read_to_string(ws.join("made.txt")).unwrap(), "made\n");
    let started = events.iter().find(|e| e["kind"] == "tool_call_started").unwrap();
    assert_eq!(started["data"]["tool"], "shell.run");
    let finished = events.iter().find(|e| e["kind"] == "tool_call_finished").unwrap();
    let sandbox = &finished["data"]["sandbox"];
    assert!(sandbox["filesystem"].as_str().unwrap().starts_with("landlock-v"), "{finished}");
    assert_eq!(sandbox["network"], "isolated");
    assert_eq!(sandbox["environment"], "clean");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    let output: Value = serde_json::from_str(&outputs(&snapshot)[0]).unwrap();
    assert!(output["stderr"].as_str().unwrap().contains("Permission denied"), "{output}");
    let stdout = output["stdout"].as_str().unwrap();
    assert!(!stdout.contains(&token), "the keel token stayed out of reach");
    assert!(!stdout.contains("sk-test-key") && !stdout.contains("OPENAI"), "keel's keys stayed out: {stdout}");
}

#[tokio::test]
async fn interrupting_a_turn_kills_the_command_it_was_running() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "shell__run", r#"{"command": "sleep 300 & sleep 301 # interrupt-marker-5d1"}"#));
    let keel =
        Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle(dir.path(), "\"shell.run\"", ""), &[])
            .unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws).await;
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "go"})).await.unwrap();
    client.events_until("tool_call_started").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while leftovers_now("interrupt-marker-5d1") < 2 {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stopped = client.ok("turn/interrupt", json!({"session_id": id})).await.unwrap();
    assert_eq!(stopped["status"], "cancelled");
    assert_eq!(leftovers("interrupt-marker-5d1"), 0, "the command and its background child died with the turn");
}

fn leftovers_now(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker)))
        .count()
}

#[tokio::test]
async fn a_real_mcp_server_is_called_through_a_turn_and_its_images_stay_out_of_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "everything__echo", r#"{"message": "hello from keel"}"#));
    mock.push(Reply::tool_call("c2", "everything__get-tiny-image", "{}"));
    mock.push(Reply::tool_call("c3", "everything__echo", r#"{"wrong": 1}"#));
    mock.push(Reply::text("done"));
    let extra = format!("[mcp_servers.everything]\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\n", everything_js());
    let bundle = bundle(dir.path(), "\"everything.*\"", &extra);
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws).await;
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "go"})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    let outputs = outputs(&snapshot);
    assert!(outputs[0].contains("Echo: hello from keel"), "{}", outputs[0]);
    // The image is referenced in history, never stored there.
    let image_item = snapshot["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["call_id"] == "c2" && i["type"] == "function_call_output")
        .unwrap();
    let image = &image_item["images"][0];
    assert_eq!(image["mime_type"], "image/png");
    assert!(image["bytes"].as_u64().unwrap() > 50);
    // Arguments that break the server's schema come back as a tool error.
    assert!(outputs[2].contains("error"), "{}", outputs[2]);
    // The model saw the tools under their model-visible names, and the image
    // in the request that followed the call.
    let requests = mock.requests();
    let first = requests[0].json.clone().unwrap();
    let names: Vec<&str> =
        first["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"everything__echo") && names.contains(&"everything__get-tiny-image"), "{names:?}");
    let png_base64_prefix = "iVBORw0KGgo";
    let after_image = String::from_utf8_lossy(&requests[2].body).into_owned();
    assert!(after_image.contains(png_base64_prefix), "the image was sent to the model");
    // Nothing of the image's bytes is in the journal.
    drop(client);
    keel.kill();
    let db = rusqlite::Connection::open(state.join("runtime.sqlite3")).unwrap();
    let hits: i64 = db
        .query_row(
            "SELECT (SELECT COUNT(*) FROM events WHERE data LIKE ?1) + (SELECT COUNT(*) FROM history WHERE item LIKE ?1) + (SELECT COUNT(*) FROM tool_calls WHERE COALESCE(output, '') LIKE ?1) + (SELECT COUNT(*) FROM model_attempts WHERE text LIKE ?1)",
            [format!("%{png_base64_prefix}%")],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(hits, 0);
}

#[tokio::test]
async fn a_dead_mcp_server_is_reported_and_the_other_tools_keep_working() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    // The server starts once; every restart after it dies fails.
    let once = dir.path().join("started-once");
    let script = format!(
        "if [ -e '{}' ]; then echo 'refusing to start again' >&2; exit 1; fi; touch '{}'; exec node '{}' stdio",
        once.display(),
        once.display(),
        everything_js()
    );
    let extra = format!(
        "[mcp_servers.everything]\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\nenv = {{ KEEL_TEST_MARKER = \"dead-mcp-7a2\" }}\n"
    );
    let bundle = bundle(dir.path(), "\"everything.echo\", \"fs.write_file\"", &extra);
    let keel = Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws).await;
    // Kill the server (found by the marker in its environment).
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find(|e| {
            std::fs::read(e.path().join("environ")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("dead-mcp-7a2"))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .expect("the MCP server runs");
    std::process::Command::new("kill").args(["-KILL", &pid]).status().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    mock.push(Reply::tool_call("c1", "fs__write_file", r#"{"path": "still.txt", "content": "working"}"#));
    mock.push(Reply::text("done"));
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "go"})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    let down =
        events.iter().find(|e| e["kind"] == "tool_server_unavailable").expect("the outage is in the session's events");
    assert_eq!(down["data"]["server"], "everything");
    assert!(down["data"]["reason"].as_str().unwrap().contains("down"), "{down}");
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert_eq!(std::fs::read_to_string(ws.join("still.txt")).unwrap(), "working");
    // The model was told, and was not offered the dead tool.
    let request = mock.requests()[0].json.clone().unwrap();
    let system = request["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("\"everything__echo\":{\"available\":false"), "{system}");
    let names: Vec<&str> =
        request["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["fs__write_file"]);
}

#[tokio::test]
async fn an_mcp_server_over_streamable_http_is_called_through_a_turn() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let _server = keel_testkit::mcp_servers::start_http_everything(port).await;
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "remote__get-sum", r#"{"a": 20, "b": 22}"#));
    mock.push(Reply::text("done"));
    let extra =
        format!("[mcp_servers.remote]\nurl = \"http://127.0.0.1:{port}/mcp\"\nheaders = {{ X-Keel = \"1\" }}\n");
    let bundle = bundle(dir.path(), "\"remote.get-sum\"", &extra);
    let keel = Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle, &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws).await;
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "add"})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    assert!(outputs(&snapshot)[0].contains("42"), "{:?}", outputs(&snapshot));
}

#[tokio::test]
async fn secrets_never_reach_the_journal_file() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let planted = "sk-planted-secret-7f3a9c0d1e2b";
    let mock = MockServer::start().await.unwrap();
    // The tool prints the secret its policy passes it; the model repeats it.
    mock.push(Reply::tool_call("c1", "shell__run", r#"{"command": "echo key=$PLANTED_KEY; env"}"#));
    mock.push(Reply::text(format!("The key is {planted}.")));
    let extra = "[coworkers.w.resources]\nenv = [\"PLANTED_KEY\"]\n";
    let bundle = bundle(dir.path(), "\"shell.run\"", extra);
    let keel = Keel::start_with(&state, &mock.base_url(), &bundle, &[("PLANTED_KEY", planted)]).unwrap();
    let mut client = keel.client().await.unwrap();
    let id = session(&mut client, &ws).await;
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "show me the key"})).await.unwrap();
    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let snapshot = client.ok("session/get", json!({"session_id": id})).await.unwrap();
    let output = outputs(&snapshot).remove(0);
    assert!(output.contains("key=[redacted:PLANTED_KEY]"), "the tool ran with it, the journal got a mark: {output}");
    drop(client);
    keel.terminate();
    keel.wait();
    // Grep every file of the state directory, the database and its WAL.
    for entry in std::fs::read_dir(&state).unwrap().flatten() {
        let bytes = std::fs::read(entry.path()).unwrap_or_default();
        let found = bytes.windows(planted.len()).any(|w| w == planted.as_bytes());
        assert!(!found, "{} holds the planted key", entry.path().display());
        let api_key = b"sk-test-key";
        assert!(
            !bytes.windows(api_key.len()).any(|w| w == api_key),
            "{} holds the provider key",
            entry.path().display()
        );
    }
}
