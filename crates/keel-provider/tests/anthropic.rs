//! `Anthropic` against the keel-testkit mock server speaking the Messages
//! wire format, over real sockets: streaming, `tool_use` input assembly,
//! the request body and headers, and every failure class.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use anyhow::Context;
use keel_protocol::{ContentPart, Item, Role, ToolSpec, Usage};
use keel_provider::{Anthropic, AnthropicConfig, FailureKind, ModelProvider, ModelRequest, ProviderError};
use keel_testkit::{MockServer, Reply, ScriptedError, ScriptedUsage, responders};
use serde_json::json;

mod support;

use support::{only_request, run, stories};

/// A provider whose base URL ends in `/v1`, as `MockServer::base_url` does.
fn provider(server: &MockServer) -> anyhow::Result<Anthropic> {
    Ok(Anthropic::new(AnthropicConfig::new(server.base_url()))?)
}

fn ask(text: &str) -> ModelRequest {
    support::ask("claude-test", text)
}

/// The failure of a request that must fail.
async fn failure(server: &MockServer, reply: Reply) -> anyhow::Result<ProviderError> {
    support::failure_of(server, &provider(server)?, &ask("hi"), reply).await
}

fn call(id: &str, name: &str, arguments: &str) -> Item {
    Item::FunctionCall { call_id: id.into(), name: name.into(), arguments: arguments.into() }
}

fn output(id: &str, text: &str) -> Item {
    Item::FunctionCallOutput { call_id: id.into(), output: text.into(), images: Vec::new() }
}

#[tokio::test]
async fn text_is_streamed_as_deltas_and_usage_counts_cache_reads() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    // Sent as input_tokens 56 plus cache_read_input_tokens 64.
    let usage = ScriptedUsage { prompt_tokens: 120, completion_tokens: 9, cached_tokens: 64, reasoning_tokens: 0 };
    let expected = Usage { input_tokens: 120, output_tokens: 9, cached_input_tokens: 64, ..Usage::default() };
    let provider = provider(&server)?;
    assert_eq!(provider.name(), "anthropic");
    stories::text_streams_as_deltas(&server, &provider, usage, expected).await
}

#[tokio::test]
async fn tool_input_split_across_fragments_is_reassembled_exactly() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    stories::tool_call_is_reassembled_exactly(&server, &provider(&server)?).await
}

#[tokio::test]
async fn text_then_two_tool_calls_come_out_in_order() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    stories::text_then_two_calls_come_out_in_order(&server, &provider(&server)?).await
}

#[tokio::test]
async fn a_tool_use_without_input_deltas_has_empty_object_arguments() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::tool_call("toolu_1", "list_files", ""));
    let response = run(&provider(&server)?, &ask("list")).await.0?;
    assert_eq!(response.items, vec![call("toolu_1", "list_files", "{}")]);
    Ok(())
}

#[tokio::test]
async fn the_request_body_merges_history_into_alternating_messages() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("ok"));
    let request = ModelRequest {
        model: "claude-test".into(),
        instructions: "You are keel.".into(),
        items: vec![
            Item::Message {
                role: Role::System,
                content: vec![ContentPart::InputText { text: "Use metric units.".into() }],
                runtime_notice: None,
            },
            Item::user_text("read a and b"),
            Item::assistant_text("Reading."),
            call("c1", "read_file", r#"{"path":"a"}"#),
            call("c2", "read_file", r#"{"path":"b"}"#),
            output("c1", "A"),
            output("c2", "B"),
            Item::Message {
                role: Role::User,
                content: vec![ContentPart::InputText { text: "Both files were read.".into() }],
                runtime_notice: Some("note".into()),
            },
        ],
        tools: vec![ToolSpec {
            name: "read_file".into(),
            description: "Reads a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }],
        max_output_tokens: None,
        images: Default::default(),
    };
    let config = AnthropicConfig::new(server.base_url()).with_api_key("sk-ant-test-1");
    run(&Anthropic::new(config)?, &request).await.0?;
    let recorded = only_request(&server)?;
    assert_eq!((recorded.method.as_str(), recorded.path.as_str()), ("POST", "/v1/messages"));
    assert_eq!(recorded.header("x-api-key"), Some("sk-ant-test-1"));
    assert_eq!(recorded.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(recorded.header("content-type"), Some("application/json"));
    assert_eq!(recorded.header("authorization"), None);
    let tool_use =
        |id: &str, path: &str| json!({"type": "tool_use", "id": id, "name": "read_file", "input": {"path": path}});
    let tool_result = |id: &str, text: &str| json!({"type": "tool_result", "tool_use_id": id, "content": text});
    assert_eq!(
        recorded.json,
        Some(json!({
            "model": "claude-test",
            "system": "You are keel.\n\nUse metric units.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "read a and b"}]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Reading."}, tool_use("c1", "a"), tool_use("c2", "b")]},
                {"role": "user", "content": [
                    tool_result("c1", "A"), tool_result("c2", "B"), {"type": "text", "text": "Both files were read."}]},
            ],
            "tools": [{
                "name": "read_file",
                "description": "Reads a file",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            }],
            "max_tokens": 4096,
            "stream": true,
        }))
    );
    Ok(())
}

