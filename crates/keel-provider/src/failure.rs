//! Classification of provider failures into [`FailureKind`]s, shared by the
//! adapters: an HTTP error response, or an error object sent inside a stream.
//!
//! Classification looks at the HTTP status first and at the error body's
//! `code`, `type` and `message` second, because the same status means
//! different things: a 400 may be a malformed request or an over-long
//! context, and OpenAI answers 429 both for "slow down" and for "your quota
//! is used up", which no retry will fix.

use std::time::Duration;

use serde_json::Value;

use crate::{FailureKind, ProviderError};

/// The longest excerpt of an error body put into a message.
pub const MAX_BODY_EXCERPT: usize = 500;

/// What an error body says, in the shapes OpenAI, Anthropic, Ollama and
/// llama.cpp use: `{"error": {"code", "type", "message"}}`,
/// `{"error": "text"}`, `{"type": "error", "error": {...}}`, or the flat
/// `{"type": "error", "code", "message"}` of a Responses `error` event.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ErrorDetails {
    pub code: Option<String>,
    pub kind: Option<String>,
    pub message: Option<String>,
    /// llama.cpp puts the HTTP status in `error.code` as a number.
    pub numeric_code: Option<u16>,
}

impl ErrorDetails {
    /// Reads an error body, or the value of an in-stream `error` field.
    pub fn from_value(value: &Value) -> ErrorDetails {
        let inner = value.get("error").unwrap_or(value);
        if let Some(text) = inner.as_str() {
            return ErrorDetails { message: Some(text.to_owned()), ..ErrorDetails::default() };
        }
        let text = |key: &str| inner.get(key).and_then(Value::as_str).map(str::to_owned);
        ErrorDetails {
            code: text("code"),
            kind: text("type"),
            message: text("message").or_else(|| text("detail")),
            numeric_code: inner.get("code").and_then(Value::as_u64).and_then(|c| u16::try_from(c).ok()),
        }
    }

    fn from_body(body: &[u8]) -> ErrorDetails {
        serde_json::from_slice::<Value>(body).map(|v| ErrorDetails::from_value(&v)).unwrap_or_default()
    }

    fn tags(&self) -> [&str; 2] {
        [self.code.as_deref().unwrap_or(""), self.kind.as_deref().unwrap_or("")]
    }

    fn has_tag(&self, wanted: &[&str]) -> bool {
        self.tags().iter().any(|tag| wanted.iter().any(|w| tag.eq_ignore_ascii_case(w)))
    }
}

/// Classifies an HTTP error response. `body` is the raw response body.
pub fn classify_http_error(status: u16, retry_after: Option<Duration>, body: &[u8]) -> ProviderError {
    let text = String::from_utf8_lossy(body);
    let details = ErrorDetails::from_body(body);
    let kind = kind_for(Some(status), &details, &text);
    let what = describe(kind, &details, Some(status));
    let excerpt = excerpt(&text);
    let excerpt = if excerpt.is_empty() { "empty body".to_owned() } else { excerpt };
    let message = format!("{what} (HTTP {status}): {excerpt}; {}", advice(kind, Some(status), retry_after));
    ProviderError {
        kind,
        message,
        retry_after: retry_after.filter(|_| kind == FailureKind::RateLimited || kind == FailureKind::Transient),
        http_status: Some(status),
    }
}

/// Classifies an `{"error": ...}` object the server sent inside a 200 stream.
pub fn classify_stream_error(error: &Value) -> ProviderError {
    let details = ErrorDetails::from_value(error);
    let text = error.to_string();
    let status = details.numeric_code.filter(|code| (400..=599).contains(code));
    let kind = kind_for(status, &details, &text);
    let what = describe(kind, &details, status);
    ProviderError {
        kind,
        message: format!("{what} in the middle of the stream: {}; {}", excerpt(&text), advice(kind, None, None)),
        retry_after: None,
        http_status: None,
    }
}

fn kind_for(status: Option<u16>, details: &ErrorDetails, text: &str) -> FailureKind {
    let lower = text.to_ascii_lowercase();
    if details.has_tag(&["content_filter", "content_policy_violation"])
        || ["content_policy_violation", "content_filter", "content management policy", "safety system", "usage policy"]
            .iter()
            .any(|needle| lower.contains(needle))
    {
        return FailureKind::SafetyBlocked;
    }
    if details.has_tag(&["insufficient_quota", "billing_hard_limit_reached", "billing_not_active", "billing_error"]) {
        return FailureKind::Auth;
    }
    let context_too_long =
        details.has_tag(&["context_length_exceeded", "exceed_context_size_error", "request_too_large"])
            || ["maximum context length", "context length", "context window", "context size", "prompt is too long"]
                .iter()
                .any(|needle| lower.contains(needle));
    match status {
        Some(429) => FailureKind::RateLimited,
        Some(401..=403) => FailureKind::Auth,
        Some(408 | 409) => FailureKind::Transient,
        Some(413) => FailureKind::ContextTooLong,
        Some(400..=499) if context_too_long => FailureKind::ContextTooLong,
        Some(500..=599) => FailureKind::Transient,
        Some(_) => FailureKind::BadRequest,
        None if context_too_long => FailureKind::ContextTooLong,
        None => kind_from_tags(details),
    }
}

