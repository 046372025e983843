//! The mock server: a listener, the accept loop that owns every connection
//! task, the reply queue and the record of requests.
//!
//! Task ownership: the accept loop is one task whose handle the
//! [`MockServer`] holds; connection tasks live in a `JoinSet` owned by that
//! loop. Dropping the server aborts the loop, which drops the `JoinSet`,
//! which aborts every connection, so nothing outlives the server.

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::connection::serve_connection;
use crate::{RecordedRequest, Reply, Responder, responders};

/// A local HTTP/1.1 server speaking model-provider wire formats.
#[derive(Debug)]
pub struct MockServer {
    addr: SocketAddr,
    state: Arc<ServerState>,
    accept_loop: JoinHandle<()>,
}

/// Options for [`MockServer`]; start with [`MockServer::builder`].
pub struct MockServerBuilder {
    listen: SocketAddr,
    replies: VecDeque<Reply>,
    fallback: Option<Responder>,
    record_requests: bool,
}

/// State shared by the server handle and the connection tasks. The mutexes
/// are std ones: they are held for a push or a pop, never across an await.
pub(crate) struct ServerState {
    queue: Mutex<VecDeque<Reply>>,
    fallback: Responder,
    recorded: Mutex<Vec<RecordedRequest>>,
    record_requests: bool,
    request_count: AtomicU64,
    connection_count: AtomicU64,
}

impl std::fmt::Debug for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerState").field("request_count", &self.request_count).finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves plain data behind,
    // still fine to read in a test helper.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ServerState {
    /// Counts and records a request; returns its 1-based number.
    pub(crate) fn record(&self, request: &RecordedRequest) -> u64 {
        if self.record_requests {
            lock(&self.recorded).push(request.clone());
        }
        self.request_count.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The next scripted reply, or the fallback's answer.
    pub(crate) fn next_reply(&self, request: &RecordedRequest) -> Reply {
        let scripted = lock(&self.queue).pop_front();
        scripted.unwrap_or_else(|| (self.fallback)(request))
    }
}

impl MockServerBuilder {
    /// Where to listen; the default is `127.0.0.1:0`, a free port.
    pub fn listen(mut self, addr: SocketAddr) -> MockServerBuilder {
        self.listen = addr;
        self
    }

    /// Queues a reply.
    pub fn reply(mut self, reply: Reply) -> MockServerBuilder {
        self.replies.push_back(reply);
        self
    }

    /// Answers requests once the queue is empty. Without one, such requests
    /// get a 400 saying no reply was scripted.
    pub fn fallback(
        mut self,
        responder: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static,
    ) -> MockServerBuilder {
        self.fallback = Some(Arc::new(responder));
        self
    }

    /// Whether to keep every request for [`MockServer::requests`] (the
    /// default). Benchmarks turn it off so memory stays flat.
    pub fn record_requests(mut self, record: bool) -> MockServerBuilder {
        self.record_requests = record;
        self
    }

    /// Binds and starts serving.
    pub async fn start(self) -> io::Result<MockServer> {
        let listener = TcpListener::bind(self.listen).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(ServerState {
            queue: Mutex::new(self.replies),
            fallback: self.fallback.unwrap_or_else(|| Arc::new(responders::unscripted())),
            recorded: Mutex::new(Vec::new()),
            record_requests: self.record_requests,
            request_count: AtomicU64::new(0),
            connection_count: AtomicU64::new(0),
        });
        let accept_loop = tokio::spawn(accept_loop(listener, Arc::clone(&state)));
        Ok(MockServer { addr, state, accept_loop })
    }
}

impl MockServer {
    pub fn builder() -> MockServerBuilder {
        MockServerBuilder {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            replies: VecDeque::new(),
            fallback: None,
            record_requests: true,
        }
    }

    /// A server on a free local port with an empty queue and no fallback.
    pub async fn start() -> io::Result<MockServer> {
        MockServer::builder().start().await
    }

    /// A server on a free local port that answers every request with
    /// `responder` unless a reply was pushed.
    pub async fn start_with(
        responder: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static,
    ) -> io::Result<MockServer> {
        MockServer::builder().fallback(responder).start().await
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The API root to give a client, such as `http://127.0.0.1:41234/v1`.
    pub fn base_url(&self) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(Ipv4Addr::LOCALHOST.into());
        }
        format!("http://{addr}/v1")
    }

    /// Queues a reply, used before the fallback.
    pub fn push(&self, reply: Reply) {
        lock(&self.state.queue).push_back(reply);
    }

    /// Scripted replies not consumed yet.
    pub fn pending_replies(&self) -> usize {
        lock(&self.state.queue).len()
    }

    /// Every request received so far, in arrival order (empty when
    /// recording is off).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.state.recorded).clone()
    }

    /// How many requests arrived, recorded or not.
    pub fn request_count(&self) -> u64 {
        self.state.request_count.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` requests arrived, for up to 30 s. A test that
    /// acts on a request in flight (interrupts it, kills keel) waits here
    /// first: `model_attempt_started` is journaled before the request is sent.
    pub async fn wait_for_requests(&self, n: u64) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.request_count() < n {
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("only {} of {n} requests arrived", self.request_count()));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// How many TCP connections were accepted: with keep-alive working, far
    /// fewer than [`MockServer::request_count`].
    pub fn connection_count(&self) -> u64 {
        self.state.connection_count.load(Ordering::Relaxed)
    }

    /// Stops the server and waits until its port is closed and every
    /// connection is gone.
    pub async fn shutdown(mut self) {
        self.accept_loop.abort();
        let _ = (&mut self.accept_loop).await;
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<ServerState>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    state.connection_count.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(serve_connection(stream, Arc::clone(&state)));
                }
                // Out of file descriptors and the like: back off, don't spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            // Reap finished connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}
