//! Scripted replies: what the mock server answers to one request.
//!
//! A [`Reply`] describes model output (text, tool calls, usage, how the stream
//! ends) independently of any wire format; the server encodes it in the
//! format of the endpoint that was called: OpenAI Chat Completions, OpenAI
//! Responses or Anthropic Messages. Endings and errors are format-neutral
//! too ([`Reply::output_limit`], [`Reply::refused`], [`Reply::in_stream_error`],
//! [`Reply::api_error`]) and come out as each API sends them. Status replies
//! and raw bytes cover the remaining error paths and garbage. Builders compose:
//!
//! ```
//! use keel_testkit::{Reply, ScriptedUsage};
//! let reply = Reply::text("Let me check.")
//!     .with_tool_call("call_1", "read_file", r#"{"path":"a.txt"}"#)
//!     .usage(ScriptedUsage { prompt_tokens: 100, cached_tokens: 40, ..ScriptedUsage::default() })
//!     .cut_after(3);
//! # let _ = reply;
//! ```

use std::time::Duration;

use crate::deltas::split_text;
use crate::errors::{ApiError, ScriptedError};

/// One scripted answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub(crate) body: ReplyBody,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) first_byte_delay: Duration,
    pub(crate) chunk_delay: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ReplyBody {
    Model(ModelOutput),
    Status {
        status: u16,
        body: String,
    },
    /// An HTTP error in the error format of the endpoint called.
    ApiError(ApiError),
    /// A 200 event-stream response whose body is exactly these bytes.
    RawStream(Vec<u8>),
    /// Bytes written to the socket instead of an HTTP response.
    Raw(Vec<u8>),
}

/// Model output, in any wire format.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelOutput {
    pub text_deltas: Vec<String>,
    pub tool_calls: Vec<ToolCall>,
    pub finish: Finish,
    pub usage: ScriptedUsage,
    pub usage_in_finish_chunk: bool,
    pub send_done: bool,
    /// Sent as an in-stream error after the content, ending the stream.
    pub stream_error: Option<StreamError>,
    pub cut: Option<Cut>,
}

/// How the model's output ends, rendered natively by each format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Finish {
    /// `stop` (`end_turn`, `completed`), or tool calls when there are any.
    Natural,
    /// The output token limit was hit.
    OutputLimit,
    /// The safety system stopped the output.
    Refusal,
    /// A finish reason sent as is (Chat `finish_reason`, Anthropic
    /// `stop_reason`, Responses `incomplete_details.reason`).
    Raw(String),
}

/// An error sent inside a 200 stream.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StreamError {
    /// This object, in the format's error event (`{"error": ...}` for Chat,
    /// an `error` event for Responses and Anthropic).
    Raw(serde_json::Value),
    /// A classified error, as the format reports it natively.
    Scripted(ScriptedError),
}

/// Where a stream stops early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    pub after_events: usize,
    /// End the HTTP body properly (a clean close) instead of dropping the
    /// connection mid-body.
    pub clean: bool,
}

/// One tool call of a scripted reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub call_id: String,
    pub name: String,
    /// The arguments JSON text, sent in at least three fragments.
    pub arguments: String,
}

impl ToolCall {
    pub fn new(call_id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> ToolCall {
        ToolCall { call_id: call_id.into(), name: name.into(), arguments: arguments.into() }
    }
}

/// Token counts reported in the usage chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScriptedUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
    pub reasoning_tokens: u64,
}

/// 10 prompt tokens and 5 completion tokens, none cached or reasoning.
impl Default for ScriptedUsage {
    fn default() -> Self {
        ScriptedUsage { prompt_tokens: 10, completion_tokens: 5, cached_tokens: 0, reasoning_tokens: 0 }
    }
}

impl Reply {
    fn new(body: ReplyBody) -> Reply {
        Reply { body, headers: Vec::new(), first_byte_delay: Duration::ZERO, chunk_delay: Duration::ZERO }
    }

