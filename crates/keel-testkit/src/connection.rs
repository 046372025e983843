//! Serving one connection: read a request, route it to a wire format, write
//! the reply, repeat while the client keeps the connection alive.
//!
//! Routing is by path, so another wire format (Anthropic Messages at
//! `/v1/messages`, OpenAI Responses at `/v1/responses`) is a new
//! [`WireFormat`] variant and an encoder module beside [`openai_chat`].

use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::net::TcpStream;

use crate::http::Connection;
use crate::openai_chat::{self, ChatContext};
use crate::reply::{ModelOutput, ReplyBody};
use crate::server::ServerState;
use crate::{RecordedRequest, Reply};

/// The API an endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WireFormat {
    OpenAiChat,
}

impl WireFormat {
    fn for_path(path: &str) -> Option<WireFormat> {
        let path = path.split('?').next().unwrap_or_default();
        match path.trim_end_matches('/') {
            "/v1/chat/completions" | "/chat/completions" => Some(WireFormat::OpenAiChat),
            _ => None,
        }
    }
}

/// Whether the connection can carry another request.
type KeepOpen = bool;

pub(crate) async fn serve_connection(stream: TcpStream, state: Arc<ServerState>) {
    let mut connection = Connection::new(stream);
    loop {
        let request = match connection.read_request().await {
            Ok(Some(request)) => request,
            Ok(None) => return,
            Err(error) => {
                if let Some((status, message)) = error.response() {
                    let headers = [("content-type".to_owned(), "text/plain".to_owned())];
                    let _ = connection.write_response(status, &headers, message.as_bytes(), false).await;
                }
                connection.shutdown().await;
                return;
            }
        };
        let keep_alive = request.keep_alive;
        let request = RecordedRequest::from_parts(request.method, request.path, request.headers, request.body);
        let number = state.record(&request);
        match respond(&mut connection, &state, &request, number, keep_alive).await {
            Ok(true) if keep_alive => {}
            _ => {
                connection.shutdown().await;
                return;
            }
        }
    }
}

async fn respond(
    connection: &mut Connection,
    state: &ServerState,
    request: &RecordedRequest,
    number: u64,
    keep_alive: bool,
) -> io::Result<KeepOpen> {
    let json_headers = |number: u64| {
        vec![
            ("content-type".to_owned(), "application/json".to_owned()),
            ("x-request-id".to_owned(), format!("req_mock_{number}")),
        ]
    };
    let Some(format) = WireFormat::for_path(&request.path) else {
        let message = format!("Invalid URL ({} {})", request.method, request.path);
        let body = openai_chat::error_body(&message, "invalid_request_error", None);
        connection.write_response(404, &json_headers(number), body.as_bytes(), keep_alive).await?;
        return Ok(true);
    };
    if request.method != "POST" {
        let body = openai_chat::error_body("Only POST is supported here", "invalid_request_error", None);
        connection.write_response(405, &json_headers(number), body.as_bytes(), keep_alive).await?;
        return Ok(true);
    }
    let Some(body) = &request.json else {
        let message = "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly.)";
        let body = openai_chat::error_body(message, "invalid_request_error", None);
        connection.write_response(400, &json_headers(number), body.as_bytes(), keep_alive).await?;
        return Ok(true);
    };
    let reply = state.next_reply(request);
    write_reply(connection, reply, format, body, number, keep_alive).await
}

async fn write_reply(
    connection: &mut Connection,
    reply: Reply,
    format: WireFormat,
    request_body: &Value,
    number: u64,
    keep_alive: bool,
) -> io::Result<KeepOpen> {
    if !reply.first_byte_delay.is_zero() {
        tokio::time::sleep(reply.first_byte_delay).await;
    }
    let mut headers = vec![("x-request-id".to_owned(), format!("req_mock_{number}"))];
    headers.extend(reply.headers.iter().cloned());
    match reply.body {
        ReplyBody::Raw(bytes) => {
            connection.write_all(&bytes).await?;
            Ok(false)
        }
        ReplyBody::Status { status, body } => {
            let is_json = serde_json::from_str::<Value>(&body).is_ok();
            let content_type = if is_json { "application/json" } else { "text/plain; charset=utf-8" };
            headers.push(("content-type".to_owned(), content_type.to_owned()));
            connection.write_response(status, &headers, body.as_bytes(), keep_alive).await?;
            Ok(true)
        }
        ReplyBody::RawStream(bytes) => {
            push_stream_headers(&mut headers);
            connection.write_head(200, &headers, None, keep_alive).await?;
            connection.write_chunk(&bytes).await?;
            connection.finish_chunked().await?;
            Ok(true)
        }
        ReplyBody::Model(output) => match format {
            WireFormat::OpenAiChat => {
                let context = ChatContext {
                    completion_id: &format!("chatcmpl-mock{number}"),
                    model: request_body.get("model").and_then(Value::as_str).unwrap_or("mock-model"),
                    created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
                    include_usage: request_body.pointer("/stream_options/include_usage") == Some(&Value::Bool(true)),
                };
                if request_body.get("stream") == Some(&Value::Bool(true)) {
                    let events = openai_chat::stream_events(&output, &context);
                    write_events(connection, &output, events, headers, reply.chunk_delay, keep_alive).await
                } else {
                    write_completion(connection, &output, &context, headers, keep_alive).await
                }
            }
        },
    }
}

fn push_stream_headers(headers: &mut Vec<(String, String)>) {
    headers.push(("content-type".to_owned(), "text/event-stream; charset=utf-8".to_owned()));
    headers.push(("cache-control".to_owned(), "no-cache".to_owned()));
}

/// Streams `data:` events, one chunk each, honouring the output's cut.
async fn write_events(
    connection: &mut Connection,
    output: &ModelOutput,
    events: Vec<String>,
    mut headers: Vec<(String, String)>,
    chunk_delay: Duration,
    keep_alive: bool,
) -> io::Result<KeepOpen> {
    push_stream_headers(&mut headers);
    connection.write_head(200, &headers, None, keep_alive).await?;
    let limit = output.cut.map_or(usize::MAX, |cut| cut.after_events);
    for (index, event) in events.iter().take(limit).enumerate() {
        if index > 0 && !chunk_delay.is_zero() {
            tokio::time::sleep(chunk_delay).await;
        }
        connection.write_chunk(format!("data: {event}\n\n").as_bytes()).await?;
    }
    if output.cut.is_some_and(|cut| !cut.clean) {
        // Dropping the connection mid-body: no terminating chunk.
        return Ok(false);
    }
    connection.finish_chunked().await?;
    Ok(true)
}

/// Answers a non-streaming request with one JSON object. A cut closes the
/// connection before anything is sent; a stream error becomes a 500.
async fn write_completion(
    connection: &mut Connection,
    output: &ModelOutput,
    context: &ChatContext<'_>,
    mut headers: Vec<(String, String)>,
    keep_alive: bool,
) -> io::Result<KeepOpen> {
    if output.cut.is_some_and(|cut| !cut.clean) {
        return Ok(false);
    }
    headers.push(("content-type".to_owned(), "application/json".to_owned()));
    let (status, body) = match &output.stream_error {
        Some(error) => (500, serde_json::json!({"error": error})),
        None => (200, openai_chat::completion(output, context)),
    };
    connection.write_response(status, &headers, body.to_string().as_bytes(), keep_alive).await?;
    Ok(true)
}
