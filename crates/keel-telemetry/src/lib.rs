//! OpenTelemetry for keel: finished spans and metric totals exported over
//! OTLP HTTP/protobuf by one background thread, through a bounded queue that
//! never blocks the caller.
//!
//! [`Telemetry::start`] reads a [`TelemetryConfig`] (usually
//! [`TelemetryConfig::from_env`], the standard `OTEL_*` variables) and
//! returns a cheap-to-clone [`Telemetry`] handle plus a [`TelemetryGuard`]
//! that flushes on [`TelemetryGuard::shutdown`]. With no endpoint configured
//! the handle is disabled and every call returns at once.
//!
//! Invariant: recording never waits. [`Telemetry::record_span`] is a
//! `try_send` into a queue of `OTEL_BSP_MAX_QUEUE_SIZE` spans, and a full
//! queue drops the span and counts it; metrics are a hash-map update under a
//! mutex that the exporter holds only to copy totals out. A slow or dead
//! collector therefore costs dropped data ([`TelemetryStats`]), never a
//! slower turn. Export failures are counted and logged once, not returned.

mod config;
mod encode;
mod error;
mod exporter;
mod ids;
mod metrics;
mod span;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;

pub use config::TelemetryConfig;
pub use error::{Result, TelemetryError};
pub use ids::{SpanId, TraceId};
pub use metrics::DEFAULT_BOUNDARIES;
pub use span::{AttrValue, KeyValue, SpanEvent, SpanKind, SpanRecord, SpanStatus, now_unix_nanos};

use crate::exporter::ExporterHandle;
use crate::metrics::MetricsStore;

/// The recording handle. Clones share one pipeline; a disabled handle
/// (the [`Default`]) ignores everything.
#[derive(Debug, Clone, Default)]
pub struct Telemetry {
    shared: Option<Arc<Shared>>,
}

#[derive(Debug)]
struct Shared {
    /// `None` when traces are off.
    spans: Option<mpsc::Sender<SpanRecord>>,
    /// `None` when metrics are off.
    metrics: Option<Arc<Mutex<MetricsStore>>>,
    counters: Arc<Counters>,
    capture_content: bool,
}

/// Running totals, shared with the export thread.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub spans_recorded: AtomicU64,
    pub spans_exported: AtomicU64,
    pub spans_dropped: AtomicU64,
    pub export_failures: AtomicU64,
    pub metric_exports: AtomicU64,
}

/// What happened to the telemetry so far. Every recorded span ends up
/// exported or dropped: `spans_recorded = spans_exported + spans_dropped +
/// spans_queued`, and after shutdown `spans_queued` is 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TelemetryStats {
    pub spans_recorded: u64,
    pub spans_exported: u64,
    /// Refused by a full queue, in a failed export, or still queued at the
    /// shutdown deadline.
    pub spans_dropped: u64,
    /// Accepted and not yet exported or dropped: queued or in flight.
    pub spans_queued: u64,
    /// Export requests (traces or metrics) that failed or timed out.
    pub export_failures: u64,
    /// Metric exports the collector accepted.
    pub metric_exports: u64,
}

impl Counters {
    fn snapshot(&self) -> TelemetryStats {
        // Outcomes first: a span is counted recorded before its outcome, so
        // reading in this order never sees more outcomes than spans.
        let spans_exported = self.spans_exported.load(Ordering::Relaxed);
        let spans_dropped = self.spans_dropped.load(Ordering::Relaxed);
        let spans_recorded = self.spans_recorded.load(Ordering::Relaxed);
        TelemetryStats {
            spans_recorded,
            spans_exported,
            spans_dropped,
            spans_queued: spans_recorded.saturating_sub(spans_exported + spans_dropped),
            export_failures: self.export_failures.load(Ordering::Relaxed),
            metric_exports: self.metric_exports.load(Ordering::Relaxed),
        }
    }
}

/// Owns the export thread. Call [`TelemetryGuard::shutdown`] to flush;
/// dropping it instead stops the thread without waiting and drops what is
/// queued.
#[derive(Debug, Default)]
pub struct TelemetryGuard {
    exporter: Option<ExporterHandle>,
    counters: Arc<Counters>,
}

// keel's runtime shares one handle across its tasks and threads.
const _: fn() = || {
    fn shareable<T: Send + Sync + Clone>() {}
    shareable::<Telemetry>();
};

