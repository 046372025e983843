//! Conformance stories: one behaviour, checked the same way against every
//! provider adapter, each through its own wire format on the mock server.
//! A test file calls a story with its provider and the facts of its format
//! (such as how many events open a stream).

use std::time::Duration;

use anyhow::Context;
use keel_protocol::{Item, Usage};
use keel_provider::{FailureKind, FinishReason, ModelProvider, ModelResponse, ProviderError};
use keel_testkit::{MockServer, Reply, ScriptedUsage, ToolCall};

use super::{ask, failure_of, run};

fn call(id: &str, name: &str, arguments: &str) -> Item {
    Item::FunctionCall { call_id: id.into(), name: name.into(), arguments: arguments.into() }
}

/// Text arrives as one delta per word, and `usage` is reported as `expected`.
pub async fn text_streams_as_deltas(
    server: &MockServer,
    provider: &dyn ModelProvider,
    usage: ScriptedUsage,
    expected: Usage,
) -> anyhow::Result<()> {
    server.push(Reply::text("Hello from keel").usage(usage));
    let (result, deltas) = run(provider, &ask("m", "hi")).await;
    assert_eq!(deltas, vec!["Hello", " from", " keel"]);
    assert_eq!(
        result?,
        ModelResponse {
            items: vec![Item::assistant_text("Hello from keel")],
            usage: expected,
            finish: FinishReason::Stop
        }
    );
    Ok(())
}

/// Arguments streamed in three fragments, with escapes and non-ASCII text,
/// come back byte for byte.
pub async fn tool_call_is_reassembled_exactly(server: &MockServer, provider: &dyn ModelProvider) -> anyhow::Result<()> {
    let arguments = r#"{"path":"hello.txt","content":"Hello from keel \u00e9 \"quoted\" é"}"#;
    server.push(Reply::tool_call("call_abc", "write_file", arguments));
    let (result, deltas) = run(provider, &ask("m", "write it")).await;
    let response = result?;
    assert_eq!(deltas, Vec::<String>::new());
    assert_eq!(response.items, vec![call("call_abc", "write_file", arguments)]);
    assert_eq!(response.finish, FinishReason::ToolCalls);
    Ok(())
}

