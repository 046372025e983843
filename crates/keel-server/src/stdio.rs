//! JSON-RPC over stdin and stdout, one message per line.

use keel_runtime::Runtime;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

use crate::connection::Connection;

/// Serves one client on stdin/stdout until stdin closes or `shutdown` fires.
pub async fn serve_stdio(runtime: Runtime, shutdown: CancellationToken) -> std::io::Result<()> {
    serve_lines(runtime, tokio::io::stdin(), tokio::io::stdout(), shutdown).await
}

/// Serves one client on any line-oriented reader and writer.
pub async fn serve_lines<R, W>(
    runtime: Runtime,
    reader: R,
    mut writer: W,
    shutdown: CancellationToken,
) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (connection, mut outbox) = Connection::new(runtime);
    let write_task = tokio::spawn(async move {
        while let Some(line) = outbox.recv().await {
            if writer.write_all(line.as_bytes()).await.is_err()
                || writer.write_all(b"\n").await.is_err()
                || writer.flush().await.is_err()
            {
                break;
            }
        }
    });
    let mut lines = BufReader::new(reader).lines();
    loop {
        let line = tokio::select! {
            _ = shutdown.cancelled() => break,
            line = lines.next_line() => line?,
        };
        let Some(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        if let Some(response) = connection.handle_text(&line).await
            && connection.send(response).await.is_err()
        {
            break;
        }
    }
    connection.close().await;
    drop(connection);
    let _ = write_task.await;
    Ok(())
}
