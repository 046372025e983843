//! keel-mcp against real MCP servers: the MCP project's reference server
//! (`@modelcontextprotocol/server-everything`, stdio and streamable HTTP)
//! and a small server of our own on the official TypeScript SDK
//! (`fixtures/changing-tools.mjs`). `scripts/mcp-servers` installs both at
//! pinned versions; without node and npm these tests fail, saying so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use keel_mcp::{Backoff, HubConfig, McpError, McpHub, McpServerConfig, McpTransport, ServerState, ServerStatus};
use serde_json::{Value, json};

use keel_testkit::mcp_servers::{everything_js, servers_dir, start_http_everything};

fn everything(name: &str) -> McpServerConfig {
    McpServerConfig::stdio(name, "node", vec![everything_js(), "stdio".to_owned()])
}

fn changing_tools(name: &str) -> McpServerConfig {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/changing-tools.mjs");
    let sdk = servers_dir().join("node_modules/@modelcontextprotocol/sdk");
    McpServerConfig::stdio(name, "node", vec![fixture.to_str().unwrap().to_owned(), sdk.to_str().unwrap().to_owned()])
}

/// Short delays, so restarts happen within a test's patience.
fn fast() -> HubConfig {
    HubConfig {
        backoff: Backoff { initial: Duration::from_millis(50), max: Duration::from_millis(400) },
        exit_grace: Duration::from_secs(1),
        ..HubConfig::default()
    }
}

fn status_of(hub: &McpHub, server: &str) -> ServerStatus {
    hub.status().into_iter().find(|status| status.name == server).unwrap()
}

fn tool_names(hub: &McpHub, server: &str) -> BTreeSet<String> {
    hub.tools().into_iter().filter(|tool| tool.server == server).map(|tool| tool.name).collect()
}

/// Waits, by watching `changes()`, until `done` holds.
async fn wait_for(hub: &McpHub, what: &str, mut done: impl FnMut(&McpHub) -> bool) {
    let mut changes = hub.changes();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done(hub) {
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            _ => panic!("gave up waiting for {what}; status: {:#?}", hub.status()),
        }
    }
}

