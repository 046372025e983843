//! Errors as each API writes them, over HTTP and inside a stream.
//!
//! OpenAI (Chat and Responses) answers `{"error": {"message", "type",
//! "param", "code"}}`; Anthropic answers `{"type": "error", "error":
//! {"type", "message"}, "request_id"}` and reports overload as HTTP 529.
//! [`ScriptedError`] names the failures tests need in format-neutral terms;
//! this module holds the tables that turn them into each API's words.

use serde_json::{Value, json};

use crate::wire::WireFormat;

/// A classified provider failure, rendered as each API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptedError {
    /// Anthropic `overloaded_error` (HTTP 529); OpenAI's 503
    /// `server_error` "The server is overloaded or not ready yet".
    Overloaded,
    /// HTTP 429: Anthropic `rate_limit_error`, OpenAI `rate_limit_exceeded`.
    RateLimited,
    /// HTTP 500: Anthropic `api_error`, OpenAI `server_error`.
    ServerError,
    /// HTTP 400: Anthropic "prompt is too long", OpenAI
    /// `context_length_exceeded`.
    ContextTooLong,
}

/// What an HTTP error reply says, before it is put into a format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiError {
    Scripted(ScriptedError),
    Custom { status: u16, code: String, message: String },
}

/// One error in OpenAI's and Anthropic's words.
struct Wording {
    openai_status: u16,
    openai_code: &'static str,
    openai_message: &'static str,
    anthropic_status: u16,
    anthropic_type: &'static str,
    anthropic_message: &'static str,
}

impl ScriptedError {
    fn wording(self) -> Wording {
        match self {
            ScriptedError::Overloaded => Wording {
                openai_status: 503,
                openai_code: "server_error",
                openai_message: "The server is overloaded or not ready yet.",
                anthropic_status: 529,
                anthropic_type: "overloaded_error",
                anthropic_message: "Overloaded",
            },
            ScriptedError::RateLimited => Wording {
                openai_status: 429,
                openai_code: "rate_limit_exceeded",
                openai_message: "Rate limit reached for requests. Please try again in 2s.",
                anthropic_status: 429,
                anthropic_type: "rate_limit_error",
                anthropic_message: "Number of request tokens has exceeded your per-minute rate limit",
            },
            ScriptedError::ServerError => Wording {
                openai_status: 500,
                openai_code: "server_error",
                openai_message: "The server had an error while processing your request. Sorry about that!",
                anthropic_status: 500,
                anthropic_type: "api_error",
                anthropic_message: "Internal server error",
            },
            ScriptedError::ContextTooLong => Wording {
                openai_status: 400,
                openai_code: "context_length_exceeded",
                openai_message: "Your input exceeds the context window of this model. Please adjust your input and try again.",
                anthropic_status: 400,
                anthropic_type: "invalid_request_error",
                anthropic_message: "prompt is too long: 210000 tokens > 200000 maximum",
            },
        }
    }

    /// The OpenAI error object: `{"message", "type", "param", "code"}`.
    pub(crate) fn openai_object(self) -> Value {
        let words = self.wording();
        openai_object(words.openai_status, words.openai_code, words.openai_message)
    }

    /// The Anthropic error object: `{"type", "message"}`.
    pub(crate) fn anthropic_object(self) -> Value {
        let words = self.wording();
        json!({"type": words.anthropic_type, "message": words.anthropic_message})
    }
}

impl ApiError {
    /// The status and body for an endpoint of `format`.
    pub(crate) fn render(&self, format: WireFormat, request_id: &str) -> (u16, Value) {
        match (self, format) {
            (ApiError::Scripted(kind), WireFormat::Anthropic) => {
                (kind.wording().anthropic_status, anthropic_body(kind.anthropic_object(), request_id))
            }
            (ApiError::Scripted(kind), _) => (kind.wording().openai_status, json!({"error": kind.openai_object()})),
            (ApiError::Custom { status, code, message }, WireFormat::Anthropic) => {
                let kind = if code.ends_with("_error") { code.as_str() } else { anthropic_type(*status) };
                (*status, anthropic_body(json!({"type": kind, "message": message}), request_id))
            }
            (ApiError::Custom { status, code, message }, _) => {
                (*status, json!({"error": openai_object(*status, code, message)}))
            }
        }
    }
}

/// OpenAI's error object; the `type` follows from the status as the real
/// API's does, and an empty `code` is `null`.
pub(crate) fn openai_object(status: u16, code: &str, message: &str) -> Value {
    let code = if code.is_empty() { Value::Null } else { Value::from(code) };
    let kind = match status {
        429 => "requests",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    };
    json!({"message": message, "type": kind, "param": null, "code": code})
}

/// Anthropic's error envelope around an error object.
pub(crate) fn anthropic_body(error: Value, request_id: &str) -> Value {
    json!({"type": "error", "error": error, "request_id": request_id})
}

/// The Anthropic error type the API uses for an HTTP status.
fn anthropic_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overload_is_529_for_anthropic_and_503_for_openai() {
        let overloaded = ApiError::Scripted(ScriptedError::Overloaded);
        assert_eq!(
            overloaded.render(WireFormat::Anthropic, "req_1"),
            (
                529,
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "request_id": "req_1"})
            )
        );
        let (status, body) = overloaded.render(WireFormat::OpenAiResponses, "req_1");
        assert_eq!((status, &body["error"]["type"]), (503, &json!("server_error")));
    }

    #[test]
    fn custom_errors_take_their_anthropic_type_from_the_code_or_the_status() {
        let custom = |status: u16, code: &str| ApiError::Custom { status, code: code.into(), message: "m".into() };
        let kind = |error: ApiError| error.render(WireFormat::Anthropic, "r").1["error"]["type"].clone();
        assert_eq!(kind(custom(401, "invalid_api_key")), "authentication_error");
        assert_eq!(kind(custom(400, "not_found_error")), "not_found_error");
        assert_eq!(kind(custom(503, "x")), "api_error");
        let (status, body) = custom(401, "invalid_api_key").render(WireFormat::OpenAiChat, "r");
        assert_eq!(
            (status, body),
            (
                401,
                json!({"error": {"message": "m", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}})
            )
        );
    }
}
