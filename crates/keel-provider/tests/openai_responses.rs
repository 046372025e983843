//! `OpenAiResponses` against the keel-testkit mock server speaking the
//! Responses wire format, over real sockets: streaming, tool-call assembly,
//! the request body, and every failure class.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use anyhow::Context;
use keel_protocol::{ContentPart, Item, Role, ToolSpec, Usage};
use keel_provider::{
    FailureKind, FinishReason, ModelProvider, ModelRequest, OpenAiResponses, OpenAiResponsesConfig, ProviderError,
};
use keel_testkit::{MockServer, Reply, ScriptedError, ScriptedUsage, responders};
use serde_json::json;

mod support;

use support::{only_request, run, stories};

fn provider(server: &MockServer) -> anyhow::Result<OpenAiResponses> {
    Ok(OpenAiResponses::new(OpenAiResponsesConfig::new(server.base_url()))?)
}

fn ask(text: &str) -> ModelRequest {
    support::ask("gpt-5", text)
}

/// The failure of a request that must fail.
async fn failure(server: &MockServer, reply: Reply) -> anyhow::Result<ProviderError> {
    support::failure_of(server, &provider(server)?, &ask("hi"), reply).await
}

fn call(id: &str, name: &str, arguments: &str) -> Item {
    Item::FunctionCall { call_id: id.into(), name: name.into(), arguments: arguments.into() }
}

#[tokio::test]
async fn text_is_streamed_as_deltas_and_usage_is_reported() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    // Reasoning tokens also make the mock send a reasoning item, which is
    // not kept.
    let usage = ScriptedUsage { prompt_tokens: 120, completion_tokens: 9, cached_tokens: 64, reasoning_tokens: 4 };
    let expected =
        Usage { input_tokens: 120, output_tokens: 9, cached_input_tokens: 64, reasoning_tokens: 4, ..Usage::default() };
    let provider = provider(&server)?;
    assert_eq!(provider.name(), "openai");
    stories::text_streams_as_deltas(&server, &provider, usage, expected).await
}

#[tokio::test]
async fn a_tool_call_split_across_fragments_is_reassembled_exactly() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    stories::tool_call_is_reassembled_exactly(&server, &provider(&server)?).await
}

#[tokio::test]
async fn text_then_two_tool_calls_come_out_in_order() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    stories::text_then_two_calls_come_out_in_order(&server, &provider(&server)?).await
}

#[tokio::test]
async fn the_request_body_maps_history_tools_and_options() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("ok"));
    let notice = Item::Message {
        role: Role::User,
        content: vec![ContentPart::InputText { text: "The call c2 was interrupted.".into() }],
        runtime_notice: Some("interrupted".into()),
    };
    let request = ModelRequest {
        model: "gpt-5".into(),
        instructions: "You are keel.".into(),
        items: vec![
            Item::user_text("read a and b"),
            Item::assistant_text("Reading."),
            call("c1", "read_file", r#"{"path":"a"}"#),
            call("c2", "read_file", r#"{"path":"b"}"#),
            Item::FunctionCallOutput { call_id: "c1".into(), output: "A".into(), images: Vec::new() },
            notice,
        ],
        tools: vec![ToolSpec {
            name: "read_file".into(),
            description: "Reads a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }],
        max_output_tokens: Some(512),
        images: Default::default(),
    };
    let provider = OpenAiResponses::new(OpenAiResponsesConfig::new(server.base_url()).with_api_key("sk-test-1"))?;
    run(&provider, &request).await.0?;
    let recorded = only_request(&server)?;
    assert_eq!((recorded.method.as_str(), recorded.path.as_str()), ("POST", "/v1/responses"));
    assert_eq!(recorded.header("content-type"), Some("application/json"));
    assert_eq!(recorded.header("accept"), Some("text/event-stream"));
    assert_eq!(recorded.header("authorization"), Some("Bearer sk-test-1"));
    let function_call = |id: &str, path: &str| json!({"type": "function_call", "call_id": id, "name": "read_file", "arguments": format!(r#"{{"path":"{path}"}}"#)});
    assert_eq!(
        recorded.json,
        Some(json!({
            "model": "gpt-5",
            "instructions": "You are keel.",
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "read a and b"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]},
                function_call("c1", "a"),
                function_call("c2", "b"),
                {"type": "function_call_output", "call_id": "c1", "output": "A"},
                {"type": "message", "role": "developer",
                 "content": [{"type": "input_text", "text": "The call c2 was interrupted."}]},
            ],
            "tools": [{
                "type": "function",
                "name": "read_file",
                "description": "Reads a file",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            }],
            "stream": true,
            "store": false,
            "max_output_tokens": 512,
        }))
    );
    Ok(())
}

#[tokio::test]
async fn tool_images_are_sent_as_input_image_parts_of_the_output() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("I see them"));
    run(&provider(&server)?, &support::screenshot_request("gpt-5")).await.0?;
    let body = only_request(&server)?.json.context("the body is not JSON")?;
    let output = &body["input"][2];
    assert_eq!((output["type"].as_str(), output["call_id"].as_str()), (Some("function_call_output"), Some("c1")));
    let parts = output["output"].as_array().context("the output is not a list of parts")?;
    assert_eq!(parts.len(), 2, "{parts:?}");
    assert_eq!(parts[0], json!({"type": "input_text", "text": format!("two shots\n{}", support::EXPIRED_PLACEHOLDER)}));
    assert_eq!(parts[1]["type"], "input_image");
    let url = parts[1]["image_url"].as_str().context("no image_url")?;
    let data = url.strip_prefix("data:image/png;base64,").context("not a PNG data URL")?;
    assert_eq!(support::decode_base64(data)?, support::SCREENSHOT_PNG);
    Ok(())
}

#[tokio::test]
async fn without_a_key_no_authorization_is_sent() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("ok"));
    run(&provider(&server)?, &ask("hi")).await.0?;
    assert_eq!(only_request(&server)?.header("authorization"), None);
    Ok(())
}

#[tokio::test]
async fn hitting_the_output_limit_finishes_with_length_and_keeps_the_text() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    stories::output_limit_finishes_with_length(&server, &provider(&server)?).await
}

#[tokio::test]
async fn the_agent_loop_responder_answers_a_tool_result_with_text() -> anyhow::Result<()> {
    let server = MockServer::start_with(responders::tool_then_answer("write_file", r#"{"path":"x"}"#)).await?;
    stories::agent_loop_round_trip(&provider(&server)?).await
}

#[tokio::test]
async fn sequential_requests_reuse_one_pooled_connection() -> anyhow::Result<()> {
    let server = MockServer::start_with(responders::always(Reply::text("pong"))).await?;
    let provider = provider(&server)?;
    assert_eq!(provider.endpoint(), format!("{}/responses", server.base_url()));
    stories::requests_reuse_one_connection(&server, &provider).await
}

#[path = "openai_responses/failures.rs"]
mod failures;
