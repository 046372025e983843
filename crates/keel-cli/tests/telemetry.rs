//! OpenTelemetry through the real binary and a real OTLP/HTTP collector
//! (keel-testkit's receiver, decoding with the official protobuf types):
//! the span tree of a turn, segments across a wait and a restart, metrics,
//! content off by default, and a collector that is down or slow costing
//! turns nothing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use keel_testkit::otlp::OtlpReceiver;
use keel_testkit::{MockServer, Reply, ScriptedUsage};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::json;
use support::Keel;

fn otel_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.to_string()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50".into()),
        ("OTEL_METRIC_EXPORT_INTERVAL", "200".into()),
        ("KEEL_RETRY_BASE_MS", "5".into()),
    ]
}

fn start(state: &Path, mock: &MockServer, env: &[(&'static str, String)]) -> Keel {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Keel::start_with(state, &mock.base_url(), &support::example_bundle(), &env).unwrap()
}

fn attr(span: &Span, key: &str) -> Option<Any> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| a.value.clone()).and_then(|v| v.value)
}

fn text(span: &Span, key: &str) -> String {
    match attr(span, key) {
        Some(Any::StringValue(s)) => s,
        other => panic!("{key} on {}: {other:?}", span.name),
    }
}

fn int(span: &Span, key: &str) -> i64 {
    match attr(span, key) {
        Some(Any::IntValue(n)) => n,
        other => panic!("{key} on {}: {other:?}", span.name),
    }
}

