//! Assembling a [`ModelResponse`] from Chat Completions stream chunks.
//!
//! Text deltas are forwarded as they arrive; tool calls come in fragments
//! keyed by `index` (the `id` and name only in the first) and are put back
//! together here. The assembler is pure: the HTTP driver feeds it events and
//! asks for the result when the stream ends, so every server quirk is
//! testable without a network.
//!
//! Quirks accepted on purpose: usage in the same chunk as `finish_reason`
//! (llama.cpp, Ollama), a stream that closes after `finish_reason` without
//! `[DONE]`, tool calls without `index` or `id`, and `finish_reason: "stop"`
//! on a response that has tool calls (older Ollama), reported as
//! [`FinishReason::ToolCalls`].

use std::collections::BTreeMap;

use keel_protocol::{Item, Usage};
use serde::Deserialize;

use crate::decoding::{Progress, StreamDecoder};
use crate::failure::{classify_stream_error, content_filtered_before_output, invalid_data, stream_ended_early};
use crate::sse::SseEvent;
use crate::{DeltaSink, FinishReason, ModelResponse, ProviderError};

#[derive(Debug, Default)]
pub struct ResponseAssembler {
    text: String,
    /// Keyed by the wire `index`, so calls come out in index order.
    calls: BTreeMap<u64, PartialCall>,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
    done: bool,
}

#[derive(Debug, Default)]
struct PartialCall {
    id: Option<String>,
    name: String,
    arguments: String,
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    usage: Option<WireUsage>,
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: u64,
    /// `message` instead of `delta` in a non-streamed completion.
    #[serde(alias = "message")]
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    index: Option<u64>,
    id: Option<String>,
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    reasoning_tokens: Option<u64>,
}

impl ResponseAssembler {
    fn on_json(&mut self, json: &[u8], on_delta: DeltaSink<'_>) -> Result<(), ProviderError> {
        let chunk: Chunk = serde_json::from_slice(json).map_err(|error| {
            let data = String::from_utf8_lossy(json);
            invalid_data("a valid chunk", "an OpenAI-compatible server", &data, &error)
        })?;
        if let Some(error) = chunk.error {
            return Err(classify_stream_error(&error));
        }
        if let Some(usage) = chunk.usage {
            self.usage = Some(Usage {
                input_tokens: usage.prompt_tokens.unwrap_or(0),
                output_tokens: usage.completion_tokens.unwrap_or(0),
                cached_input_tokens: usage.prompt_tokens_details.and_then(|d| d.cached_tokens).unwrap_or(0),
                reasoning_tokens: usage.completion_tokens_details.and_then(|d| d.reasoning_tokens).unwrap_or(0),
                ..Usage::default()
            });
        }
        // keel never asks for `n > 1`; other choices are ignored.
        for choice in chunk.choices.into_iter().filter(|choice| choice.index == 0) {
            if let Some(delta) = choice.delta {
                if let Some(text) = delta.content.filter(|text| !text.is_empty()) {
                    on_delta(&text);
                    self.text.push_str(&text);
                }
                for call in delta.tool_calls.unwrap_or_default() {
                    self.on_tool_call(call);
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.finish = Some(finish_reason(&reason));
            }
        }
        Ok(())
    }

    fn on_tool_call(&mut self, delta: ToolCallDelta) {
        let index = delta.index.unwrap_or_else(|| {
            // Without an index, a new id starts a new call; otherwise the
            // fragment continues the last one.
            let last = self.calls.last_key_value();
            match (last, &delta.id) {
                (Some((index, call)), Some(id)) if call.id.as_ref() != Some(id) => index + 1,
                (Some((index, _)), _) => *index,
                (None, _) => 0,
            }
        });
        let call = self.calls.entry(index).or_default();
        if call.id.is_none() {
            call.id = delta.id.filter(|id| !id.is_empty());
        }
        if let Some(function) = delta.function {
            match function.name {
                // Servers that repeat the full name in every fragment must
                // not produce "readread"; servers that split it are joined.
                Some(name) if name != call.name => call.name.push_str(&name),
                _ => {}
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }
}

impl StreamDecoder for ResponseAssembler {
    const STREAM_NAME: &'static str = "an OpenAI-compatible stream";

    /// Takes one SSE event of the stream.
    fn on_event(&mut self, event: &SseEvent, on_delta: DeltaSink<'_>) -> Result<Progress, ProviderError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(Progress::Done);
        }
        if data.is_empty() {
            return Ok(Progress::Continue);
        }
        if event.event.as_deref() == Some("error") {
            let error = serde_json::from_str(data).unwrap_or_else(|_| serde_json::Value::from(data));
            return Err(classify_stream_error(&error));
        }
        self.on_json(data.as_bytes(), on_delta)?;
        Ok(Progress::Continue)
    }

    /// Takes a whole non-streamed completion, for servers that ignore
    /// `"stream": true` and answer with `application/json`.
    fn on_json_body(&mut self, body: &[u8], on_delta: DeltaSink<'_>) -> Result<(), ProviderError> {
        self.on_json(body, on_delta)?;
        self.done = true;
        Ok(())
    }

    /// The response, once the stream has ended cleanly.
    fn finish(self) -> Result<ModelResponse, ProviderError> {
        let finish = match (self.finish, self.done) {
            (Some(finish), _) => finish,
            (None, true) if self.calls.is_empty() => FinishReason::Stop,
            (None, true) => FinishReason::ToolCalls,
            (None, false) => return Err(stream_ended_early()),
        };
        let finish = match finish {
            FinishReason::Stop if !self.calls.is_empty() => FinishReason::ToolCalls,
            other => other,
        };
        if finish == FinishReason::ContentFilter && self.text.is_empty() && self.calls.is_empty() {
            return Err(content_filtered_before_output());
        }
        let mut items = Vec::with_capacity(self.calls.len() + 1);
        if !self.text.is_empty() {
            items.push(Item::assistant_text(self.text));
        }
        for call in self.calls.into_values() {
            items.push(Item::FunctionCall {
                call_id: call.id.unwrap_or_else(|| keel_protocol::ids::new_id("call")),
                name: call.name,
                arguments: call.arguments,
            });
        }
        Ok(ModelResponse { items, usage: self.usage.unwrap_or_default(), finish })
    }
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" => FinishReason::Stop,
        // `function_call` is the legacy name from before parallel tool calls.
        "tool_calls" | "function_call" => FinishReason::ToolCalls,
        "length" => FinishReason::Length,
        "content_filter" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

#[cfg(test)]
#[path = "response_tests.rs"]
mod tests;
