//! Unit tests for stream assembly, including the quirks of local servers.

use serde_json::json;

use super::*;
use crate::FailureKind;
use crate::decoding::decode_events;

/// Feeds `chunks` (JSON values, or `[DONE]`) and returns the result plus the
/// text deltas seen.
fn assemble(chunks: &[serde_json::Value]) -> (Result<ModelResponse, ProviderError>, Vec<String>) {
    let events = chunks.iter().map(|chunk| {
        let data = chunk.as_str().map(str::to_owned).unwrap_or_else(|| chunk.to_string());
        SseEvent { event: None, data, id: None }
    });
    decode_events(ResponseAssembler::default(), events)
}

fn delta(delta: serde_json::Value) -> serde_json::Value {
    json!({"choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
}

fn finish(reason: &str) -> serde_json::Value {
    json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
}

#[test]
fn usage_in_the_finish_chunk_and_no_done_is_accepted() {
    let (result, deltas) = assemble(&[
        delta(json!({"role": "assistant", "content": "Hi"})),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}),
    ]);
    let response = result.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(deltas, vec!["Hi"]);
    assert_eq!(response.items, vec![Item::assistant_text("Hi")]);
    assert_eq!(response.usage, Usage { input_tokens: 3, output_tokens: 1, ..Usage::default() });
    assert_eq!(response.finish, FinishReason::Stop);
}

#[test]
fn calls_without_index_or_id_are_still_assembled() {
    let (result, _) = assemble(&[
        delta(json!({"tool_calls": [{"function": {"name": "a", "arguments": "{\"x\":"}}]})),
        delta(json!({"tool_calls": [{"function": {"arguments": "1}"}}]})),
        finish("stop"),
        json!("[DONE]"),
    ]);
    let response = result.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.finish, FinishReason::ToolCalls, "stop with tool calls means tool calls");
    match response.items.as_slice() {
        [Item::FunctionCall { call_id, name, arguments }] => {
            assert!(call_id.starts_with("call_"), "{call_id}");
            assert_eq!((name.as_str(), arguments.as_str()), ("a", "{\"x\":1}"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_repeated_full_name_is_not_doubled() {
    let (result, _) = assemble(&[
        delta(json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "read", "arguments": "{"}}]})),
        delta(json!({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "read", "arguments": "}"}}]})),
        finish("tool_calls"),
    ]);
    let items = result.map(|r| r.items).unwrap_or_default();
    assert_eq!(items, vec![Item::FunctionCall { call_id: "c".into(), name: "read".into(), arguments: "{}".into() }]);
}

#[test]
fn a_stream_without_finish_is_a_transport_failure() {
    let (result, deltas) = assemble(&[delta(json!({"content": "par"})), delta(json!({"content": "tial"}))]);
    assert_eq!(deltas, vec!["par", "tial"]);
    let error = result.err().unwrap_or_else(|| panic!("expected an error"));
    assert_eq!(error.kind, FailureKind::Transport);
    assert_eq!(error.message, "the stream ended before the model finished; retry the request");
}

#[test]
fn content_filter_without_output_is_safety_blocked_but_with_output_is_kept() {
    let (result, _) = assemble(&[finish("content_filter"), json!("[DONE]")]);
    assert_eq!(result.map_err(|e| e.kind), Err(FailureKind::SafetyBlocked));

    let (result, _) = assemble(&[delta(json!({"content": "Once"})), finish("content_filter"), json!("[DONE]")]);
    assert_eq!(result.map(|r| r.finish), Ok(FinishReason::ContentFilter));
}

#[test]
fn invalid_json_is_a_transport_failure_that_quotes_the_bytes() {
    let (result, _) = assemble(&[json!("{not json")]);
    let error = result.err().unwrap_or_else(|| panic!("expected an error"));
    assert_eq!(error.kind, FailureKind::Transport);
    assert!(error.message.contains(": {not json; retry"), "{}", error.message);
}

#[test]
fn an_error_event_is_classified() {
    let mut assembler = ResponseAssembler::default();
    let event = SseEvent { event: Some("error".into()), data: r#"{"type":"overloaded_error"}"#.into(), id: None };
    let result = assembler.on_event(&event, &|_| {});
    assert_eq!(result.map_err(|e| e.kind), Err(FailureKind::Transient));
}

#[test]
fn other_finish_reasons_are_kept() {
    let (result, _) = assemble(&[delta(json!({"content": "x"})), finish("length")]);
    assert_eq!(result.map(|r| r.finish), Ok(FinishReason::Length));
    let (result, _) = assemble(&[delta(json!({"content": "x"})), finish("eos"), json!("[DONE]")]);
    assert_eq!(result.map(|r| r.finish), Ok(FinishReason::Other("eos".into())));
}

#[test]
fn a_non_streamed_completion_is_understood() {
    let body = json!({
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "x", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "y", "arguments": "{}"}}
            ]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 1}, "completion_tokens_details": null}
    });
    let mut assembler = ResponseAssembler::default();
    let outcome = assembler.on_json_body(body.to_string().as_bytes(), &|_| {});
    assert_eq!(outcome, Ok(()));
    let response = assembler.finish().unwrap_or_else(|e| panic!("{e}"));
    let ids: Vec<_> = response
        .items
        .iter()
        .filter_map(|item| match item {
            Item::FunctionCall { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, vec!["a", "b"]);
    assert_eq!(response.usage.cached_input_tokens, 1);
}
