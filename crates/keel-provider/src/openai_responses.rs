//! The OpenAI Responses adapter (`POST {base_url}/responses`, streamed), the
//! API OpenAI's newest models are built for. Models are named
//! `openai:<model>`, such as `openai:gpt-5`.
//!
//! keel's history items already have the Responses shape, so the request
//! side is nearly a copy (`openai_responses/request.rs`); the response side
//! (`openai_responses/response.rs`) decodes the typed event stream. Requests
//! are sent with `"store": false`: keel keeps the history itself and
//! resends it, so nothing needs to stay on OpenAI's servers.

mod config;
mod request;
mod response;

pub use config::OpenAiResponsesConfig;
pub use request::{request_body, to_responses_input};
use response::ResponsesDecoder;

use crate::transport::{self, HttpTransport, Timeouts, bearer_auth, usable_key};
use crate::{
    BoxFuture, ConfigError, DeltaSink, ModelProvider, ModelRequest, ModelResponse, ProviderError, ResponseBody,
};

/// A [`ModelProvider`] for the Responses API.
#[derive(Debug)]
pub struct OpenAiResponses {
    transport: HttpTransport,
}

impl OpenAiResponses {
    /// Builds the provider and its HTTP client. Fails on a base URL that is
    /// not http(s) or an API key that cannot go into a header.
    pub fn new(config: OpenAiResponsesConfig) -> Result<OpenAiResponses, ConfigError> {
        let endpoint = transport::endpoint(&config.base_url, "responses")?;
        let key = usable_key(config.api_key.as_deref());
        let timeouts = Timeouts {
            connect: config.connect_timeout,
            request: config.request_timeout,
            stream_idle: config.stream_idle_timeout,
        };
        Ok(OpenAiResponses { transport: HttpTransport::new("openai", endpoint, bearer_auth(key)?, timeouts, key)? })
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> &str {
        self.transport.endpoint()
    }
}

impl ModelProvider for OpenAiResponses {
    fn name(&self) -> &str {
        "openai"
    }

    fn token_counter(&self, model: &str) -> std::sync::Arc<dyn crate::TokenCounter> {
        crate::tokens::openai_counter(model)
    }

    fn context_window(&self, model: &str) -> Option<u64> {
        crate::tokens::openai_context_window(model)
    }

    fn stream<'a>(
        &'a self,
        request: &'a ModelRequest,
        on_delta: DeltaSink<'a>,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        let body = request_body(request).to_string();
        Box::pin(self.transport.exchange(body, ResponsesDecoder::default(), on_delta))
    }
}

/// Decodes a Responses response body with no network, through the
/// same SSE parser and decoder a live response goes through. For fuzzing
/// and tests.
pub fn decode_body(body: ResponseBody<'_>, on_delta: DeltaSink<'_>) -> Result<ModelResponse, ProviderError> {
    crate::decoding::decode_body(ResponsesDecoder::default(), body, on_delta)
}
