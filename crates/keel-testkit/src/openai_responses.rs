//! The OpenAI Responses wire format, as the real API streams it: typed
//! events, each named in its `event:` line and its `type`, numbered by
//! `sequence_number`. A response opens with `response.created` and
//! `response.in_progress`; every output item is announced by
//! `response.output_item.added`, streamed (`response.output_text.delta`,
//! `response.function_call_arguments.delta`), restated by its `.done`
//! events, and closed by `response.output_item.done`. The stream ends with
//! `response.completed`, `response.incomplete` (output limit, content
//! filter) or `response.failed`, each carrying the whole response object.
//! A request without `"stream": true` gets that object alone.
//!
//! Output usage with reasoning tokens also gets a reasoning item first, as
//! OpenAI's reasoning models produce one.

use serde_json::{Value, json};

use crate::deltas::split_in_three;
use crate::reply::{Finish, ModelOutput, ScriptedUsage, StreamError};

/// What the encoder needs from the exchange.
pub(crate) struct ResponsesContext<'a> {
    /// The request's 1-based number on the server, for ids.
    pub number: u64,
    pub model: &'a str,
    pub created: u64,
}

impl ResponsesContext<'_> {
    fn response(&self, status: &str, output: Vec<Value>, usage: Value) -> Value {
        json!({
            "id": format!("resp_mock{}", self.number),
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": null,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "store": false,
            "usage": usage,
        })
    }
}

/// The events of one response, numbered as they are pushed.
struct Events(Vec<Value>);

impl Events {
    fn push(&mut self, kind: &str, mut event: Value) {
        event["type"] = Value::from(kind);
        event["sequence_number"] = Value::from(self.0.len());
        self.0.push(event);
    }
}

/// The output items of the finished response, in order.
fn output_items(output: &ModelOutput, context: &ResponsesContext<'_>) -> Vec<Value> {
    let mut items = Vec::new();
    if output.usage.reasoning_tokens > 0 {
        items.push(json!({"id": format!("rs_mock{}", context.number), "type": "reasoning", "summary": []}));
    }
    let text = output.text_deltas.concat();
    if !text.is_empty() {
        items.push(json!({
            "id": format!("msg_mock{}", context.number),
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
        }));
    }
    for (index, call) in output.tool_calls.iter().enumerate() {
        items.push(json!({
            "id": format!("fc_mock{}_{index}", context.number),
            "type": "function_call",
            "status": "completed",
            "arguments": call.arguments,
            "call_id": call.call_id,
            "name": call.name,
        }));
    }
    items
}

/// The event payloads of a streamed response, in order. Cuts are applied
/// by the caller.
pub(crate) fn stream_events(output: &ModelOutput, context: &ResponsesContext<'_>) -> Vec<Value> {
    let mut events = Events(Vec::new());
    let opening = context.response("in_progress", Vec::new(), Value::Null);
    events.push("response.created", json!({"response": opening}));
    events.push("response.in_progress", json!({"response": opening}));
    let items = output_items(output, context);
    for (index, item) in items.iter().enumerate() {
        let mut added = item.clone();
        added["status"] = Value::from("in_progress");
        let id = item["id"].clone();
        match item["type"].as_str() {
            Some("message") => {
                added["content"] = json!([]);
                events.push("response.output_item.added", json!({"output_index": index, "item": added}));
                let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                let part = |text: &str| json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text});
                events.push("response.content_part.added", with(&at, "part", part("")));
                for delta in &output.text_deltas {
                    let mut event = with(&at, "delta", Value::from(delta.as_str()));
                    event["logprobs"] = json!([]);
                    events.push("response.output_text.delta", event);
                }
                let text = output.text_deltas.concat();
                events.push("response.output_text.done", with(&at, "text", Value::from(text.as_str())));
                events.push("response.content_part.done", with(&at, "part", part(&text)));
            }
            Some("function_call") => {
                added["arguments"] = Value::from("");
                events.push("response.output_item.added", json!({"output_index": index, "item": added}));
                let at = json!({"item_id": id, "output_index": index});
                let arguments = item["arguments"].as_str().unwrap_or_default();
                for fragment in split_in_three(arguments) {
                    events.push("response.function_call_arguments.delta", with(&at, "delta", Value::from(fragment)));
                }
                events.push("response.function_call_arguments.done", with(&at, "arguments", Value::from(arguments)));
            }
            _ => events.push("response.output_item.added", json!({"output_index": index, "item": added})),
        }
        events.push("response.output_item.done", json!({"output_index": index, "item": item}));
    }
    match &output.stream_error {
        Some(StreamError::Raw(error)) => {
            let mut event = json!({"code": null, "message": error.to_string(), "param": null});
            if let Some(fields) = error.as_object() {
                for (key, value) in fields {
                    event[key.as_str()] = value.clone();
                }
            }
            events.push("error", event);
        }
        Some(StreamError::Scripted(kind)) => {
            let mut failed = context.response("failed", items, Value::Null);
            let error = kind.openai_object();
            failed["error"] = json!({"code": error["code"], "message": error["message"]});
            events.push("response.failed", json!({"response": failed}));
        }
        None => {
            let response = final_response(output, context, items);
            let kind = if response["status"] == "completed" { "response.completed" } else { "response.incomplete" };
            events.push(kind, json!({"response": response}));
        }
    }
    events.0
}

