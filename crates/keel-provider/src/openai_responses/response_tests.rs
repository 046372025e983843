//! Unit tests for decoding Responses events, including hand-made streams
//! the mock server does not produce.

use std::sync::Mutex;

use keel_protocol::Item;
use serde_json::json;

use super::*;
use crate::decoding::{decode_events, typed_events};

/// Feeds `events` (JSON values with a `type`) and returns the result plus
/// the text deltas seen.
fn decode(events: &[Value]) -> (Result<ModelResponse, ProviderError>, Vec<String>) {
    decode_events(ResponsesDecoder::default(), typed_events(events))
}

fn text_delta(index: u64, delta: &str) -> Value {
    json!({"type": "response.output_text.delta", "output_index": index, "content_index": 0, "delta": delta})
}

fn terminal(kind: &str, response: Value) -> Value {
    json!({"type": kind, "response": response})
}

fn completed() -> Value {
    terminal("response.completed", json!({"status": "completed", "output": []}))
}

fn incomplete(reason: &str) -> Value {
    terminal("response.incomplete", json!({"status": "incomplete", "incomplete_details": {"reason": reason}}))
}

#[test]
fn deltas_alone_assemble_text_and_calls_and_reasoning_is_dropped() {
    let (result, deltas) = decode(&[
        json!({"type": "response.created", "response": {"status": "in_progress"}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning", "summary": []}}),
        json!({"type": "response.reasoning_summary_text.delta", "output_index": 0, "delta": "thinking"}),
        text_delta(1, "Checking"),
        text_delta(1, " now."),
        json!({"type": "response.output_item.added", "output_index": 2,
               "item": {"type": "function_call", "call_id": "call_9", "name": "read", "arguments": ""}}),
        json!({"type": "response.function_call_arguments.delta", "output_index": 2, "delta": "{\"pa"}),
        json!({"type": "response.function_call_arguments.delta", "output_index": 2, "delta": "th\":\"a"}),
        json!({"type": "response.function_call_arguments.delta", "output_index": 2, "delta": "\"}"}),
        json!({"type": "response.something_new", "output_index": 7}),
        terminal(
            "response.completed",
            json!({"status": "completed", "output": [], "usage": {
            "input_tokens": 30, "input_tokens_details": {"cached_tokens": 8},
            "output_tokens": 12, "output_tokens_details": {"reasoning_tokens": 5}}}),
        ),
    ]);
    let response = result.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(deltas, vec!["Checking", " now."]);
    assert_eq!(
        response,
        ModelResponse {
            items: vec![
                Item::assistant_text("Checking now."),
                Item::FunctionCall {
                    call_id: "call_9".into(),
                    name: "read".into(),
                    arguments: "{\"path\":\"a\"}".into()
                },
            ],
            usage: Usage {
                input_tokens: 30,
                output_tokens: 12,
                cached_input_tokens: 8,
                reasoning_tokens: 5,
                ..Usage::default()
            },
            finish: FinishReason::ToolCalls,
        }
    );
}

#[test]
fn done_events_restate_items_in_full() {
    let (result, _) = decode(&[
        text_delta(0, "Hel"),
        json!({"type": "response.output_item.done", "output_index": 0, "item": {"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}}),
        json!({"type": "response.output_item.added", "output_index": 1,
               "item": {"type": "function_call", "call_id": "c", "name": "f", "arguments": ""}}),
        json!({"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "{\"x\""}),
        json!({"type": "response.function_call_arguments.done", "output_index": 1, "arguments": "{\"x\":1}"}),
        completed(),
    ]);
    let items = result.map(|r| r.items).unwrap_or_default();
    assert_eq!(
        items,
        vec![
            Item::assistant_text("Hello"),
            Item::FunctionCall { call_id: "c".into(), name: "f".into(), arguments: "{\"x\":1}".into() }
        ]
    );
}

#[test]
fn a_terminal_event_alone_still_carries_the_output() {
    let output = json!([
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]},
    ]);
    let (result, _) = decode(&[terminal("response.completed", json!({"status": "completed", "output": output}))]);
    assert_eq!(result.map(|r| (r.items, r.finish)), Ok((vec![Item::assistant_text("Hi")], FinishReason::Stop)));
}

#[test]
fn incomplete_responses_report_length_or_the_content_filter() {
    let (result, _) = decode(&[text_delta(0, "Once"), incomplete("max_output_tokens")]);
    assert_eq!(result.map(|r| r.finish), Ok(FinishReason::Length));
    let (result, _) = decode(&[text_delta(0, "Once"), incomplete("content_filter")]);
    assert_eq!(result.map(|r| r.finish), Ok(FinishReason::ContentFilter));
    let (result, _) = decode(&[incomplete("content_filter")]);
    assert_eq!(result.map_err(|e| e.kind), Err(FailureKind::SafetyBlocked));
    let (result, _) = decode(&[text_delta(0, "x"), incomplete("something_else")]);
    assert_eq!(result.map(|r| r.finish), Ok(FinishReason::Other("something_else".into())));
}

#[test]
fn a_refusal_without_output_is_safety_blocked() {
    let (result, deltas) = decode(&[
        json!({"type": "response.refusal.delta", "output_index": 0, "delta": "I can't help with that."}),
        completed(),
    ]);
    assert_eq!(deltas, Vec::<String>::new());
    let error = result.err().unwrap_or_else(|| panic!("expected an error"));
    assert_eq!(error.kind, FailureKind::SafetyBlocked);
    assert_eq!(
        error.message,
        "the model refused the request: I can't help with that.; change the request, sending the same one again will be refused again"
    );
}

#[test]
fn failed_responses_and_error_events_are_classified() {
    let failed =
        |code: &str| terminal("response.failed", json!({"status": "failed", "error": {"code": code, "message": "m"}}));
    let cases = [
        (failed("rate_limit_exceeded"), FailureKind::RateLimited),
        (failed("server_error"), FailureKind::Transient),
        (failed("context_length_exceeded"), FailureKind::ContextTooLong),
        (failed("invalid_prompt"), FailureKind::BadRequest),
        (terminal("response.failed", json!({"status": "failed", "error": null})), FailureKind::Transient),
        (
            json!({"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": null}),
            FailureKind::RateLimited,
        ),
        (
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}),
            FailureKind::BadRequest,
        ),
        (json!({"type": "error", "code": "server_error", "message": "oops"}), FailureKind::Transient),
    ];
    for (event, kind) in cases {
        let (result, _) = decode(&[text_delta(0, "partial"), event.clone()]);
        assert_eq!(result.map_err(|e| e.kind), Err(kind), "{event}");
    }
}

#[test]
fn a_stream_without_a_terminal_event_is_transport() {
    let (result, deltas) = decode(&[text_delta(0, "par"), text_delta(0, "tial")]);
    assert_eq!(deltas, vec!["par", "tial"]);
    assert_eq!(result, Err(stream_ended_early()));
}

#[test]
fn invalid_json_is_transport_and_quotes_the_data() {
    let mut decoder = ResponsesDecoder::default();
    let event = SseEvent { event: None, data: "{oops".into(), id: None };
    let error = decoder.on_event(&event, &|_| {}).err().unwrap_or_else(|| panic!("expected an error"));
    assert_eq!(error.kind, FailureKind::Transport);
    assert!(error.message.contains("): {oops; retry the request"), "{}", error.message);
}

#[test]
fn a_non_streamed_response_body_is_understood() {
    let body = json!({"id": "resp_1", "object": "response", "status": "completed", "output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ], "usage": {"input_tokens": 3, "output_tokens": 2}});
    let seen = Mutex::new(String::new());
    let mut decoder = ResponsesDecoder::default();
    let sink = |text: &str| seen.lock().map(|mut s| s.push_str(text)).unwrap_or_default();
    assert_eq!(decoder.on_json_body(body.to_string().as_bytes(), &sink), Ok(()));
    let response = decoder.finish().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(seen.into_inner().unwrap_or_default(), "Hi");
    assert_eq!(response.finish, FinishReason::ToolCalls);
    assert_eq!(response.usage, Usage { input_tokens: 3, output_tokens: 2, ..Usage::default() });
    assert_eq!(response.items.len(), 2);
}