/// For errors without a status: decide by the documented codes and types,
/// and treat anything unknown as the provider's trouble.
fn kind_from_tags(details: &ErrorDetails) -> FailureKind {
    if details.has_tag(&["rate_limit_exceeded", "rate_limit_error"]) {
        FailureKind::RateLimited
    } else if details.has_tag(&[
        "invalid_api_key",
        "authentication_error",
        "permission_error",
        "unauthorized",
        "permission_denied",
    ]) {
        FailureKind::Auth
    } else if details.has_tag(&[
        "invalid_request_error",
        "not_found_error",
        "model_not_found",
        "invalid_value",
        "invalid_prompt",
    ]) {
        FailureKind::BadRequest
    } else {
        FailureKind::Transient
    }
}

fn describe(kind: FailureKind, details: &ErrorDetails, status: Option<u16>) -> &'static str {
    match kind {
        FailureKind::RateLimited => "the provider rate-limited the request",
        FailureKind::Transient if status.is_none() => "the provider reported an error",
        FailureKind::Transient => "the provider failed",
        FailureKind::Transport => "the connection to the provider failed",
        FailureKind::ContextTooLong => "the request is longer than the model's context window",
        FailureKind::Auth if status == Some(402) || details.has_tag(&["insufficient_quota"]) => {
            "the provider account is out of credit"
        }
        FailureKind::Auth => "the provider rejected the credentials",
        FailureKind::SafetyBlocked => "the provider refused the request on safety grounds",
        FailureKind::BadRequest => "the provider rejected the request as invalid",
    }
}

fn advice(kind: FailureKind, status: Option<u16>, retry_after: Option<Duration>) -> String {
    match (kind, retry_after) {
        (FailureKind::BadRequest, _) if status == Some(404) => {
            "check the model name, and that the base URL ends in the API version, such as /v1".to_owned()
        }
        (FailureKind::RateLimited, Some(delay)) => {
            format!("retry after {:.1}s or lower the request rate", delay.as_secs_f64())
        }
        (FailureKind::RateLimited, None) => "retry later or lower the request rate".to_owned(),
        (FailureKind::Transient | FailureKind::Transport, _) => "retry the request".to_owned(),
        (FailureKind::ContextTooLong, _) => {
            "compact the history, or use a model with a larger context window".to_owned()
        }
        (FailureKind::Auth, _) => "check the API key, its permissions and the account's credit".to_owned(),
        (FailureKind::SafetyBlocked, _) => {
            "change the request; sending the same one again will be refused again".to_owned()
        }
        (FailureKind::BadRequest, _) => {
            "check the model name and the request; retrying the same request will not help".to_owned()
        }
    }
}

/// The server sent event data that does not parse as `what` (such as "a
/// valid chunk"); `api` names what the base URL should point at.
pub fn invalid_data(what: &str, api: &str, data: &str, error: &dyn std::fmt::Display) -> ProviderError {
    ProviderError::new(
        FailureKind::Transport,
        format!(
            "the provider sent data that is not {what} ({error}): {}; retry the request, and check that the base URL points at {api}",
            excerpt(data)
        ),
    )
}

/// The body ended cleanly but before the terminal event of the stream.
pub fn stream_ended_early() -> ProviderError {
    ProviderError::new(FailureKind::Transport, "the stream ended before the model finished; retry the request")
}

/// A content filter (or a refusal) ended the response before any output:
/// nothing usable came back, and the same request will be refused again.
pub fn content_filtered_before_output() -> ProviderError {
    ProviderError::new(
        FailureKind::SafetyBlocked,
        "the provider's content filter stopped the response before any output; change the request, sending the same one again will be refused again",
    )
}

/// At most [`MAX_BODY_EXCERPT`] characters of `text`, whitespace collapsed,
/// with `…` when cut.
pub fn excerpt(text: &str) -> String {
    let mut out = String::new();
    let mut count = 0;
    for word in text.split_whitespace() {
        if count > 0 {
            out.push(' ');
            count += 1;
        }
        for ch in word.chars() {
            if count >= MAX_BODY_EXCERPT {
                out.push('…');
                return out;
            }
            out.push(ch);
            count += 1;
        }
    }
    out
}

#[cfg(test)]
#[path = "failure_tests.rs"]
mod tests;