/// Waits until the collector holds a span named `name`.
async fn wait_for_span(receiver: &OtlpReceiver, name: &str) -> Vec<Span> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let spans = receiver.spans();
        if spans.iter().any(|s| s.name.starts_with(name)) {
            return spans;
        }
        assert!(
            Instant::now() < deadline,
            "no {name} span; got {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_turn_with_a_retry_and_a_tool_call_is_one_span_tree() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let receiver = OtlpReceiver::start().await.unwrap();
    let mock = MockServer::start().await.unwrap();
    let usage = ScriptedUsage { prompt_tokens: 120, completion_tokens: 30, cached_tokens: 0, reasoning_tokens: 0 };
    mock.push(Reply::openai_error(429, "rate_limit_exceeded", "slow down"));
    mock.push(Reply::tool_call("c1", "fs__write_file", r#"{"path":"a.txt","content":"x"}"#).usage(usage));
    mock.push(Reply::text("done").usage(usage));
    let keel = start(&dir.path().join("state"), &mock, &otel_env(&receiver.endpoint()));
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    let started =
        client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "write"})).await.unwrap();
    client.events_until("turn_finished").await.unwrap();
    let spans = wait_for_span(&receiver, "invoke_agent").await;

    let by_name = |prefix: &str| spans.iter().filter(|s| s.name.starts_with(prefix)).collect::<Vec<_>>();
    let agent = by_name("invoke_agent");
    assert_eq!(agent.len(), 1);
    let agent = agent[0];
    assert_eq!(agent.name, "invoke_agent assistant-example");
    assert!(agent.parent_span_id.is_empty(), "the turn is the root");
    assert_eq!(text(agent, "gen_ai.operation.name"), "invoke_agent");
    assert_eq!(text(agent, "keel.turn.id"), started["turn_id"].as_str().unwrap());
    assert_eq!(text(agent, "keel.turn.status"), "completed");
    assert_eq!(int(agent, "gen_ai.usage.input_tokens"), 240);
    let segments = by_name("segment");
    assert_eq!(segments.len(), 1);
    assert_eq!(segments[0].parent_span_id, agent.span_id);
    let chats = by_name("chat ");
    assert_eq!(chats.len(), 3, "one span per attempt, the failed one included");
    let tools = by_name("execute_tool");
    assert_eq!(tools.len(), 1);
    for span in chats.iter().chain(&tools) {
        assert_eq!(span.trace_id, agent.trace_id);
        assert_eq!(span.parent_span_id, segments[0].span_id);
    }
    let mut chats = chats;
    chats.sort_by_key(|s| int(s, "keel.attempt"));
    assert_eq!(chats[0].name, "chat gpt-4o-mini");
    assert_eq!(text(chats[0], "gen_ai.provider.name"), "openai");
    assert_eq!(text(chats[0], "keel.attempt.outcome"), "failed");
    assert_eq!(text(chats[0], "error.type"), "rate_limited");
    assert_eq!(chats[0].status.as_ref().unwrap().code, 2, "error status");
    assert_eq!(text(chats[1], "keel.attempt.outcome"), "completed");
    assert_eq!(int(chats[1], "gen_ai.usage.output_tokens"), 30);
    match attr(chats[1], "gen_ai.response.finish_reasons") {
        Some(Any::ArrayValue(array)) => assert_eq!(array.values.len(), 1),
        other => panic!("finish reasons: {other:?}"),
    }
    assert_eq!(text(tools[0], "gen_ai.tool.name"), "fs__write_file");
    assert_eq!(text(tools[0], "gen_ai.tool.call.id"), "c1");
    assert_eq!(text(tools[0], "keel.tool.outcome"), "completed");
    assert!(spans.iter().all(|s| attr(s, "gen_ai.output.messages").is_none()), "content is off by default");

    // Metrics arrive too.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let names: Vec<String> = receiver.metrics().iter().map(|m| m.name.clone()).collect();
        let wanted = [
            "keel.turns",
            "keel.model.attempts",
            "keel.tool.calls",
            "gen_ai.client.token.usage",
            "gen_ai.client.operation.duration",
        ];
        if wanted.iter().all(|w| names.iter().any(|n| n == w)) {
            break;
        }
        assert!(Instant::now() < deadline, "metrics so far: {names:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_turn_that_waits_and_resumes_after_a_restart_continues_its_trace() {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let state = dir.path().join("state");
    let receiver = OtlpReceiver::start().await.unwrap();
    let mock = MockServer::start().await.unwrap();
    mock.push(Reply::tool_call("c1", "shell__run", r#"{"command":"touch x"}"#));
    let mut env = otel_env(&receiver.endpoint());
    env.push(("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true".into()));
    let keel = start(&state, &mock, &env);
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    client.ok("turn/start", json!({"session_id": id, "submission_id": "s1", "text": "touch"})).await.unwrap();
    let waiting = client.events_until("turn_waiting").await.unwrap();
    let question = waiting.last().unwrap()["data"]["interaction_id"].clone();
    wait_for_span(&receiver, "segment").await;
    drop(client);
    keel.terminate();
    keel.wait();

    mock.push(Reply::text("touched"));
    let keel = start(&state, &mock, &env);
    let mut client = keel.client().await.unwrap();
    client
        .ok("interaction/respond", json!({"session_id": id, "interaction_id": question, "decision": "allow_once"}))
        .await
        .unwrap();
    client.wait_for_status(&id, "completed").await.unwrap();
    let spans = wait_for_span(&receiver, "invoke_agent").await;
    let agent = spans.iter().find(|s| s.name.starts_with("invoke_agent")).unwrap();
    let segments: Vec<&Span> = spans.iter().filter(|s| s.name == "segment").collect();
    assert_eq!(segments.len(), 2, "one segment before the wait, one after the restart");
    let outcomes: HashMap<String, usize> = segments.iter().fold(HashMap::new(), |mut m, s| {
        *m.entry(text(s, "keel.segment.outcome")).or_default() += 1;
        m
    });
    assert_eq!(outcomes.get("waiting"), Some(&1), "{outcomes:?}");
    assert_eq!(outcomes.get("completed"), Some(&1), "{outcomes:?}");
    for span in &spans {
        assert_eq!(span.trace_id, agent.trace_id, "{} is in the turn's trace", span.name);
    }
    for segment in segments {
        assert_eq!(segment.parent_span_id, agent.span_id);
    }
    let captured: Vec<String> = spans
        .iter()
        .filter(|s| s.name.starts_with("chat ") && attr(s, "gen_ai.output.messages").is_some())
        .map(|s| text(s, "gen_ai.output.messages"))
        .collect();
    assert_eq!(captured.len(), 2, "content is captured when asked");
    assert!(captured.iter().any(|c| c.contains("touched")) && captured.iter().any(|c| c.contains("shell__run")));
}

/// Runs turns for `window` and returns how many completed.
async fn turns_in_window(env: &[(&'static str, String)], window: Duration) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let ws = support::workspace(&dir);
    let mock = MockServer::start_with(keel_testkit::responders::always(Reply::text("ok"))).await.unwrap();
    let keel = start(&dir.path().join("state"), &mock, env);
    let mut client = keel.client().await.unwrap();
    let id = client.create_session(&ws).await.unwrap();
    client.ok("events/subscribe", json!({"session_id": id})).await.unwrap();
    let began = Instant::now();
    let mut done = 0;
    while began.elapsed() < window {
        client
            .ok("turn/start", json!({"session_id": id, "submission_id": format!("s{done}"), "text": "hi"}))
            .await
            .unwrap();
        client.events_until("turn_finished").await.unwrap();
        done += 1;
    }
    // Stopping flushes within its timeout even when the collector hangs.
    let stopping = Instant::now();
    keel.terminate();
    keel.wait();
    assert!(stopping.elapsed() < Duration::from_secs(30), "keel stopped within its flush timeout");
    done
}

#[tokio::test]
async fn a_collector_that_is_down_or_slow_does_not_slow_turns() {
    let window = Duration::from_secs(2);
    let baseline = turns_in_window(&[], window).await;
    // Down: nothing listens on the endpoint.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let with_down = turns_in_window(&otel_env(&down), window).await;
    // Slow: the collector holds every answer for a minute.
    let slow = OtlpReceiver::start().await.unwrap();
    slow.set_delay(Duration::from_secs(60));
    let with_slow = turns_in_window(&otel_env(&slow.endpoint()), window).await;
    eprintln!("turns in {window:?}: no telemetry {baseline}, collector down {with_down}, collector slow {with_slow}");
    // Generous bounds: a blocking exporter would manage one turn or none.
    assert!(with_down * 3 >= baseline, "down: {with_down} vs {baseline}");
    assert!(with_slow * 3 >= baseline, "slow: {with_slow} vs {baseline}");
    assert!(with_slow >= 5 && with_down >= 5);
}
