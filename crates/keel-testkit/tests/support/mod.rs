//! A raw TCP HTTP/1.1 client for checking the mock server byte for byte,
//! shared by the test files.

#![allow(dead_code)]

use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use keel_testkit::MockServer;
use serde_json::Value;

/// A response as read off the socket.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// False when the connection closed before the body was complete.
    pub complete: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `event:` name (if any) and parsed `data:` of each event of an
    /// event-stream body.
    pub fn named_events(&self) -> anyhow::Result<Vec<(Option<String>, Value)>> {
        let text = self.text();
        let mut events = Vec::new();
        for block in text.split("\n\n").filter(|block| !block.is_empty()) {
            let mut name = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(value) = line.strip_prefix("event: ") {
                    name = Some(value.to_owned());
                } else if let Some(value) = line.strip_prefix("data: ") {
                    data = Some(serde_json::from_str(value).with_context(|| format!("bad data: {value}"))?);
                }
            }
            events.push((name, data.context("an event without data")?));
        }
        Ok(events)
    }

    /// The `data:` payloads of an event-stream body.
    pub fn events(&self) -> Vec<String> {
        self.text().split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_owned).collect()
    }
}

pub struct Client {
    reader: BufReader<TcpStream>,
}

impl Client {
    pub async fn connect(server: &MockServer) -> anyhow::Result<Client> {
        Ok(Client { reader: BufReader::new(TcpStream::connect(server.addr()).await?) })
    }

    pub async fn connect_to(addr: &str) -> anyhow::Result<Client> {
        Ok(Client { reader: BufReader::new(TcpStream::connect(addr).await?) })
    }

    pub async fn send(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.reader.get_mut().write_all(bytes).await?;
        Ok(())
    }

    pub async fn post(&mut self, path: &str, body: &Value) -> anyhow::Result<Response> {
        let body = body.to_string();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        self.send(format!("{head}{body}").as_bytes()).await?;
        self.response().await
    }

    pub async fn line(&mut self) -> anyhow::Result<Option<String>> {
        let mut line = String::new();
        if self.reader.read_line(&mut line).await? == 0 {
            return Ok(None);
        }
        Ok(Some(line.trim_end_matches("\r\n").to_owned()))
    }

    pub async fn response(&mut self) -> anyhow::Result<Response> {
        let status_line = self.line().await?.context("the connection closed before a response")?;
        let status = status_line.split(' ').nth(1).context("no status")?.parse()?;
        let mut headers = Vec::new();
        while let Some(line) = self.line().await? {
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').context("bad header")?;
            headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
        }
        let mut response = Response { status, headers, body: Vec::new(), complete: true };
        if let Some(length) = response.header("content-length") {
            response.body = vec![0; length.parse()?];
            self.reader.read_exact(&mut response.body).await?;
        } else if response.header("transfer-encoding") == Some("chunked") {
            loop {
                let Some(size) = self.line().await? else {
                    response.complete = false;
                    break;
                };
                let size = usize::from_str_radix(&size, 16)?;
                if size == 0 {
                    // Trailers end at an empty line.
                    while self.line().await?.is_some_and(|line| !line.is_empty()) {}
                    break;
                }
                let mut chunk = vec![0; size + 2];
                if self.reader.read_exact(&mut chunk).await.is_err() {
                    response.complete = false;
                    break;
                }
                response.body.extend_from_slice(&chunk[..size]);
            }
        }
        Ok(response)
    }

    /// Whether the server closed the connection.
    pub async fn is_closed(&mut self) -> anyhow::Result<bool> {
        let mut byte = [0u8; 1];
        Ok(tokio::time::timeout(Duration::from_secs(5), self.reader.read(&mut byte)).await?? == 0)
    }
}
