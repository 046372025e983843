//! A minimal HTTP/1.1 server connection on a raw tokio `TcpStream`: request
//! parsing (Content-Length and chunked bodies, `Expect: 100-continue`,
//! keep-alive and pipelining) and response writing (Content-Length or
//! chunked, each chunk written and flushed as it is produced).
//!
//! It is deliberately small and strict rather than complete: it only has to
//! serve HTTP clients under test, and a client that sends something odd
//! gets a clear 4xx instead of a guess.

use std::io;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest request head (request line and headers) accepted.
const MAX_HEAD: usize = 64 * 1024;
/// The largest request body accepted.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub method: String,
    pub path: String,
    /// Names lowercased, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Whether the client wants the connection kept open afterwards.
    pub keep_alive: bool,
}

/// Why a request could not be read. All but `Io` are answered with a
/// status before the connection is closed.
#[derive(Debug)]
pub(crate) enum HttpError {
    Malformed(&'static str),
    HeadTooLarge,
    BodyTooLarge,
    UnsupportedTransferEncoding,
    /// The socket failed: the client is gone, so there is no one to answer.
    Io,
}

impl HttpError {
    /// The status and plain-text message to answer with, if any.
    pub fn response(&self) -> Option<(u16, String)> {
        match self {
            HttpError::Malformed(what) => Some((400, format!("malformed request: {what}"))),
            HttpError::HeadTooLarge => Some((431, format!("request head larger than {MAX_HEAD} bytes"))),
            HttpError::BodyTooLarge => Some((413, format!("request body larger than {MAX_BODY} bytes"))),
            HttpError::UnsupportedTransferEncoding => {
                Some((501, "only the chunked transfer-encoding is supported".to_owned()))
            }
            HttpError::Io => None,
        }
    }
}

impl From<io::Error> for HttpError {
    fn from(_: io::Error) -> Self {
        HttpError::Io
    }
}

/// One client connection.
pub(crate) struct Connection {
    stream: TcpStream,
    /// Bytes read but not consumed yet: the start of a pipelined request.
    buffer: BytesMut,
}

impl Connection {
    pub fn new(stream: TcpStream) -> Connection {
        // Responses are written in small pieces; Nagle would delay them.
        let _ = stream.set_nodelay(true);
        Connection { stream, buffer: BytesMut::with_capacity(8 * 1024) }
    }

    /// Reads more bytes into the buffer; `false` at end of stream.
    async fn fill(&mut self) -> io::Result<bool> {
        Ok(self.stream.read_buf(&mut self.buffer).await? > 0)
    }

    /// Reads the next request, or `None` when the client closed the
    /// connection between requests.
    pub async fn read_request(&mut self) -> Result<Option<Request>, HttpError> {
        let head_end = loop {
            if let Some(end) = find(&self.buffer, b"\r\n\r\n") {
                break end + 4;
            }
            if self.buffer.len() > MAX_HEAD {
                return Err(HttpError::HeadTooLarge);
            }
            if !self.fill().await? {
                return match self.buffer.is_empty() {
                    true => Ok(None),
                    false => Err(HttpError::Malformed("the connection closed inside the request head")),
                };
            }
        };
        let head = self.buffer.split_to(head_end);
        let head = std::str::from_utf8(&head).map_err(|_| HttpError::Malformed("the head is not UTF-8"))?;
        let mut lines = head.split("\r\n");
        let request_line = lines.next().unwrap_or_default();
        let mut parts = request_line.split(' ');
        let (Some(method), Some(path), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(HttpError::Malformed("the request line is not `METHOD TARGET HTTP/1.x`"));
        };
        let http10 = match version {
            "HTTP/1.1" => false,
            "HTTP/1.0" => true,
            _ => {
                return Err(HttpError::Malformed("only HTTP/1.0 and HTTP/1.1 are supported"));
            }
        };
        let mut headers = Vec::new();
        for line in lines.filter(|line| !line.is_empty()) {
            if line.starts_with([' ', '\t']) {
                return Err(HttpError::Malformed("obsolete header line folding"));
            }
            let (name, value) = line.split_once(':').ok_or(HttpError::Malformed("a header line has no colon"))?;
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
        }
        let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        let connection = header("connection").unwrap_or_default().to_ascii_lowercase();
        let keep_alive = if http10 { connection.contains("keep-alive") } else { !connection.contains("close") };
        if header("expect").is_some_and(|value| value.eq_ignore_ascii_case("100-continue")) {
            self.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
        }
        let body = match (header("transfer-encoding"), header("content-length")) {
            (Some(coding), _) if coding.eq_ignore_ascii_case("chunked") => self.read_chunked_body().await?,
            (Some(_), _) => return Err(HttpError::UnsupportedTransferEncoding),
            (None, Some(length)) => {
                let length: usize =
                    length.parse().map_err(|_| HttpError::Malformed("Content-Length is not a number"))?;
                self.read_exact(length).await?
            }
            (None, None) => Vec::new(),
        };
        Ok(Some(Request { method: method.to_owned(), path: path.to_owned(), headers, body, keep_alive }))
    }

