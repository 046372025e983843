//! Decoding the Responses event stream into a [`ModelResponse`].
//!
//! Every event names itself in its `type`. Text arrives as
//! `response.output_text.delta`, arguments as
//! `response.function_call_arguments.delta`, each keyed by `output_index`;
//! `.done` events and `response.output_item.done` restate an item in full.
//! The stream ends with exactly one of `response.completed`,
//! `response.incomplete` (an output limit or the content filter) or
//! `response.failed`; an `error` event may replace all of them. Event types
//! keel does not need (reasoning summaries, annotations, `in_progress`) are
//! ignored, so new ones do not break old keel versions.

use keel_protocol::Usage;
use serde::Deserialize;
use serde_json::Value;

use crate::decoding::{Progress, StreamDecoder, TypedEvents};
use crate::failure::{classify_stream_error, content_filtered_before_output, excerpt, stream_ended_early};
use crate::output::OutputBlocks;
use crate::sse::SseEvent;
use crate::{DeltaSink, FailureKind, FinishReason, ModelResponse, ProviderError};

const EVENTS: TypedEvents = TypedEvents { what: "a valid Responses event", api: "the OpenAI Responses API" };

#[derive(Debug, Default)]
pub(crate) struct ResponsesDecoder {
    output: OutputBlocks,
    /// Refusal text, from `response.refusal.delta` or a message's
    /// `refusal` part.
    refusal: String,
    usage: Option<Usage>,
    ending: Option<Ending>,
}

