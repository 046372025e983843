//! Provider failure semantics through the real binary and API: classified
//! retries, the attempts ledger, safety blocks, output-limit continuation,
//! fallbacks, circuit breakers, usage and cost.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use keel_testkit::{MockServer, Reply, ScriptedUsage};
use serde_json::{Value, json};
use support::{Client, Keel};

const BUNDLE: &str = r#"
[coworkers.worker]
model = "openai-chat:primary"
fallback_models = ["openai-chat:backup"]
instructions = "You are a test coworker."
tools = ["fs.read_file", "fs.write_file", "fs.list_dir"]
policies = { "fs.write_file" = "allow" }
max_output_tokens = 64

[prices."openai-chat:primary"]
input = 2.0
output = 10.0
cached_input = 1.0
"#;

/// A keel with the test bundle, fast backoff, and a session ready.
struct Setup {
    _dir: tempfile::TempDir,
    keel: Keel,
    client: Client,
    session: String,
}

async fn setup(mock: &MockServer) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(bundle.join("keel.toml"), BUNDLE).unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let keel =
        Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle, &[("KEEL_RETRY_BASE_MS", "5")]).unwrap();
    let mut client = keel.client().await.unwrap();
    let created =
        client.ok("session/create", json!({"name": "p", "coworker": "worker", "workspace": ws})).await.unwrap();
    let session = created["session"]["id"].as_str().unwrap().to_string();
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    Setup { _dir: dir, keel, client, session }
}

impl Setup {
    async fn turn(&mut self, submission: &str, text: &str) -> Vec<Value> {
        self.client
            .ok("turn/start", json!({"session_id": self.session, "submission_id": submission, "text": text}))
            .await
            .unwrap();
        self.client.events_until("turn_finished").await.unwrap()
    }

