//! `OpenAiChat` against the keel-testkit mock server, over real sockets:
//! streaming, tool-call assembly, the request body, and every failure class.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use keel_protocol::{Item, ToolSpec, Usage};
use keel_provider::{
    FailureKind, FinishReason, ModelProvider, ModelRequest, ModelResponse, OpenAiChat, OpenAiChatConfig, ProviderError,
};
use keel_testkit::{MockServer, RecordedRequest, Reply, ScriptedUsage, ToolCall};
use serde_json::json;

fn provider(server: &MockServer) -> anyhow::Result<OpenAiChat> {
    Ok(OpenAiChat::new(OpenAiChatConfig::new(server.base_url()))?)
}

fn ask(text: &str) -> ModelRequest {
    ModelRequest {
        model: "gpt-test".into(),
        instructions: String::new(),
        items: vec![Item::user_text(text)],
        tools: vec![],
        max_output_tokens: None,
    }
}

/// Runs one request and returns the outcome and the text deltas seen.
async fn run(provider: &OpenAiChat, request: &ModelRequest) -> (Result<ModelResponse, ProviderError>, Vec<String>) {
    let deltas = Mutex::new(Vec::new());
    let sink = |text: &str| {
        if let Ok(mut deltas) = deltas.lock() {
            deltas.push(text.to_owned());
        }
    };
    let result = provider.stream(request, &sink).await;
    (result, deltas.into_inner().unwrap_or_default())
}

/// The failure of a request that must fail.
async fn failure(server: &MockServer, reply: Reply) -> anyhow::Result<ProviderError> {
    server.push(reply);
    let (result, _) = run(&provider(server)?, &ask("hi")).await;
    match result {
        Ok(response) => anyhow::bail!("expected a failure, got {response:?}"),
        Err(error) => Ok(error),
    }
}

fn only_request(server: &MockServer) -> anyhow::Result<RecordedRequest> {
    let mut requests = server.requests();
    anyhow::ensure!(requests.len() == 1, "expected one request, got {}", requests.len());
    requests.pop().context("no request")
}

#[tokio::test]
async fn text_is_streamed_as_deltas_and_usage_is_reported() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let usage = ScriptedUsage { prompt_tokens: 120, completion_tokens: 9, cached_tokens: 64, reasoning_tokens: 4 };
    server.push(Reply::text("Hello from keel").usage(usage));
    let (result, deltas) = run(&provider(&server)?, &ask("hi")).await;
    let response = result?;
    assert_eq!(deltas, vec!["Hello", " from", " keel"]);
    assert_eq!(
        response,
        ModelResponse {
            items: vec![Item::assistant_text("Hello from keel")],
            usage: Usage { input_tokens: 120, output_tokens: 9, cached_input_tokens: 64, reasoning_tokens: 4 },
            finish: FinishReason::Stop,
        }
    );
    Ok(())
}

#[tokio::test]
async fn a_tool_call_split_across_chunks_is_reassembled_exactly() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let arguments = r#"{"path":"hello.txt","content":"Hello from keel \u00e9 \"quoted\""}"#;
    server.push(Reply::tool_call("call_abc", "write_file", arguments));
    let (result, deltas) = run(&provider(&server)?, &ask("write it")).await;
    let response = result?;
    assert_eq!(deltas, Vec::<String>::new());
    assert_eq!(
        response.items,
        vec![Item::FunctionCall { call_id: "call_abc".into(), name: "write_file".into(), arguments: arguments.into() }]
    );
    assert_eq!(response.finish, FinishReason::ToolCalls);
    Ok(())
}

#[tokio::test]
async fn text_then_two_parallel_tool_calls_come_out_in_order() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(
        Reply::tool_calls([
            ToolCall::new("call_1", "read_file", r#"{"path":"a.txt"}"#),
            ToolCall::new("call_2", "read_file", r#"{"path":"b.txt"}"#),
        ])
        .with_text("Reading both."),
    );
    let (result, deltas) = run(&provider(&server)?, &ask("read")).await;
    let response = result?;
    assert_eq!(deltas.concat(), "Reading both.");
    assert_eq!(
        response.items,
        vec![
            Item::assistant_text("Reading both."),
            Item::FunctionCall {
                call_id: "call_1".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"a.txt"}"#.into()
            },
            Item::FunctionCall {
                call_id: "call_2".into(),
                name: "read_file".into(),
                arguments: r#"{"path":"b.txt"}"#.into()
            },
        ]
    );
    assert_eq!(response.finish, FinishReason::ToolCalls);
    Ok(())
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
            Item::FunctionCallOutput { call_id: "c1".into(), output: "A".into() },
            Item::FunctionCallOutput { call_id: "c2".into(), output: "B".into() },
        ],
        tools: vec![ToolSpec {
            name: "read_file".into(),
            description: "Reads a file".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }],
        max_output_tokens: Some(512),
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
    let server = MockServer::start_with(keel_testkit::responders::always(Reply::text("pong"))).await?;
    let provider = provider(&server)?;
    for _ in 0..20 {
        run(&provider, &ask("ping")).await.0?;
    }
    assert_eq!(server.request_count(), 20);
    assert_eq!(server.connection_count(), 1);
    Ok(())
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
