//! Test support: a real `keel serve` process and a JSON-RPC WebSocket client.

#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// The example bundle shipped in the repository.
pub fn example_bundle() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/assistant")
}

/// A `keel serve` child process, killed on drop.
pub struct Keel {
    child: Child,
    pub url: String,
    pub state: PathBuf,
}

impl Keel {
    /// Starts `keel serve` on a free loopback port with the example bundle,
    /// pointing `openai-chat` at `base_url`.
    pub fn start(state: &Path, base_url: &str) -> Result<Keel> {
        Keel::start_with(state, base_url, &example_bundle(), &[])
    }

    /// Starts `keel serve` with a chosen bundle and extra environment.
    pub fn start_with(state: &Path, base_url: &str, bundle: &Path, env: &[(&str, &str)]) -> Result<Keel> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("--state")
            .arg(state)
            .args(["serve", "--listen", "127.0.0.1:0", "--bundle"])
            .arg(bundle)
            .envs(env.iter().copied())
            .env("OPENAI_BASE_URL", base_url)
            .env("ANTHROPIC_BASE_URL", base_url)
            .env("ANTHROPIC_API_KEY", "sk-ant-test")
            .env("OPENAI_API_KEY", "sk-test-key")
            .env("KEEL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawn keel")?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
        let mut lines = BufReader::new(stderr).lines();
        let url = loop {
            let line = lines.next().ok_or_else(|| anyhow!("keel exited before listening"))??;
            if let Some(rest) = line.strip_prefix("keel: serving JSON-RPC on ") {
                break rest.trim().to_string();
            }
        };
        // Keep draining stderr so the child never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(Keel { child, url, state: state.to_path_buf() })
    }

    pub fn token(&self) -> Result<String> {
        Ok(std::fs::read_to_string(self.state.join("token"))?.trim().to_string())
    }

    pub async fn client(&self) -> Result<Client> {
        Client::connect(&self.url, &self.token()?).await
    }

    /// SIGTERM: keel shuts down gracefully.
    pub fn terminate(&self) {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
    }

    /// Waits for the process to exit.
    pub fn wait(mut self) {
        let _ = self.child.wait();
    }

    /// Whether the process has exited (for crash-point tests).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// SIGKILL: no shutdown code runs.
    /// The keel process id.
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Keel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A JSON-RPC error as received.
#[derive(Debug)]
pub struct RpcFailure {
    pub code: i64,
    pub message: String,
    pub data: Value,
}

/// A JSON-RPC client over WebSocket that keeps notifications aside.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    notifications: VecDeque<Value>,
}

impl Client {
    pub async fn connect(url: &str, token: &str) -> Result<Client> {
        let mut request = url.into_client_request()?;
        request.headers_mut().insert("authorization", format!("Bearer {token}").parse()?);
        let (ws, _) = tokio_tungstenite::connect_async(request).await?;
        Ok(Client { ws, next_id: 0, notifications: VecDeque::new() })
    }

    pub async fn send_text(&mut self, text: &str) -> Result<()> {
        self.ws.send(Message::text(text.to_string())).await?;
        Ok(())
    }

    /// The next message that is not a notification.
    pub async fn recv_response(&mut self) -> Result<Value> {
        loop {
            let message = self.recv_raw().await?;
            if message.get("method").is_some() && message.get("id").is_none() {
                self.notifications.push_back(message);
            } else {
                return Ok(message);
            }
        }
    }

    async fn recv_raw(&mut self) -> Result<Value> {
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(30), self.ws.next())
                .await
                .context("timed out waiting for keel")?
                .ok_or_else(|| anyhow!("connection closed"))??;
            if let Message::Text(text) = frame {
                return Ok(serde_json::from_str(text.as_str())?);
            }
        }
    }

    /// Calls a method; `Err` carries a JSON-RPC error.
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Result<Value, RpcFailure>> {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_text(&request.to_string()).await?;
        let response = self.recv_response().await?;
        if response["id"] != json!(id) {
            bail!("response for another request: {response}");
        }
        if let Some(error) = response.get("error") {
            return Ok(Err(RpcFailure {
                code: error["code"].as_i64().unwrap_or_default(),
                message: error["message"].as_str().unwrap_or_default().to_string(),
                data: error.get("data").cloned().unwrap_or(Value::Null),
            }));
        }
        Ok(Ok(response["result"].clone()))
    }

    /// Calls a method that must succeed.
    pub async fn ok(&mut self, method: &str, params: Value) -> Result<Value> {
        self.call(method, params).await?.map_err(|e| anyhow!("{method} failed: {} {}", e.code, e.message))
    }

    /// The next notification, waiting up to 30 s.
    pub async fn notification(&mut self) -> Result<Value> {
        if let Some(n) = self.notifications.pop_front() {
            return Ok(n);
        }
        loop {
            let message = self.recv_raw().await?;
            if message.get("method").is_some() {
                return Ok(message);
            }
        }
    }

    /// Journal events (skipping deltas) until one of `kind` for any turn.
    pub async fn events_until(&mut self, kind: &str) -> Result<Vec<Value>> {
        let mut events = Vec::new();
        loop {
            let n = self.notification().await?;
            if n["method"] != "events/event" {
                continue;
            }
            let event = n["params"]["event"].clone();
            let done = event["kind"] == kind;
            events.push(event);
            if done {
                return Ok(events);
            }
        }
    }

    pub async fn create_session(&mut self, workspace: &Path) -> Result<String> {
        let created = self
            .ok("session/create", json!({"name": "test", "coworker": "assistant-example", "workspace": workspace}))
            .await?;
        Ok(created["session"]["id"].as_str().ok_or_else(|| anyhow!("no id"))?.to_string())
    }

    /// Polls `session/get` until the current turn has `status`.
    pub async fn wait_for_status(&mut self, session: &str, status: &str) -> Result<Value> {
        for _ in 0..600 {
            let snapshot = self.ok("session/get", json!({"session_id": session})).await?;
            if snapshot["turn"]["status"] == status {
                return Ok(snapshot);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!("turn never became {status}")
    }
}

/// `<dir>/workspace`, created: a workspace beside (not around) the state
/// directory, which keel refuses to put inside a workspace.
pub fn workspace(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let ws = dir.path().join("workspace");
    std::fs::create_dir_all(&ws).unwrap();
    ws
}