/// Whether a process is still running (a zombie is not).
fn is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => !stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn kill(pid: u32) {
    let pid = rustix::process::Pid::from_raw(pid.try_into().unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
}

#[tokio::test]
async fn stdio_server_echoes_returns_images_and_rejects_bad_calls() {
    let hub = McpHub::start_with(vec![everything("everything")], fast());
    hub.settled().await;
    assert_eq!(status_of(&hub, "everything").state, ServerState::Ready, "{:#?}", hub.status());
    let names = tool_names(&hub, "everything");
    eprintln!("server-everything tools: {names:?}");
    assert!(names.contains("echo") && names.contains("get-tiny-image"), "{names:?}");
    let echo = hub.tools().into_iter().find(|tool| tool.name == "echo").unwrap();
    assert_eq!(echo.input_schema["properties"]["message"]["type"], "string");

    let output = hub.call("everything", "echo", json!({"message": "hello keel"})).await.unwrap();
    assert_eq!(output.text, "Echo: hello keel");
    assert!(!output.is_error && output.images.is_empty());

    let output = hub.call("everything", "get-tiny-image", json!({})).await.unwrap();
    assert_eq!(output.images.len(), 1, "{output:?}");
    assert_eq!(output.images[0].mime_type, "image/png");
    assert!(output.images[0].data.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert!(output.text.contains("image"), "{}", output.text);

    // A missing required argument: the server says so, one way or the other.
    match hub.call("everything", "echo", json!({})).await {
        Ok(output) => assert!(output.is_error, "{output:?}"),
        Err(McpError::Call { code, message, .. }) => eprintln!("bad arguments: error {code}: {message}"),
        Err(other) => panic!("unexpected error: {other}"),
    }
    let error = hub.call("everything", "echo", json!("hello")).await.unwrap_err();
    assert!(matches!(error, McpError::InvalidArguments { found: "a string", .. }), "{error}");
    let error = hub.call("everything", "no-such-tool", json!({})).await.unwrap_err();
    assert!(matches!(error, McpError::NoSuchTool { .. }), "{error}");
    let error = hub.call("nowhere", "echo", json!({})).await.unwrap_err();
    assert_eq!(error, McpError::NoSuchServer("nowhere".into()));

    let pid = hub.server_pid("everything").unwrap();
    hub.shutdown().await;
    assert_eq!(status_of(&hub, "everything").state, ServerState::Stopped);
    assert!(!is_running(pid), "server process {pid} outlived shutdown");
    let error = hub.call("everything", "echo", json!({"message": "late"})).await.unwrap_err();
    assert!(matches!(error, McpError::Unavailable { .. }), "{error}");
}

#[tokio::test]
async fn streamable_http_server_is_called_and_reconnected() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = start_http_everything(port).await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    let config = McpServerConfig::new(
        "remote",
        McpTransport::Http { url, headers: BTreeMap::from([("X-Keel-Test".to_owned(), "1".to_owned())]) },
    );
    let hub =
        McpHub::start_with(vec![config], HubConfig { http_ping_interval: Some(Duration::from_millis(200)), ..fast() });
    hub.settled().await;
    assert_eq!(status_of(&hub, "remote").state, ServerState::Ready, "{:#?}", hub.status());
    assert!(tool_names(&hub, "remote").contains("echo"));
    let output = hub.call("remote", "echo", json!({"message": "over http"})).await.unwrap();
    assert_eq!(output.text, "Echo: over http");

    // The server goes away: its session breaks, its tools disappear.
    server.kill().await.unwrap();
    wait_for(&hub, "the HTTP server to be marked failed", |hub| {
        matches!(status_of(hub, "remote").state, ServerState::Failed { .. })
    })
    .await;
    assert!(hub.tools().is_empty());

    // It comes back: keel reconnects with a new session.
    let _server = start_http_everything(port).await;
    wait_for(&hub, "the HTTP server to be ready again", |hub| status_of(hub, "remote").state == ServerState::Ready)
        .await;
    let status = status_of(&hub, "remote");
    assert!(status.restarts >= 1 && status.last_error.is_some(), "{status:#?}");
    let output = hub.call("remote", "echo", json!({"message": "again"})).await.unwrap();
    assert_eq!(output.text, "Echo: again");
    hub.shutdown().await;
}

#[tokio::test]
async fn killed_stdio_server_is_restarted() {
    let hub = McpHub::start_with(vec![everything("everything")], fast());
    hub.settled().await;
    let tools_before = tool_names(&hub, "everything");
    let pid = hub.server_pid("everything").unwrap();

    kill(pid);
    wait_for(&hub, "the killed server to be marked failed", |hub| status_of(hub, "everything").last_error.is_some())
        .await;
    let error = status_of(&hub, "everything").last_error.unwrap();
    assert!(error.contains("signal: 9"), "{error}");

    wait_for(&hub, "the server to be ready again", |hub| status_of(hub, "everything").state == ServerState::Ready)
        .await;
    let status = status_of(&hub, "everything");
    assert!(status.restarts >= 1, "{status:#?}");
    assert_eq!(tool_names(&hub, "everything"), tools_before);
    let new_pid = hub.server_pid("everything").unwrap();
    assert_ne!(new_pid, pid);
    assert!(!is_running(pid));
    let output = hub.call("everything", "echo", json!({"message": "back"})).await.unwrap();
    assert_eq!(output.text, "Echo: back");
    hub.shutdown().await;
    assert!(!is_running(new_pid));
}

#[tokio::test]
async fn missing_command_fails_alone() {
    let missing = McpServerConfig::stdio("missing", "keel-mcp-test-no-such-server", vec![]);
    let hub = McpHub::start_with(vec![missing, everything("everything")], fast());
    hub.settled().await;

    let status = status_of(&hub, "missing");
    let ServerState::Failed { error, .. } = &status.state else { panic!("{status:#?}") };
    assert!(error.contains("keel-mcp-test-no-such-server") && error.contains("command not found"), "{error}");
    let error = hub.call("missing", "echo", json!({})).await.unwrap_err();
    assert!(matches!(error, McpError::Unavailable { .. }), "{error}");
    eprintln!("{error}");

    assert_eq!(status_of(&hub, "everything").state, ServerState::Ready);
    assert!(hub.tools().iter().all(|tool| tool.server == "everything"));
    let output = hub.call("everything", "echo", json!({"message": "unaffected"})).await.unwrap();
    assert_eq!(output.text, "Echo: unaffected");

    // It keeps being retried, with backoff.
    wait_for(&hub, "a retry", |hub| status_of(hub, "missing").restarts >= 2).await;
    hub.shutdown().await;
}

#[tokio::test]
async fn stdio_server_gets_a_clean_environment() {
    // cargo sets CARGO_MANIFEST_DIR (and more) for this test process.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let mut config = everything("everything");
    let McpTransport::Stdio { env, .. } = &mut config.transport else { unreachable!() };
    env.insert("KEEL_GRANTED".to_owned(), "yes".to_owned());
    let hub = McpHub::start_with(vec![config], fast());
    hub.settled().await;

    let output = hub.call("everything", "get-env", json!({})).await.unwrap();
    let seen: BTreeMap<String, String> = serde_json::from_str(&output.text).unwrap();
    assert_eq!(seen.get("KEEL_GRANTED").map(String::as_str), Some("yes"));
    let allowed = ["PATH", "HOME", "LANG", "KEEL_GRANTED"];
    let leaked: Vec<&String> = seen.keys().filter(|name| !allowed.contains(&name.as_str())).collect();
    assert!(leaked.is_empty(), "the server saw variables it was not given: {leaked:?}");
    hub.shutdown().await;
}

#[tokio::test]
async fn slow_call_times_out_and_the_server_stays_usable() {
    let mut config = everything("everything");
    config.call_timeout = Duration::from_millis(500);
    let hub = McpHub::start_with(vec![config], fast());
    hub.settled().await;

    let started = Instant::now();
    let error = hub
        .call("everything", "trigger-long-running-operation", json!({"duration": 10, "steps": 5}))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(error, McpError::Timeout { after, .. } if after == Duration::from_millis(500)), "{error}");
    assert!(took < Duration::from_secs(2), "timing out took {took:?}");
    eprintln!("{error}");

    let output = hub.call("everything", "echo", json!({"message": "still here"})).await.unwrap();
    assert_eq!(output.text, "Echo: still here");
    assert_eq!(status_of(&hub, "everything").restarts, 0);
    hub.shutdown().await;
}

