//! The mock server on the wire, checked with a raw TCP client so framing
//! (keep-alive, chunked bodies, abrupt cuts) is observed byte for byte.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use anyhow::{Context, bail, ensure};
use keel_testkit::{MockServer, Reply, responders};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;

mod support;

use support::Client;

fn chat(stream: bool) -> Value {
    json!({"model": "gpt-test", "stream": stream, "stream_options": {"include_usage": true},
           "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn many_requests_share_one_keep_alive_connection() -> anyhow::Result<()> {
    let server = MockServer::start_with(responders::always(Reply::text("pong"))).await?;
    let mut client = Client::connect(&server).await?;
    for _ in 0..3 {
        let response = client.post("/v1/chat/completions", &chat(true)).await?;
        assert_eq!(response.status, 200);
        assert_eq!(response.header("content-type"), Some("text/event-stream; charset=utf-8"));
        assert!(response.complete);
        assert_eq!(response.events().last().map(String::as_str), Some("[DONE]"));
    }
    assert_eq!((server.request_count(), server.connection_count()), (3, 1));
    Ok(())
}

#[tokio::test]
async fn requests_are_recorded_with_headers_and_json() -> anyhow::Result<()> {
    let server = MockServer::builder().reply(Reply::text("ok")).start().await?;
    let mut client = Client::connect(&server).await?;
    client.post("/v1/chat/completions", &chat(true)).await?;
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!((requests[0].method.as_str(), requests[0].path.as_str()), ("POST", "/v1/chat/completions"));
    assert_eq!(requests[0].header("Content-Type"), Some("application/json"));
    assert_eq!(requests[0].json, Some(chat(true)));
    assert_eq!(requests[0].last_message_role(), Some("user"));
    Ok(())
}

#[tokio::test]
async fn chunked_request_bodies_and_expect_continue_are_supported() -> anyhow::Result<()> {
    let server = MockServer::builder().reply(Reply::text("ok")).start().await?;
    let mut client = Client::connect(&server).await?;
    let body = chat(false).to_string();
    let (first, second) = body.split_at(10);
    let head =
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nexpect: 100-continue\r\n\r\n";
    client.send(head.as_bytes()).await?;
    let interim = client.response().await?;
    assert_eq!(interim.status, 100);
    let chunks =
        format!("{:x};ext=1\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\ntrailer: x\r\n\r\n", first.len(), second.len());
    client.send(chunks.as_bytes()).await?;
    let response = client.response().await?;
    assert_eq!(response.status, 200);
    assert_eq!(server.requests()[0].json, Some(chat(false)));
    Ok(())
}

#[tokio::test]
async fn a_non_streaming_request_gets_one_completion_object() -> anyhow::Result<()> {
    let server = MockServer::builder().reply(Reply::tool_call("call_1", "write_file", "{}")).start().await?;
    let response = Client::connect(&server).await?.post("/v1/chat/completions", &chat(false)).await?;
    let body: Value = serde_json::from_slice(&response.body)?;
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "gpt-test");
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"],
        json!([{"id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": "{}"}}])
    );
    Ok(())
}

