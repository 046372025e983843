//! `OpenAiChat` against the keel-testkit mock server, over real sockets:
//! streaming, tool-call assembly, the request body, and every failure class.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use anyhow::Context;
use keel_protocol::{Item, ToolSpec, Usage};
use keel_provider::{FailureKind, FinishReason, ModelRequest, OpenAiChat, OpenAiChatConfig, ProviderError};
use keel_testkit::{MockServer, Reply, ScriptedUsage, responders};
use serde_json::json;

mod support;

use support::{only_request, run, stories};

fn provider(server: &MockServer) -> anyhow::Result<OpenAiChat> {
    Ok(OpenAiChat::new(OpenAiChatConfig::new(server.base_url()))?)
}

fn ask(text: &str) -> ModelRequest {
    support::ask("gpt-test", text)
}

/// The failure of a request that must fail.
async fn failure(server: &MockServer, reply: Reply) -> anyhow::Result<ProviderError> {
    support::failure_of(server, &provider(server)?, &ask("hi"), reply).await
}

#[tokio::test]
async fn text_is_streamed_as_deltas_and_usage_is_reported() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let usage = ScriptedUsage { prompt_tokens: 120, completion_tokens: 9, cached_tokens: 64, reasoning_tokens: 4 };
    let expected =
        Usage { input_tokens: 120, output_tokens: 9, cached_input_tokens: 64, reasoning_tokens: 4, ..Usage::default() };
    stories::text_streams_as_deltas(&server, &provider(&server)?, usage, expected).await
}

#[tokio::test]
async fn a_tool_call_split_across_chunks_is_reassembled_exactly() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    stories::tool_call_is_reassembled_exactly(&server, &provider(&server)?).await
}

#[tokio::test]
async fn text_then_two_parallel_tool_calls_come_out_in_order() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    stories::text_then_two_calls_come_out_in_order(&server, &provider(&server)?).await
}

#[tokio::test]
async fn hitting_the_output_limit_finishes_with_length() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    stories::output_limit_finishes_with_length(&server, &provider(&server)?).await
}

#[tokio::test]
async fn the_agent_loop_responder_answers_a_tool_result_with_text() -> anyhow::Result<()> {
    let server = MockServer::start_with(responders::tool_then_answer("write_file", r#"{"path":"x"}"#)).await?;
    stories::agent_loop_round_trip(&provider(&server)?).await
}

#[tokio::test]
async fn the_request_body_maps_history_tools_and_streaming_options() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("ok"));
    let request = ModelRequest {
        model: "gpt-test".into(),
        instructions: "You are keel.".into(),
        items: vec![
            Item::user_text("read a and b"),
            Item::assistant_text("Reading."),
            Item::FunctionCall { call_id: "c1".into(), name: "read_file".into(), arguments: r#"{"path":"a"}"#.into() },
            Item::FunctionCall { call_id: "c2".into(), name: "read_file".into(), arguments: r#"{"path":"b"}"#.into() },
            Item::FunctionCallOutput { call_id: "c1".into(), output: "A".into(), images: Vec::new() },
            Item::FunctionCallOutput { call_id: "c2".into(), output: "B".into(), images: Vec::new() },
        ],
        tools: vec![ToolSpec {
            name: "read_file".into(),
            description: "Reads a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }],
        max_output_tokens: Some(512),
        images: Default::default(),
    };
    run(&provider(&server)?, &request).await.0?;
    let recorded = only_request(&server)?;
    assert_eq!((recorded.method.as_str(), recorded.path.as_str()), ("POST", "/v1/chat/completions"));
    assert_eq!(recorded.header("content-type"), Some("application/json"));
    assert_eq!(recorded.header("accept"), Some("text/event-stream"));
    let call = |id: &str, path: &str| json!({"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!(r#"{{"path":"{path}"}}"#)}});
    assert_eq!(
        recorded.json,
        Some(json!({
            "model": "gpt-test",
            "messages": [
                {"role": "system", "content": "You are keel."},
                {"role": "user", "content": "read a and b"},
                {"role": "assistant", "content": "Reading.", "tool_calls": [call("c1", "a"), call("c2", "b")]},
                {"role": "tool", "tool_call_id": "c1", "content": "A"},
                {"role": "tool", "tool_call_id": "c2", "content": "B"},
            ],
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [{"type": "function", "function": {
                "name": "read_file",
                "description": "Reads a file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            }}],
            "max_tokens": 512,
        }))
    );
    Ok(())
}

#[tokio::test]
async fn tool_images_follow_the_tool_message_in_a_user_message() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("I see them"));
    run(&provider(&server)?, &support::screenshot_request("gpt-test")).await.0?;
    let body = only_request(&server)?.json.context("the body is not JSON")?;
    let messages = body["messages"].as_array().context("no messages")?;
    assert_eq!(messages.len(), 4, "{messages:?}");
    assert_eq!(
        messages[2],
        json!({"role": "tool", "tool_call_id": "c1", "content": format!("two shots\n{}", support::EXPIRED_PLACEHOLDER)})
    );
    assert_eq!(messages[3]["role"], "user");
    assert_eq!(messages[3]["content"][0], json!({"type": "text", "text": "Images returned by tool call c1:"}));
    assert_eq!(messages[3]["content"][1]["type"], "image_url");
    let url = messages[3]["content"][1]["image_url"]["url"].as_str().context("no image_url.url")?;
    let data = url.strip_prefix("data:image/png;base64,").context("not a PNG data URL")?;
    assert_eq!(support::decode_base64(data)?, support::SCREENSHOT_PNG);
    assert_eq!(messages[3]["content"].as_array().map(Vec::len), Some(2));
    Ok(())
}

#[tokio::test]
async fn the_bearer_token_is_sent_only_when_a_key_is_set() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("one"));
    server.push(Reply::text("two"));
    let keyed = OpenAiChat::new(OpenAiChatConfig::new(server.base_url()).with_api_key("sk-test-123"))?;
    run(&keyed, &ask("hi")).await.0?;
    run(&provider(&server)?, &ask("hi")).await.0?;
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].header("authorization"), Some("Bearer sk-test-123"));
    assert_eq!(requests[1].header("authorization"), None);
    Ok(())
}

#[tokio::test]
async fn sequential_requests_reuse_one_pooled_connection() -> anyhow::Result<()> {
    let server = MockServer::start_with(responders::always(Reply::text("pong"))).await?;
    stories::requests_reuse_one_connection(&server, &provider(&server)?).await
}

#[tokio::test]
async fn a_trailing_slash_in_the_base_url_is_tolerated() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("ok"));
    let provider = OpenAiChat::new(OpenAiChatConfig::new(format!("{}/", server.base_url())))?;
    assert_eq!(provider.endpoint(), format!("{}/chat/completions", server.base_url()));
    run(&provider, &ask("hi")).await.0?;
    assert_eq!(only_request(&server)?.path, "/v1/chat/completions");
    Ok(())
}

#[path = "openai_chat/failures.rs"]
mod failures;
