//! The export thread: one std thread named `keel-otlp` that owns a
//! current-thread tokio runtime and the HTTP client, batches spans from the
//! bounded queue and POSTs them, and POSTs the metric totals on an interval.
//!
//! Nothing here can slow a recording thread: recorders only `try_send` into
//! the queue. While an export is in flight the queue is not drained, so a
//! slow or dead collector fills it and further spans are dropped and counted.
//! After a failed export the thread waits one schedule delay before trying
//! again, so a collector that is down is not hammered with connections.
//!
//! Shutdown sets a deadline on a watch channel. Every request races that
//! deadline, so a hung collector cannot hold the thread past it; whatever is
//! still queued then is counted as dropped.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError, mpsc as std_mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use tokio::sync::{mpsc, watch};
use tokio::time::sleep_until;

use crate::encode::Origin;
use crate::metrics::MetricsStore;
use crate::{Counters, Result, SpanRecord, TelemetryConfig, TelemetryError, now_unix_nanos};

/// How long to wait before the one retry a 429 or 503 gets.
const RETRY_DELAY: Duration = Duration::from_millis(500);

/// The caller's side of the export thread.
#[derive(Debug)]
pub(crate) struct ExporterHandle {
    stop: watch::Sender<Option<Instant>>,
    done: std_mpsc::Receiver<()>,
    thread: JoinHandle<()>,
}

/// The shutdown deadline, `None` while running.
type Stop = watch::Receiver<Option<Instant>>;

struct Exporter {
    client: reqwest::Client,
    origin: Origin,
    traces_endpoint: Option<String>,
    metrics_endpoint: Option<String>,
    metrics: Option<Arc<Mutex<MetricsStore>>>,
    counters: Arc<Counters>,
    batch_size: usize,
    schedule_delay: Duration,
    metric_interval: Duration,
    start_unix_nanos: u64,
    /// Whether the last export failed, so a failing collector is logged once.
    failing: Cell<bool>,
}

