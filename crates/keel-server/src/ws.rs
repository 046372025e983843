//! JSON-RPC over WebSocket, one message per text frame.
//!
//! The handshake is refused with HTTP 401 unless the client presents the
//! token. Every connection is a task owned by the server's tracker and ends
//! when the server shuts down.

use std::net::SocketAddr;

use futures_util::{SinkExt, StreamExt};
use keel_runtime::Runtime;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection::Connection;

/// Largest message accepted from a client.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// Accepts WebSocket clients on `listener` until `shutdown` fires, then
/// closes every connection and returns.
pub async fn serve_ws(listener: TcpListener, runtime: Runtime, token: String, shutdown: CancellationToken) {
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, peer)) => {
                let runtime = runtime.clone();
                let token = token.clone();
                let shutdown = shutdown.clone();
                connections.spawn(async move {
                    if let Err(error) = serve_client(stream, peer, runtime, &token, shutdown).await {
                        tracing::debug!(%peer, %error, "websocket connection ended with an error");
                    }
                });
            }
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    connections.close();
    connections.wait().await;
}

fn authorized(request: &Request, token: &str) -> bool {
    let bearer = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let query = request.uri().query().unwrap_or("").split('&').find_map(|pair| pair.strip_prefix("token="));
    [bearer, query].into_iter().flatten().any(|given| constant_time_eq(given.as_bytes(), token.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn serve_client(
    stream: TcpStream,
    peer: SocketAddr,
    runtime: Runtime,
    token: &str,
    shutdown: CancellationToken,
) -> Result<(), tokio_tungstenite::tungstenite::Error> {
    let _ = stream.set_nodelay(true);
    // The handshake callback's signature is fixed by tungstenite.
    #[allow(clippy::result_large_err)]
    let check = |request: &Request, response: Response| -> Result<Response, ErrorResponse> {
        if authorized(request, token) {
            Ok(response)
        } else {
            let mut refusal = ErrorResponse::new(Some(
                "missing or wrong token: send Authorization: Bearer <token> (the token is in the state directory's token file)".into(),
            ));
            *refusal.status_mut() = StatusCode::UNAUTHORIZED;
            Err(refusal)
        }
    };
    let config = WebSocketConfig::default().max_message_size(Some(MAX_MESSAGE)).max_frame_size(Some(MAX_MESSAGE));
    let ws = tokio_tungstenite::accept_hdr_async_with_config(stream, check, Some(config)).await?;
    tracing::debug!(%peer, "websocket client connected");
    let (mut sink, mut source) = ws.split();
    let (connection, mut outbox) = Connection::new(runtime);
    let done = CancellationToken::new();
    let writer = async {
        loop {
            let text = tokio::select! {
                _ = done.cancelled() => break,
                text = outbox.recv() => text,
            };
            let Some(text) = text else { break };
            sink.send(Message::text(text)).await?;
        }
        let _ = sink.close().await;
        Ok::<(), tokio_tungstenite::tungstenite::Error>(())
    };
    let reader = async {
        loop {
            let message = tokio::select! {
                _ = shutdown.cancelled() => break,
                message = source.next() => message,
            };
            match message {
                Some(Ok(Message::Text(text))) => {
                    if let Some(response) = connection.handle_text(text.as_str()).await
                        && connection.send(response).await.is_err()
                    {
                        break;
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    let error = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"invalid request: send JSON-RPC as text frames, not binary"}}"#;
                    if connection.send(error.to_string()).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            }
        }
        connection.close().await;
        done.cancel();
    };
    // The reader ends on close, error or shutdown; it then stops the
    // connection's subscriptions and the writer.
    let (result, ()) = tokio::join!(writer, reader);
    result
}
