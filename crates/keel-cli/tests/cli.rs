//! The `keel` command line: `run`, the read-only views, and `serve --stdio`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use keel_testkit::{MockServer, Reply};
use serde_json::{Value, json};

fn keel(state: &std::path::Path, base_url: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .arg("--state")
        .arg(state)
        .env("OPENAI_BASE_URL", base_url)
        .env("OPENAI_API_KEY", "sk-test")
        .env_remove("KEEL_STATE_DIR");
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_streams_the_answer_and_the_views_show_the_session() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "fs__write_file", r#"{"path":"out.txt","content":"42"}"#));
    mock.push(Reply::text_deltas(["The answer ", "is in ", "out.txt."]));
    let bundle = support::example_bundle();
    let output = keel(&state, &mock.base_url())
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg("--workspace")
        .arg(&ws)
        .arg("compute the answer")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(stdout.trim(), "The answer is in out.txt.");
    assert!(stderr.contains("write_file"), "tool calls are reported on stderr: {stderr}");
    assert_eq!(std::fs::read_to_string(ws.join("out.txt")).unwrap(), "42");

    let listing = keel(&state, &mock.base_url()).args(["sessions", "--json"]).output().unwrap();
    let sessions: Value = serde_json::from_slice(&listing.stdout).unwrap();
    let id = sessions[0]["id"].as_str().unwrap().to_string();
    let shown = keel(&state, &mock.base_url()).args(["show", &id, "--json"]).output().unwrap();
    let snapshot: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(snapshot["turn"]["status"], "completed");
    assert_eq!(snapshot["history"].as_array().unwrap().len(), 4);
    let human = keel(&state, &mock.base_url()).args(["show", &id]).output().unwrap();
    assert!(String::from_utf8_lossy(&human.stdout).contains("completed after 2 model round trips"));
    let events = keel(&state, &mock.base_url()).args(["events", &id, "--after", "2"]).output().unwrap();
    let lines: Vec<Value> =
        String::from_utf8_lossy(&events.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0]["seq"], 3);
    assert_eq!(lines.last().unwrap()["kind"], "turn_finished");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exits_non_zero_when_the_provider_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::openai_error(401, "invalid_api_key", "Incorrect API key provided"));
    let output = keel(&dir.path().join("state"), &mock.base_url())
        .args(["run", "--bundle"])
        .arg(support::example_bundle())
        .arg("--workspace")
        .arg(support::workspace(&dir))
        .arg("hello")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("failed") && stderr.contains("auth"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reports_a_missing_coworker_as_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let output = keel(&dir.path().join("state"), "http://127.0.0.1:9/v1")
        .args(["run", "--bundle"])
        .arg(support::example_bundle())
        .args(["--coworker", "nobody", "hello"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("assistant-example"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_stdio_speaks_json_rpc_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("hi there"));
    let mut child = keel(&dir.path().join("state"), &mock.base_url())
        .args(["serve", "--stdio", "--bundle"])
        .arg(support::example_bundle())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = |message: Value| {
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    };
    send(
        json!({"jsonrpc":"2.0","id":1,"method":"session/create","params":{"name":"s","coworker":"assistant-example","workspace":ws}}),
    );
    let created: Value = serde_json::from_str(&stdout.next().unwrap().unwrap()).unwrap();
    let session = created["result"]["session"]["id"].as_str().unwrap().to_string();
    send(json!({"jsonrpc":"2.0","id":2,"method":"events/subscribe","params":{"session_id":session}}));
    send(
        json!({"jsonrpc":"2.0","id":3,"method":"turn/start","params":{"session_id":session,"submission_id":"x","text":"hello"}}),
    );
    let mut finished = None;
    for line in stdout.by_ref() {
        let message: Value = serde_json::from_str(&line.unwrap()).unwrap();
        if message["params"]["event"]["kind"] == "turn_finished" {
            finished = Some(message);
            break;
        }
    }
    assert_eq!(finished.unwrap()["params"]["event"]["data"]["status"], "completed");
    writeln!(stdin, "this is not json").unwrap();
    stdin.flush().unwrap();
    let error: Value = serde_json::from_str(&stdout.next().unwrap().unwrap()).unwrap();
    assert_eq!(error["error"]["code"], -32700);
    drop(stdin);
    assert!(child.wait().unwrap().success(), "closing stdin ends the server cleanly");
}

/// A real turn on the local SmolLM2 model, through `keel run` with no
/// provider configured: the default a newcomer gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_uses_the_local_model_when_no_provider_is_configured() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let fetched = Command::new(repo.join("scripts/fetch-model")).output().unwrap();
    assert!(fetched.status.success(), "{}", String::from_utf8_lossy(&fetched.stderr));
    let model = String::from_utf8_lossy(&fetched.stdout).trim().to_string();
    let models_dir = std::path::Path::new(&model).parent().unwrap().to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    // The example coworker, with limits that keep a 135M model's worst case
    // (rambling to the output limit at every step) short.
    let example = std::fs::read_to_string(support::example_bundle().join("keel.toml")).unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(
        bundle.join("keel.toml"),
        example.replace("max_steps = 16", "max_steps = 3\nmax_output_tokens = 160"),
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--state")
        .arg(&state)
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg("--workspace")
        .arg(support::workspace(&dir))
        .arg("Say hello in one short sentence.")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env("KEEL_MODELS_DIR", &models_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("local:smollm2"), "{stderr}");
    let shown = keel(&state, "http://127.0.0.1:9/v1").args(["sessions", "--json"]).output().unwrap();
    let sessions: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let id = sessions[0]["id"].as_str().unwrap();
    let snapshot: Value = serde_json::from_slice(
        &keel(&state, "http://127.0.0.1:9/v1").args(["show", id, "--json"]).output().unwrap().stdout,
    )
    .unwrap();
    // A 135M model may answer, call tools until the step limit, or ramble
    // to the output limit; each is a real outcome of a real model. What must
    // hold is that the turn ended cleanly and exit code matches it.
    let status = snapshot["turn"]["status"].as_str().unwrap();
    // It may also ask to run a command the example's policy does not allow:
    // with no terminal to answer, `keel run` stops with code 3.
    assert!(["completed", "failed", "truncated", "waiting"].contains(&status), "{status}");
    assert_eq!(output.status.success(), status == "completed", "{stderr}");
    assert_eq!(output.status.code() == Some(3), status == "waiting", "{stderr}");
    if status == "completed" {
        assert!(!String::from_utf8_lossy(&output.stdout).trim().is_empty(), "the model answered");
    }
    assert_eq!(snapshot["attempts"][0]["model"], "local:smollm2");
    assert_eq!(snapshot["attempts"][0]["status"], "completed");
    assert!(snapshot["session"]["usage"]["output_tokens"].as_u64().unwrap() > 0);
    // Every tool call the model made was valid JSON for a declared tool.
    for item in snapshot["history"].as_array().unwrap() {
        if item["type"] == "function_call" {
            let args: Value = serde_json::from_str(item["arguments"].as_str().unwrap()).unwrap();
            assert!(args.is_object());
            let name = item["name"].as_str().unwrap();
            assert!(name.starts_with("fs__") || name == "shell__run", "{name}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_stops_with_code_3_when_a_call_needs_approval_and_nobody_can_answer() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "shell__run", r#"{"command": "touch made-without-asking"}"#));
    let output = keel(&dir.path().join("state"), &mock.base_url())
        .args(["run", "--bundle"])
        .arg(support::example_bundle())
        .arg("--workspace")
        .arg(&ws)
        .arg("make a file")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("approval needed for shell.run"), "{stderr}");
    assert!(stderr.contains("stays pending"), "{stderr}");
    assert!(!ws.join("made-without-asking").exists());
}

#[test]
fn validate_reports_every_problem_with_file_line_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("keel.toml"),
        "[coworkers.a]\nmodel = \"gpt-4\"\ninstructions = \"\"\ntools = [\"read_file\", \"rm_rf\"]\nmax_steps = 0\n\n[coworkers.b]\nmodel = \"nosuch:x\"\ninstructions = \"hi\"\n",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keel")).arg("validate").arg(dir.path()).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let file = dir.path().join("keel.toml").display().to_string();
    for expected in [
        format!("{file}:2: coworker \"a\": the model \"gpt-4\" does not name a provider"),
        format!("{file}:3: coworker \"a\": the instructions are empty"),
        format!("{file}:4: coworker \"a\": unknown tool \"rm_rf\""),
        format!(
            "{file}:4: coworker \"a\": unknown tool \"read_file\" (fix: tools are named server.tool: write \"fs.read_file\")"
        ),
        format!("{file}:5: coworker \"a\": max_steps is 0"),
        format!("{file}:8: coworker \"b\": unknown provider \"nosuch\""),
    ] {
        assert!(stdout.contains(&expected), "missing {expected:?} in:\n{stdout}");
    }
    assert_eq!(stdout.matches("(fix: ").count(), 6);
    // keel serve refuses the same bundle with the same list.
    let serve = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--state")
        .arg(dir.path().join("state"))
        .args(["serve", "--stdio", "--bundle"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(serve.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&serve.stderr).contains("unknown tool \"rm_rf\""));
    let ok = Command::new(env!("CARGO_BIN_EXE_keel")).arg("validate").arg(support::example_bundle()).output().unwrap();
    assert!(ok.status.success());
}

#[test]
fn the_published_bundle_schema_matches_the_code() {
    let published =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/bundle.schema.json"))
            .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_keel")).args(["validate", "--schema"]).output().unwrap();
    let generated: Value = serde_json::from_slice(&output.stdout).unwrap();
    let published: Value = serde_json::from_str(&published).unwrap();
    assert_eq!(generated, published, "regenerate docs/bundle.schema.json with `keel validate --schema`");
}
