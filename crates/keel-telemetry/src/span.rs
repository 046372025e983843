//! What keel records: finished spans and typed attributes. These are plain
//! data with no I/O; the exporter turns them into OTLP messages.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::{SpanId, TraceId};

/// One finished span, recorded whole when it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRecord {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// `None` for the root of a trace.
    pub parent_span_id: Option<SpanId>,
    pub name: String,
    pub kind: SpanKind,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Vec<KeyValue>,
    pub status: SpanStatus,
    pub events: Vec<SpanEvent>,
}

impl SpanRecord {
    /// A span with a fresh id, no attributes or events, and status unset.
    pub fn new(
        trace_id: TraceId,
        parent_span_id: Option<SpanId>,
        name: impl Into<String>,
        kind: SpanKind,
        start_unix_nanos: u64,
        end_unix_nanos: u64,
    ) -> SpanRecord {
        SpanRecord {
            trace_id,
            span_id: SpanId::random(),
            parent_span_id,
            name: name.into(),
            kind,
            start_unix_nanos,
            end_unix_nanos,
            attributes: Vec::new(),
            status: SpanStatus::Unset,
            events: Vec::new(),
        }
    }
}

/// The span kinds keel uses: a turn is `Server`, a model or MCP call is
/// `Client`, a tool run is `Internal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanKind {
    Internal,
    Client,
    Server,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SpanStatus {
    #[default]
    Unset,
    Ok,
    Error {
        message: String,
    },
}

/// Something that happened at one instant within a span.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanEvent {
    pub name: String,
    pub time_unix_nanos: u64,
    pub attributes: Vec<KeyValue>,
}

/// One attribute.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyValue {
    pub key: String,
    pub value: AttrValue,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    String(String),
    Bool(bool),
    I64(i64),
    F64(f64),
    StringArray(Vec<String>),
}

impl KeyValue {
    pub fn new(key: impl Into<String>, value: AttrValue) -> KeyValue {
        KeyValue { key: key.into(), value }
    }

    pub fn str(key: impl Into<String>, value: impl Into<String>) -> KeyValue {
        KeyValue::new(key, AttrValue::String(value.into()))
    }

    pub fn bool(key: impl Into<String>, value: bool) -> KeyValue {
        KeyValue::new(key, AttrValue::Bool(value))
    }

    pub fn i64(key: impl Into<String>, value: i64) -> KeyValue {
        KeyValue::new(key, AttrValue::I64(value))
    }

    pub fn f64(key: impl Into<String>, value: f64) -> KeyValue {
        KeyValue::new(key, AttrValue::F64(value))
    }

    pub fn strings(key: impl Into<String>, values: impl IntoIterator<Item = impl Into<String>>) -> KeyValue {
        KeyValue::new(key, AttrValue::StringArray(values.into_iter().map(Into::into).collect()))
    }
}

/// Now, in nanoseconds since the Unix epoch (0 if the clock is before it).
pub fn now_unix_nanos() -> u64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since_epoch.as_nanos()).unwrap_or(u64::MAX)
}