/// Text, then two parallel calls, come out in the order produced.
pub async fn text_then_two_calls_come_out_in_order(
    server: &MockServer,
    provider: &dyn ModelProvider,
) -> anyhow::Result<()> {
    server.push(
        Reply::tool_calls([
            ToolCall::new("call_1", "read_file", r#"{"path":"a.txt"}"#),
            ToolCall::new("call_2", "read_file", r#"{"path":"b.txt"}"#),
        ])
        .with_text("Reading both."),
    );
    let (result, deltas) = run(provider, &ask("m", "read")).await;
    let response = result?;
    assert_eq!(deltas.concat(), "Reading both.");
    assert_eq!(
        response.items,
        vec![
            Item::assistant_text("Reading both."),
            call("call_1", "read_file", r#"{"path":"a.txt"}"#),
            call("call_2", "read_file", r#"{"path":"b.txt"}"#),
        ]
    );
    assert_eq!(response.finish, FinishReason::ToolCalls);
    Ok(())
}

/// An answer cut by the output limit keeps its text and says `Length`.
pub async fn output_limit_finishes_with_length(
    server: &MockServer,
    provider: &dyn ModelProvider,
) -> anyhow::Result<()> {
    server.push(Reply::text("Once upon a").output_limit());
    let response = run(provider, &ask("m", "tell a story")).await.0?;
    assert_eq!(response.items, vec![Item::assistant_text("Once upon a")]);
    assert_eq!(response.finish, FinishReason::Length);
    Ok(())
}

/// Against `responders::tool_then_answer("write_file", r#"{"path":"x"}"#)`:
/// a user turn gets the call, the call's result gets the answer.
pub async fn agent_loop_round_trip(provider: &dyn ModelProvider) -> anyhow::Result<()> {
    let first = run(provider, &ask("m", "write x")).await.0?;
    assert_eq!(first.items, vec![call("call_1", "write_file", r#"{"path":"x"}"#)]);
    let mut request = ask("m", "write x");
    request.items.extend(first.items);
    request.items.push(Item::FunctionCallOutput { call_id: "call_1".into(), output: "ok".into(), images: Vec::new() });
    let second = run(provider, &request).await.0?;
    assert_eq!((second.items, second.finish), (vec![Item::assistant_text("Done.")], FinishReason::Stop));
    Ok(())
}

/// Against a server that always answers: sequential requests share one
/// pooled connection.
pub async fn requests_reuse_one_connection(server: &MockServer, provider: &dyn ModelProvider) -> anyhow::Result<()> {
    for _ in 0..20 {
        run(provider, &ask("m", "ping")).await.0?;
    }
    assert_eq!((server.request_count(), server.connection_count()), (20, 1));
    Ok(())
}

/// A connection dropped after the first text delta (`opening` events come
/// before it) is a transport failure, after that delta was streamed.
pub async fn a_cut_stream_is_transport(
    server: &MockServer,
    provider: &dyn ModelProvider,
    opening: usize,
) -> anyhow::Result<()> {
    server.push(Reply::text("Hello from keel").cut_after(opening + 1));
    let (result, deltas) = run(provider, &ask("m", "hi")).await;
    assert_eq!(deltas, vec!["Hello"]);
    let error = result.err().context("expected a failure")?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Transport, Some(200)));
    assert!(error.message.starts_with("the connection broke while the response was streaming: "), "{}", error.message);
    assert!(error.message.ends_with("; retry the request"), "{}", error.message);
    Ok(())
}

/// A body that ends cleanly after `events` events, before the model
/// finished, is a transport failure.
pub async fn an_unfinished_stream_is_transport(
    server: &MockServer,
    provider: &dyn ModelProvider,
    events: usize,
) -> anyhow::Result<()> {
    let error = failure_of(server, provider, &ask("m", "hi"), Reply::text("Hello from keel").end_after(events)).await?;
    assert_eq!(
        error,
        ProviderError {
            kind: FailureKind::Transport,
            message: "the stream ended before the model finished; retry the request".into(),
            retry_after: None,
            http_status: Some(200),
        }
    );
    Ok(())
}

/// `provider` must have a 200 ms `stream_idle_timeout`: a stream that goes
/// silent after its first event fails with the idle-timeout message.
pub async fn a_silent_stream_times_out(server: &MockServer, provider: &dyn ModelProvider) -> anyhow::Result<()> {
    server.push(Reply::text("Hello from keel").delay_between_chunks(Duration::from_secs(60)));
    let (result, deltas) = run(provider, &ask("m", "hi")).await;
    assert_eq!(deltas, Vec::<String>::new(), "only the first event arrived");
    assert_eq!(result, Err(ProviderError {
        kind: FailureKind::Transport,
        message: "the provider sent nothing for 200ms in the middle of the response; retry the request, or raise stream_idle_timeout for slow models".into(),
        retry_after: None,
        http_status: Some(200),
    }));
    Ok(())
}

/// A 200 whose body is an HTML page, not events, is a transport failure
/// that names the expected `stream` ("an Anthropic Messages stream") and
/// quotes the page.
pub async fn a_page_instead_of_events_is_transport(
    server: &MockServer,
    provider: &dyn ModelProvider,
    stream: &str,
) -> anyhow::Result<()> {
    let page = Reply::raw_stream("<html><body>Please log in</body></html>");
    let error = failure_of(server, provider, &ask("m", "hi"), page).await?;
    assert_eq!((error.kind, error.http_status), (FailureKind::Transport, Some(200)));
    assert_eq!(
        error.message,
        format!(
            "the provider's response contained no events, so it is not {stream} (body began: <html><body>Please log in</body></html>); check the base URL and the model name"
        )
    );
    Ok(())
}