pub(crate) fn spawn(
    config: &TelemetryConfig,
    spans: Option<mpsc::Receiver<SpanRecord>>,
    metrics: Option<Arc<Mutex<MetricsStore>>>,
    counters: Arc<Counters>,
) -> Result<ExporterHandle> {
    let mut headers = HeaderMap::new();
    for (name, value) in &config.headers {
        let bad = |reason: &str| TelemetryError::InvalidSetting {
            name: "OTEL_EXPORTER_OTLP_HEADERS",
            value: format!("{name}={value}"),
            reason: reason.to_owned(),
        };
        let name = HeaderName::try_from(name.as_str()).map_err(|_| bad("not a valid HTTP header name"))?;
        let value = HeaderValue::try_from(value.as_str()).map_err(|_| bad("not a valid HTTP header value"))?;
        headers.append(name, value);
    }
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/x-protobuf"));
    let client = reqwest::Client::builder()
        .timeout(config.timeout)
        .default_headers(headers)
        .user_agent(concat!("keel-telemetry/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|error| TelemetryError::Start(format!("the HTTP client could not be built: {error}")))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| TelemetryError::Start(format!("the exporter runtime could not be built: {error}")))?;
    let exporter = Exporter {
        client,
        origin: Origin::new(config),
        traces_endpoint: config.traces_endpoint.clone(),
        metrics_endpoint: config.metrics_endpoint.clone(),
        metrics,
        counters,
        batch_size: config.max_export_batch_size.clamp(1, config.max_queue_size.max(1)),
        // A zero delay or interval would spin the loop.
        schedule_delay: config.schedule_delay.max(Duration::from_millis(1)),
        metric_interval: config.metric_export_interval.max(Duration::from_millis(1)),
        start_unix_nanos: now_unix_nanos(),
        failing: Cell::new(false),
    };
    let (stop, stop_rx) = watch::channel(None);
    let (done_tx, done) = std_mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("keel-otlp".to_owned())
        .spawn(move || {
            runtime.block_on(exporter.run(spans, stop_rx));
            let _ = done_tx.send(());
            // A DNS lookup stuck in the blocking pool must not hold the thread.
            runtime.shutdown_background();
        })
        .map_err(|error| TelemetryError::Start(format!("the exporter thread could not be spawned: {error}")))?;
    Ok(ExporterHandle { stop, done, thread })
}

impl ExporterHandle {
    /// Flushes and stops the thread, waiting at most `timeout`; `false` if
    /// it had not finished by then (it is left to end on its own).
    pub fn stop(self, timeout: Duration) -> bool {
        // The thread's own deadline comes a little earlier, so it has time
        // to count what it dropped before the caller stops waiting.
        let margin = (timeout / 10).min(Duration::from_millis(100));
        self.stop.send_replace(Some(Instant::now() + timeout - margin));
        let finished = self.done.recv_timeout(timeout).is_ok();
        if finished {
            let _ = self.thread.join();
        }
        finished
    }

    /// Tells the thread to stop now, dropping what is queued, without waiting.
    pub fn abandon(self) {
        self.stop.send_replace(Some(Instant::now()));
    }
}

impl Exporter {
    async fn run(self, mut spans: Option<mpsc::Receiver<SpanRecord>>, mut stop: Stop) {
        let mut batch = Vec::with_capacity(self.batch_size);
        let mut flush_at = tokio::time::Instant::now() + self.schedule_delay;
        let mut metrics_at = tokio::time::Instant::now() + self.metric_interval;
        loop {
            let flush = tokio::select! {
                biased;
                _ = stop.changed() => break,
                received = next_spans(&mut spans, &mut batch, self.batch_size) => {
                    if received == 0 {
                        spans = None; // Every Telemetry handle is gone.
                    }
                    batch.len() >= self.batch_size
                }
                () = sleep_until(flush_at) => true,
                () = sleep_until(metrics_at), if self.metrics.is_some() => {
                    self.export_metrics(&stop).await;
                    metrics_at = tokio::time::Instant::now() + self.metric_interval;
                    false
                }
            };
            if !flush {
                continue;
            }
            flush_at = tokio::time::Instant::now() + self.schedule_delay;
            if !batch.is_empty() && !self.export_spans(std::mem::take(&mut batch), &stop).await {
                tokio::select! {
                    () = tokio::time::sleep(self.schedule_delay) => {}
                    _ = stop.changed() => break,
                }
            }
        }
        self.drain(batch, spans, &stop).await;
    }

    /// Exports what is queued until the queue is empty, an export fails or
    /// the deadline passes, then sends the final metrics.
    async fn drain(&self, mut batch: Vec<SpanRecord>, mut spans: Option<mpsc::Receiver<SpanRecord>>, stop: &Stop) {
        if let Some(spans) = &mut spans {
            spans.close(); // Spans recorded from now on are dropped and counted.
        }
        let mut healthy = true;
        loop {
            if let Some(spans) = &mut spans {
                while batch.len() < self.batch_size {
                    let Ok(span) = spans.try_recv() else { break };
                    batch.push(span);
                }
            }
            if batch.is_empty() {
                break;
            }
            if healthy && !deadline_reached(stop) {
                healthy = self.export_spans(std::mem::take(&mut batch), stop).await;
            } else {
                self.counters.spans_dropped.fetch_add(batch.len() as u64, Ordering::Relaxed);
                batch.clear();
            }
        }
        if !deadline_reached(stop) {
            self.export_metrics(stop).await;
        }
    }

    /// Sends one batch; `false` if it was dropped.
    async fn export_spans(&self, batch: Vec<SpanRecord>, stop: &Stop) -> bool {
        let count = batch.len() as u64;
        let body = Bytes::from(self.origin.traces_body(&batch));
        drop(batch);
        let Some(url) = &self.traces_endpoint else { return false };
        let exported = self.post(url, body, stop).await;
        let counter = if exported { &self.counters.spans_exported } else { &self.counters.spans_dropped };
        counter.fetch_add(count, Ordering::Relaxed);
        exported
    }

    async fn export_metrics(&self, stop: &Stop) {
        let (Some(store), Some(url)) = (&self.metrics, &self.metrics_endpoint) else { return };
        let metrics = {
            // Held only to copy the totals out, never across the request.
            let store = store.lock().unwrap_or_else(PoisonError::into_inner);
            if store.is_empty() {
                return;
            }
            store.snapshot(self.start_unix_nanos, now_unix_nanos())
        };
        let body = Bytes::from(self.origin.metrics_body(metrics));
        if self.post(url, body, stop).await {
            self.counters.metric_exports.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// POSTs a body, retrying once after a 429 or 503, and gives up at the
    /// shutdown deadline. Failures are counted here.
    async fn post(&self, url: &str, body: Bytes, stop: &Stop) -> bool {
        let attempts = async {
            let mut outcome = String::new();
            for attempt in 0..2 {
                match self.client.post(url).body(body.clone()).send().await {
                    Ok(response) if response.status().is_success() => {
                        // Read the (empty) answer so the connection is reused.
                        let _ = response.bytes().await;
                        return Ok(());
                    }
                    Ok(response) => {
                        outcome = format!("the collector answered {}", response.status());
                        if attempt > 0 || !matches!(response.status().as_u16(), 429 | 503) {
                            break;
                        }
                        tokio::time::sleep(RETRY_DELAY).await;
                    }
                    Err(error) => {
                        outcome = format!("the request failed: {error}");
                        break;
                    }
                }
            }
            Err(outcome)
        };
        let result = tokio::select! {
            result = attempts => result,
            () = deadline_passed(stop.clone()) => Err("shutdown came before the collector answered".to_owned()),
        };
        let Err(reason) = result else {
            self.failing.set(false);
            return true;
        };
        self.counters.export_failures.fetch_add(1, Ordering::Relaxed);
        if !self.failing.replace(true) {
            tracing::warn!(url, "OTLP export failed, dropping the batch: {reason}; check that the collector is up");
        }
        false
    }
}

async fn next_spans(
    spans: &mut Option<mpsc::Receiver<SpanRecord>>,
    batch: &mut Vec<SpanRecord>,
    batch_size: usize,
) -> usize {
    match spans {
        Some(spans) => spans.recv_many(batch, batch_size.saturating_sub(batch.len())).await,
        None => std::future::pending().await,
    }
}

fn deadline_reached(stop: &Stop) -> bool {
    stop.borrow().is_some_and(|deadline| Instant::now() >= deadline)
}

/// Resolves once a shutdown deadline is set and has passed.
async fn deadline_passed(mut stop: Stop) {
    loop {
        let deadline = *stop.borrow_and_update();
        if let Some(deadline) = deadline {
            sleep_until(deadline.into()).await;
            return;
        }
        if stop.changed().await.is_err() {
            return; // The guard is gone without a deadline: stop now.
        }
    }
}
