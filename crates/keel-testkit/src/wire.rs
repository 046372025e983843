//! Which API an endpoint speaks, and putting a scripted reply into it.
//!
//! Routing is by path: `/v1/chat/completions`, `/v1/responses` and
//! `/v1/messages`, each also without the `/v1` prefix. The encoders live
//! beside this module, one per format ([`openai_chat`],
//! [`openai_responses`], [`anthropic`]); this module gives them what they
//! need from the request and turns their output into server-sent event
//! frames or a JSON body.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::anthropic::{self, MessagesContext};
use crate::errors::{ApiError, anthropic_body};
use crate::openai_chat::{self, ChatContext};
use crate::openai_responses::{self, ResponsesContext};
use crate::reply::{ModelOutput, StreamError};

/// The API an endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireFormat {
    OpenAiChat,
    OpenAiResponses,
    Anthropic,
}

impl WireFormat {
    pub fn for_path(path: &str) -> Option<WireFormat> {
        let path = path.split('?').next().unwrap_or_default();
        match path.trim_end_matches('/') {
            "/v1/chat/completions" | "/chat/completions" => Some(WireFormat::OpenAiChat),
            "/v1/responses" | "/responses" => Some(WireFormat::OpenAiResponses),
            "/v1/messages" | "/messages" => Some(WireFormat::Anthropic),
            _ => None,
        }
    }
}

/// One server-sent event: an optional `event:` name and its `data:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Frame {
    pub event: Option<String>,
    pub data: String,
}

impl Frame {
    pub fn to_bytes(&self) -> Vec<u8> {
        match &self.event {
            Some(event) => format!("event: {event}\ndata: {}\n\n", self.data).into_bytes(),
            None => format!("data: {}\n\n", self.data).into_bytes(),
        }
    }
}

/// What the encoders need from one request.
pub(crate) struct Exchange<'a> {
    pub format: WireFormat,
    /// The request's 1-based number on the server.
    pub number: u64,
    pub body: &'a Value,
}

impl Exchange<'_> {
    pub fn request_id(&self) -> String {
        format!("req_mock_{}", self.number)
    }

    /// Whether the client asked for a stream.
    pub fn streams(&self) -> bool {
        self.body.get("stream") == Some(&Value::Bool(true))
    }

    fn model(&self) -> &str {
        self.body.get("model").and_then(Value::as_str).unwrap_or("mock-model")
    }

    fn created() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
    }

    fn chat_context<'b>(&'b self, completion_id: &'b str) -> ChatContext<'b> {
        ChatContext {
            completion_id,
            model: self.model(),
            created: Self::created(),
            include_usage: self.body.pointer("/stream_options/include_usage") == Some(&Value::Bool(true)),
        }
    }

    /// The events of a streamed answer, before any cut.
    pub fn frames(&self, output: &ModelOutput) -> Vec<Frame> {
        match self.format {
            WireFormat::OpenAiChat => {
                let id = format!("chatcmpl-mock{}", self.number);
                let events = openai_chat::stream_events(output, &self.chat_context(&id));
                events.into_iter().map(|data| Frame { event: None, data }).collect()
            }
            WireFormat::OpenAiResponses => {
                let context = ResponsesContext { number: self.number, model: self.model(), created: Self::created() };
                let events = openai_responses::stream_events(output, &context);
                events
                    .iter()
                    .map(|event| Frame { event: event["type"].as_str().map(str::to_owned), data: event.to_string() })
                    .collect()
            }
            WireFormat::Anthropic => {
                let context = MessagesContext { number: self.number, model: self.model() };
                let events = anthropic::stream_events(output, &context);
                events.into_iter().map(|(name, data)| Frame { event: Some(name), data: data.to_string() }).collect()
            }
        }
    }

    /// A non-streamed answer: the status and the JSON body. A stream that
    /// would have failed becomes an HTTP error.
    pub fn whole_body(&self, output: &ModelOutput) -> (u16, Value) {
        match (&output.stream_error, self.format) {
            (Some(StreamError::Scripted(kind)), format) => ApiError::Scripted(*kind).render(format, &self.request_id()),
            (Some(StreamError::Raw(error)), WireFormat::Anthropic) => {
                (500, anthropic_body(error.clone(), &self.request_id()))
            }
            (Some(StreamError::Raw(error)), _) => (500, serde_json::json!({"error": error})),
            (None, WireFormat::OpenAiChat) => {
                let id = format!("chatcmpl-mock{}", self.number);
                (200, openai_chat::completion(output, &self.chat_context(&id)))
            }
            (None, WireFormat::OpenAiResponses) => {
                let context = ResponsesContext { number: self.number, model: self.model(), created: Self::created() };
                (200, openai_responses::response_body(output, &context))
            }
            (None, WireFormat::Anthropic) => {
                (200, anthropic::message_body(output, &MessagesContext { number: self.number, model: self.model() }))
            }
        }
    }
}