#[tokio::test]
async fn tool_images_are_sent_as_base64_image_blocks_of_the_tool_result() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("I see them"));
    run(&provider(&server)?, &support::screenshot_request("claude-test")).await.0?;
    let body = only_request(&server)?.json.context("the body is not JSON")?;
    let result = &body["messages"][2]["content"][0];
    assert_eq!((result["type"].as_str(), result["tool_use_id"].as_str()), (Some("tool_result"), Some("c1")));
    let blocks = result["content"].as_array().context("the tool result content is not a list of blocks")?;
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    assert_eq!(blocks[0], json!({"type": "text", "text": format!("two shots\n{}", support::EXPIRED_PLACEHOLDER)}));
    assert_eq!(blocks[1]["type"], "image");
    assert_eq!(
        (blocks[1]["source"]["type"].as_str(), blocks[1]["source"]["media_type"].as_str()),
        (Some("base64"), Some("image/png"))
    );
    let data = blocks[1]["source"]["data"].as_str().context("no image data")?;
    assert_eq!(support::decode_base64(data)?, support::SCREENSHOT_PNG);
    Ok(())
}

#[tokio::test]
async fn the_output_limit_and_version_come_from_the_request_and_config() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("ok"));
    let mut config = AnthropicConfig::new(server.base_url());
    config.anthropic_version = "2024-01-01".into();
    config.max_tokens = 1000;
    let mut request = ask("hi");
    request.max_output_tokens = Some(256);
    run(&Anthropic::new(config)?, &request).await.0?;
    let recorded = only_request(&server)?;
    assert_eq!(recorded.header("anthropic-version"), Some("2024-01-01"));
    assert_eq!(recorded.header("x-api-key"), None, "no key configured, none sent");
    assert_eq!(recorded.json.as_ref().map(|body| body["max_tokens"].clone()), Some(json!(256)));
    Ok(())
}

#[tokio::test]
async fn a_base_url_without_the_version_reaches_v1_messages() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("ok"));
    let root = format!("http://{}", server.addr());
    let provider = Anthropic::new(AnthropicConfig::new(format!("{root}/")))?;
    assert_eq!(provider.endpoint(), format!("{root}/v1/messages"));
    run(&provider, &ask("hi")).await.0?;
    assert_eq!(only_request(&server)?.path, "/v1/messages");
    Ok(())
}

#[tokio::test]
async fn hitting_max_tokens_finishes_with_length_and_keeps_the_text() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    stories::output_limit_finishes_with_length(&server, &provider(&server)?).await
}

#[tokio::test]
async fn the_agent_loop_responder_answers_tool_results_with_text() -> anyhow::Result<()> {
    let server = MockServer::start_with(responders::tool_then_answer("write_file", r#"{"path":"x"}"#)).await?;
    stories::agent_loop_round_trip(&provider(&server)?).await
}

#[tokio::test]
async fn sequential_requests_reuse_one_pooled_connection() -> anyhow::Result<()> {
    let server = MockServer::start_with(responders::always(Reply::text("pong"))).await?;
    stories::requests_reuse_one_connection(&server, &provider(&server)?).await
}

#[path = "anthropic/failures.rs"]
mod failures;
