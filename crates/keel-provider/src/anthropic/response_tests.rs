//! Unit tests for decoding Messages events, including hand-made streams
//! the mock server does not produce.

use keel_protocol::Item;
use serde_json::json;

use super::*;
use crate::decoding::{decode_events, typed_events};

/// Feeds `events` (JSON values with a `type`, sent under that event name)
/// and returns the result plus the text deltas seen.
fn decode(events: &[Value]) -> (Result<ModelResponse, ProviderError>, Vec<String>) {
    decode_events(MessagesDecoder::default(), typed_events(events))
}

fn start(usage: Value) -> Value {
    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
           "content": [], "stop_reason": null, "usage": usage}})
}

fn text_block(index: u64) -> Value {
    json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
}

fn text_delta(index: u64, text: &str) -> Value {
    json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})
}

fn tool_block(index: u64, id: &str, name: &str) -> Value {
    json!({"type": "content_block_start", "index": index,
           "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})
}

fn json_delta(index: u64, partial: &str) -> Value {
    json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": partial}})
}

fn stop(index: u64) -> Value {
    json!({"type": "content_block_stop", "index": index})
}

fn message_delta(reason: &str, output_tokens: u64) -> Value {
    json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null},
           "usage": {"output_tokens": output_tokens}})
}

fn message_stop() -> Value {
    json!({"type": "message_stop"})
}

#[test]
fn thinking_is_dropped_and_text_and_tools_come_out_in_block_order() {
    let (result, deltas) = decode(&[
        start(
            json!({"input_tokens": 20, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 5, "output_tokens": 1}),
        ),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "x"}}),
        stop(0),
        text_block(1),
        json!({"type": "ping"}),
        text_delta(1, "Let me"),
        text_delta(1, " look."),
        stop(1),
        tool_block(2, "toolu_1", "read"),
        json_delta(2, ""),
        json_delta(2, "{\"pa"),
        json_delta(2, "th\": \"a"),
        json_delta(2, "\"}"),
        stop(2),
        message_delta("tool_use", 42),
        message_stop(),
    ]);
    let response = result.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(deltas, vec!["Let me", " look."]);
    assert_eq!(
        response,
        ModelResponse {
            items: vec![
                Item::assistant_text("Let me look."),
                Item::FunctionCall {
                    call_id: "toolu_1".into(),
                    name: "read".into(),
                    arguments: "{\"path\": \"a\"}".into()
                },
            ],
            usage: Usage { input_tokens: 125, output_tokens: 42, cached_input_tokens: 100, ..Usage::default() },
            finish: FinishReason::ToolCalls,
        }
    );
}

#[test]
fn a_tool_use_without_deltas_has_empty_object_arguments() {
    let (result, _) = decode(&[
        start(json!({"input_tokens": 3})),
        tool_block(0, "toolu_2", "list"),
        stop(0),
        message_delta("tool_use", 5),
        message_stop(),
    ]);
    let items = result.map(|r| r.items).unwrap_or_default();
    assert_eq!(
        items,
        vec![Item::FunctionCall { call_id: "toolu_2".into(), name: "list".into(), arguments: "{}".into() }]
    );
}

#[test]
fn stop_reasons_map_to_finish_reasons() {
    let cases = [
        ("end_turn", FinishReason::Stop),
        ("stop_sequence", FinishReason::Stop),
        ("max_tokens", FinishReason::Length),
        ("pause_turn", FinishReason::Other("pause_turn".into())),
    ];
    for (reason, finish) in cases {
        let (result, _) =
            decode(&[start(json!({})), text_block(0), text_delta(0, "x"), message_delta(reason, 1), message_stop()]);
        assert_eq!(result.map(|r| r.finish), Ok(finish), "{reason}");
    }
}

