//! Model providers: one trait, one adapter per wire format.
//!
//! Transport concerns live in two places shared by every adapter: SSE
//! framing in [`sse`] and the HTTP exchange (timeouts, status
//! classification, the stream loop) in `transport`, which drives each
//! adapter's decoder through the contract in `decoding`. Each provider module
//! ([`openai_chat`], [`openai_responses`], [`anthropic`]) only maps keel's
//! history [`Item`]s to its wire format and decodes its events back, in one
//! place. Every failure is classified into a [`FailureKind`] so the runtime can
//! decide what to retry without looking at provider-specific text. Tool-result
//! images are split into the ones to attach and text placeholders for the
//! rest the same way for every adapter, in `images`; each adapter only puts
//! them into its wire format.

pub mod anthropic;
mod decoding;
mod failure;
mod images;
pub mod openai_chat;
pub mod openai_responses;
mod output;
mod retry_after;
pub mod sse;
pub mod tokens;
mod transport;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use keel_protocol::{Item, ToolSpec, Usage};

pub use anthropic::{Anthropic, AnthropicConfig};
pub use decoding::ResponseBody;
pub use openai_chat::{OpenAiChat, OpenAiChatConfig};
pub use openai_responses::{OpenAiResponses, OpenAiResponsesConfig};
pub use tokens::TokenCounter;

/// What to send to a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The provider's model name, without the `provider:` prefix.
    pub model: String,
    /// The system instructions.
    pub instructions: String,
    pub items: Vec<Item>,
    pub tools: Vec<ToolSpec>,
    pub max_output_tokens: Option<u32>,
    /// The bytes of the images the model may see now, by [`ImageRef`] id.
    /// An image referenced in `items` but absent here (expired, or its tool
    /// no longer allows showing it) is sent as a text placeholder.
    ///
    /// [`ImageRef`]: keel_protocol::ImageRef
    pub images: std::collections::BTreeMap<String, ImageData>,
}

/// An image's bytes, shared cheaply between attempts.
#[derive(Clone, PartialEq, Eq)]
pub struct ImageData {
    pub mime_type: String,
    pub data: std::sync::Arc<[u8]>,
}

impl std::fmt::Debug for ImageData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ImageData({}, {} bytes)", self.mime_type, self.data.len())
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A natural end of the answer.
    Stop,
    /// The model wants tool calls run.
    ToolCalls,
    /// The output token limit was hit.
    Length,
    /// The provider filtered the output.
    ContentFilter,
    Other(String),
}

impl FinishReason {
    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::Length => "length",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Other(other) => other,
        }
    }
}

/// A complete model response.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    /// Assistant messages and function calls, in the order produced.
    pub items: Vec<Item>,
    pub usage: Usage,
    pub finish: FinishReason,
}

/// The class of a provider failure, which decides what the runtime does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// HTTP 429 or an equivalent; retry after `retry_after` when given.
    RateLimited,
    /// 5xx, 529, "overloaded": the provider's trouble, worth retrying.
    Transient,
    /// Connection refused or reset, a stream cut mid-way, a timeout.
    Transport,
    /// The request is larger than the model's context window.
    ContextTooLong,
    /// Missing or wrong credentials, or no credit left.
    Auth,
    /// The provider refused on safety grounds. Never retried.
    SafetyBlocked,
    /// The request itself is wrong; retrying cannot help.
    BadRequest,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::RateLimited => "rate_limited",
            FailureKind::Transient => "transient",
            FailureKind::Transport => "transport",
            FailureKind::ContextTooLong => "context_too_long",
            FailureKind::Auth => "auth",
            FailureKind::SafetyBlocked => "safety_blocked",
            FailureKind::BadRequest => "bad_request",
        }
    }

    /// Whether trying the same request again may succeed.
    pub fn is_retryable(self) -> bool {
        matches!(self, FailureKind::RateLimited | FailureKind::Transient | FailureKind::Transport)
    }
}

/// A classified provider failure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind_name}: {message}", kind_name = kind.as_str())]
pub struct ProviderError {
    pub kind: FailureKind,
    pub message: String,
    /// The server's `Retry-After`, when it sent one.
    pub retry_after: Option<Duration>,
    pub http_status: Option<u16>,
}

impl ProviderError {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> ProviderError {
        ProviderError { kind, message: message.into(), retry_after: None, http_status: None }
    }
}

/// Why a provider could not be built from its settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "the base URL `{url}` is not usable ({reason}); set an http(s) URL such as https://api.openai.com/v1 or https://api.anthropic.com"
    )]
    InvalidBaseUrl { url: String, reason: String },
    #[error(
        "the API key contains characters that cannot be sent in an HTTP header; check the key for stray quotes or line breaks"
    )]
    InvalidApiKey,
    #[error("the {setting} setting `{value}` cannot be sent in an HTTP header; remove stray quotes or line breaks")]
    InvalidHeaderValue { setting: &'static str, value: String },
    #[error("the HTTP client could not be built: {0}; check the TLS setup of this machine")]
    HttpClient(String),
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Receives streamed text as it arrives.
pub type DeltaSink<'a> = &'a (dyn Fn(&str) + Send + Sync);

/// A model provider.
pub trait ModelProvider: Send + Sync {
    /// The provider's name as used in `provider:model`, e.g. `openai-chat`.
    fn name(&self) -> &str;

    /// Sends `request`, calling `on_delta` with each piece of streamed text,
    /// and returns the complete response. Dropping the future cancels the
    /// request at once.
    fn stream<'a>(
        &'a self,
        request: &'a ModelRequest,
        on_delta: DeltaSink<'a>,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>>;

    /// How this provider's `model` counts tokens (the estimate unless the
    /// provider knows better).
    fn token_counter(&self, _model: &str) -> std::sync::Arc<dyn TokenCounter> {
        std::sync::Arc::new(tokens::Estimate)
    }

    /// The model's context window in tokens, when known.
    fn context_window(&self, _model: &str) -> Option<u64> {
        None
    }
}
