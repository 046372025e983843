//! The OpenAI Chat Completions adapter (`POST {base_url}/chat/completions`,
//! streamed), which also speaks to the many servers that copy that API:
//! Ollama, vLLM, llama.cpp, LM Studio, OpenRouter.
//!
//! This file is the HTTP driver: it sends the body built by
//! [`request_body`], feeds the response bytes through the [`SseParser`] into
//! the response assembler (`openai_chat/response.rs`), and turns every way
//! the exchange can fail into a [`ProviderError`]. One `reqwest::Client` per
//! provider keeps connections pooled, and a stream is read to its end after
//! `[DONE]` so its connection goes back to the pool.

mod request;
mod response;

use std::time::{Duration, SystemTime};

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use tokio::time::timeout;

pub use request::{MaxTokensField, request_body, to_chat_messages};
use response::{Progress, ResponseAssembler};

use crate::failure::{classify_http_error, excerpt};
use crate::retry_after::retry_delay;
use crate::sse::SseParser;
use crate::{
    BoxFuture, ConfigError, DeltaSink, FailureKind, ModelProvider, ModelRequest, ModelResponse, ProviderError,
};

mod config;
pub use config::{DEFAULT_BASE_URL, OpenAiChatConfig};

/// How much of an error body is read: enough for any real error message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// How long to wait for the end of the body after `[DONE]`.
const DRAIN_TIMEOUT: Duration = Duration::from_millis(250);
/// How many leading body bytes are kept to explain a stream with no events.
const HEAD_KEPT: usize = 512;

/// A [`ModelProvider`] for the Chat Completions API.
#[derive(Debug)]
pub struct OpenAiChat {
    client: reqwest::Client,
    endpoint: reqwest::Url,
    authorization: Option<HeaderValue>,
    max_tokens_field: MaxTokensField,
    config: OpenAiChatConfig,
}

