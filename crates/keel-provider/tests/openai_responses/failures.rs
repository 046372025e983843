//! Every failure class of the Responses adapter: HTTP statuses in OpenAI's
//! error shape, `response.failed` and `error` events, refusals, and broken
//! or silent streams.

use super::*;

#[tokio::test]
async fn http_429_is_rate_limited_with_the_retry_after_delay() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let reply = Reply::http_error(ScriptedError::RateLimited).with_header("Retry-After", "2");
    let error = failure(&server, reply).await?;
    let body = json!({"error": {"message": "Rate limit reached for requests. Please try again in 2s.",
                                "type": "requests", "param": null, "code": "rate_limit_exceeded"}});
    assert_eq!(
        error,
        ProviderError {
            kind: FailureKind::RateLimited,
            message: format!(
                "the provider rate-limited the request (HTTP 429): {body}; retry after 2.0s or lower the request rate"
            ),
            retry_after: Some(Duration::from_secs(2)),
            http_status: Some(429),
        }
    );
    Ok(())
}

#[tokio::test]
async fn overload_and_server_errors_are_transient() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    for (reply, status) in
        [(Reply::http_error(ScriptedError::Overloaded), 503), (Reply::http_error(ScriptedError::ServerError), 500)]
    {
        let error = failure(&server, reply).await?;
        assert_eq!((error.kind, error.http_status), (FailureKind::Transient, Some(status)));
        assert!(error.message.starts_with(&format!("the provider failed (HTTP {status}): ")), "{}", error.message);
        assert!(error.message.ends_with("; retry the request"), "{}", error.message);
    }
    Ok(())
}

#[tokio::test]
async fn a_wrong_key_is_auth_and_never_shown() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::api_error(401, "invalid_api_key", "Incorrect API key provided: sk-live-abcdef123456"));
    let config = OpenAiResponsesConfig::new(server.base_url()).with_api_key("sk-live-abcdef123456");
    let error = run(&OpenAiResponses::new(config)?, &ask("hi")).await.0.err().context("expected a failure")?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Auth, Some(401)));
    assert!(!error.message.contains("sk-live-abcdef123456"), "{}", error.message);
    assert!(error.message.contains("Incorrect API key provided: [redacted]"), "{}", error.message);
    Ok(())
}

#[tokio::test]
async fn an_overlong_context_is_context_too_long() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let error = failure(&server, Reply::http_error(ScriptedError::ContextTooLong)).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::ContextTooLong, Some(400)));
    assert!(error.message.ends_with("; compact the history, or use a model with a larger context window"));

    let error = failure(&server, Reply::text("partial").in_stream_error(ScriptedError::ContextTooLong)).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::ContextTooLong, Some(200)));
    Ok(())
}

#[tokio::test]
async fn a_failed_response_is_classified_by_its_error_code() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let cases = [
        (ScriptedError::RateLimited, FailureKind::RateLimited),
        (ScriptedError::ServerError, FailureKind::Transient),
        (ScriptedError::Overloaded, FailureKind::Transient),
    ];
    for (scripted, kind) in cases {
        server.push(Reply::text("partial answer").in_stream_error(scripted));
        let (result, deltas) = run(&provider(&server)?, &ask("hi")).await;
        assert_eq!(deltas, vec!["partial", " answer"], "{scripted:?}");
        let error = result.err().context("expected a failure")?;
        assert_eq!((error.kind, error.http_status), (kind, Some(200)), "{scripted:?}");
        assert!(error.message.contains("in the middle of the stream: "), "{}", error.message);
    }
    Ok(())
}

#[tokio::test]
async fn an_error_event_is_classified_by_its_code() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let reply = Reply::text("partial").stream_error(json!({"code": "rate_limit_exceeded", "message": "Slow down"}));
    let error = failure(&server, reply).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::RateLimited, Some(200)));
    let reply = Reply::text("partial").stream_error(json!({"code": "server_error", "message": "Oops"}));
    assert_eq!(failure(&server, reply).await?.kind, FailureKind::Transient);
    Ok(())
}

#[tokio::test]
async fn a_content_filter_stop_is_safety_blocked_without_output() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let error = failure(&server, Reply::refusal()).await?;
    assert_eq!(error, ProviderError {
        kind: FailureKind::SafetyBlocked,
        message: "the provider's content filter stopped the response before any output; change the request, sending the same one again will be refused again".into(),
        retry_after: None,
        http_status: Some(200),
    });

    server.push(Reply::text("Once upon").refused());
    let response = run(&provider(&server)?, &ask("hi")).await.0?;
    assert_eq!(
        (response.items, response.finish),
        (vec![Item::assistant_text("Once upon")], FinishReason::ContentFilter)
    );
    Ok(())
}

#[tokio::test]
async fn a_stream_cut_mid_way_is_transport_after_partial_deltas() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    // response.created, response.in_progress, output_item.added, content_part.added
    stories::a_cut_stream_is_transport(&server, &provider(&server)?, 4).await
}

#[tokio::test]
async fn a_stream_closed_without_a_terminal_event_is_transport() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    // Everything up to and including output_item.done, but no response.completed.
    stories::an_unfinished_stream_is_transport(&server, &provider(&server)?, 10).await
}

#[tokio::test]
async fn garbage_is_transport() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    // HTTP, but no event stream.
    stories::a_page_instead_of_events_is_transport(&server, &provider(&server)?, "an OpenAI Responses stream").await?;
    let error = failure(&server, Reply::raw_stream("event: response.created\ndata: {oops\n\n")).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Transport, Some(200)));
    assert!(
        error.message.starts_with("the provider sent data that is not a valid Responses event ("),
        "{}",
        error.message
    );
    Ok(())
}

#[tokio::test]
async fn a_silent_stream_hits_the_idle_timeout() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let mut config = OpenAiResponsesConfig::new(server.base_url());
    config.stream_idle_timeout = Duration::from_millis(200);
    stories::a_silent_stream_times_out(&server, &OpenAiResponses::new(config)?).await
}