#[test]
fn a_refusal_is_safety_blocked_even_after_some_text() {
    let (result, _) = decode(&[start(json!({})), message_delta("refusal", 0), message_stop()]);
    let error = result.err().unwrap_or_else(|| panic!("expected an error"));
    assert_eq!(error.kind, FailureKind::SafetyBlocked);
    assert_eq!(
        error.message,
        "the model refused to continue on safety grounds (stop_reason `refusal`); change the request, sending the same one again will be refused again"
    );
    let (result, _) = decode(&[
        start(json!({})),
        text_block(0),
        text_delta(0, "Sure, the"),
        message_delta("refusal", 3),
        message_stop(),
    ]);
    let error = result.err().unwrap_or_else(|| panic!("expected an error"));
    assert_eq!(error.kind, FailureKind::SafetyBlocked);
    assert!(error.message.contains(r#"(stop_reason `refusal`) after "Sure, the"; change"#), "{}", error.message);
}

#[test]
fn error_events_are_classified_by_type() {
    let cases = [
        ("overloaded_error", "Overloaded", FailureKind::Transient),
        ("api_error", "Internal server error", FailureKind::Transient),
        ("rate_limit_error", "Number of request tokens has exceeded your rate limit", FailureKind::RateLimited),
        ("authentication_error", "invalid x-api-key", FailureKind::Auth),
        ("permission_error", "Your API key does not have permission", FailureKind::Auth),
        ("invalid_request_error", "messages: roles must alternate", FailureKind::BadRequest),
        ("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum", FailureKind::ContextTooLong),
    ];
    for (kind, message, expected) in cases {
        let error = json!({"type": "error", "error": {"type": kind, "message": message}});
        let (result, deltas) = decode(&[start(json!({})), text_block(0), text_delta(0, "partial"), error]);
        assert_eq!(deltas, vec!["partial"]);
        assert_eq!(result.map_err(|e| e.kind), Err(expected), "{kind}: {message}");
    }
}

#[test]
fn a_stream_that_ends_without_a_stop_reason_is_transport() {
    let (result, _) = decode(&[start(json!({})), text_block(0), text_delta(0, "par")]);
    assert_eq!(result, Err(stream_ended_early()));
    // A stop reason without `message_stop` is a finished answer.
    let (result, _) = decode(&[start(json!({})), text_block(0), text_delta(0, "done"), message_delta("end_turn", 1)]);
    assert_eq!(result.map(|r| r.finish), Ok(FinishReason::Stop));
}

#[test]
fn later_usage_reports_replace_only_the_counts_they_carry() {
    let (result, _) = decode(&[
        start(json!({"input_tokens": 0, "output_tokens": 1})),
        text_block(0),
        text_delta(0, "hi"),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"input_tokens": 9, "output_tokens": 4}}),
        message_stop(),
    ]);
    assert_eq!(result.map(|r| r.usage), Ok(Usage { input_tokens: 9, output_tokens: 4, ..Usage::default() }));
}

#[test]
fn a_non_streamed_message_is_understood() {
    let body = json!({"id": "msg_1", "type": "message", "role": "assistant", "stop_reason": "tool_use",
        "content": [{"type": "text", "text": "Reading."}, {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}}],
        "usage": {"input_tokens": 10, "output_tokens": 7}});
    let mut decoder = MessagesDecoder::default();
    assert_eq!(decoder.on_json_body(body.to_string().as_bytes(), &|_| {}), Ok(()));
    let response = decoder.finish().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        response.items,
        vec![
            Item::assistant_text("Reading."),
            Item::FunctionCall { call_id: "toolu_1".into(), name: "read".into(), arguments: "{\"path\":\"a\"}".into() },
        ]
    );
    assert_eq!(response.finish, FinishReason::ToolCalls);
}

#[test]
fn malformed_data_is_transport() {
    let (result, _) = decode(&[json!({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"}})]);
    let error = result.err().unwrap_or_else(|| panic!("expected an error"));
    assert_eq!(error.kind, FailureKind::Transport);
    assert!(
        error.message.starts_with("the provider sent data that is not a valid Messages event ("),
        "{}",
        error.message
    );
    assert!(
        error.message.ends_with("check that the base URL points at the Anthropic Messages API"),
        "{}",
        error.message
    );
}

/// Found by fuzzing: usage counts whose sum passes `u64::MAX` made
/// `finish` panic in debug builds.
#[test]
fn huge_usage_counts_saturate() {
    let usage = json!({"input_tokens": u64::MAX, "cache_read_input_tokens": 1, "cache_creation_input_tokens": 1});
    let (result, _) = decode(&[start(usage), message_stop()]);
    let response = result.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(response.usage.input_tokens, u64::MAX);
    assert_eq!(response.usage.cached_input_tokens, 1);
}