/// How a response that did not fail ended.
#[derive(Debug, Clone, PartialEq)]
enum Ending {
    Completed,
    /// `response.incomplete`, with `incomplete_details.reason`.
    Incomplete(String),
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum WireEvent {
    #[serde(rename = "response.output_item.added", alias = "response.output_item.done")]
    Item {
        #[serde(default)]
        output_index: u64,
        item: WireItem,
    },
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        #[serde(default)]
        output_index: u64,
        delta: String,
    },
    #[serde(rename = "response.refusal.delta")]
    RefusalDelta { delta: String },
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        #[serde(default)]
        output_index: u64,
        delta: String,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        #[serde(default)]
        output_index: u64,
        arguments: String,
    },
    #[serde(rename = "response.completed")]
    Completed { response: WireResponse },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: WireResponse },
    #[serde(rename = "response.failed")]
    Failed { response: WireResponse },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum WireItem {
    #[serde(rename = "message")]
    Message {
        #[serde(default)]
        content: Vec<WirePart>,
    },
    #[serde(rename = "function_call")]
    FunctionCall {
        call_id: Option<String>,
        #[serde(default)]
        name: String,
        arguments: Option<String>,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum WirePart {
    #[serde(rename = "output_text")]
    OutputText { text: String },
    #[serde(rename = "refusal")]
    Refusal { refusal: String },
    #[serde(other)]
    Other,
}

/// The response object of the terminal events, and of a non-streamed body.
#[derive(Deserialize)]
struct WireResponse {
    status: Option<String>,
    #[serde(default)]
    output: Vec<WireItem>,
    usage: Option<WireUsage>,
    incomplete_details: Option<IncompleteDetails>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct IncompleteDetails {
    reason: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    input_tokens_details: Option<InputDetails>,
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct OutputDetails {
    reasoning_tokens: Option<u64>,
}

impl ResponsesDecoder {
    fn on_item(&mut self, index: u64, item: WireItem) {
        match item {
            WireItem::Message { content } if content.is_empty() => self.output.start_text(index),
            WireItem::Message { content } => {
                let mut text = String::new();
                let mut refusal = String::new();
                for part in content {
                    match part {
                        WirePart::OutputText { text: more } => text.push_str(&more),
                        WirePart::Refusal { refusal: more } => refusal.push_str(&more),
                        WirePart::Other => {}
                    }
                }
                self.output.set_text(index, text);
                if !refusal.is_empty() {
                    self.refusal = refusal;
                }
            }
            WireItem::FunctionCall { call_id, name, arguments } => {
                // `output_item.added` carries `"arguments": ""`, which must
                // not wipe fragments that raced ahead of it.
                self.output.start_call(index, call_id, name, arguments.filter(|a| !a.is_empty()));
            }
            WireItem::Other => self.output.ignore(index),
        }
    }

    /// Takes the response object of a terminal event.
    fn on_response(&mut self, response: WireResponse) -> Result<(), ProviderError> {
        if let Some(usage) = response.usage {
            self.usage = Some(Usage {
                input_tokens: usage.input_tokens.unwrap_or(0),
                output_tokens: usage.output_tokens.unwrap_or(0),
                cached_input_tokens: usage.input_tokens_details.and_then(|d| d.cached_tokens).unwrap_or(0),
                reasoning_tokens: usage.output_tokens_details.and_then(|d| d.reasoning_tokens).unwrap_or(0),
                ..Usage::default()
            });
        }
        let error = response.error.filter(|error| !error.is_null());
        match response.status.as_deref() {
            Some("failed") => return Err(failed(error)),
            Some("incomplete") => {
                let reason = response.incomplete_details.and_then(|d| d.reason).unwrap_or_default();
                self.ending = Some(Ending::Incomplete(reason));
            }
            _ if error.is_some() => return Err(failed(error)),
            _ => self.ending = Some(Ending::Completed),
        }
        // Items come from the stream; the final list is only a fallback for
        // servers that send nothing but the terminal event.
        if self.output.is_empty() {
            for (index, item) in (0u64..).zip(response.output) {
                self.on_item(index, item);
            }
        }
        Ok(())
    }
}

impl StreamDecoder for ResponsesDecoder {
    const STREAM_NAME: &'static str = "an OpenAI Responses stream";

    fn on_event(&mut self, event: &SseEvent, on_delta: DeltaSink<'_>) -> Result<Progress, ProviderError> {
        let Some(value) = EVENTS.parse(event)? else {
            return Ok(Progress::Continue);
        };
        match WireEvent::deserialize(&value).map_err(|error| EVENTS.invalid(&event.data, &error))? {
            WireEvent::Item { output_index, item } => self.on_item(output_index, item),
            WireEvent::TextDelta { output_index, delta } => {
                if !delta.is_empty() {
                    on_delta(&delta);
                    self.output.push_text(output_index, &delta);
                }
            }
            WireEvent::RefusalDelta { delta } => self.refusal.push_str(&delta),
            WireEvent::ArgumentsDelta { output_index, delta } => self.output.push_arguments(output_index, &delta),
            WireEvent::ArgumentsDone { output_index, arguments } => self.output.set_arguments(output_index, arguments),
            // The event type decides how the response ended, whatever
            // its `status` says.
            WireEvent::Completed { response } => {
                self.on_response(WireResponse { status: Some("completed".into()), ..response })?;
                return Ok(Progress::Done);
            }
            WireEvent::Incomplete { response } => {
                self.on_response(WireResponse { status: Some("incomplete".into()), ..response })?;
                return Ok(Progress::Done);
            }
            WireEvent::Failed { response } => return Err(failed(response.error)),
            WireEvent::Other => {}
        }
        Ok(Progress::Continue)
    }

    fn on_json_body(&mut self, body: &[u8], on_delta: DeltaSink<'_>) -> Result<(), ProviderError> {
        let text = String::from_utf8_lossy(body);
        let response: WireResponse = serde_json::from_slice(body).map_err(|error| EVENTS.invalid(&text, &error))?;
        self.on_response(response)?;
        let text = self.output.text();
        if !text.is_empty() {
            on_delta(&text);
        }
        Ok(())
    }

    fn finish(self) -> Result<ModelResponse, ProviderError> {
        let Some(ending) = self.ending else {
            return Err(stream_ended_early());
        };
        let finish = match ending {
            Ending::Completed if !self.output.has_output() && !self.refusal.is_empty() => {
                return Err(ProviderError::new(
                    FailureKind::SafetyBlocked,
                    format!(
                        "the model refused the request: {}; change the request, sending the same one again will be refused again",
                        excerpt(&self.refusal)
                    ),
                ));
            }
            Ending::Completed if self.output.has_calls() => FinishReason::ToolCalls,
            Ending::Completed => FinishReason::Stop,
            Ending::Incomplete(reason) => match reason.as_str() {
                "max_output_tokens" => FinishReason::Length,
                "content_filter" if !self.output.has_output() => return Err(content_filtered_before_output()),
                "content_filter" => FinishReason::ContentFilter,
                _ => FinishReason::Other(reason),
            },
        };
        Ok(ModelResponse { items: self.output.into_items(), usage: self.usage.unwrap_or_default(), finish })
    }
}

/// A `response.failed`, classified by `response.error.code`.
fn failed(error: Option<Value>) -> ProviderError {
    match error.filter(|error| !error.is_null()) {
        Some(error) => classify_stream_error(&error),
        None => ProviderError::new(
            FailureKind::Transient,
            "the provider reported that the response failed, without saying why; retry the request",
        ),
    }
}

#[cfg(test)]
#[path = "response_tests.rs"]
mod tests;
