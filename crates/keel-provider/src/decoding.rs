//! What every stream decoder shares: the [`StreamDecoder`] contract the
//! transport drives, [`EventFeed`], which takes body bytes through the SSE
//! parser into a decoder, and [`TypedEvents`], the parsing both typed-event
//! formats (OpenAI Responses, Anthropic Messages) start with.
//!
//! Decoders are pure: they take parsed server-sent events and return a
//! [`ModelResponse`] or a classified [`ProviderError`], so every server quirk
//! is unit-testable without a network ([`decode_events`] feeds them in tests).
//! [`decode_body`] runs a whole body through exactly what the transport
//! runs, without the network; each adapter exposes it for fuzzing and tests.

use crate::failure::{classify_stream_error, invalid_data};
use crate::sse::{SseEvent, SseParser};
use crate::transport::transport;
use crate::{DeltaSink, ModelResponse, ProviderError};

/// Whether the stream has more to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Continue,
    /// The terminal event arrived; anything after it is ignored.
    Done,
}

/// Turns one wire format's events into a [`ModelResponse`].
pub(crate) trait StreamDecoder {
    /// The wire format, as named in errors: "an OpenAI-compatible stream".
    const STREAM_NAME: &'static str;

    /// Takes one server-sent event.
    fn on_event(&mut self, event: &SseEvent, on_delta: DeltaSink<'_>) -> Result<Progress, ProviderError>;

    /// Takes a whole `application/json` body, from a server that ignored
    /// `"stream": true`.
    fn on_json_body(&mut self, body: &[u8], on_delta: DeltaSink<'_>) -> Result<(), ProviderError>;

    /// The response, once the body has ended.
    fn finish(self) -> Result<ModelResponse, ProviderError>;
}

/// The bytes of a response body as the transport hands them to a decoder.
#[derive(Debug, Clone, Copy)]
pub enum ResponseBody<'a> {
    /// An event stream, in the pieces the network delivered.
    Stream(&'a [&'a [u8]]),
    /// A whole `application/json` body, from a server that ignored
    /// `"stream": true`.
    Json(&'a [u8]),
}

/// Body bytes in, decoded events out: the SSE parser feeding a decoder.
#[derive(Debug)]
pub(crate) struct EventFeed<D> {
    parser: SseParser,
    decoder: D,
    events_seen: usize,
}

impl<D: StreamDecoder> EventFeed<D> {
    pub fn new(decoder: D) -> EventFeed<D> {
        EventFeed { parser: SseParser::new(), decoder, events_seen: 0 }
    }

    /// Feeds the next piece of the body; [`Progress::Done`] once the
    /// terminal event arrived (the rest of the body is then ignored).
    pub fn feed(&mut self, chunk: &[u8], on_delta: DeltaSink<'_>) -> Result<Progress, ProviderError> {
        let events = self
            .parser
            .feed(chunk)
            .map_err(|error| transport(format!("the provider's event stream is broken: {error}")))?;
        for event in &events {
            self.events_seen += 1;
            if self.decoder.on_event(event, on_delta)? == Progress::Done {
                return Ok(Progress::Done);
            }
        }
        Ok(Progress::Continue)
    }

    /// How many events reached the decoder.
    pub fn events_seen(&self) -> usize {
        self.events_seen
    }

    /// The response, once the body has ended or the terminal event arrived.
    pub fn finish(self) -> Result<ModelResponse, ProviderError> {
        self.decoder.finish()
    }
}

/// Decodes a whole `application/json` body.
pub(crate) fn decode_json_body<D: StreamDecoder>(
    mut decoder: D,
    body: &[u8],
    on_delta: DeltaSink<'_>,
) -> Result<ModelResponse, ProviderError> {
    decoder.on_json_body(body, on_delta).and_then(|()| decoder.finish())
}

/// Decodes a body with no network: the same parser and decoder, fed the
/// same way, as a live response. For fuzzing and tests.
pub(crate) fn decode_body<D: StreamDecoder>(
    decoder: D,
    body: ResponseBody<'_>,
    on_delta: DeltaSink<'_>,
) -> Result<ModelResponse, ProviderError> {
    let chunks = match body {
        ResponseBody::Json(body) => return decode_json_body(decoder, body, on_delta),
        ResponseBody::Stream(chunks) => chunks,
    };
    let mut feed = EventFeed::new(decoder);
    for chunk in chunks {
        if feed.feed(chunk, on_delta)? == Progress::Done {
            break;
        }
    }
    feed.finish()
}

/// How a wire format with typed events (each event's data is a JSON object
/// with a `type`) is named in errors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TypedEvents {
    /// "a valid Messages event"
    pub what: &'static str,
    /// "the Anthropic Messages API"
    pub api: &'static str,
}

impl TypedEvents {
    /// The JSON data of `event`, or `None` when it has none. An `error`
    /// event (by its SSE name or its `type`) comes back as the classified
    /// failure it reports.
    pub fn parse(&self, event: &SseEvent) -> Result<Option<serde_json::Value>, ProviderError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(None);
        }
        let value: serde_json::Value = serde_json::from_str(data).map_err(|error| self.invalid(data, &error))?;
        if event.event.as_deref() == Some("error") || value.get("type").and_then(|t| t.as_str()) == Some("error") {
            return Err(classify_stream_error(&value));
        }
        Ok(Some(value))
    }

    /// The failure for data that does not have the expected shape.
    pub fn invalid(&self, data: &str, error: &dyn std::fmt::Display) -> ProviderError {
        invalid_data(self.what, self.api, data, error)
    }
}

/// Feeds `events` to `decoder` as the transport would, stopping at the
/// first error or at [`Progress::Done`], and returns the outcome plus the
/// text deltas seen. For the decoders' unit tests.
#[cfg(test)]
pub(crate) fn decode_events<D: StreamDecoder>(
    mut decoder: D,
    events: impl IntoIterator<Item = SseEvent>,
) -> (Result<ModelResponse, ProviderError>, Vec<String>) {
    let deltas = std::sync::Mutex::new(Vec::new());
    let sink = |text: &str| deltas.lock().map(|mut d| d.push(text.to_owned())).unwrap_or_default();
    for event in events {
        match decoder.on_event(&event, &sink) {
            Ok(Progress::Continue) => {}
            Ok(Progress::Done) => break,
            Err(error) => return (Err(error), deltas.into_inner().unwrap_or_default()),
        }
    }
    (decoder.finish(), deltas.into_inner().unwrap_or_default())
}

/// Typed events (JSON objects with a `type`), each sent under its type's
/// name as the Responses and Anthropic APIs do.
#[cfg(test)]
pub(crate) fn typed_events(values: &[serde_json::Value]) -> Vec<SseEvent> {
    values
        .iter()
        .map(|value| SseEvent { event: value["type"].as_str().map(str::to_owned), data: value.to_string(), id: None })
        .collect()
}
