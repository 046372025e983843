//! What every stream decoder shares: the [`StreamDecoder`] contract the
//! transport drives, and [`TypedEvents`], the parsing both typed-event
//! formats (OpenAI Responses, Anthropic Messages) start with.
//!
//! Decoders are pure: they take parsed server-sent events and return a
//! [`ModelResponse`] or a classified [`ProviderError`], so every server quirk
//! is unit-testable without a network ([`decode_events`] feeds them in tests).

use crate::failure::{classify_stream_error, invalid_data};
use crate::sse::SseEvent;
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
