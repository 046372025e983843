//! The Anthropic Messages wire format, as the real API streams it: named
//! events whose data repeats the name in `type`. `message_start` carries
//! the input usage; each content block (text, then `tool_use`) is
//! `content_block_start`, deltas (`text_delta`, or `input_json_delta`
//! fragments of the input JSON after an empty first one) and
//! `content_block_stop`; a `ping` follows the first block start;
//! `message_delta` carries the `stop_reason` and output tokens;
//! `message_stop` ends it. Errors are an `error` event. A request without
//! `"stream": true` gets one `message` object.
//!
//! Anthropic counts cache reads apart from `input_tokens`, so a scripted
//! usage of 100 prompt tokens with 40 cached is sent as `input_tokens: 60`
//! and `cache_read_input_tokens: 40`.

use serde_json::{Value, json};

use crate::deltas::split_in_three;
use crate::reply::{Finish, ModelOutput, ScriptedUsage, StreamError};

/// What the encoder needs from the exchange.
pub(crate) struct MessagesContext<'a> {
    /// The request's 1-based number on the server, for ids.
    pub number: u64,
    pub model: &'a str,
}

fn stop_reason(output: &ModelOutput) -> &str {
    match &output.finish {
        Finish::Natural if output.tool_calls.is_empty() => "end_turn",
        Finish::Natural => "tool_use",
        Finish::OutputLimit => "max_tokens",
        Finish::Refusal => "refusal",
        Finish::Raw(reason) => reason,
    }
}

fn event(kind: &str, mut fields: Value) -> (String, Value) {
    fields["type"] = Value::from(kind);
    (kind.to_owned(), fields)
}

/// The named events of a streamed message, in order. Cuts are applied by
/// the caller.
pub(crate) fn stream_events(output: &ModelOutput, context: &MessagesContext<'_>) -> Vec<(String, Value)> {
    let mut message = message_object(output, context, Vec::new(), Value::Null);
    message["usage"]["output_tokens"] = Value::from(1);
    let mut events = vec![event("message_start", json!({"message": message}))];
    let mut blocks: Vec<(Value, Vec<Value>)> = Vec::new();
    if !output.text_deltas.is_empty() {
        let deltas = output.text_deltas.iter().map(|text| json!({"type": "text_delta", "text": text})).collect();
        blocks.push((json!({"type": "text", "text": ""}), deltas));
    }
    for call in &output.tool_calls {
        let mut deltas = vec![json!({"type": "input_json_delta", "partial_json": ""})];
        deltas.extend(
            split_in_three(&call.arguments)
                .into_iter()
                .map(|fragment| json!({"type": "input_json_delta", "partial_json": fragment})),
        );
        blocks.push((json!({"type": "tool_use", "id": call.call_id, "name": call.name, "input": {}}), deltas));
    }
    if blocks.is_empty() {
        events.push(event("ping", json!({})));
    }
    for (index, (block, deltas)) in blocks.into_iter().enumerate() {
        events.push(event("content_block_start", json!({"index": index, "content_block": block})));
        if index == 0 {
            events.push(event("ping", json!({})));
        }
        for delta in deltas {
            events.push(event("content_block_delta", json!({"index": index, "delta": delta})));
        }
        events.push(event("content_block_stop", json!({"index": index})));
    }
    if let Some(error) = &output.stream_error {
        let error = match error {
            StreamError::Raw(error) => error.clone(),
            StreamError::Scripted(kind) => kind.anthropic_object(),
        };
        events.push(event("error", json!({"error": error})));
        return events;
    }
    events.push(event(
        "message_delta",
        json!({"delta": {"stop_reason": stop_reason(output), "stop_sequence": null},
               "usage": {"output_tokens": output.usage.completion_tokens}}),
    ));
    if output.send_done {
        events.push(event("message_stop", json!({})));
    }
    events
}

fn message_object(output: &ModelOutput, context: &MessagesContext<'_>, content: Vec<Value>, stop: Value) -> Value {
    json!({
        "id": format!("msg_mock{}", context.number),
        "type": "message",
        "role": "assistant",
        "model": context.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage_json(&output.usage),
    })
}

/// A non-streamed `message` object. Arguments that are not JSON become an
/// empty input, since the object can only carry parsed input.
pub(crate) fn message_body(output: &ModelOutput, context: &MessagesContext<'_>) -> Value {
    let mut content = Vec::new();
    let text = output.text_deltas.concat();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in &output.tool_calls {
        let input = serde_json::from_str::<Value>(&call.arguments).unwrap_or_else(|_| json!({}));
        content.push(json!({"type": "tool_use", "id": call.call_id, "name": call.name, "input": input}));
    }
    message_object(output, context, content, Value::from(stop_reason(output)))
}

fn usage_json(usage: &ScriptedUsage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens.saturating_sub(usage.cached_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::ReplyBody;
    use crate::{Reply, ScriptedError};

    fn events(reply: Reply) -> Vec<(String, Value)> {
        let ReplyBody::Model(output) = reply.body else { panic!("not model output") };
        stream_events(&output, &MessagesContext { number: 3, model: "claude-test" })
    }

    fn names(events: &[(String, Value)]) -> Vec<&str> {
        events.iter().map(|(name, _)| name.as_str()).collect()
    }

    #[test]
    fn text_then_a_tool_streams_blocks_in_order() {
        let events = events(Reply::tool_call("toolu_1", "read", r#"{"p":"a"}"#).with_text("Reading it"));
        assert_eq!(
            names(&events),
            vec![
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert!(events.iter().all(|(name, data)| data["type"] == name.as_str()));
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 10);
        assert_eq!(
            events[6].1["content_block"],
            json!({"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}})
        );
        assert_eq!(events[7].1["delta"], json!({"type": "input_json_delta", "partial_json": ""}));
        let json: String = events[8..11].iter().filter_map(|(_, e)| e["delta"]["partial_json"].as_str()).collect();
        assert_eq!(json, r#"{"p":"a"}"#);
        assert_eq!(events[12].1["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn endings_and_errors_are_native() {
        let stop = |reply: Reply| {
            events(reply)
                .iter()
                .find(|(name, _)| name == "message_delta")
                .map(|(_, e)| e["delta"]["stop_reason"].clone())
        };
        assert_eq!(stop(Reply::text("hi")), Some(json!("end_turn")));
        assert_eq!(stop(Reply::text("hi").output_limit()), Some(json!("max_tokens")));
        assert_eq!(stop(Reply::refusal()), Some(json!("refusal")));
        let last = events(Reply::text("hi").in_stream_error(ScriptedError::Overloaded)).pop();
        assert_eq!(
            last,
            Some((
                "error".to_owned(),
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
            ))
        );
    }

    #[test]
    fn cached_tokens_are_reported_apart_from_input_tokens() {
        let usage = ScriptedUsage { prompt_tokens: 100, cached_tokens: 40, completion_tokens: 7, reasoning_tokens: 0 };
        let events = events(Reply::text("hi").usage(usage));
        assert_eq!(
            events[0].1["message"]["usage"],
            json!({"input_tokens": 60, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 40, "output_tokens": 1})
        );
        let delta = events.iter().find(|(name, _)| name == "message_delta").map(|(_, e)| e["usage"].clone());
        assert_eq!(delta, Some(json!({"output_tokens": 7})));
    }
}
