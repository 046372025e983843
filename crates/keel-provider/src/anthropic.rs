//! The Anthropic Messages adapter (`POST {base_url}/v1/messages`,
//! streamed). Models are named `anthropic:<model>`, such as
//! `anthropic:claude-sonnet-4-5`.
//!
//! The Messages API differs from keel's Responses-shaped history more than
//! the OpenAI APIs do: the system prompt is a field of its own, tool calls
//! and results are content blocks inside assistant and user messages, and
//! roles must alternate. All of that translation is one function,
//! [`to_anthropic_messages`]; decoding the event stream is
//! `anthropic/response.rs`; HTTP is the shared transport.

mod config;
mod request;
mod response;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

pub use config::{AnthropicConfig, DEFAULT_ANTHROPIC_VERSION, DEFAULT_BASE_URL, DEFAULT_MAX_TOKENS};
pub use request::{AnthropicMessages, request_body, to_anthropic_messages};
use response::MessagesDecoder;

use crate::transport::{HttpTransport, Timeouts, secret_header, usable_key};
use crate::{
    BoxFuture, ConfigError, DeltaSink, ModelProvider, ModelRequest, ModelResponse, ProviderError, ResponseBody,
};

/// A [`ModelProvider`] for the Anthropic Messages API.
#[derive(Debug)]
pub struct Anthropic {
    transport: HttpTransport,
    default_max_tokens: u32,
}

impl Anthropic {
    /// Builds the provider and its HTTP client. Fails on a base URL that is
    /// not http(s), or a key or API version that cannot go into a header.
    pub fn new(config: AnthropicConfig) -> Result<Anthropic, ConfigError> {
        let endpoint = config::endpoint(&config.base_url)?;
        let key = usable_key(config.api_key.as_deref());
        let mut headers = HeaderMap::new();
        if let Some(key) = key {
            headers.insert(HeaderName::from_static("x-api-key"), secret_header(key)?);
        }
        let version = HeaderValue::from_str(config.anthropic_version.trim()).map_err(|_| {
            ConfigError::InvalidHeaderValue { setting: "anthropic_version", value: config.anthropic_version.clone() }
        })?;
        headers.insert(HeaderName::from_static("anthropic-version"), version);
        let timeouts = Timeouts {
            connect: config.connect_timeout,
            request: config.request_timeout,
            stream_idle: config.stream_idle_timeout,
        };
        let transport = HttpTransport::new("anthropic", endpoint, headers, timeouts, key)?;
        Ok(Anthropic { transport, default_max_tokens: config.max_tokens })
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> &str {
        self.transport.endpoint()
    }
}

impl ModelProvider for Anthropic {
    fn name(&self) -> &str {
        "anthropic"
    }

    fn context_window(&self, model: &str) -> Option<u64> {
        crate::tokens::anthropic_context_window(model)
    }

    fn stream<'a>(
        &'a self,
        request: &'a ModelRequest,
        on_delta: DeltaSink<'a>,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        let body = request_body(request, self.default_max_tokens).to_string();
        Box::pin(self.transport.exchange(body, MessagesDecoder::default(), on_delta))
    }
}

/// Decodes a Messages response body with no network, through the
/// same SSE parser and decoder a live response goes through. For fuzzing
/// and tests.
pub fn decode_body(body: ResponseBody<'_>, on_delta: DeltaSink<'_>) -> Result<ModelResponse, ProviderError> {
    crate::decoding::decode_body(MessagesDecoder::default(), body, on_delta)
}
