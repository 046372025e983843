//! A local OTLP/HTTP collector for tests: it accepts `POST /v1/traces` and
//! `POST /v1/metrics`, decodes each protobuf body with the official
//! generated types of the `opentelemetry-proto` crate, and keeps what it
//! decoded. Decoding with types keel did not write is what proves keel's
//! hand-written encoding right.
//!
//! Knobs make it a bad collector on demand: [`OtlpReceiver::set_delay`]
//! holds every response (a slow collector), [`OtlpReceiver::set_status`]
//! answers with an error status (and keeps nothing). It shares the HTTP
//! layer of [`crate::MockServer`] and owns its tasks the same way: dropping
//! the receiver aborts the accept loop and every connection.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::metrics::v1::Metric;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::RecordedRequest;
use crate::http::Connection;

/// A local OTLP/HTTP protobuf collector.
#[derive(Debug)]
pub struct OtlpReceiver {
    addr: SocketAddr,
    state: Arc<ReceiverState>,
    accept_loop: JoinHandle<()>,
}

/// The mutexes are std ones: held for a push or a copy, never across an await.
#[derive(Debug, Default)]
struct ReceiverState {
    traces: Mutex<Vec<ExportTraceServiceRequest>>,
    metrics: Mutex<Vec<ExportMetricsServiceRequest>>,
    requests: Mutex<Vec<RecordedRequest>>,
    delay: Mutex<Duration>,
    /// 0 means answer 200.
    status: AtomicU16,
    decode_errors: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread leaves plain data behind, still fine to read.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl OtlpReceiver {
    /// Binds `127.0.0.1:0` and starts serving.
    pub async fn start() -> io::Result<OtlpReceiver> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(ReceiverState::default());
        let accept_loop = tokio::spawn(accept_loop(listener, Arc::clone(&state)));
        Ok(OtlpReceiver { addr, state, accept_loop })
    }

    /// The base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Holds every response this long before answering.
    pub fn set_delay(&self, delay: Duration) {
        *lock(&self.state.delay) = delay;
    }

    /// Answers with this status; anything but 2xx keeps nothing.
    pub fn set_status(&self, status: u16) {
        self.state.status.store(status, Ordering::Relaxed);
    }

    /// Every request received, with its headers and raw body.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state.requests).clone()
    }

    /// Accepted trace exports, decoded.
    pub fn trace_requests(&self) -> Vec<ExportTraceServiceRequest> {
        lock(&self.state.traces).clone()
    }

    /// Accepted metric exports, decoded, in arrival order.
    pub fn metric_requests(&self) -> Vec<ExportMetricsServiceRequest> {
        lock(&self.state.metrics).clone()
    }

    /// Every accepted span, in arrival order.
    pub fn spans(&self) -> Vec<Span> {
        let traces = lock(&self.state.traces);
        let resource_spans = traces.iter().flat_map(|request| &request.resource_spans);
        resource_spans.flat_map(|r| &r.scope_spans).flat_map(|s| s.spans.iter().cloned()).collect()
    }

    /// Every metric of every accepted export, in arrival order; cumulative
    /// metrics repeat once per export.
    pub fn metrics(&self) -> Vec<Metric> {
        let exports = lock(&self.state.metrics);
        let resource_metrics = exports.iter().flat_map(|request| &request.resource_metrics);
        resource_metrics.flat_map(|r| &r.scope_metrics).flat_map(|s| s.metrics.iter().cloned()).collect()
    }

    /// Bodies that were not valid OTLP protobuf.
    pub fn decode_errors(&self) -> u64 {
        self.state.decode_errors.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` spans arrived and returns them all.
    pub async fn wait_for_spans(&self, n: usize, timeout: Duration) -> Result<Vec<Span>, String> {
        self.wait_until(timeout, || Some(self.spans()).filter(|spans| spans.len() >= n))
            .await
            .map_err(|()| format!("only {} of {n} spans arrived within {timeout:?}", self.spans().len()))
    }

    /// Waits until a metric export satisfies `check` and returns that export.
    pub async fn wait_for_metrics(
        &self,
        timeout: Duration,
        check: impl Fn(&ExportMetricsServiceRequest) -> bool,
    ) -> Result<ExportMetricsServiceRequest, String> {
        let found = || lock(&self.state.metrics).iter().rev().find(|request| check(request)).cloned();
        self.wait_until(timeout, found).await.map_err(|()| {
            format!("no matching metric export within {timeout:?} ({} arrived)", self.metric_requests().len())
        })
    }

    async fn wait_until<T>(&self, timeout: Duration, mut found: impl FnMut() -> Option<T>) -> Result<T, ()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(value) = found() {
                return Ok(value);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<ReceiverState>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve(stream, Arc::clone(&state)));
                }
                // Out of file descriptors and the like: back off, don't spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve(stream: TcpStream, state: Arc<ReceiverState>) {
    let mut connection = Connection::new(stream);
    while let Ok(Some(request)) = connection.read_request().await {
        let keep_alive = request.keep_alive;
        let request = RecordedRequest::from_parts(request.method, request.path, request.headers, request.body);
        lock(&state.requests).push(request.clone());
        let delay = *lock(&state.delay);
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let status = answer(&state, &request);
        let headers = [("content-type".to_owned(), "application/x-protobuf".to_owned())];
        if connection.write_response(status, &headers, &[], keep_alive).await.is_err() || !keep_alive {
            break;
        }
    }
    connection.shutdown().await;
}

/// Decodes and keeps an export; returns the status to answer with.
fn answer(state: &ReceiverState, request: &RecordedRequest) -> u16 {
    if request.method != "POST" {
        return 405;
    }
    let status = match state.status.load(Ordering::Relaxed) {
        0 => 200,
        status => status,
    };
    let accepted = (200..300).contains(&status);
    let body = request.body.as_slice();
    let decoded = match request.path.as_str() {
        "/v1/traces" => ExportTraceServiceRequest::decode(body).map(|export| {
            if accepted {
                lock(&state.traces).push(export);
            }
        }),
        "/v1/metrics" => ExportMetricsServiceRequest::decode(body).map(|export| {
            if accepted {
                lock(&state.metrics).push(export);
            }
        }),
        _ => return 404,
    };
    if decoded.is_err() {
        state.decode_errors.fetch_add(1, Ordering::Relaxed);
        return 400;
    }
    status
}
