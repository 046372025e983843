//! Every failure class of the Anthropic adapter: HTTP statuses (529
//! included) in Anthropic's error shape, in-stream `error` events, the
//! `refusal` stop reason, and broken or silent streams.

use super::*;

/// Anthropic's error body, as the mock sends it for request `number`.
fn error_body(kind: &str, message: &str, number: u64) -> String {
    json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": format!("req_mock_{number}")})
        .to_string()
}

#[tokio::test]
async fn http_429_is_rate_limited_with_the_retry_after_delay() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let reply = Reply::http_error(ScriptedError::RateLimited).with_header("retry-after", "3");
    let error = failure(&server, reply).await?;
    let body = error_body("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit", 1);
    assert_eq!(
        error,
        ProviderError {
            kind: FailureKind::RateLimited,
            message: format!(
                "the provider rate-limited the request (HTTP 429): {body}; retry after 3.0s or lower the request rate"
            ),
            retry_after: Some(Duration::from_secs(3)),
            http_status: Some(429),
        }
    );
    Ok(())
}

#[tokio::test]
async fn http_529_overloaded_and_503_are_transient() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let error = failure(&server, Reply::http_error(ScriptedError::Overloaded)).await?;
    assert_eq!(
        error,
        ProviderError {
            kind: FailureKind::Transient,
            message: format!(
                "the provider failed (HTTP 529): {}; retry the request",
                error_body("overloaded_error", "Overloaded", 1)
            ),
            retry_after: None,
            http_status: Some(529),
        }
    );
    let error = failure(&server, Reply::api_error(503, "api_error", "Service unavailable")).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Transient, Some(503)));
    Ok(())
}

#[tokio::test]
async fn credential_failures_are_auth_and_the_key_is_never_shown() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::api_error(401, "authentication_error", "invalid x-api-key sk-ant-live-abcdef123456"));
    server.push(Reply::api_error(403, "permission_error", "Your API key does not have permission"));
    let config = AnthropicConfig::new(server.base_url()).with_api_key("sk-ant-live-abcdef123456");
    let provider = Anthropic::new(config)?;
    let error = run(&provider, &ask("hi")).await.0.err().context("expected a failure")?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Auth, Some(401)));
    assert_eq!(
        error.message,
        format!(
            "the provider rejected the credentials (HTTP 401): {}; check the API key, its permissions and the account's credit",
            error_body("authentication_error", "invalid x-api-key [redacted]", 1)
        )
    );
    let error = run(&provider, &ask("hi")).await.0.err().context("expected a failure")?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Auth, Some(403)));
    Ok(())
}

#[tokio::test]
async fn a_prompt_that_is_too_long_is_context_too_long() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let error = failure(&server, Reply::http_error(ScriptedError::ContextTooLong)).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::ContextTooLong, Some(400)));
    assert!(error.message.contains("prompt is too long: 210000 tokens > 200000 maximum"), "{}", error.message);
    assert!(error.message.ends_with("; compact the history, or use a model with a larger context window"));

    let error =
        failure(&server, Reply::api_error(413, "request_too_large", "Request exceeds the maximum size")).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::ContextTooLong, Some(413)));
    Ok(())
}

#[tokio::test]
async fn other_invalid_requests_are_bad_requests() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let reply = Reply::api_error(400, "invalid_request_error", "messages: roles must alternate");
    let error = failure(&server, reply).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::BadRequest, Some(400)));
    let error = failure(&server, Reply::api_error(404, "not_found_error", "model: claude-nope")).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::BadRequest, Some(404)));
    Ok(())
}

#[tokio::test]
async fn an_error_event_in_the_stream_is_classified_by_its_type() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let cases = [
        (ScriptedError::Overloaded, FailureKind::Transient),
        (ScriptedError::RateLimited, FailureKind::RateLimited),
        (ScriptedError::ServerError, FailureKind::Transient),
        (ScriptedError::ContextTooLong, FailureKind::ContextTooLong),
    ];
    for (scripted, kind) in cases {
        server.push(Reply::text("partial answer").in_stream_error(scripted));
        let (result, deltas) = run(&provider(&server)?, &ask("hi")).await;
        assert_eq!(deltas, vec!["partial", " answer"], "{scripted:?}");
        let error = result.err().context("expected a failure")?;
        assert_eq!((error.kind, error.http_status), (kind, Some(200)), "{scripted:?}");
    }
    let error = failure(&server, Reply::text("partial").in_stream_error(ScriptedError::Overloaded)).await?;
    assert_eq!(
        error.message,
        r#"the provider reported an error in the middle of the stream: {"error":{"message":"Overloaded","type":"overloaded_error"},"type":"error"}; retry the request"#
    );
    Ok(())
}

#[tokio::test]
async fn a_refusal_is_safety_blocked() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let error = failure(&server, Reply::refusal()).await?;
    assert_eq!(error, ProviderError {
        kind: FailureKind::SafetyBlocked,
        message: "the model refused to continue on safety grounds (stop_reason `refusal`); change the request, sending the same one again will be refused again".into(),
        retry_after: None,
        http_status: Some(200),
    });
    let error = failure(&server, Reply::text("Sure, here").refused()).await?;
    assert_eq!(error.kind, FailureKind::SafetyBlocked);
    Ok(())
}

#[tokio::test]
async fn a_stream_cut_mid_way_is_transport_after_partial_deltas() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    // message_start, content_block_start, ping
    stories::a_cut_stream_is_transport(&server, &provider(&server)?, 3).await
}

#[tokio::test]
async fn a_stream_closed_before_the_stop_reason_is_transport() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    // Every content event, but no message_delta.
    stories::an_unfinished_stream_is_transport(&server, &provider(&server)?, 7).await
}

#[tokio::test]
async fn garbage_is_transport() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    // HTTP, but no event stream.
    stories::a_page_instead_of_events_is_transport(&server, &provider(&server)?, "an Anthropic Messages stream")
        .await?;
    let error =
        failure(&server, Reply::raw_stream("event: message_start\ndata: {\"type\": \"message_start\"}\n\n")).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Transport, Some(200)));
    assert!(
        error.message.starts_with("the provider sent data that is not a valid Messages event ("),
        "{}",
        error.message
    );
    Ok(())
}

#[tokio::test]
async fn a_silent_stream_hits_the_idle_timeout() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let mut config = AnthropicConfig::new(server.base_url());
    config.stream_idle_timeout = Duration::from_millis(200);
    stories::a_silent_stream_times_out(&server, &Anthropic::new(config)?).await
}
