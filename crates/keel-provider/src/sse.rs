//! An incremental Server-Sent Events parser, following the WHATWG HTML
//! specification's "event stream interpretation".
//!
//! Bytes are fed in whatever pieces the network delivers: a chunk may end
//! inside a UTF-8 sequence, inside a line, or between the `\r` and `\n` of a
//! CRLF. Lines are split on bytes (terminators are ASCII) and only decoded once
//! complete, so no split can corrupt text. The parser does no I/O; the
//! provider adapters drive it.
//!
//! One deliberate limit beyond the spec: a line, or the data of one event,
//! longer than [`SseParser::max_line_len`] is an error, so a server that never
//! sends a newline cannot make keel buffer without bound.

/// The default cap on one line and on one event's data: 8 MiB.
pub const DEFAULT_MAX_LINE_LEN: usize = 8 * 1024 * 1024;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, or `None` when the server did not name the event
    /// (the spec's default type, `message`).
    pub event: Option<String>,
    /// The `data:` lines, joined by `\n`.
    pub data: String,
    /// The last event ID seen on the stream so far, if any.
    pub id: Option<String>,
}

/// Why a stream cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error(
        "the event stream sent a line or event longer than {limit} bytes; check that the base URL points at a server that streams server-sent events"
    )]
    TooLong { limit: usize },
}

/// Incremental event-stream parser. Feed it with [`SseParser::feed`].
///
/// After an error the parser's state is unspecified; abandon the stream.
#[derive(Debug)]
pub struct SseParser {
    max_line_len: usize,
    /// The current, not yet terminated line.
    line: Vec<u8>,
    /// The previous chunk ended with `\r`: a `\n` starting the next chunk
    /// belongs to that terminator.
    after_cr: bool,
    /// Whether the byte-order mark check at the stream start is done.
    bom_checked: bool,
    event_type: String,
    data: String,
    /// The spec's "last event ID buffer", which survives between events.
    last_event_id: String,
    retry_ms: Option<u64>,
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::new()
    }
}

impl SseParser {
    /// A parser with the [`DEFAULT_MAX_LINE_LEN`] limit.
    pub fn new() -> SseParser {
        SseParser::with_max_line_len(DEFAULT_MAX_LINE_LEN)
    }

    /// A parser that fails once a line or an event's data exceeds `limit` bytes.
    pub fn with_max_line_len(limit: usize) -> SseParser {
        SseParser {
            max_line_len: limit,
            line: Vec::new(),
            after_cr: false,
            bom_checked: false,
            event_type: String::new(),
            data: String::new(),
            last_event_id: String::new(),
            retry_ms: None,
        }
    }

    pub fn max_line_len(&self) -> usize {
        self.max_line_len
    }

    /// The reconnection time the server asked for with `retry:`, if any.
    pub fn retry_ms(&self) -> Option<u64> {
        self.retry_ms
    }

    /// Feeds the next bytes of the stream and returns the events they
    /// complete, in order. An event is complete at its terminating blank line;
    /// an unterminated event at the end of the stream is discarded, as the
    /// spec requires.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<Vec<SseEvent>, SseError> {
        let mut events = Vec::new();
        if !self.bom_checked {
            // The BOM may itself arrive split across chunks.
            const BOM: &[u8] = b"\xEF\xBB\xBF";
            let seen = self.line.len() + chunk.len();
            if seen < BOM.len() && BOM.starts_with(&[self.line.as_slice(), chunk].concat()) {
                self.line.extend_from_slice(chunk);
                return Ok(events);
            }
            let mut joined = std::mem::take(&mut self.line);
            joined.extend_from_slice(chunk);
            self.bom_checked = true;
            let rest = joined.strip_prefix(BOM).unwrap_or(&joined).to_vec();
            self.feed_lines(&rest, &mut events)?;
            return Ok(events);
        }
        if self.after_cr && !chunk.is_empty() {
            self.after_cr = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        self.feed_lines(chunk, &mut events)?;
        Ok(events)
    }

    fn feed_lines(&mut self, mut chunk: &[u8], events: &mut Vec<SseEvent>) -> Result<(), SseError> {
        while let Some(end) = chunk.iter().position(|b| *b == b'\n' || *b == b'\r') {
            let (head, rest) = chunk.split_at(end);
            self.check_len(self.line.len() + head.len())?;
            let line = if self.line.is_empty() {
                String::from_utf8_lossy(head).into_owned()
            } else {
                self.line.extend_from_slice(head);
                let text = String::from_utf8_lossy(&self.line).into_owned();
                self.line.clear();
                text
            };
            // `rest` starts with the terminator; a CRLF counts as one.
            chunk = match rest {
                [b'\r', b'\n', tail @ ..] => tail,
                [b'\r'] => {
                    self.after_cr = true;
                    &[]
                }
                [_, tail @ ..] => tail,
                [] => &[],
            };
            if let Some(event) = self.process_line(&line)? {
                events.push(event);
            }
        }
        self.check_len(self.line.len() + chunk.len())?;
        self.line.extend_from_slice(chunk);
        Ok(())
    }

    fn check_len(&self, len: usize) -> Result<(), SseError> {
        if len > self.max_line_len {
            return Err(SseError::TooLong { limit: self.max_line_len });
        }
        Ok(())
    }

    fn process_line(&mut self, line: &str) -> Result<Option<SseEvent>, SseError> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        if line.starts_with(':') {
            return Ok(None);
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => value.clone_into(&mut self.event_type),
            "data" => {
                self.check_len(self.data.len() + value.len() + 1)?;
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => value.clone_into(&mut self.last_event_id),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                self.retry_ms = value.parse().ok();
            }
            _ => {}
        }
        Ok(None)
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        let event_type = std::mem::take(&mut self.event_type);
        if self.data.is_empty() {
            return None;
        }
        let mut data = std::mem::take(&mut self.data);
        if data.ends_with('\n') {
            data.pop();
        }
        Some(SseEvent {
            event: (!event_type.is_empty()).then_some(event_type),
            data,
            id: (!self.last_event_id.is_empty()).then(|| self.last_event_id.clone()),
        })
    }
}

#[cfg(test)]
#[path = "sse_tests.rs"]
mod tests;
