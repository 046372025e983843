//! Every failure class, from HTTP statuses, broken streams and in-stream
//! errors to a server that is not there.

use super::*;

#[tokio::test]
async fn http_429_is_rate_limited_with_the_retry_after_delay() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let body = r#"{"error":{"message":"Rate limit reached","code":"rate_limit_exceeded"}}"#;
    let error = failure(&server, Reply::status(429, body).with_header("Retry-After", "2")).await?;
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

    let error = failure(&server, Reply::status(429, body).with_header("retry-after-ms", "1500")).await?;
    assert_eq!(error.retry_after, Some(Duration::from_millis(1500)));
    Ok(())
}

#[tokio::test]
async fn quota_exhaustion_on_429_is_auth_not_a_rate_limit() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let reply = Reply::openai_error(429, "insufficient_quota", "You exceeded your current quota");
    let error = failure(&server, reply).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Auth, Some(429)));
    assert!(error.message.starts_with("the provider account is out of credit (HTTP 429): "), "{}", error.message);
    Ok(())
}

#[tokio::test]
async fn server_errors_and_529_are_transient() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    for status in [500, 502, 503, 529] {
        let reply = Reply::status(status, "upstream unavailable").with_header("Retry-After", "1");
        let error = failure(&server, reply).await?;
        assert_eq!(
            error,
            ProviderError {
                kind: FailureKind::Transient,
                message: format!("the provider failed (HTTP {status}): upstream unavailable; retry the request"),
                retry_after: Some(Duration::from_secs(1)),
                http_status: Some(status),
            }
        );
    }
    Ok(())
}

#[tokio::test]
async fn credential_and_credit_failures_are_auth() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let error = failure(&server, Reply::openai_error(401, "invalid_api_key", "Incorrect API key provided")).await?;
    assert_eq!((error.kind, error.http_status, error.retry_after), (FailureKind::Auth, Some(401), None));
    assert!(error.message.starts_with("the provider rejected the credentials (HTTP 401): "), "{}", error.message);
    assert!(error.message.ends_with("; check the API key, its permissions and the account's credit"));

    let error = failure(&server, Reply::status(402, r#"{"error":"Insufficient credits"}"#)).await?;
    assert_eq!(error.kind, FailureKind::Auth);
    assert!(error.message.starts_with("the provider account is out of credit (HTTP 402)"), "{}", error.message);
    Ok(())
}

#[tokio::test]
async fn the_api_key_never_appears_in_an_error() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::status(401, "Incorrect API key provided: sk-live-abcdef123456"));
    let config = OpenAiChatConfig::new(server.base_url()).with_api_key("sk-live-abcdef123456");
    let error = run(&OpenAiChat::new(config)?, &ask("hi")).await.0.err().context("expected a failure")?;
    assert_eq!(
        error.message,
        "the provider rejected the credentials (HTTP 401): Incorrect API key provided: [redacted]; check the API key, its permissions and the account's credit"
    );
    Ok(())
}

#[tokio::test]
async fn an_overlong_context_is_context_too_long() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let message =
        "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.";
    let error = failure(&server, Reply::openai_error(400, "context_length_exceeded", message)).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::ContextTooLong, Some(400)));
    assert!(error.message.ends_with("; compact the history, or use a model with a larger context window"));
    Ok(())
}

#[tokio::test]
async fn other_client_errors_are_bad_requests() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let error = failure(&server, Reply::openai_error(400, "invalid_value", "Invalid 'messages[1].role'")).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::BadRequest, Some(400)));

    // A base URL without /v1 reaches the server's 404.
    let provider = OpenAiChat::new(OpenAiChatConfig::new(format!("{}/v2", server.base_url())))?;
    let error = run(&provider, &ask("hi")).await.0.err().context("expected a failure")?;
    assert_eq!((error.kind, error.http_status), (FailureKind::BadRequest, Some(404)));
    assert!(error.message.contains("Invalid URL (POST /v1/v2/chat/completions)"), "{}", error.message);
    assert!(error.message.ends_with("that the base URL ends in the API version, such as /v1"), "{}", error.message);
    Ok(())
}

#[tokio::test]
async fn safety_refusals_are_safety_blocked() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let reply = Reply::openai_error(400, "content_policy_violation", "Your request was rejected by the safety system");
    let error = failure(&server, reply).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::SafetyBlocked, Some(400)));

    // A stream that the filter stops before any output.
    let reply = Reply::text_deltas(Vec::<String>::new()).finish_reason("content_filter");
    let error = failure(&server, reply).await?;
    assert_eq!(error, ProviderError {
        kind: FailureKind::SafetyBlocked,
        message: "the provider's content filter stopped the response before any output; change the request, sending the same one again will be refused again".into(),
        retry_after: None,
        http_status: Some(200),
    });

    // With output, the partial answer is kept and the reason reported.
    server.push(Reply::text("Once upon").finish_reason("content_filter"));
    let response = run(&provider(&server)?, &ask("hi")).await.0?;
    assert_eq!(response.finish, FinishReason::ContentFilter);
    assert_eq!(response.items, vec![Item::assistant_text("Once upon")]);
    Ok(())
}

