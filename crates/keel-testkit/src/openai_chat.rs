//! The OpenAI Chat Completions wire format, as the real API sends it: chunk
//! objects with `id`, `object`, `created`, `model`, `system_fingerprint`; a
//! first chunk carrying the role; `"usage": null` on every chunk when the
//! client asked for usage, then a final chunk with `"choices": []` and the
//! usage; `data: [DONE]` last. A request without `"stream": true` gets a
//! single `chat.completion` object.

use serde_json::{Value, json};

use crate::deltas::split_in_three;
use crate::reply::{Finish, ModelOutput, ScriptedUsage, StreamError};

/// What the encoder needs from the request.
pub(crate) struct ChatContext<'a> {
    pub completion_id: &'a str,
    pub model: &'a str,
    pub created: u64,
    pub include_usage: bool,
}

impl ChatContext<'_> {
    fn chunk(&self, choices: Value) -> Value {
        let mut chunk = json!({
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_keel_mock",
            "choices": choices,
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    fn delta(&self, delta: Value) -> Value {
        self.chunk(json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}]))
    }
}

fn finish_reason(output: &ModelOutput) -> &str {
    match &output.finish {
        Finish::Natural if output.tool_calls.is_empty() => "stop",
        Finish::Natural => "tool_calls",
        Finish::OutputLimit => "length",
        Finish::Refusal => "content_filter",
        Finish::Raw(reason) => reason,
    }
}

/// The `data:` payloads of a streamed response, in order, ending with
/// `[DONE]` unless the output says otherwise. Cuts are applied by the caller.
pub(crate) fn stream_events(output: &ModelOutput, context: &ChatContext<'_>) -> Vec<String> {
    let mut events = vec![context.delta(json!({"role": "assistant", "content": "", "refusal": null}))];
    for text in &output.text_deltas {
        events.push(context.delta(json!({"content": text})));
    }
    for (index, call) in output.tool_calls.iter().enumerate() {
        events.push(context.delta(json!({"tool_calls": [{
            "index": index,
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }]})));
        for fragment in split_in_three(&call.arguments) {
            events.push(context.delta(json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})));
        }
    }
    if let Some(error) = &output.stream_error {
        events.push(json!({"error": error_object(error)}));
        return events.iter().map(Value::to_string).collect();
    }
    let mut finish = context.chunk(json!([{
        "index": 0, "delta": {}, "logprobs": null, "finish_reason": finish_reason(output),
    }]));
    if output.usage_in_finish_chunk {
        finish["usage"] = usage_json(&output.usage);
    }
    events.push(finish);
    if context.include_usage && !output.usage_in_finish_chunk {
        let mut usage = context.chunk(json!([]));
        usage["usage"] = usage_json(&output.usage);
        events.push(usage);
    }
    let mut events: Vec<String> = events.iter().map(Value::to_string).collect();
    if output.send_done {
        events.push("[DONE]".to_owned());
    }
    events
}

/// A non-streamed `chat.completion` object.
pub(crate) fn completion(output: &ModelOutput, context: &ChatContext<'_>) -> Value {
    let text: String = output.text_deltas.concat();
    let mut message = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { Value::from(text) }, "refusal": null});
    if !output.tool_calls.is_empty() {
        message["tool_calls"] = output
            .tool_calls
            .iter()
            .map(|call| {
                json!({"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}})
            })
            .collect();
    }
    json!({
        "id": context.completion_id,
        "object": "chat.completion",
        "created": context.created,
        "model": context.model,
        "system_fingerprint": "fp_keel_mock",
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason(output)}],
        "usage": usage_json(&output.usage),
    })
}

fn usage_json(usage: &ScriptedUsage) -> Value {
    json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": usage.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    })
}

/// The object of an in-stream error: `{"error": <this>}`.
pub(crate) fn error_object(error: &StreamError) -> Value {
    match error {
        StreamError::Raw(error) => error.clone(),
        StreamError::Scripted(kind) => kind.openai_object(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Reply;
    use crate::reply::ReplyBody;

    fn output(reply: Reply) -> ModelOutput {
        match reply.body {
            ReplyBody::Model(output) => output,
            other => panic!("not model output: {other:?}"),
        }
    }

    fn context(include_usage: bool) -> ChatContext<'static> {
        ChatContext { completion_id: "chatcmpl-1", model: "m", created: 7, include_usage }
    }

    fn parse(events: &[String]) -> Vec<Value> {
        events.iter().map(|e| serde_json::from_str(e).unwrap_or_else(|_| Value::String(e.clone()))).collect()
    }

    #[test]
    fn a_text_stream_has_role_deltas_finish_usage_and_done() {
        let events = parse(&stream_events(&output(Reply::text("Hi there")), &context(true)));
        assert_eq!(events.len(), 6);
        assert_eq!(events[0]["object"], "chat.completion.chunk");
        assert_eq!(events[0]["choices"][0]["delta"], json!({"role": "assistant", "content": "", "refusal": null}));
        assert_eq!(events[1]["choices"][0]["delta"], json!({"content": "Hi"}));
        assert_eq!(events[1]["usage"], Value::Null);
        assert_eq!(events[2]["choices"][0]["delta"], json!({"content": " there"}));
        assert_eq!(events[3]["choices"][0]["finish_reason"], "stop");
        assert_eq!(events[4]["choices"], json!([]));
        assert_eq!(events[4]["usage"]["prompt_tokens"], 10);
        assert_eq!(events[5], "[DONE]");
    }

    #[test]
    fn usage_is_only_sent_when_asked_for() {
        let events = stream_events(&output(Reply::text("Hi there")), &context(false));
        assert_eq!(events.len(), 5);
        assert!(!events.iter().any(|e| e.contains("usage")));
    }

    #[test]
    fn a_tool_call_streams_id_and_name_once_then_argument_fragments() {
        let events = parse(&stream_events(&output(Reply::tool_call("c1", "write", r#"{"a":1}"#)), &context(true)));
        let calls: Vec<&Value> = events.iter().filter_map(|e| e["choices"][0]["delta"].get("tool_calls")).collect();
        assert_eq!(calls.len(), 4);
        assert_eq!(
            calls[0],
            &json!([{"index": 0, "id": "c1", "type": "function", "function": {"name": "write", "arguments": ""}}])
        );
        let arguments: String = calls[1..].iter().filter_map(|c| c[0]["function"]["arguments"].as_str()).collect();
        assert_eq!(arguments, r#"{"a":1}"#);
        assert!(calls[1..].iter().all(|c| c[0].get("id").is_none() && c[0]["function"].get("name").is_none()));
        assert_eq!(events[events.len() - 3]["choices"][0]["finish_reason"], "tool_calls");
    }
}