/// The finished response object: what `response.completed` or
/// `response.incomplete` carries, and the body of a non-streamed request.
pub(crate) fn final_response(output: &ModelOutput, context: &ResponsesContext<'_>, items: Vec<Value>) -> Value {
    let reason = match &output.finish {
        Finish::Natural => None,
        Finish::OutputLimit => Some("max_output_tokens"),
        Finish::Refusal => Some("content_filter"),
        Finish::Raw(reason) => Some(reason.as_str()),
    };
    let status = if reason.is_some() { "incomplete" } else { "completed" };
    let mut response = context.response(status, items, usage_json(&output.usage));
    if let Some(reason) = reason {
        response["incomplete_details"] = json!({"reason": reason});
    }
    response
}

/// The body of a non-streamed request.
pub(crate) fn response_body(output: &ModelOutput, context: &ResponsesContext<'_>) -> Value {
    final_response(output, context, output_items(output, context))
}

fn with(base: &Value, key: &str, value: Value) -> Value {
    let mut event = base.clone();
    event[key] = value;
    event
}

fn usage_json(usage: &ScriptedUsage) -> Value {
    json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply::ReplyBody;
    use crate::{Reply, ScriptedError};

    fn events(reply: Reply) -> Vec<Value> {
        let ReplyBody::Model(output) = reply.body else { panic!("not model output") };
        stream_events(&output, &ResponsesContext { number: 1, model: "gpt-test", created: 7 })
    }

    fn types(events: &[Value]) -> Vec<&str> {
        events.iter().filter_map(|e| e["type"].as_str()).collect()
    }

    #[test]
    fn a_text_response_streams_every_lifecycle_event() {
        let events = events(Reply::text("Hi there"));
        assert_eq!(
            types(&events),
            vec![
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        assert_eq!(events[4]["delta"], "Hi");
        assert_eq!(events[9]["sequence_number"], 9);
        assert_eq!(events[9]["response"]["output"][0]["content"][0]["text"], "Hi there");
        assert_eq!(events[9]["response"]["usage"]["input_tokens"], 10);
    }

    #[test]
    fn calls_stream_arguments_in_three_fragments_after_a_reasoning_item() {
        let usage = ScriptedUsage { reasoning_tokens: 3, ..ScriptedUsage::default() };
        let events = events(Reply::tool_call("call_1", "write", r#"{"a":1}"#).usage(usage));
        assert_eq!(events[2]["item"]["type"], "reasoning");
        assert_eq!(
            events[4]["item"],
            json!({"id": "fc_mock1_0", "type": "function_call", "status": "in_progress",
            "arguments": "", "call_id": "call_1", "name": "write"})
        );
        let fragments: Vec<&str> = events
            .iter()
            .filter(|e| e["type"] == "response.function_call_arguments.delta")
            .filter_map(|e| e["delta"].as_str())
            .collect();
        assert_eq!((fragments.len(), fragments.concat()), (3, r#"{"a":1}"#.to_owned()));
        assert_eq!(events.last().map(|e| e["type"].clone()), Some(json!("response.completed")));
    }

    #[test]
    fn limits_refusals_and_errors_end_the_stream_natively() {
        let last = |reply: Reply| events(reply).pop().unwrap_or_default();
        let limit = last(Reply::text("partial").output_limit());
        assert_eq!(limit["type"], "response.incomplete");
        assert_eq!(limit["response"]["incomplete_details"], json!({"reason": "max_output_tokens"}));
        let refusal = last(Reply::refusal());
        assert_eq!(refusal["response"]["incomplete_details"], json!({"reason": "content_filter"}));
        assert_eq!(refusal["response"]["output"], json!([]));
        let failed = last(Reply::text("x").in_stream_error(ScriptedError::RateLimited));
        assert_eq!(failed["type"], "response.failed");
        assert_eq!(failed["response"]["error"]["code"], "rate_limit_exceeded");
        let error = last(Reply::text("x").stream_error(json!({"code": "server_error", "message": "boom"})));
        assert_eq!(
            (&error["type"], &error["code"], &error["message"]),
            (&json!("error"), &json!("server_error"), &json!("boom"))
        );
    }
}
