//! Decoding the Messages event stream into a [`ModelResponse`].
//!
//! The stream is `message_start` (input usage), then for each content block
//! `content_block_start`, deltas and `content_block_stop`, then
//! `message_delta` (the `stop_reason` and output usage) and
//! `message_stop`. Text blocks stream `text_delta`s; `tool_use` blocks
//! stream their `input` as `input_json_delta` fragments of JSON text, put
//! back together per block index. Thinking blocks, `ping`s and event types
//! keel does not know are ignored. An `error` event may arrive at any point
//! and ends the stream.
//!
//! Usage: Anthropic counts cache reads and cache writes apart from
//! `input_tokens`; keel's `input_tokens` is their sum, so that it means the
//! whole prompt as it does for OpenAI, and `cached_input_tokens` is the
//! cache reads.

use keel_protocol::Usage;
use serde::Deserialize;
use serde_json::Value;

use crate::decoding::{Progress, StreamDecoder, TypedEvents};
use crate::failure::{excerpt, stream_ended_early};
use crate::output::OutputBlocks;
use crate::sse::SseEvent;
use crate::{DeltaSink, FailureKind, FinishReason, ModelResponse, ProviderError};

const EVENTS: TypedEvents = TypedEvents { what: "a valid Messages event", api: "the Anthropic Messages API" };