#[tokio::test]
async fn timed_out_call_is_cancelled_on_the_server() {
    let mut config = changing_tools("changing");
    config.call_timeout = Duration::from_millis(300);
    let hub = McpHub::start_with(vec![config], fast());
    hub.settled().await;

    let error = hub.call("changing", "wait-for-cancel", json!({})).await.unwrap_err();
    assert!(matches!(error, McpError::Timeout { .. }), "{error}");
    // The cancellation went out before this call, on the same connection.
    let output = hub.call("changing", "cancelled-count", json!({})).await.unwrap();
    assert_eq!(output.text, "1");
    hub.shutdown().await;
}

#[tokio::test]
async fn tool_list_follows_list_changed() {
    let hub = McpHub::start_with(vec![changing_tools("changing")], fast());
    hub.settled().await;
    assert!(!tool_names(&hub, "changing").contains("extra-1"));

    let mut changes = hub.changes();
    changes.mark_unchanged();
    let output = hub.call("changing", "add-tool", json!({})).await.unwrap();
    assert_eq!(output.text, "added extra-1");
    wait_for(&hub, "extra-1 to be listed", |hub| tool_names(hub, "changing").contains("extra-1")).await;
    assert!(changes.has_changed().unwrap());
    let extra = hub.tools().into_iter().find(|tool| tool.name == "extra-1").unwrap();
    assert_eq!(extra.description, "Tool number 1 added at run time");
    let output = hub.call("changing", "extra-1", Value::Null).await.unwrap();
    assert_eq!(output.text, "extra-1 ran");
    assert_eq!(status_of(&hub, "changing").tools, 5);
    hub.shutdown().await;
}

#[tokio::test]
async fn crash_is_reported_with_exit_status_and_stderr() {
    let hub = McpHub::start_with(vec![changing_tools("changing")], fast());
    hub.settled().await;

    let error = hub.call("changing", "crash", json!({})).await.unwrap_err();
    assert!(matches!(error, McpError::Disconnected { .. }), "{error}");
    wait_for(&hub, "the crash to be recorded", |hub| status_of(hub, "changing").last_error.is_some()).await;
    let last_error = status_of(&hub, "changing").last_error.unwrap();
    eprintln!("{last_error}");
    assert!(last_error.contains("exit status: 3"), "{last_error}");
    assert!(last_error.contains("crashing on purpose"), "{last_error}");

    wait_for(&hub, "the restart", |hub| status_of(hub, "changing").state == ServerState::Ready).await;
    hub.shutdown().await;
}

#[tokio::test]
async fn dropping_the_hub_kills_its_servers() {
    let hub = McpHub::start_with(vec![everything("everything")], fast());
    hub.settled().await;
    let pid = hub.server_pid("everything").unwrap();
    assert!(is_running(pid));
    drop(hub);
    let deadline = Instant::now() + Duration::from_secs(5);
    while is_running(pid) {
        assert!(Instant::now() < deadline, "server process {pid} outlived the dropped hub");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
