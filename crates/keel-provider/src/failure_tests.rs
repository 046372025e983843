//! Unit tests for failure classification, driven by a table of real-world
//! error bodies from OpenAI, Anthropic, llama.cpp, vLLM and Ollama.

use serde_json::json;

use super::*;

#[test]
fn http_errors_are_classified_by_status_and_body() {
    let cases: &[(u16, &str, FailureKind)] = &[
        (
            429,
            r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
            FailureKind::RateLimited,
        ),
        (
            429,
            r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#,
            FailureKind::Auth,
        ),
        (500, r#"{"error":{"message":"The server had an error","type":"server_error"}}"#, FailureKind::Transient),
        (503, "upstream connect error", FailureKind::Transient),
        (529, r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#, FailureKind::Transient),
        (401, r#"{"error":{"message":"Incorrect API key provided","code":"invalid_api_key"}}"#, FailureKind::Auth),
        (403, "", FailureKind::Auth),
        (402, r#"{"error":"insufficient credits"}"#, FailureKind::Auth),
        (400, r#"{"error":{"message":"Invalid 'messages'","type":"invalid_request_error"}}"#, FailureKind::BadRequest),
        (
            404,
            r#"{"error":{"message":"The model `x` does not exist","code":"model_not_found"}}"#,
            FailureKind::BadRequest,
        ),
        (422, "unprocessable", FailureKind::BadRequest),
        (400, r#"{"error":{"message":"too long","code":"context_length_exceeded"}}"#, FailureKind::ContextTooLong),
        (
            400,
            r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"}"#,
            FailureKind::ContextTooLong,
        ),
        (
            400,
            r#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}}"#,
            FailureKind::ContextTooLong,
        ),
        (
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
            FailureKind::ContextTooLong,
        ),
        (413, "request too large", FailureKind::ContextTooLong),
        (400, r#"{"error":{"message":"flagged","code":"content_policy_violation"}}"#, FailureKind::SafetyBlocked),
        (
            400,
            r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy","code":"content_filter"}}"#,
            FailureKind::SafetyBlocked,
        ),
        (408, "", FailureKind::Transient),
        (418, "teapot", FailureKind::BadRequest),
    ];
    for (status, body, expected) in cases {
        let error = classify_http_error(*status, None, body.as_bytes());
        assert_eq!(error.kind, *expected, "HTTP {status}: {body}");
        assert_eq!(error.http_status, Some(*status));
        assert!(!error.message.ends_with('.'), "{}", error.message);
    }
}

#[test]
fn messages_say_what_happened_and_what_to_do() {
    let error = classify_http_error(429, Some(Duration::from_secs(2)), br#"{"error":{"code":"rate_limit_exceeded"}}"#);
    assert_eq!(
        error.message,
        r#"the provider rate-limited the request (HTTP 429): {"error":{"code":"rate_limit_exceeded"}}; retry after 2.0s or lower the request rate"#
    );
    assert_eq!(error.retry_after, Some(Duration::from_secs(2)));

    let error = classify_http_error(401, Some(Duration::from_secs(2)), b"");
    assert_eq!(
        error.message,
        "the provider rejected the credentials (HTTP 401): empty body; check the API key, its permissions and the account's credit"
    );
    assert_eq!(error.retry_after, None, "a retry hint is only kept when a retry can help");

    let error = classify_http_error(404, None, b"Not Found");
    assert!(error.message.ends_with("such as /v1"), "{}", error.message);
}

#[test]
fn long_bodies_are_cut_to_an_excerpt() {
    let body = "x".repeat(5000);
    let error = classify_http_error(500, None, body.as_bytes());
    assert!(error.message.len() < 700, "{}", error.message.len());
    assert!(error.message.contains(&format!("{}…", "x".repeat(MAX_BODY_EXCERPT))));
}

#[test]
fn excerpt_collapses_whitespace_and_respects_char_boundaries() {
    assert_eq!(excerpt("  a\n\n  b\tc  "), "a b c");
    let cut = excerpt(&"é".repeat(600));
    assert_eq!(cut.chars().count(), MAX_BODY_EXCERPT + 1);
}

#[test]
fn stream_errors_are_classified_by_code_and_type() {
    let cases = [
        (json!({"message": "slow down", "code": "rate_limit_exceeded"}), FailureKind::RateLimited),
        (json!({"message": "oops", "type": "server_error"}), FailureKind::Transient),
        (json!({"type": "overloaded_error", "message": "Overloaded"}), FailureKind::Transient),
        (json!({"message": "too long", "code": "context_length_exceeded"}), FailureKind::ContextTooLong),
        (json!({"message": "no", "code": "content_filter"}), FailureKind::SafetyBlocked),
        (json!({"message": "bad key", "code": "invalid_api_key"}), FailureKind::Auth),
        (json!({"message": "bad", "type": "invalid_request_error"}), FailureKind::BadRequest),
        (json!({"code": 500, "message": "llama.cpp failed"}), FailureKind::Transient),
        (json!({"code": 429, "message": "busy"}), FailureKind::RateLimited),
        (json!("something broke"), FailureKind::Transient),
        (json!({"type": "billing_error", "message": "Your credit balance is too low"}), FailureKind::Auth),
        (
            json!({"type": "request_too_large", "message": "Request exceeds the maximum size"}),
            FailureKind::ContextTooLong,
        ),
        (json!({"code": "invalid_prompt", "message": "Invalid prompt: unsupported input"}), FailureKind::BadRequest),
        (
            json!({"code": "invalid_prompt", "message": "Invalid prompt: flagged as potentially violating our usage policy"}),
            FailureKind::SafetyBlocked,
        ),
        (
            json!({"type": "error", "code": "rate_limit_exceeded", "message": "flat Responses error event"}),
            FailureKind::RateLimited,
        ),
    ];
    for (error, expected) in cases {
        let classified = classify_stream_error(&error);
        assert_eq!(classified.kind, expected, "{error}");
        assert_eq!(classified.http_status, None);
    }
}