    async fn snapshot(&mut self) -> Value {
        self.client.ok("session/get", json!({"session_id": self.session})).await.unwrap()
    }
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["kind"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn a_rate_limit_is_retried_after_retry_after_and_partial_text_stays_out_of_history() {
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::openai_error(429, "rate_limit_exceeded", "slow down").with_header("retry-after", "1"));
    mock.push(Reply::text("failed partial answer that is cut").cut_after(2));
    mock.push(Reply::text("final answer"));
    let mut s = setup(&mock).await;
    let events = s.turn("s1", "hello").await;
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let retries: Vec<&Value> = events.iter().filter(|e| e["kind"] == "model_retrying").collect();
    assert_eq!(retries.len(), 2);
    assert_eq!(retries[0]["data"]["reason"], "rate_limited");
    assert_eq!(retries[0]["data"]["delay_ms"], 1000, "Retry-After is honoured");
    assert_eq!(retries[1]["data"]["reason"], "transport");
    let snapshot = s.snapshot().await;
    let attempts = snapshot["attempts"].as_array().unwrap();
    let statuses: Vec<&str> = attempts.iter().map(|a| a["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["failed", "failed", "completed"]);
    assert_eq!(attempts.iter().map(|a| a["attempt"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(attempts[1]["text"].as_str().unwrap().starts_with("failed"), "the ledger keeps partial text");
    assert_eq!(snapshot["turn"]["attempts"], 3);
    let history = snapshot["history"].to_string();
    assert!(!history.contains("failed partial"), "partial text never enters history");
    assert!(history.contains("final answer"));
    // The retry's request carries no trace of the failed attempt.
    let last = mock.requests().last().unwrap().json.clone().unwrap();
    assert!(!last.to_string().contains("failed partial"));
}

#[tokio::test]
async fn transient_failures_stop_after_three_attempts_then_the_fallback_model_answers() {
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::openai_error(503, "server_error", "unavailable"));
    mock.push(Reply::openai_error(529, "overloaded", "overloaded"));
    mock.push(Reply::openai_error(500, "server_error", "boom"));
    mock.push(Reply::text("backup answer"));
    let mut s = setup(&mock).await;
    let events = s.turn("s1", "hello").await;
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    let switched = events.iter().find(|e| e["kind"] == "model_switched").unwrap();
    assert_eq!(switched["data"]["from"], "openai-chat:primary");
    assert_eq!(switched["data"]["to"], "openai-chat:backup");
    let models: Vec<String> =
        mock.requests().iter().map(|r| r.json.clone().unwrap()["model"].as_str().unwrap().to_string()).collect();
    assert_eq!(models, ["primary", "primary", "primary", "backup"]);
    let snapshot = s.snapshot().await;
    assert_eq!(snapshot["turn"]["attempts"], 4);
    assert_eq!(snapshot["attempts"][3]["model"], "openai-chat:backup");
}

#[tokio::test]
async fn auth_failure_moves_to_the_fallback_at_once() {
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::openai_error(401, "invalid_api_key", "bad key"));
    mock.push(Reply::text("from backup"));
    let mut s = setup(&mock).await;
    let events = s.turn("s1", "hello").await;
    assert_eq!(events.last().unwrap()["data"]["status"], "completed");
    assert!(!kinds(&events).contains(&"model_retrying"), "auth is never retried");
    assert_eq!(mock.requests().len(), 2);
}

#[tokio::test]
async fn a_safety_block_is_never_retried_and_blocks_the_session_durably() {
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::text("").finish_reason("content_filter"));
    let mut s = setup(&mock).await;
    let events = s.turn("s1", "something disallowed").await;
    let finished = events.last().unwrap();
    assert_eq!(finished["data"]["status"], "failed");
    assert_eq!(finished["data"]["error"]["kind"], "provider_safety_blocked");
    assert_eq!(mock.requests().len(), 1);
    let snapshot = s.snapshot().await;
    assert_eq!(snapshot["session"]["provider_blocked"], true);
    let refused = s
        .client
        .call("turn/start", json!({"session_id": s.session, "submission_id": "s2", "text": "again"}))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code, -32004);
    // Durable: still blocked after a restart.
    let state = s.keel.state.clone();
    let session = s.session.clone();
    let Setup { keel, _dir: dir, .. } = s;
    keel.kill();
    let keel = Keel::start_with(&state, &mock.base_url(), &dir.path().join("bundle"), &[]).unwrap();
    let mut client = keel.client().await.unwrap();
    let snapshot = client.ok("session/get", json!({"session_id": session})).await.unwrap();
    assert_eq!(snapshot["session"]["provider_blocked"], true);
}

#[tokio::test]
async fn interrupt_cancels_a_retry_backoff_without_another_request() {
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::openai_error(429, "rate_limit_exceeded", "wait").with_header("retry-after", "30"));
    let mut s = setup(&mock).await;
    s.client.ok("turn/start", json!({"session_id": s.session, "submission_id": "s1", "text": "x"})).await.unwrap();
    let events = s.client.events_until("model_retrying").await.unwrap();
    assert_eq!(events.last().unwrap()["data"]["delay_ms"], 30_000);
    let stopped =
        tokio::time::timeout(Duration::from_secs(5), s.client.ok("turn/interrupt", json!({"session_id": s.session})))
            .await
            .expect("the backoff ends at once")
            .unwrap();
    assert_eq!(stopped["status"], "cancelled");
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn output_limit_continues_twice_then_the_turn_is_truncated() {
    let mock = MockServer::start().await.unwrap();
    for part in ["part one ", "part two ", "part three"] {
        mock.push(Reply::text(part).finish_reason("length"));
    }
    let mut s = setup(&mock).await;
    let events = s.turn("s1", "write a long essay").await;
    let finished = events.last().unwrap();
    assert_eq!(finished["data"]["status"], "truncated");
    assert_eq!(finished["data"]["error"]["kind"], "output_limit");
    let snapshot = s.snapshot().await;
    assert_eq!(snapshot["turn"]["continuations"], 2);
    let history = snapshot["history"].as_array().unwrap();
    let notices: Vec<&Value> = history.iter().filter(|i| i["_runtime_notice"] == "output_continuation").collect();
    assert_eq!(notices.len(), 2);
    assert_eq!(notices[0]["role"], "developer", "a runtime notice, not a user instruction");
    assert_eq!(history.len(), 1 + 3 + 2);
    let requests = mock.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].json.clone().unwrap()["max_tokens"], 64);
    let second = requests[1].json.clone().unwrap();
    let last = second["messages"].as_array().unwrap().last().unwrap().clone();
    assert!(last["content"].as_str().unwrap().contains("cut off by the output limit"));
    assert_ne!(last["role"], "user");
}