    fn model(text_deltas: Vec<String>, tool_calls: Vec<ToolCall>) -> Reply {
        Reply::new(ReplyBody::Model(ModelOutput {
            text_deltas,
            tool_calls,
            finish: Finish::Natural,
            usage: ScriptedUsage::default(),
            usage_in_finish_chunk: false,
            send_done: true,
            stream_error: None,
            cut: None,
        }))
    }

    /// A text answer, streamed as several deltas (split at word boundaries,
    /// or inside a single word), then `stop`, usage and `[DONE]`.
    pub fn text(text: impl AsRef<str>) -> Reply {
        Reply::model(split_text(text.as_ref()), Vec::new())
    }

    /// A text answer streamed as exactly these deltas.
    pub fn text_deltas<S: Into<String>>(deltas: impl IntoIterator<Item = S>) -> Reply {
        Reply::model(deltas.into_iter().map(Into::into).collect(), Vec::new())
    }

    /// One tool call: id and name in the first fragment, the arguments in at
    /// least three more, then `tool_calls`, usage and `[DONE]`.
    pub fn tool_call(call_id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> Reply {
        Reply::tool_calls([ToolCall::new(call_id, name, arguments)])
    }

    /// Several parallel tool calls, each streamed in turn.
    pub fn tool_calls(calls: impl IntoIterator<Item = ToolCall>) -> Reply {
        Reply::model(Vec::new(), calls.into_iter().collect())
    }

    /// An HTTP error (or any status) with this body, sent with a
    /// Content-Length. JSON bodies get `Content-Type: application/json`.
    pub fn status(status: u16, body: impl Into<String>) -> Reply {
        Reply::new(ReplyBody::Status { status, body: body.into() })
    }

    /// An HTTP error in the error shape of the endpoint called: OpenAI's
    /// `{"error": {"message", "type", "param": null, "code"}}`, or
    /// Anthropic's `{"type": "error", "error": {"type", "message"},
    /// "request_id"}`. For Anthropic, a `code` ending in `_error` (such as
    /// `overloaded_error`) is the error type; otherwise the type follows
    /// from the status, as the real API's does.
    pub fn api_error(status: u16, code: impl Into<String>, message: impl Into<String>) -> Reply {
        Reply::new(ReplyBody::ApiError(ApiError::Custom { status, code: code.into(), message: message.into() }))
    }

    /// A classified HTTP error as the endpoint's API sends it: for
    /// [`ScriptedError::Overloaded`], Anthropic's 529 `overloaded_error` and
    /// OpenAI's 503.
    pub fn http_error(kind: ScriptedError) -> Reply {
        Reply::new(ReplyBody::ApiError(ApiError::Scripted(kind)))
    }

    /// Nothing but a safety refusal: Chat `finish_reason: content_filter`,
    /// Responses `response.incomplete` for `content_filter`, Anthropic
    /// `stop_reason: refusal`.
    pub fn refusal() -> Reply {
        Reply::model(Vec::new(), Vec::new()).refused()
    }

    /// An error in OpenAI's shape, whatever the endpoint:
    /// `{"error": {"message", "type", "param": null, "code"}}`.
    pub fn openai_error(status: u16, code: &str, message: &str) -> Reply {
        let kind = match status {
            429 => "requests",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        let body = serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
        Reply::status(status, body.to_string())
    }

    /// A 200 `text/event-stream` response whose body is exactly `body`.
    pub fn raw_stream(body: impl Into<Vec<u8>>) -> Reply {
        Reply::new(ReplyBody::RawStream(body.into()))
    }

    /// Bytes written straight to the socket instead of an HTTP response;
    /// the connection is closed after them.
    pub fn raw(bytes: impl Into<Vec<u8>>) -> Reply {
        Reply::new(ReplyBody::Raw(bytes.into()))
    }

    /// Adds a response header, such as `Retry-After: 2`.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Waits this long before sending the first byte of the response.
    pub fn delay_first_byte(mut self, delay: Duration) -> Reply {
        self.first_byte_delay = delay;
        self
    }

    /// Waits this long between stream events.
    pub fn delay_between_chunks(mut self, delay: Duration) -> Reply {
        self.chunk_delay = delay;
        self
    }

    fn map_output(mut self, change: impl FnOnce(&mut ModelOutput)) -> Reply {
        if let ReplyBody::Model(output) = &mut self.body {
            change(output);
        }
        self
    }

    /// Streams `text` before the tool calls.
    pub fn with_text(self, text: impl AsRef<str>) -> Reply {
        self.map_output(|output| output.text_deltas.extend(split_text(text.as_ref())))
    }

    /// Adds one more tool call.
    pub fn with_tool_call(
        self,
        call_id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Reply {
        self.map_output(|output| output.tool_calls.push(ToolCall::new(call_id, name, arguments)))
    }

    /// Overrides the finish reason. `length` and `content_filter` mean
    /// [`Reply::output_limit`] and [`Reply::refused`], so they come out
    /// natively in every format; other reasons are sent as they are.
    pub fn finish_reason(self, reason: impl Into<String>) -> Reply {
        let finish = match reason.into() {
            reason if reason == "length" => Finish::OutputLimit,
            reason if reason == "content_filter" => Finish::Refusal,
            reason => Finish::Raw(reason),
        };
        self.map_output(|output| output.finish = finish)
    }

    /// Ends the output as cut by the output token limit: Chat
    /// `finish_reason: length`, Responses `response.incomplete` for
    /// `max_output_tokens`, Anthropic `stop_reason: max_tokens`.
    pub fn output_limit(self) -> Reply {
        self.map_output(|output| output.finish = Finish::OutputLimit)
    }

    /// Ends the output with a safety stop: Chat `finish_reason:
    /// content_filter`, Responses `response.incomplete` for
    /// `content_filter`, Anthropic `stop_reason: refusal`.
    pub fn refused(self) -> Reply {
        self.map_output(|output| output.finish = Finish::Refusal)
    }

    pub fn usage(self, usage: ScriptedUsage) -> Reply {
        self.map_output(|output| output.usage = usage)
    }

    /// Puts usage in the `finish_reason` chunk, as llama.cpp and Ollama do,
    /// instead of a separate final chunk.
    pub fn usage_in_finish_chunk(self) -> Reply {
        self.map_output(|output| output.usage_in_finish_chunk = true)
    }

    /// Ends the stream cleanly after the last chunk without `data: [DONE]`.
    pub fn without_done(self) -> Reply {
        self.map_output(|output| output.send_done = false)
    }

    /// After the content, sends `error` in the format's error event (Chat
    /// `{"error": error}`, a Responses `error` event with the object's
    /// fields, an Anthropic `error` event) and ends the stream without a
    /// finish reason.
    pub fn stream_error(self, error: serde_json::Value) -> Reply {
        self.map_output(|output| output.stream_error = Some(StreamError::Raw(error)))
    }

    /// After the content, ends the stream with a classified error as the
    /// format reports it: a Chat `{"error": ...}` chunk, a Responses
    /// `response.failed` event, an Anthropic `error` event (such as
    /// `overloaded_error`).
    pub fn in_stream_error(self, kind: ScriptedError) -> Reply {
        self.map_output(|output| output.stream_error = Some(StreamError::Scripted(kind)))
    }

    /// Sends only the first `events` stream events, then drops the
    /// connection in the middle of the body. Formats open differently: Chat
    /// with one `role` chunk, Anthropic with `message_start`,
    /// `content_block_start` and a `ping`, Responses with `response.created`,
    /// `response.in_progress`, `response.output_item.added` and
    /// `response.content_part.added`.
    pub fn cut_after(self, events: usize) -> Reply {
        self.map_output(|output| output.cut = Some(Cut { after_events: events, clean: false }))
    }

    /// Sends only the first `events` stream events, then ends the HTTP body
    /// properly, as a server that gives up politely would.
    pub fn end_after(self, events: usize) -> Reply {
        self.map_output(|output| output.cut = Some(Cut { after_events: events, clean: true }))
    }
}
