//! The HTTP exchange every adapter shares: send one JSON body, classify an
//! error status, then feed the event stream through the [`SseParser`] into
//! the adapter's [`StreamDecoder`] under an idle timeout.
//!
//! Adapters only build bodies and decode events (see [`crate::decoding`]);
//! everything that can go
//! wrong on the wire (connect and response timeouts, a cut or silent stream,
//! a body that is not an event stream, an API key echoed back in an error) is
//! handled here once. One `reqwest::Client` per provider keeps connections
//! pooled, and a stream is read to its end after its last event so the
//! connection goes back to the pool.

use std::time::{Duration, SystemTime};

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue};
use tokio::time::timeout;

use crate::decoding::{EventFeed, Progress, StreamDecoder, decode_json_body};
use crate::failure::{classify_http_error, excerpt};
use crate::retry_after::retry_delay;
use crate::sse::DEFAULT_MAX_LINE_LEN;
use crate::{ConfigError, DeltaSink, FailureKind, ModelResponse, ProviderError};

/// How much of an error body is read: enough for any real error message.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// How long to wait for the end of the body after the last event.
const DRAIN_TIMEOUT: Duration = Duration::from_millis(250);
/// How many leading body bytes are kept to explain a stream with no events.
const HEAD_KEPT: usize = 512;

/// The three timeouts of an exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeouts {
    pub connect: Duration,
    /// Until the response headers arrive.
    pub request: Duration,
    /// Silence in the middle of a body.
    pub stream_idle: Duration,
}

/// One provider's HTTP client and endpoint.
pub(crate) struct HttpTransport {
    client: reqwest::Client,
    endpoint: reqwest::Url,
    /// Credentials and API-version headers, sent with every request.
    headers: HeaderMap,
    timeouts: Timeouts,
    /// Removed from every error message, in case a server echoes it.
    secret: Option<String>,
    /// The provider name, for logs.
    provider: &'static str,
}

/// Hand-written so that debug output never shows the key.
impl std::fmt::Debug for HttpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpTransport")
            .field("provider", &self.provider)
            .field("endpoint", &self.endpoint.as_str())
            .field("headers", &self.headers)
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

impl HttpTransport {
    pub fn new(
        provider: &'static str,
        endpoint: reqwest::Url,
        headers: HeaderMap,
        timeouts: Timeouts,
        secret: Option<&str>,
    ) -> Result<HttpTransport, ConfigError> {
        let client = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(90))
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| ConfigError::HttpClient(error_chain(&error)))?;
        let secret = secret.map(str::to_owned);
        Ok(HttpTransport { client, endpoint, headers, timeouts, secret, provider })
    }

    pub fn endpoint(&self) -> &str {
        self.endpoint.as_str()
    }

    /// POSTs `body` and decodes the streamed answer. Every error is
    /// classified, carries the HTTP status when there was one, and never
    /// contains the API key.
    pub async fn exchange<D: StreamDecoder>(
        &self,
        body: String,
        decoder: D,
        on_delta: DeltaSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        self.run(body, decoder, on_delta).await.map_err(|error| {
            tracing::debug!(provider = self.provider, kind = error.kind.as_str(), status = ?error.http_status, "model request failed");
            self.redact(error)
        })
    }

    async fn run<D: StreamDecoder>(
        &self,
        body: String,
        decoder: D,
        on_delta: DeltaSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        let request = self
            .client
            .post(self.endpoint.clone())
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(body);
        let mut response = match timeout(self.timeouts.request, request.send()).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return Err(self.send_failure(error)),
            Err(_) => {
                return Err(transport(format!(
                    "{} sent no response within {:?}; retry the request, or raise request_timeout if the server is slow to start answering",
                    self.endpoint, self.timeouts.request
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
        let result = if is_json {
            match self.read_body(&mut response, DEFAULT_MAX_LINE_LEN).await {
                Ok(body) => decode_json_body(decoder, &body, on_delta),
                Err((_, error)) => Err(error),
            }
        } else {
            self.read_stream(response, decoder, on_delta).await
        };
        // The exchange had a status even when the body then went wrong.
        result.map_err(|mut error| {
            error.http_status.get_or_insert(status);
            error
        })
    }

    async fn read_stream<D: StreamDecoder>(
        &self,
        mut response: reqwest::Response,
        decoder: D,
        on_delta: DeltaSink<'_>,
    ) -> Result<ModelResponse, ProviderError> {
        let mut feed = EventFeed::new(decoder);
        let mut head = Vec::new();
        while let Some(chunk) = self.next_chunk(&mut response).await? {
            if feed.events_seen() == 0 && head.len() < HEAD_KEPT {
                head.extend_from_slice(&chunk[..chunk.len().min(HEAD_KEPT - head.len())]);
            }
            if feed.feed(&chunk, on_delta)? == Progress::Done {
                // Reading to the end returns the connection to the pool.
                let _ = timeout(DRAIN_TIMEOUT, async { while let Ok(Some(_)) = response.chunk().await {} }).await;
                return feed.finish();
            }
        }
        let events_seen = feed.events_seen();
        feed.finish().map_err(|mut error| {
            if events_seen == 0 && error.kind == FailureKind::Transport {
                error.message = format!(
                    "the provider's response contained no events, so it is not {} (body began: {}); check the base URL and the model name",
                    D::STREAM_NAME,
                    if head.is_empty() { "empty".to_owned() } else { excerpt(&String::from_utf8_lossy(&head)) }
                );
            }
            error
        })
    }

    /// The next body chunk, or `None` at a clean end of the body.
    async fn next_chunk(&self, response: &mut reqwest::Response) -> Result<Option<bytes::Bytes>, ProviderError> {
        let idle = self.timeouts.stream_idle;
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
                self.endpoint, self.timeouts.connect
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
        if let Some(key) = self.secret.as_deref()
            && error.message.contains(key)
        {
            error.message = error.message.replace(key, "[redacted]");
        }
        error
    }
}

/// `{base_url}/{path}`, tolerating surrounding whitespace and trailing
/// slashes; only http(s) URLs without query or fragment are accepted.
pub(crate) fn endpoint(base_url: &str, path: &str) -> Result<reqwest::Url, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidBaseUrl { url: base_url.to_owned(), reason };
    let trimmed = base_url.trim().trim_end_matches('/');
    let url = reqwest::Url::parse(&format!("{trimmed}/{path}")).map_err(|e| invalid(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!("the scheme is `{}`, not http or https", url.scheme())));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("it has a query or fragment".to_owned()));
    }
    Ok(url)
}