#[tokio::test]
async fn status_replies_carry_their_headers_and_keep_the_connection() -> anyhow::Result<()> {
    let server = MockServer::builder()
        .reply(Reply::status(429, r#"{"error":{"code":"rate_limit_exceeded"}}"#).with_header("Retry-After", "2"))
        .reply(Reply::text("ok"))
        .start()
        .await?;
    let mut client = Client::connect(&server).await?;
    let response = client.post("/v1/chat/completions", &chat(true)).await?;
    assert_eq!(response.status, 429);
    assert_eq!(response.header("retry-after"), Some("2"));
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert_eq!(response.text(), r#"{"error":{"code":"rate_limit_exceeded"}}"#);
    assert_eq!(client.post("/v1/chat/completions", &chat(true)).await?.status, 200);
    Ok(())
}

#[tokio::test]
async fn unknown_paths_get_404_without_consuming_a_reply() -> anyhow::Result<()> {
    let server = MockServer::builder().reply(Reply::text("ok")).start().await?;
    let response = Client::connect(&server).await?.post("/v1/nope", &chat(true)).await?;
    assert_eq!(response.status, 404);
    assert!(response.text().contains("Invalid URL (POST /v1/nope)"), "{}", response.text());
    assert_eq!(server.pending_replies(), 1);
    Ok(())
}

#[tokio::test]
async fn without_a_scripted_reply_the_default_fallback_says_so() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let response = Client::connect(&server).await?.post("/v1/chat/completions", &chat(true)).await?;
    assert_eq!(response.status, 400);
    assert!(response.text().contains("no scripted reply left"), "{}", response.text());
    Ok(())
}

#[tokio::test]
async fn cut_after_drops_the_connection_mid_body() -> anyhow::Result<()> {
    let server = MockServer::builder().reply(Reply::text("Hello from keel").cut_after(2)).start().await?;
    let mut client = Client::connect(&server).await?;
    let response = client.post("/v1/chat/completions", &chat(true)).await?;
    assert!(!response.complete);
    assert_eq!(response.events().len(), 2);
    assert!(client.is_closed().await?);
    Ok(())
}

#[tokio::test]
async fn end_after_and_without_done_end_the_body_cleanly() -> anyhow::Result<()> {
    let server = MockServer::builder()
        .reply(Reply::text("Hello from keel").end_after(2))
        .reply(Reply::text("Hi").without_done())
        .start()
        .await?;
    let mut client = Client::connect(&server).await?;
    let response = client.post("/v1/chat/completions", &chat(true)).await?;
    assert!(response.complete);
    assert_eq!(response.events().len(), 2);
    let response = client.post("/v1/chat/completions", &chat(true)).await?;
    assert!(response.complete);
    let events = response.events();
    assert!(events.last().is_some_and(|e| e.contains("prompt_tokens")), "{events:?}");
    Ok(())
}

#[tokio::test]
async fn raw_replies_write_bytes_and_close() -> anyhow::Result<()> {
    let server = MockServer::builder().reply(Reply::raw("garbage\r\n")).start().await?;
    let mut client = Client::connect(&server).await?;
    client.send(b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}").await?;
    assert_eq!(client.line().await?, Some("garbage".to_owned()));
    assert!(client.is_closed().await?);
    Ok(())
}

#[tokio::test]
async fn malformed_requests_get_a_400_and_a_close() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let mut client = Client::connect(&server).await?;
    client.send(b"NONSENSE\r\n\r\n").await?;
    let response = client.response().await?;
    assert_eq!(response.status, 400);
    assert_eq!(response.header("connection"), Some("close"));
    assert!(client.is_closed().await?);
    Ok(())
}

#[tokio::test]
async fn after_shutdown_the_port_refuses_connections() -> anyhow::Result<()> {
    let server = MockServer::start().await?;
    let addr = server.addr();
    server.shutdown().await;
    match TcpStream::connect(addr).await {
        Ok(_) => bail!("the port still accepts connections"),
        Err(error) => ensure!(error.kind() == std::io::ErrorKind::ConnectionRefused, "{error}"),
    }
    Ok(())
}

#[tokio::test]
async fn the_binary_prints_its_url_and_serves_the_demo_script() -> anyhow::Result<()> {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_keel-mock-provider"))
        .args(["--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).await?;
    let base_url = line.trim();
    let addr = base_url.strip_prefix("http://").and_then(|rest| rest.strip_suffix("/v1")).context(line.clone())?;
    let mut client = Client::connect_to(addr).await?;
    let response = client.post("/v1/chat/completions", &chat(false)).await?;
    let body: Value = serde_json::from_slice(&response.body)?;
    let call = &body["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "fs__write_file");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap_or_default())?;
    assert_eq!(arguments, json!({"path": "hello.txt", "content": "Hello from keel"}));

    let answer = json!({"model": "m", "messages": [{"role": "tool", "tool_call_id": "call_1", "content": "ok"}]});
    let body: Value = serde_json::from_slice(&client.post("/v1/chat/completions", &answer).await?.body)?;
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    child.kill().await?;
    Ok(())
}