impl OpenAiChat {
    /// Builds the provider and its HTTP client. Fails on a base URL that is
    /// not http(s) or an API key that cannot go into a header.
    pub fn new(config: OpenAiChatConfig) -> Result<OpenAiChat, ConfigError> {
        let endpoint = config::endpoint(&config.base_url)?;
        let authorization = match config.api_key.as_deref().map(str::trim) {
            Some(key) if !key.is_empty() => {
                let mut value =
                    HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| ConfigError::InvalidApiKey)?;
                value.set_sensitive(true);
                Some(value)
            }
            _ => None,
        };
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(90))
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| ConfigError::HttpClient(error_chain(&error)))?;
        Ok(OpenAiChat {
            client,
            max_tokens_field: config::max_tokens_field(&config, &endpoint),
            endpoint,
            authorization,
            config,
        })
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    async fn run(&self, request: &ModelRequest, on_delta: DeltaSink<'_>) -> Result<ModelResponse, ProviderError> {
        let body = request_body(request, self.max_tokens_field).to_string();
        let mut builder = self
            .client
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(body);
        if let Some(authorization) = &self.authorization {
            builder = builder.header(AUTHORIZATION, authorization.clone());
        }
        let mut response = match timeout(self.config.request_timeout, builder.send()).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return Err(self.send_failure(error)),
            Err(_) => {
                return Err(transport(format!(
                    "{} sent no response within {:?}; retry the request, or raise request_timeout if the server is slow to start answering",
                    self.endpoint, self.config.request_timeout
                )));
            }
        };
        let status = response.status().as_u16();
        if !response.status().is_success() {
            let retry_after = retry_hint(response.headers());
            let body = self.read_body(&mut response, MAX_ERROR_BODY).await.unwrap_or_else(|(partial, _)| partial);
            return Err(classify_http_error(status, retry_after, &body));
        }
        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.trim_start().starts_with("application/json"));
        let mut assembler = ResponseAssembler::default();
        let result = if is_json {
            match self.read_body(&mut response, crate::sse::DEFAULT_MAX_LINE_LEN).await {
                Ok(body) => assembler.on_completion(&body, on_delta).and_then(|()| assembler.finish()),
                Err((_, error)) => Err(error),
            }
        } else {
            self.read_stream(response, assembler, on_delta).await
        };
        // The exchange had a status even when the body then went wrong.
        result.map_err(|mut error| {
            error.http_status.get_or_insert(status);
            error
        })
    }

    async fn read_stream(
        &self,
        mut response: reqwest::Response,
        mut assembler: ResponseAssembler,
        on_delta: DeltaSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        let mut parser = SseParser::new();
        let mut head = Vec::new();
        let mut events_seen = 0usize;
        while let Some(chunk) = self.next_chunk(&mut response).await? {
            if events_seen == 0 && head.len() < HEAD_KEPT {
                head.extend_from_slice(&chunk[..chunk.len().min(HEAD_KEPT - head.len())]);
            }
            let events = parser
                .feed(&chunk)
                .map_err(|error| transport(format!("the provider's event stream is broken: {error}")))?;
            for event in &events {
                events_seen += 1;
                if assembler.on_event(event, on_delta)? == Progress::Done {
                    // Reading to the end returns the connection to the pool.
                    let _ = timeout(DRAIN_TIMEOUT, async { while let Ok(Some(_)) = response.chunk().await {} }).await;
                    return assembler.finish();
                }
            }
        }
        assembler.finish().map_err(|mut error| {
            if events_seen == 0 && error.kind == FailureKind::Transport {
                error.message = format!(
                    "the provider's response contained no events, so it is not an OpenAI-compatible stream (body began: {}); check the base URL and the model name",
                    if head.is_empty() { "empty".to_owned() } else { excerpt(&String::from_utf8_lossy(&head)) }
                );
            }
            error
        })
    }

    /// The next body chunk, or `None` at a clean end of the body.
    async fn next_chunk(&self, response: &mut reqwest::Response) -> Result<Option<bytes::Bytes>, ProviderError> {
        let idle = self.config.stream_idle_timeout;
        match timeout(idle, response.chunk()).await {
            Ok(Ok(chunk)) => Ok(chunk),
            Ok(Err(error)) => Err(transport(format!(
                "the connection broke while the response was streaming: {}; retry the request",
                error_chain(&error)
            ))),
            Err(_) => Err(transport(format!(
                "the provider sent nothing for {idle:?} in the middle of the response; retry the request, or raise stream_idle_timeout for slow models"
            ))),
        }
    }

    /// Reads a whole body of at most `limit` bytes. On failure, returns what
    /// was read so far with the error.
    async fn read_body(
        &self,
        response: &mut reqwest::Response,
        limit: usize,
    ) -> Result<Vec<u8>, (Vec<u8>, ProviderError)> {
        let mut body = Vec::new();
        loop {
            match self.next_chunk(response).await {
                Ok(Some(chunk)) if body.len() + chunk.len() > limit => {
                    let error =
                        transport(format!("the provider's response is larger than {limit} bytes; check the base URL"));
                    return Err((body, error));
                }
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => return Ok(body),
                Err(error) => return Err((body, error)),
            }
        }
    }

    fn send_failure(&self, error: reqwest::Error) -> ProviderError {
        let (timed_out, connect) = (error.is_timeout(), error.is_connect());
        // The message names the endpoint once; reqwest would repeat it.
        let chain = error_chain(&error.without_url());
        let message = if timed_out {
            format!(
                "connecting to {} timed out after {:?} ({chain}); check that the server is reachable, or raise connect_timeout",
                self.endpoint, self.config.connect_timeout
            )
        } else if connect {
            format!(
                "could not connect to {}: {chain}; check that the server is running and the base URL is right, then retry",
                self.endpoint
            )
        } else {
            format!("the request to {} failed: {chain}; retry the request", self.endpoint)
        };
        transport(message)
    }

    /// Removes the API key from a message, in case a server echoed it.
    fn redact(&self, mut error: ProviderError) -> ProviderError {
        if let Some(key) = self.config.api_key.as_deref().map(str::trim).filter(|key| !key.is_empty())
            && error.message.contains(key)
        {
            error.message = error.message.replace(key, "[redacted]");
        }
        error
    }
}

impl ModelProvider for OpenAiChat {
    fn name(&self) -> &str {
        "openai-chat"
    }

    fn stream<'a>(
        &'a self,
        request: &'a ModelRequest,
        on_delta: DeltaSink<'a>,
    ) -> BoxFuture<'a, Result<ModelResponse, ProviderError>> {
        Box::pin(async move {
            self.run(request, on_delta).await.map_err(|error| {
                tracing::debug!(kind = error.kind.as_str(), status = ?error.http_status, "chat completion failed");
                self.redact(error)
            })
        })
    }
}

fn transport(message: String) -> ProviderError {
    ProviderError::new(FailureKind::Transport, message)
}

fn retry_hint(headers: &HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    retry_delay(header("retry-after-ms"), header("retry-after"), SystemTime::now())
}

/// An error and its sources, `: `-separated, without repeats (reqwest and
/// hyper often wrap an error in one with the same text).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if parts.last().is_none_or(|last| !last.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}
