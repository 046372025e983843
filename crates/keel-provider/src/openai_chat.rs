//! The OpenAI Chat Completions adapter (`POST {base_url}/chat/completions`,
//! streamed), which also speaks to the many servers that copy that API:
//! Ollama, vLLM, llama.cpp, LM Studio, OpenRouter.
//!
//! This file wires the pieces together: [`request_body`] builds the body,
//! the shared `HttpTransport` sends it and reads the stream, and the
//! response assembler (`openai_chat/response.rs`) decodes its chunks.

mod request;
mod response;

pub use request::{MaxTokensField, request_body, to_chat_messages};
use response::ResponseAssembler;

use crate::transport::{HttpTransport, Timeouts, bearer_auth, usable_key};
use crate::{
    BoxFuture, ConfigError, DeltaSink, ModelProvider, ModelRequest, ModelResponse, ProviderError, ResponseBody,
};

mod config;
pub use config::{DEFAULT_BASE_URL, OpenAiChatConfig};

/// A [`ModelProvider`] for the Chat Completions API.
#[derive(Debug)]
pub struct OpenAiChat {
    transport: HttpTransport,
    max_tokens_field: MaxTokensField,
}

impl OpenAiChat {
    /// Builds the provider and its HTTP client. Fails on a base URL that is
    /// not http(s) or an API key that cannot go into a header.
    pub fn new(config: OpenAiChatConfig) -> Result<OpenAiChat, ConfigError> {
        let endpoint = config::endpoint(&config.base_url)?;
        let key = usable_key(config.api_key.as_deref());
        let timeouts = Timeouts {
            connect: config.connect_timeout,
            request: config.request_timeout,
            stream_idle: config.stream_idle_timeout,
        };
        let max_tokens_field = config::max_tokens_field(&config, &endpoint);
        let transport = HttpTransport::new("openai-chat", endpoint, bearer_auth(key)?, timeouts, key)?;
        Ok(OpenAiChat { transport, max_tokens_field })
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> &str {
        self.transport.endpoint()
    }
}

impl ModelProvider for OpenAiChat {
    fn name(&self) -> &str {
        "openai-chat"
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
        let body = request_body(request, self.max_tokens_field).to_string();
        Box::pin(self.transport.exchange(body, ResponseAssembler::default(), on_delta))
    }
}

/// Decodes a Chat Completions response body with no network, through the
/// same SSE parser and decoder a live response goes through. For fuzzing
/// and tests.
pub fn decode_body(body: ResponseBody<'_>, on_delta: DeltaSink<'_>) -> Result<ModelResponse, ProviderError> {
    crate::decoding::decode_body(ResponseAssembler::default(), body, on_delta)
}
