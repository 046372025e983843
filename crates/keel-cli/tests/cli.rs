//! The `keel` command line: `run`, the read-only views, and `serve --stdio`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Output, Stdio};

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
    let output = offline_keel(&state)
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg("--workspace")
        .arg(support::workspace(&dir))
        .arg("Say hello in one short sentence.")
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

/// A fresh folder to run in and a state directory beside it, both outside
/// the repository (keel refuses a state directory inside the workspace).
fn outside_the_repo(dir: &tempfile::TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let cwd = dir.path().join("cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    (cwd, dir.path().join("state"))
}

/// `keel run` with no `--bundle`, `--coworker` or `--workspace`, from `cwd`,
/// scripted to write `hello.txt` and answer "done".
async fn run_builtin_writing_hello(state: &std::path::Path, cwd: &std::path::Path) -> (MockServer, Output) {
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "fs__write_file", r#"{"path":"hello.txt","content":"hi"}"#));
    mock.push(Reply::text("done"));
    let output = keel(state, &mock.base_url())
        .current_dir(cwd)
        .args(["run", "--model", "openai-chat:m", "say hi in hello.txt"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (mock, output)
}

fn session_ids(state: &std::path::Path) -> Vec<String> {
    let listing = keel(state, "http://127.0.0.1:9/v1").args(["sessions", "--json"]).output().unwrap();
    assert!(listing.status.success(), "{}", String::from_utf8_lossy(&listing.stderr));
    let sessions: Value = serde_json::from_slice(&listing.stdout).unwrap();
    sessions.as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_with_no_bundle_uses_the_builtin_assistant_in_the_current_folder() {
    let dir = tempfile::tempdir().unwrap();
    let (cwd, state) = outside_the_repo(&dir);
    let (mock, output) = run_builtin_writing_hello(&state, &cwd).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "done");
    assert_eq!(std::fs::read_to_string(cwd.join("hello.txt")).unwrap(), "hi", "the workspace is the current folder");
    assert!(stderr.contains("keel: -> fs.write_file("), "tools are reported by qualified name: {stderr}");
    assert!(!stderr.contains("fs__write_file"), "{stderr}");
    // The compiled-in bundle, written under the state directory.
    let example = std::fs::read_to_string(support::example_bundle().join("keel.toml")).unwrap();
    assert_eq!(std::fs::read_to_string(state.join("builtin/assistant/keel.toml")).unwrap(), example);
    let first = mock.requests()[0].json.clone().unwrap();
    assert_eq!(first["model"], "m");
    assert!(first.to_string().contains("You are a careful assistant"), "the built-in instructions: {first}");
    let ids = session_ids(&state);
    assert_eq!(ids.len(), 1);
    let shown = keel(&state, "http://127.0.0.1:9/v1").args(["show", &ids[0], "--json"]).output().unwrap();
    let snapshot: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(snapshot["session"]["coworker"], "assistant-example");
    assert_eq!(snapshot["session"]["workspace"], cwd.canonicalize().unwrap().display().to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_names_tools_as_bundles_do_and_export_import_speak_json() {
    let dir = tempfile::tempdir().unwrap();
    let (cwd, state) = outside_the_repo(&dir);
    let (_mock, output) = run_builtin_writing_hello(&state, &cwd).await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let id = session_ids(&state).remove(0);

    let shown = keel(&state, "http://127.0.0.1:9/v1").args(["show", &id]).output().unwrap();
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    assert!(text.contains("call      fs.write_file("), "{text}");
    assert!(!text.contains("fs__write_file"), "{text}");

    let file = dir.path().join("run.keel");
    let exported =
        keel(&state, "http://127.0.0.1:9/v1").args(["export", &id]).arg(&file).arg("--json").output().unwrap();
    assert!(exported.status.success(), "{}", String::from_utf8_lossy(&exported.stderr));
    let stdout = String::from_utf8_lossy(&exported.stdout);
    assert_eq!(stdout.trim().lines().count(), 1, "one JSON object: {stdout}");
    let summary: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(summary["session"], id.as_str());
    assert!(summary["records"].as_u64().unwrap() > 0, "{summary}");

    let other = dir.path().join("other-state");
    let imported = keel(&other, "http://127.0.0.1:9/v1").arg("import").arg(&file).arg("--json").output().unwrap();
    assert!(imported.status.success(), "{}", String::from_utf8_lossy(&imported.stderr));
    let result: Value = serde_json::from_slice(&imported.stdout).unwrap();
    assert_eq!(result["session"]["id"], id.as_str());
    assert_eq!(session_ids(&other), [id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reads_a_dash_task_from_stdin_and_prints_events_as_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let (cwd, state) = outside_the_repo(&dir);
    let mock = MockServer::start().await.unwrap();
    let answer = "The folder is empty.";
    mock.push(Reply::text(answer));
    let mut child = keel(&state, &mock.base_url())
        .current_dir(&cwd)
        .args(["run", "--json", "--model", "openai-chat:m", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let task = "Describe this folder.\nThe task came through a pipe.";
    child.stdin.take().unwrap().write_all(task.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let body = String::from_utf8_lossy(&mock.requests()[0].body).into_owned();
    assert!(body.contains("The task came through a pipe."), "the task from stdin reaches the model: {body}");
    let events: Vec<Value> =
        stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    assert!(!events.is_empty());
    let ids = session_ids(&state);
    for event in &events {
        assert!(event["seq"].is_u64() && event["kind"].is_string(), "{event}");
        assert_eq!(event["session_id"], ids[0].as_str(), "{event}");
    }
    let finished = events.iter().find(|e| e["kind"] == "turn_finished").expect("a turn_finished event");
    assert_eq!(finished["data"]["status"], "completed");
    assert!(!stdout.lines().any(|l| l.trim() == answer), "the answer is not printed raw: {stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_a_vendor_model_without_its_key_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let (cwd, state) = outside_the_repo(&dir);
    // Any request (straight or through a proxy) would land here, never on
    // the real vendor: reqwest honours the proxy variables.
    let trap = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    trap.set_nonblocking(true).unwrap();
    let proxy = format!("http://{}", trap.local_addr().unwrap());
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--state")
        .arg(&state)
        .current_dir(&cwd)
        .args(["run", "--model", "openai:gpt-5", "hello"])
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("KEEL_STATE_DIR")
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .env("HTTPS_PROXY", &proxy)
        .env("https_proxy", &proxy)
        .env("ALL_PROXY", &proxy)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("OPENAI_API_KEY"), "{stderr}");
    assert!(stderr.contains("https://api.openai.com/v1"), "{stderr}");
    assert!(matches!(trap.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock), "nothing was sent");
    assert!(session_ids(&state).is_empty(), "no session was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_missing_state_directory_has_no_sessions_yet() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    // A state directory keel has opened, with no session in it.
    let opened = dir.path().join("opened");
    let served = keel(&opened, "http://127.0.0.1:9/v1")
        .args(["serve", "--stdio", "--bundle"])
        .arg(support::example_bundle())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(served.status.success(), "{}", String::from_utf8_lossy(&served.stderr));
    assert!(opened.join("runtime.sqlite3").is_file());
    for state in [&missing, &empty, &opened] {
        let json = keel(state, "http://127.0.0.1:9/v1").args(["sessions", "--json"]).output().unwrap();
        assert!(json.status.success(), "{}: {}", state.display(), String::from_utf8_lossy(&json.stderr));
        let listed: Value = serde_json::from_slice(&json.stdout).unwrap();
        assert_eq!(listed, json!([]), "{}", state.display());
        let human = keel(state, "http://127.0.0.1:9/v1").arg("sessions").output().unwrap();
        let stderr = String::from_utf8_lossy(&human.stderr);
        assert!(human.status.success(), "{}: {stderr}", state.display());
        assert!(stderr.contains("no sessions yet"), "{}: {stderr}", state.display());
    }
    for state in [&missing, &empty] {
        let shown = keel(state, "http://127.0.0.1:9/v1").args(["show", "nope"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&shown.stderr);
        assert_eq!(shown.status.code(), Some(1), "{}: {stderr}", state.display());
        assert!(stderr.contains("no sessions yet"), "{stderr}");
        assert!(!stderr.contains("storage failed"), "{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_and_deny_print_the_servers_answer_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "shell__run", r#"{"command": "touch asked.txt"}"#));
    mock.push(Reply::text("done"));
    let served = support::Keel::start_with(&state, &mock.base_url(), &support::example_bundle(), &[]).unwrap();
    let mut client = served.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    let started =
        client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "make a file"})).await.unwrap();
    let events = client.events_until("turn_waiting").await.unwrap();
    let asked = events.iter().find(|e| e["kind"] == "interaction_requested").unwrap();
    let interaction = asked["data"]["interaction"]["id"].as_str().unwrap().to_string();

    let cli = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_keel")).arg("--state").arg(&state).args(args).output().unwrap();
        assert!(output.status.success(), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout)
            .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {}", String::from_utf8_lossy(&output.stdout)))
    };
    // `--json` goes before the text: the text takes every argument after it.
    let steered = cli(&["msg", "--json", &id, "Keep", "it", "short."]);
    assert_eq!(steered["turn_id"], started["turn_id"]);
    assert_eq!(steered["duplicate"], false);
    let denied = cli(&["deny", &id, &interaction, "--message", "not today", "--json"]);
    assert_eq!(denied["status"], "applied", "{denied}");
    assert_eq!(denied["interaction"]["id"], interaction.as_str(), "{denied}");

    let events = client.events_until("turn_finished").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert!(!ws.join("asked.txt").exists());
    let second = String::from_utf8_lossy(&mock.requests()[1].body).into_owned();
    assert!(second.contains("Keep it short.") && second.contains("not today"), "{second}");
}

/// The demo's default task, exactly as `scripts/demo` runs it: `keel run`
/// with no flags, the built-in coworker and the offline default model
/// (SmolLM2-135M, greedy, so every run is the same run). The file must be
/// in the workspace: a coworker that only says it wrote it fails. Before
/// the tool-choice format matched what the model was trained on, the model
/// answered "Hello, World! ... in the `hello.txt` directory" and wrote
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_task_is_done_by_the_offline_default_model() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let demo = std::fs::read_to_string(repo.join("scripts/demo")).unwrap();
    let task = demo
        .lines()
        .find_map(|line| line.strip_prefix("default_task=\""))
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("scripts/demo sets default_task")
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let output = offline_keel(&dir.path().join("state")).arg("run").arg(&task).current_dir(&ws).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("-> fs.write_file("), "{stderr}");
    let written = std::fs::read_to_string(ws.join("hello.txt")).unwrap_or_default();
    assert!(!written.trim().is_empty(), "hello.txt was not written; stderr:\n{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).trim().is_empty(), "the model answered");
}

/// `keel` with the offline default: no provider configured, and the models
/// folder `scripts/fetch-model` fills (fetched if missing).
fn offline_keel(state: &std::path::Path) -> Command {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let fetched = Command::new(repo.join("scripts/fetch-model")).output().unwrap();
    assert!(fetched.status.success(), "{}", String::from_utf8_lossy(&fetched.stderr));
    let model = String::from_utf8_lossy(&fetched.stdout).trim().to_string();
    let models_dir = std::path::Path::new(&model).parent().unwrap().to_path_buf();
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .arg("--state")
        .arg(state)
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_BASE_URL")
        .env("KEEL_MODELS_DIR", &models_dir);
    command
}