impl Telemetry {
    /// Starts the export thread, or returns a disabled handle when `config`
    /// exports nothing.
    pub fn start(config: &TelemetryConfig) -> Result<(Telemetry, TelemetryGuard)> {
        if !config.is_enabled() {
            return Ok((Telemetry::disabled(), TelemetryGuard::default()));
        }
        let counters = Arc::new(Counters::default());
        let (spans, spans_rx) = match config.traces_endpoint {
            Some(_) => {
                let (sender, receiver) = mpsc::channel(config.max_queue_size.max(1));
                (Some(sender), Some(receiver))
            }
            None => (None, None),
        };
        let metrics = config.metrics_endpoint.as_ref().map(|_| Arc::new(Mutex::new(MetricsStore::default())));
        let exporter = exporter::spawn(config, spans_rx, metrics.clone(), Arc::clone(&counters))?;
        let shared =
            Shared { spans, metrics, counters: Arc::clone(&counters), capture_content: config.capture_content };
        Ok((Telemetry { shared: Some(Arc::new(shared)) }, TelemetryGuard { exporter: Some(exporter), counters }))
    }

    /// A handle that records nothing.
    pub fn disabled() -> Telemetry {
        Telemetry { shared: None }
    }

    /// Whether anything recorded here can be exported; check it before
    /// building a span that would be thrown away.
    pub fn is_enabled(&self) -> bool {
        self.shared.is_some()
    }

    /// Whether message content may be put in spans (false when disabled).
    pub fn capture_content(&self) -> bool {
        self.shared.as_ref().is_some_and(|shared| shared.capture_content)
    }

    /// Queues a finished span for export without ever waiting: when the
    /// queue is full (or the exporter has stopped) the span is dropped and
    /// counted.
    pub fn record_span(&self, span: SpanRecord) {
        let Some(shared) = &self.shared else { return };
        let Some(sender) = &shared.spans else { return };
        shared.counters.spans_recorded.fetch_add(1, Ordering::Relaxed);
        if sender.try_send(span).is_err() {
            shared.counters.spans_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Names the unit and description a counter is exported with.
    pub fn register_counter(&self, name: &'static str, unit: &'static str, description: &'static str) {
        if let Some(mut store) = self.metrics() {
            store.register_counter(name, unit, description);
        }
    }

    /// Sets a histogram's unit, description and bucket boundaries (finite,
    /// strictly increasing); unregistered histograms use
    /// [`DEFAULT_BOUNDARIES`]. Register before the first recording: series
    /// that already exist keep their boundaries.
    pub fn register_histogram(
        &self,
        name: &'static str,
        unit: &'static str,
        description: &'static str,
        boundaries: &[f64],
    ) -> Result<()> {
        match self.metrics() {
            Some(mut store) => store.register_histogram(name, unit, description, boundaries),
            None => Ok(()),
        }
    }

    /// Adds to a monotonic counter (exported as a cumulative sum).
    pub fn counter_add(&self, name: &'static str, value: u64, attributes: &[KeyValue]) {
        if let Some(mut store) = self.metrics() {
            store.counter_add(name, value, attributes);
        }
    }

    /// Records one value into a histogram; NaN and infinities are ignored.
    pub fn histogram_record(&self, name: &'static str, value: f64, attributes: &[KeyValue]) {
        if let Some(mut store) = self.metrics() {
            store.histogram_record(name, value, attributes);
        }
    }

    pub fn stats(&self) -> TelemetryStats {
        self.shared.as_ref().map(|shared| shared.counters.snapshot()).unwrap_or_default()
    }

    fn metrics(&self) -> Option<MutexGuard<'_, MetricsStore>> {
        let store = self.shared.as_ref()?.metrics.as_ref()?;
        // A panic while recording leaves plain totals behind, still exportable.
        Some(store.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl TelemetryGuard {
    /// Exports what is queued and a final metrics snapshot, returning within
    /// `timeout` even if the collector hangs; spans still queued then count
    /// as dropped. This blocks the calling thread, so async code calls it
    /// through `spawn_blocking` (or after its runtime is done).
    pub fn shutdown(mut self, timeout: Duration) -> TelemetryStats {
        let Some(exporter) = self.exporter.take() else { return self.counters.snapshot() };
        let finished = exporter.stop(timeout);
        let mut stats = self.counters.snapshot();
        if !finished {
            // The thread overran: what it still holds is lost all the same.
            stats.spans_dropped += stats.spans_queued;
            stats.spans_queued = 0;
        }
        stats
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(exporter) = self.exporter.take() {
            exporter.abandon();
        }
    }
}