#[tokio::test]
async fn a_tool_call_with_invalid_json_arguments_is_never_run() {
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("bad", "fs__write_file", r#"{"path": "x.txt", "content": "#));
    mock.push(Reply::text("sorry"));
    let mut s = setup(&mock).await;
    let events = s.turn("s1", "write").await;
    assert!(!kinds(&events).contains(&"tool_call_started"));
    let snapshot = s.snapshot().await;
    assert!(snapshot["tool_calls"].as_array().unwrap().is_empty());
    assert!(snapshot["history"][2]["output"].as_str().unwrap().contains("not a JSON object"));
    let second = mock.requests()[1].json.clone().unwrap();
    let tool = second["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap().clone();
    assert!(tool["content"].as_str().unwrap().contains("valid JSON"));
}

#[tokio::test]
async fn a_context_overflow_fails_the_turn_with_a_clear_error() {
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::openai_error(400, "context_length_exceeded", "maximum context length is 8192 tokens"));
    let mut s = setup(&mock).await;
    let events = s.turn("s1", "x").await;
    let error = &events.last().unwrap()["data"]["error"];
    assert_eq!(error["kind"], "provider_context_too_long");
    assert!(error["message"].as_str().unwrap().contains("context window"));
    assert_eq!(mock.requests().len(), 1);
}

#[tokio::test]
async fn usage_and_cost_are_summed_per_attempt_turn_and_session() {
    let mock = MockServer::start().await.unwrap();
    let usage = ScriptedUsage { prompt_tokens: 1000, completion_tokens: 200, cached_tokens: 400, reasoning_tokens: 50 };
    mock.push(Reply::tool_call("c1", "fs__list_dir", r#"{"path":"."}"#).usage(usage));
    mock.push(Reply::text("done").usage(usage));
    let mut s = setup(&mock).await;
    s.turn("s1", "look").await;
    let snapshot = s.snapshot().await;
    // Per attempt: 600 fresh x $2 + 400 cached x $1 + 200 output x $10 per
    // million tokens = 1200 + 400 + 2000 micro-dollars.
    for attempt in snapshot["attempts"].as_array().unwrap() {
        assert_eq!(attempt["usage"]["cost_micro_usd"], 3600);
        assert_eq!(attempt["usage"]["reasoning_tokens"], 50);
    }
    let turn = &snapshot["turn"]["usage"];
    assert_eq!(turn["input_tokens"], 2000);
    assert_eq!(turn["output_tokens"], 400);
    assert_eq!(turn["cached_input_tokens"], 800);
    assert_eq!(turn["cost_micro_usd"], 7200);
    assert_eq!(snapshot["session"]["usage"], *turn);
}

#[tokio::test]
async fn a_dead_provider_trips_the_breaker_and_is_not_hammered() {
    let mock =
        MockServer::builder().fallback(|_| Reply::openai_error(503, "server_error", "down")).start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(&bundle).unwrap();
    // No fallback model here: one provider, one model.
    std::fs::write(bundle.join("keel.toml"), BUNDLE.replace("fallback_models = [\"openai-chat:backup\"]\n", ""))
        .unwrap();
    let keel =
        Keel::start_with(&dir.path().join("state"), &mock.base_url(), &bundle, &[("KEEL_RETRY_BASE_MS", "1")]).unwrap();
    let mut client = keel.client().await.unwrap();
    let created = client
        .ok("session/create", json!({"name": "p", "coworker": "worker", "workspace": support::workspace(&dir)}))
        .await
        .unwrap();
    let session = created["session"]["id"].as_str().unwrap().to_string();
    client.ok("events/subscribe", json!({"session_id": session})).await.unwrap();
    let mut errors = Vec::new();
    for n in 0..3 {
        client
            .ok("turn/start", json!({"session_id": session, "submission_id": n.to_string(), "text": "x"}))
            .await
            .unwrap();
        let events = client.events_until("turn_finished").await.unwrap();
        errors.push(events.last().unwrap()["data"]["error"]["message"].as_str().unwrap().to_string());
    }
    assert_eq!(mock.requests().len(), 5, "the breaker opened after five failures in a row");
    assert!(errors[1].contains("sends it nothing"), "{}", errors[1]);
    assert!(errors[2].contains("sends it nothing"), "{}", errors[2]);
}

#[tokio::test]
async fn arguments_that_break_the_schema_and_unknown_tools_are_refused_before_any_intent() {
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("bad_args", "fs__write_file", r#"{"path": "x.txt", "colour": "red"}"#));
    mock.push(Reply::tool_call("no_tool", "delete_everything", r#"{}"#));
    mock.push(Reply::text("ok"));
    let mut s = setup(&mock).await;
    let events = s.turn("s1", "go").await;
    assert!(!kinds(&events).contains(&"tool_call_started"), "nothing ran");
    assert_eq!(kinds(&events).iter().filter(|k| **k == "tool_call_rejected").count(), 2);
    let snapshot = s.snapshot().await;
    let ledger = snapshot["tool_calls"].as_array().unwrap();
    assert!(ledger.iter().all(|c| c["status"] == "rejected"));
    let outputs: Vec<&str> = snapshot["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .map(|i| i["output"].as_str().unwrap())
        .collect();
    assert!(outputs[0].contains("arguments.content is required"), "{}", outputs[0]);
    assert!(outputs[1].contains("no tool named \\\"delete_everything\\\""), "{}", outputs[1]);
    assert!(!s._dir.path().join("ws/x.txt").exists());
}
