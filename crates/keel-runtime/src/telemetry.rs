//! Traces and metrics of turns, following the OpenTelemetry GenAI semantic
//! conventions, exported through `keel-telemetry` (bounded, non-blocking:
//! a slow or missing collector costs a turn nothing; spans are dropped and
//! counted instead).
//!
//! The span tree of a turn:
//! - `invoke_agent {coworker}`: the whole turn, emitted when it ends;
//! - `segment`: one per stretch a driver ran the turn (a turn that waits for
//!   a person and goes on later has two, in the same trace), child of the
//!   turn's span;
//! - `chat {model}`: one per model attempt (retries included), and
//!   `execute_tool {tool}` per tool call, children of their segment; plus
//!   `compact` when a segment compacts the context.
//!
//! The trace id and the turn's span id are derived from the turn id
//! (SHA-256), so a turn resumed by another process, after a restart,
//! continues the same trace without storing anything. Prompt and completion
//! texts are left out unless `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`
//! is `true`; then the model's output goes in `gen_ai.output.messages`
//! (secrets already redacted).

use keel_telemetry::{KeyValue, SpanId, SpanKind, SpanRecord, SpanStatus, Telemetry, TraceId};
use sha2::{Digest, Sha256};

/// Histogram boundaries for durations in seconds.
const SECONDS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0];
/// Histogram boundaries for token counts (the semantic conventions' own).
const TOKENS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0,
    67108864.0,
];

pub(crate) const TURNS: &str = "keel.turns";
pub(crate) const ATTEMPTS: &str = "keel.model.attempts";
pub(crate) const TOOL_CALLS: &str = "keel.tool.calls";
pub(crate) const ERRORS: &str = "keel.errors";
pub(crate) const OPERATION_DURATION: &str = "gen_ai.client.operation.duration";
pub(crate) const TOKEN_USAGE: &str = "gen_ai.client.token.usage";
pub(crate) const TURN_DURATION: &str = "keel.turn.duration";
pub(crate) const TOOL_DURATION: &str = "keel.tool.duration";

/// Declares keel's instruments.
pub(crate) fn register(telemetry: &Telemetry) {
    telemetry.register_counter(TURNS, "{turn}", "Turns ended, by status");
    telemetry.register_counter(ATTEMPTS, "{attempt}", "Model requests, by outcome");
    telemetry.register_counter(TOOL_CALLS, "{call}", "Tool calls, by tool and outcome");
    telemetry.register_counter(ERRORS, "{error}", "Failures, by error type");
    let histograms = [
        (OPERATION_DURATION, "s", "Duration of model requests", SECONDS),
        (TOKEN_USAGE, "{token}", "Tokens used per model request, by token type", TOKENS),
        (TURN_DURATION, "s", "Duration of ended turns, from start to end", SECONDS),
        (TOOL_DURATION, "s", "Duration of tool calls", SECONDS),
    ];
    for (name, unit, description, boundaries) in histograms {
        if let Err(error) = telemetry.register_histogram(name, unit, description, boundaries) {
            tracing::warn!(%error, "telemetry histogram not registered");
        }
    }
}

fn digest(kind: &str, turn_id: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(kind.as_bytes());
    hash.update(turn_id.as_bytes());
    hash.finalize().into()
}

/// The trace of a turn and the id of its `invoke_agent` span.
pub(crate) fn turn_trace(turn_id: &str) -> (TraceId, SpanId) {
    let trace = digest("keel-trace:", turn_id);
    let span = digest("keel-turn-span:", turn_id);
    let mut trace_id = [0u8; 16];
    let mut span_id = [0u8; 8];
    trace_id.copy_from_slice(&trace[..16]);
    span_id.copy_from_slice(&span[..8]);
    // An all-zero id is invalid; a hash of one is astronomically unlikely.
    trace_id[15] |= (trace_id == [0; 16]) as u8;
    span_id[7] |= (span_id == [0; 8]) as u8;
    (TraceId(trace_id), SpanId(span_id))
}

/// Nanoseconds since the Unix epoch of a millisecond timestamp.
pub(crate) fn nanos(ms: i64) -> u64 {
    u64::try_from(ms).unwrap_or(0).saturating_mul(1_000_000)
}

/// The `gen_ai.provider.name` of a keel provider.
pub(crate) fn provider_name(provider: &str) -> &str {
    match provider {
        "openai-chat" | "openai" => "openai",
        "anthropic" => "anthropic",
        "local" => "llama.cpp",
        other => other,
    }
}

/// Where a segment's spans go.
#[derive(Clone, Copy)]
pub(crate) struct SegmentContext {
    pub trace: TraceId,
    pub span: SpanId,
}

/// A span under construction.
pub(crate) struct Span(SpanRecord);

impl Span {
    pub fn new(trace: TraceId, parent: Option<SpanId>, name: impl Into<String>, kind: SpanKind, start: u64) -> Span {
        Span(SpanRecord::new(trace, parent, name, kind, start, start))
    }

    pub fn with_id(mut self, id: SpanId) -> Span {
        self.0.span_id = id;
        self
    }

    pub fn id(&self) -> SpanId {
        self.0.span_id
    }

    pub fn attr(&mut self, attribute: KeyValue) -> &mut Span {
        self.0.attributes.push(attribute);
        self
    }

    pub fn error(&mut self, kind: &str, message: impl Into<String>) -> &mut Span {
        self.0.attributes.push(KeyValue::str("error.type", kind));
        self.0.status = SpanStatus::Error { message: message.into() };
        self
    }

    /// Ends the span now and hands it to the exporter.
    pub fn end(mut self, telemetry: &Telemetry) {
        self.0.end_unix_nanos = keel_telemetry::now_unix_nanos().max(self.0.start_unix_nanos);
        if matches!(self.0.status, SpanStatus::Unset) {
            self.0.status = SpanStatus::Ok;
        }
        telemetry.record_span(self.0);
    }
}
