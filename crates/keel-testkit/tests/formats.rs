//! The Responses and Anthropic Messages formats on the wire: paths with and
//! without `/v1`, named events, endings and errors rendered natively, and
//! error bodies in each API's shape.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_testkit::{MockServer, Reply, ScriptedError, ScriptedUsage, responders};
use serde_json::{Value, json};

mod support;

use support::Client;

fn responses(stream: bool) -> Value {
    json!({"model": "gpt-test", "stream": stream, "store": false,
           "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]})
}

fn messages(stream: bool) -> Value {
    json!({"model": "claude-test", "stream": stream, "max_tokens": 100,
           "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
}

/// The event names of a response, checking each matches its data's `type`.
fn names(events: &[(Option<String>, Value)]) -> Vec<String> {
    for (name, data) in events {
        assert_eq!(name.as_deref(), data["type"].as_str(), "{data}");
    }
    events.iter().filter_map(|(name, _)| name.clone()).collect()
}

#[tokio::test]
async fn both_formats_are_served_with_and_without_the_v1_prefix() -> anyhow::Result<()> {
    let server = MockServer::start_with(responders::always(Reply::text("pong"))).await?;
    let mut client = Client::connect(&server).await?;
    for path in ["/v1/responses", "/responses"] {
        let response = client.post(path, &responses(true)).await?;
        assert_eq!(response.header("content-type"), Some("text/event-stream; charset=utf-8"));
        let events = response.named_events()?;
        assert_eq!(names(&events).last().map(String::as_str), Some("response.completed"), "{path}");
    }
    for path in ["/v1/messages", "/messages"] {
        let events = client.post(path, &messages(true)).await?.named_events()?;
        let names = names(&events);
        assert_eq!(names.first().map(String::as_str), Some("message_start"), "{path}");
        assert_eq!(names.last().map(String::as_str), Some("message_stop"), "{path}");
    }
    assert_eq!((server.request_count(), server.connection_count()), (4, 1));
    Ok(())
}

#[tokio::test]
async fn a_responses_stream_carries_the_full_response_at_the_end() -> anyhow::Result<()> {
    let usage = ScriptedUsage { prompt_tokens: 50, completion_tokens: 8, cached_tokens: 20, reasoning_tokens: 0 };
    let server = MockServer::builder()
        .reply(Reply::tool_call("call_1", "write_file", r#"{"path":"a"}"#).with_text("Writing.").usage(usage))
        .start()
        .await?;
    let events = Client::connect(&server).await?.post("/v1/responses", &responses(true)).await?.named_events()?;
    let (_, completed) = events.last().cloned().unwrap_or_default();
    assert_eq!(completed["response"]["status"], "completed");
    assert_eq!(completed["response"]["model"], "gpt-test");
    assert_eq!(
        completed["response"]["usage"],
        json!({"input_tokens": 50, "input_tokens_details": {"cached_tokens": 20}, "output_tokens": 8,
               "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 58})
    );
    let output = &completed["response"]["output"];
    assert_eq!(output[0]["content"][0]["text"], "Writing.");
    assert_eq!(output[1]["call_id"], "call_1");
    let sequence: Vec<u64> = events.iter().filter_map(|(_, data)| data["sequence_number"].as_u64()).collect();
    assert_eq!(sequence, (0..events.len() as u64).collect::<Vec<_>>());
    Ok(())
}

#[tokio::test]
async fn non_streamed_requests_get_one_object_in_each_format() -> anyhow::Result<()> {
    let server = MockServer::builder()
        .reply(Reply::tool_call("call_1", "write_file", r#"{"path":"a"}"#))
        .reply(Reply::tool_call("toolu_1", "write_file", r#"{"path":"a"}"#).with_text("Writing."))
        .start()
        .await?;
    let mut client = Client::connect(&server).await?;
    let body: Value = serde_json::from_slice(&client.post("/v1/responses", &responses(false)).await?.body)?;
    assert_eq!((&body["object"], &body["status"]), (&json!("response"), &json!("completed")));
    assert_eq!(body["output"][0]["arguments"], r#"{"path":"a"}"#);
    let body: Value = serde_json::from_slice(&client.post("/v1/messages", &messages(false)).await?.body)?;
    assert_eq!(body["stop_reason"], "tool_use");
    assert_eq!(
        body["content"],
        json!([{"type": "text", "text": "Writing."},
               {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {"path": "a"}}])
    );
    Ok(())
}

#[tokio::test]
async fn endings_are_rendered_natively() -> anyhow::Result<()> {
    let server = MockServer::start_with(responders::always(Reply::text("cut short").output_limit())).await?;
    let mut client = Client::connect(&server).await?;
    let events = client.post("/v1/responses", &responses(true)).await?.named_events()?;
    let (name, last) = events.last().cloned().unwrap_or_default();
    assert_eq!(name.as_deref(), Some("response.incomplete"));
    assert_eq!(last["response"]["incomplete_details"], json!({"reason": "max_output_tokens"}));
    let events = client.post("/v1/messages", &messages(true)).await?.named_events()?;
    let delta = events.iter().find(|(name, _)| name.as_deref() == Some("message_delta")).map(|(_, d)| d.clone());
    assert_eq!(delta.map(|d| d["delta"]["stop_reason"].clone()), Some(json!("max_tokens")));
    let chat = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let events = client.post("/v1/chat/completions", &chat).await?.events();
    assert!(events.iter().any(|e| e.contains(r#""finish_reason":"length""#)), "{events:?}");
    Ok(())
}

#[tokio::test]
async fn in_stream_errors_are_rendered_natively() -> anyhow::Result<()> {
    let server =
        MockServer::start_with(responders::always(Reply::text("x").in_stream_error(ScriptedError::Overloaded))).await?;
    let mut client = Client::connect(&server).await?;
    let events = client.post("/v1/messages", &messages(true)).await?.named_events()?;
    assert_eq!(
        events.last().cloned(),
        Some((
            Some("error".to_owned()),
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
        ))
    );
    let events = client.post("/v1/responses", &responses(true)).await?.named_events()?;
    let (name, failed) = events.last().cloned().unwrap_or_default();
    assert_eq!(name.as_deref(), Some("response.failed"));
    assert_eq!(
        failed["response"]["error"],
        json!({"code": "server_error", "message": "The server is overloaded or not ready yet."})
    );
    // Without a stream, the same error is an HTTP error.
    let response = client.post("/v1/messages", &messages(false)).await?;
    assert_eq!(response.status, 529);
    Ok(())
}

#[tokio::test]
async fn http_errors_use_each_api_s_error_shape() -> anyhow::Result<()> {
    let server = MockServer::start_with(responders::always(Reply::http_error(ScriptedError::Overloaded))).await?;
    let mut client = Client::connect(&server).await?;
    let response = client.post("/v1/messages", &messages(true)).await?;
    assert_eq!(response.status, 529);
    assert_eq!(response.header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_slice(&response.body)?;
    assert_eq!(
        body,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "request_id": "req_mock_1"})
    );
    let response = client.post("/v1/responses", &responses(true)).await?;
    let body: Value = serde_json::from_slice(&response.body)?;
    assert_eq!(response.status, 503);
    assert_eq!(body["error"]["type"], "server_error");
    Ok(())
}

#[tokio::test]
async fn routing_errors_and_the_default_fallback_speak_the_format() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let mut client = Client::connect(&server).await?;
    let response = client.post("/v1/messages", &messages(true)).await?;
    let body: Value = serde_json::from_slice(&response.body)?;
    assert_eq!(
        (response.status, &body["type"], &body["error"]["type"]),
        (400, &json!("error"), &json!("invalid_request_error"))
    );
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("no scripted reply left")), "{body}");

    client.send(b"GET /v1/messages HTTP/1.1\r\nhost: x\r\n\r\n").await?;
    let response = client.response().await?;
    let body: Value = serde_json::from_slice(&response.body)?;
    assert_eq!((response.status, &body["type"]), (405, &json!("error")));
    Ok(())
}

#[tokio::test]
async fn the_agent_loop_responder_reads_the_last_input_of_each_format() -> anyhow::Result<()> {
    let server = MockServer::start_with(responders::tool_then_answer("write_file", "{}")).await?;
    let mut client = Client::connect(&server).await?;
    let events = client.post("/v1/messages", &messages(true)).await?.named_events()?;
    assert!(events.iter().any(|(_, data)| data["content_block"]["type"] == "tool_use"));
    let mut answer = messages(true);
    answer["messages"] =
        json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "ok"}]}]);
    let events = client.post("/v1/messages", &answer).await?.named_events()?;
    assert!(events.iter().any(|(_, data)| data["delta"]["stop_reason"] == "end_turn"));

    let mut answer = responses(true);
    answer["input"] = json!([{"type": "function_call_output", "call_id": "call_2", "output": "ok"}]);
    let events = client.post("/v1/responses", &answer).await?.named_events()?;
    assert!(events.iter().any(|(_, data)| data["type"] == "response.output_text.done" && data["text"] == "Done."));
    Ok(())
}
