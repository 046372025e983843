//! Serving one connection: read a request, route it to a wire format, write
//! the reply, repeat while the client keeps the connection alive.
//!
//! What a reply looks like in each API is [`crate::wire`]'s business; this
//! module only frames it: Content-Length bodies, chunked event streams one
//! event per chunk, delays, and cuts that drop the connection mid-body.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpStream;

use crate::errors::ApiError;
use crate::http::Connection;
use crate::reply::{ModelOutput, ReplyBody};
use crate::server::ServerState;
use crate::wire::{Exchange, Frame, WireFormat};
use crate::{RecordedRequest, Reply};

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
    let Some(format) = WireFormat::for_path(&request.path) else {
        // An unknown path has no format; answer as OpenAI does.
        let message = format!("Invalid URL ({} {})", request.method, request.path);
        return refuse(connection, WireFormat::OpenAiChat, 404, message, number, keep_alive).await;
    };
    if request.method != "POST" {
        let message = "Only POST is supported here".to_owned();
        return refuse(connection, format, 405, message, number, keep_alive).await;
    }
    let Some(body) = &request.json else {
        let message = "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly.)".to_owned();
        return refuse(connection, format, 400, message, number, keep_alive).await;
    };
    let reply = state.next_reply(request);
    write_reply(connection, reply, &Exchange { format, number, body }, keep_alive).await
}

/// Answers a request the server cannot route, in the format's error shape,
/// without consuming a scripted reply.
async fn refuse(
    connection: &mut Connection,
    format: WireFormat,
    status: u16,
    message: String,
    number: u64,
    keep_alive: bool,
) -> io::Result<KeepOpen> {
    let request_id = format!("req_mock_{number}");
    let (status, body) = ApiError::Custom { status, code: String::new(), message }.render(format, &request_id);
    let headers = [("content-type".to_owned(), "application/json".to_owned()), ("x-request-id".to_owned(), request_id)];
    connection.write_response(status, &headers, body.to_string().as_bytes(), keep_alive).await?;
    Ok(true)
}

async fn write_reply(
    connection: &mut Connection,
    reply: Reply,
    exchange: &Exchange<'_>,
    keep_alive: bool,
) -> io::Result<KeepOpen> {
    if !reply.first_byte_delay.is_zero() {
        tokio::time::sleep(reply.first_byte_delay).await;
    }
    let mut headers = vec![("x-request-id".to_owned(), exchange.request_id())];
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
        ReplyBody::ApiError(error) => {
            let (status, body) = error.render(exchange.format, &exchange.request_id());
            headers.push(("content-type".to_owned(), "application/json".to_owned()));
            connection.write_response(status, &headers, body.to_string().as_bytes(), keep_alive).await?;
            Ok(true)
        }
        ReplyBody::RawStream(bytes) => {
            push_stream_headers(&mut headers);
            connection.write_head(200, &headers, None, keep_alive).await?;
            connection.write_chunk(&bytes).await?;
            connection.finish_chunked().await?;
            Ok(true)
        }
        ReplyBody::Model(output) if exchange.streams() => {
            let frames = exchange.frames(&output);
            write_events(connection, &output, frames, headers, reply.chunk_delay, keep_alive).await
        }
        ReplyBody::Model(output) => write_whole(connection, &output, exchange, headers, keep_alive).await,
    }
}

fn push_stream_headers(headers: &mut Vec<(String, String)>) {
    headers.push(("content-type".to_owned(), "text/event-stream; charset=utf-8".to_owned()));
    headers.push(("cache-control".to_owned(), "no-cache".to_owned()));
}

/// Streams events, one chunk each, honouring the output's cut.
async fn write_events(
    connection: &mut Connection,
    output: &ModelOutput,
    frames: Vec<Frame>,
    mut headers: Vec<(String, String)>,
    chunk_delay: Duration,
    keep_alive: bool,
) -> io::Result<KeepOpen> {
    push_stream_headers(&mut headers);
    connection.write_head(200, &headers, None, keep_alive).await?;
    let limit = output.cut.map_or(usize::MAX, |cut| cut.after_events);
    for (index, frame) in frames.iter().take(limit).enumerate() {
        if index > 0 && !chunk_delay.is_zero() {
            tokio::time::sleep(chunk_delay).await;
        }
        connection.write_chunk(&frame.to_bytes()).await?;
    }
    if output.cut.is_some_and(|cut| !cut.clean) {
        // Dropping the connection mid-body: no terminating chunk.
        return Ok(false);
    }
    connection.finish_chunked().await?;
    Ok(true)
}

/// Answers a non-streaming request with one JSON object. A cut closes the
/// connection before anything is sent; a stream error becomes an HTTP error.
async fn write_whole(
    connection: &mut Connection,
    output: &ModelOutput,
    exchange: &Exchange<'_>,
    mut headers: Vec<(String, String)>,
    keep_alive: bool,
) -> io::Result<KeepOpen> {
    if output.cut.is_some_and(|cut| !cut.clean) {
        return Ok(false);
    }
    headers.push(("content-type".to_owned(), "application/json".to_owned()));
    let (status, body) = exchange.whole_body(output);
    connection.write_response(status, &headers, body.to_string().as_bytes(), keep_alive).await?;
    Ok(true)
}