#[tokio::test]
async fn a_stream_cut_mid_way_is_transport_after_partial_deltas() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    // The role chunk opens the stream.
    stories::a_cut_stream_is_transport(&server, &provider(&server)?, 1).await
}

#[tokio::test]
async fn a_stream_closed_cleanly_before_finishing_is_transport() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    stories::an_unfinished_stream_is_transport(&server, &provider(&server)?, 3).await
}

#[tokio::test]
async fn llama_cpp_style_usage_in_the_finish_chunk_without_done_is_accepted() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let usage = ScriptedUsage { prompt_tokens: 7, completion_tokens: 2, ..ScriptedUsage::default() };
    server.push(Reply::text("Hi there").usage(usage).usage_in_finish_chunk().without_done());
    let response = run(&provider(&server)?, &ask("hi")).await.0?;
    assert_eq!(response.items, vec![Item::assistant_text("Hi there")]);
    assert_eq!(response.usage, Usage { input_tokens: 7, output_tokens: 2, ..Usage::default() });
    assert_eq!(response.finish, FinishReason::Stop);
    Ok(())
}

#[tokio::test]
async fn garbage_is_transport() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    // Not HTTP at all.
    let error = failure(&server, Reply::raw("SSH-2.0-OpenSSH_9.6\r\n")).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Transport, None));
    assert!(error.message.starts_with("the request to http://127.0.0.1:"), "{}", error.message);

    // HTTP, but the event data is not JSON.
    let error = failure(&server, Reply::raw_stream("data: {\"choices\": [oops\n\n")).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Transport, Some(200)));
    assert!(error.message.starts_with("the provider sent data that is not a valid chunk ("), "{}", error.message);
    assert!(error.message.contains(r#"): {"choices": [oops; retry the request"#), "{}", error.message);

    // HTTP, but no event stream.
    stories::a_page_instead_of_events_is_transport(&server, &provider(&server)?, "an OpenAI-compatible stream").await?;
    Ok(())
}

#[tokio::test]
async fn an_error_inside_the_stream_is_classified_by_its_code() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let cases = [
        (
            json!({"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}),
            FailureKind::RateLimited,
        ),
        (json!({"message": "The server had an error", "type": "server_error"}), FailureKind::Transient),
        (json!({"message": "Overloaded", "type": "overloaded_error"}), FailureKind::Transient),
        (json!({"message": "too long", "code": "context_length_exceeded"}), FailureKind::ContextTooLong),
    ];
    for (error_object, kind) in cases {
        let error = failure(&server, Reply::text("partial answer").stream_error(error_object.clone())).await?;
        assert_eq!((error.kind, error.http_status), (kind, Some(200)), "{error_object}");
        assert!(error.message.contains("in the middle of the stream: "), "{}", error.message);
    }
    Ok(())
}

#[tokio::test]
async fn a_server_that_is_gone_is_transport() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let provider = provider(&server)?;
    let endpoint = provider.endpoint().to_owned();
    server.shutdown().await;
    let error = run(&provider, &ask("hi")).await.0.err().context("expected a failure")?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Transport, None));
    assert!(error.message.starts_with(&format!("could not connect to {endpoint}: ")), "{}", error.message);
    assert!(
        error.message.ends_with("; check that the server is running and the base URL is right, then retry"),
        "{}",
        error.message
    );
    Ok(())
}

#[tokio::test]
async fn a_silent_stream_hits_the_idle_timeout() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let mut config = OpenAiChatConfig::new(server.base_url());
    config.stream_idle_timeout = Duration::from_millis(200);
    stories::a_silent_stream_times_out(&server, &OpenAiChat::new(config)?).await
}

#[tokio::test]
async fn a_server_that_never_answers_hits_the_request_timeout() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    server.push(Reply::text("late").delay_first_byte(Duration::from_secs(60)));
    let mut config = OpenAiChatConfig::new(server.base_url());
    config.request_timeout = Duration::from_millis(200);
    let provider = OpenAiChat::new(config)?;
    let error = run(&provider, &ask("hi")).await.0.err().context("expected a failure")?;
    assert_eq!(
        error,
        ProviderError {
            kind: FailureKind::Transport,
            message: format!(
                "{} sent no response within 200ms; retry the request, or raise request_timeout if the server is slow to start answering",
                provider.endpoint()
            ),
            retry_after: None,
            http_status: None,
        }
    );
    Ok(())
}