    async fn read_exact(&mut self, length: usize) -> Result<Vec<u8>, HttpError> {
        if length > MAX_BODY {
            return Err(HttpError::BodyTooLarge);
        }
        while self.buffer.len() < length {
            if !self.fill().await? {
                return Err(HttpError::Malformed("the connection closed inside the body"));
            }
        }
        Ok(self.buffer.split_to(length).to_vec())
    }

    async fn read_line(&mut self) -> Result<String, HttpError> {
        loop {
            if let Some(end) = find(&self.buffer, b"\r\n") {
                let line = self.buffer.split_to(end);
                self.buffer.advance(2);
                return String::from_utf8(line.to_vec()).map_err(|_| HttpError::Malformed("a chunk line is not UTF-8"));
            }
            if self.buffer.len() > MAX_HEAD {
                return Err(HttpError::HeadTooLarge);
            }
            if !self.fill().await? {
                return Err(HttpError::Malformed("the connection closed inside a chunked body"));
            }
        }
    }

    async fn read_chunked_body(&mut self) -> Result<Vec<u8>, HttpError> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line().await?;
            let size = line.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16).map_err(|_| HttpError::Malformed("a chunk size is not hex"))?;
            if size == 0 {
                // Trailers, if any, up to the empty line.
                while !self.read_line().await?.is_empty() {}
                return Ok(body);
            }
            if body.len() + size > MAX_BODY {
                return Err(HttpError::BodyTooLarge);
            }
            let chunk = self.read_exact(size + 2).await?;
            if !chunk.ends_with(b"\r\n") {
                return Err(HttpError::Malformed("a chunk is not followed by CRLF"));
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }

    pub async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await?;
        self.stream.flush().await
    }

    /// Writes a status line and headers; `length` `None` means chunked.
    pub async fn write_head(
        &mut self,
        status: u16,
        headers: &[(String, String)],
        length: Option<usize>,
        keep_alive: bool,
    ) -> io::Result<()> {
        let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        match length {
            Some(length) => head.push_str(&format!("content-length: {length}\r\n")),
            None => head.push_str("transfer-encoding: chunked\r\n"),
        }
        if !keep_alive {
            head.push_str("connection: close\r\n");
        }
        head.push_str("\r\n");
        self.write_all(head.as_bytes()).await
    }

    /// Writes one chunk of a chunked body and flushes it.
    pub async fn write_chunk(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(()); // An empty chunk would end the body.
        }
        let mut chunk = Vec::with_capacity(data.len() + 12);
        chunk.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        chunk.extend_from_slice(data);
        chunk.extend_from_slice(b"\r\n");
        self.write_all(&chunk).await
    }

    /// Ends a chunked body.
    pub async fn finish_chunked(&mut self) -> io::Result<()> {
        self.write_all(b"0\r\n\r\n").await
    }

    /// A complete response with a Content-Length body.
    pub async fn write_response(
        &mut self,
        status: u16,
        headers: &[(String, String)],
        body: &[u8],
        keep_alive: bool,
    ) -> io::Result<()> {
        self.write_head(status, headers, Some(body.len()), keep_alive).await?;
        self.write_all(body).await
    }

    /// Closes the write side, so the client sees the end of the stream.
    pub async fn shutdown(&mut self) {
        let _ = self.stream.shutdown().await;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        529 => "Site Overloaded",
        _ => "Status",
    }
}