/// The API key, trimmed, when one is set and not blank.
pub(crate) fn usable_key(key: Option<&str>) -> Option<&str> {
    key.map(str::trim).filter(|key| !key.is_empty())
}

/// `Authorization: Bearer <key>` when there is a key, as OpenAI and the
/// servers copying its API expect.
pub(crate) fn bearer_auth(key: Option<&str>) -> Result<HeaderMap, ConfigError> {
    let mut headers = HeaderMap::new();
    if let Some(key) = key {
        headers.insert(AUTHORIZATION, secret_header(&format!("Bearer {key}"))?);
    }
    Ok(headers)
}

/// A header value that carries a secret: marked sensitive so it never
/// shows in debug output.
pub(crate) fn secret_header(value: &str) -> Result<HeaderValue, ConfigError> {
    let mut value = HeaderValue::from_str(value).map_err(|_| ConfigError::InvalidApiKey)?;
    value.set_sensitive(true);
    Ok(value)
}

/// An environment variable, trimmed; empty counts as unset.
pub(crate) fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|value| value.trim().to_owned()).filter(|value| !value.is_empty())
}

pub(crate) fn transport(message: String) -> ProviderError {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_tolerate_trailing_slashes_and_reject_other_schemes() {
        for base in ["http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1/", " http://127.0.0.1:8080/v1// "] {
            assert_eq!(
                endpoint(base, "responses").map(|u| u.to_string()),
                Ok("http://127.0.0.1:8080/v1/responses".into())
            );
        }
        for base in ["ftp://example.com/v1", "localhost:8080", "", "http://x/v1?key=1"] {
            assert!(matches!(endpoint(base, "responses"), Err(ConfigError::InvalidBaseUrl { .. })), "{base}");
        }
    }

    #[test]
    fn debug_output_never_shows_the_key() -> Result<(), ConfigError> {
        let timeouts = Timeouts { connect: Duration::ZERO, request: Duration::ZERO, stream_idle: Duration::ZERO };
        let url = endpoint("http://127.0.0.1:1/v1", "responses")?;
        let transport = HttpTransport::new("t", url, bearer_auth(Some("sk-secret-1"))?, timeouts, Some("sk-secret-1"))?;
        let shown = format!("{transport:?}");
        assert!(!shown.contains("sk-secret-1") && shown.contains("Sensitive"), "{shown}");
        Ok(())
    }

    #[test]
    fn blank_keys_are_unset_and_keys_with_line_breaks_are_rejected() {
        assert_eq!(usable_key(Some("  ")), None);
        assert_eq!(usable_key(Some(" sk-1 ")), Some("sk-1"));
        assert_eq!(secret_header("a\nb"), Err(ConfigError::InvalidApiKey));
        assert!(secret_header("sk-1").is_ok_and(|value| value.is_sensitive()));
    }
}