#[derive(Debug, Default)]
pub(crate) struct MessagesDecoder {
    output: OutputBlocks,
    usage: WireUsage,
    stop_reason: Option<String>,
    /// `message_stop` arrived.
    stopped: bool,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum WireEvent {
    #[serde(rename = "message_start")]
    MessageStart { message: WireMessage },
    #[serde(rename = "content_block_start")]
    BlockStart { index: u64, content_block: WireBlock },
    #[serde(rename = "content_block_delta")]
    BlockDelta { index: u64, delta: WireDelta },
    #[serde(rename = "message_delta")]
    MessageDelta { delta: StopDelta, usage: Option<WireUsage> },
    #[serde(rename = "message_stop")]
    MessageStop,
    /// `ping`, `content_block_stop` and anything new.
    #[serde(other)]
    Other,
}

/// The message of `message_start`, and a whole non-streamed response.
#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Vec<WireBlock>,
    stop_reason: Option<String>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum WireBlock {
    #[serde(rename = "text")]
    Text {
        #[serde(default)]
        text: String,
    },
    #[serde(rename = "tool_use")]
    ToolUse {
        id: Option<String>,
        #[serde(default)]
        name: String,
        input: Option<Value>,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum WireDelta {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct StopDelta {
    stop_reason: Option<String>,
}

/// Token counts; a later report replaces only the counts it carries.
#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
}

impl WireUsage {
    fn update(&mut self, newer: WireUsage) {
        self.input_tokens = newer.input_tokens.or(self.input_tokens);
        self.output_tokens = newer.output_tokens.or(self.output_tokens);
        self.cache_read_input_tokens = newer.cache_read_input_tokens.or(self.cache_read_input_tokens);
        self.cache_creation_input_tokens = newer.cache_creation_input_tokens.or(self.cache_creation_input_tokens);
    }

    fn to_usage(&self) -> Usage {
        let cached = self.cache_read_input_tokens.unwrap_or(0);
        Usage {
            // Saturating: the counts are whatever the server sent.
            input_tokens: self
                .input_tokens
                .unwrap_or(0)
                .saturating_add(cached)
                .saturating_add(self.cache_creation_input_tokens.unwrap_or(0)),
            output_tokens: self.output_tokens.unwrap_or(0),
            cached_input_tokens: cached,
            ..Usage::default()
        }
    }
}

impl MessagesDecoder {
    fn on_block_start(&mut self, index: u64, block: WireBlock, on_delta: DeltaSink<'_>) {
        match block {
            WireBlock::Text { text } => {
                self.output.start_text(index);
                if !text.is_empty() {
                    on_delta(&text);
                    self.output.push_text(index, &text);
                }
            }
            WireBlock::ToolUse { id, name, input } => {
                // Streamed blocks start with `"input": {}` and send the real
                // input as deltas; a non-empty one is complete already.
                let input = input.filter(|input| input.as_object().is_some_and(|o| !o.is_empty()));
                self.output.start_call(index, id, name, input.map(|input| input.to_string()));
            }
            WireBlock::Other => self.output.ignore(index),
        }
    }
}

impl StreamDecoder for MessagesDecoder {
    const STREAM_NAME: &'static str = "an Anthropic Messages stream";

    fn on_event(&mut self, event: &SseEvent, on_delta: DeltaSink<'_>) -> Result<Progress, ProviderError> {
        let Some(value) = EVENTS.parse(event)? else {
            return Ok(Progress::Continue);
        };
        match WireEvent::deserialize(&value).map_err(|error| EVENTS.invalid(&event.data, &error))? {
            WireEvent::MessageStart { message } => {
                if let Some(usage) = message.usage {
                    self.usage.update(usage);
                }
            }
            WireEvent::BlockStart { index, content_block } => self.on_block_start(index, content_block, on_delta),
            WireEvent::BlockDelta { index, delta: WireDelta::Text { text } } => {
                if !text.is_empty() {
                    on_delta(&text);
                    self.output.push_text(index, &text);
                }
            }
            WireEvent::BlockDelta { index, delta: WireDelta::InputJson { partial_json } } => {
                self.output.push_arguments(index, &partial_json);
            }
            WireEvent::BlockDelta { delta: WireDelta::Other, .. } | WireEvent::Other => {}
            WireEvent::MessageDelta { delta, usage } => {
                if delta.stop_reason.is_some() {
                    self.stop_reason = delta.stop_reason;
                }
                if let Some(usage) = usage {
                    self.usage.update(usage);
                }
            }
            WireEvent::MessageStop => {
                self.stopped = true;
                return Ok(Progress::Done);
            }
        }
        Ok(Progress::Continue)
    }

    fn on_json_body(&mut self, body: &[u8], on_delta: DeltaSink<'_>) -> Result<(), ProviderError> {
        let text = String::from_utf8_lossy(body);
        let message: WireMessage = serde_json::from_slice(body).map_err(|error| EVENTS.invalid(&text, &error))?;
        for (index, block) in (0u64..).zip(message.content) {
            self.on_block_start(index, block, on_delta);
        }
        if let Some(usage) = message.usage {
            self.usage.update(usage);
        }
        self.stop_reason = message.stop_reason;
        self.stopped = true;
        Ok(())
    }

    fn finish(self) -> Result<ModelResponse, ProviderError> {
        let finish = match self.stop_reason.as_deref() {
            None if !self.stopped => return Err(stream_ended_early()),
            None | Some("end_turn" | "stop_sequence") if self.output.has_calls() => FinishReason::ToolCalls,
            None | Some("end_turn" | "stop_sequence") => FinishReason::Stop,
            Some("tool_use") => FinishReason::ToolCalls,
            Some("max_tokens" | "model_context_window_exceeded") => FinishReason::Length,
            Some("refusal") => {
                let said = self.output.text();
                let said = if said.is_empty() { String::new() } else { format!(" after \"{}\"", excerpt(&said)) };
                return Err(ProviderError::new(
                    FailureKind::SafetyBlocked,
                    format!(
                        "the model refused to continue on safety grounds (stop_reason `refusal`){said}; change the request, sending the same one again will be refused again"
                    ),
                ));
            }
            Some(other) => FinishReason::Other(other.to_owned()),
        };
        Ok(ModelResponse { items: self.output.into_items(), usage: self.usage.to_usage(), finish })
    }
}

#[cfg(test)]
#[path = "response_tests.rs"]
mod tests;
