//! One client connection: decoding, dispatch and owned subscriptions.

use std::collections::HashMap;
use std::sync::Mutex;

use keel_protocol::ids::new_id;
use keel_protocol::rpc::{DeltaNotification, EventNotification, EventsSubscribeResponse, Notification, Response};
use keel_runtime::{BusMessage, EventStream, Runtime};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::decode::{Incoming, Message, decode_text};
use crate::dispatch;

/// Outgoing messages waiting for the transport; a slow client applies
/// backpressure to its own subscriptions only.
const OUTBOX: usize = 1024;

/// A client connection. Dropping it (after [`Connection::close`]) ends every
/// subscription it opened.
pub struct Connection {
    runtime: Runtime,
    outbox: mpsc::Sender<String>,
    subscriptions: Mutex<HashMap<String, CancellationToken>>,
    tasks: TaskTracker,
    closed: CancellationToken,
}

impl Connection {
    /// A connection and the receiver the transport drains to the client.
    pub fn new(runtime: Runtime) -> (Connection, mpsc::Receiver<String>) {
        let (outbox, rx) = mpsc::channel(OUTBOX);
        let connection = Connection {
            runtime,
            outbox,
            subscriptions: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
            closed: CancellationToken::new(),
        };
        (connection, rx)
    }

    /// Handles one incoming text and returns the response text, if any
    /// (notifications and all-notification batches get none).
    pub async fn handle_text(&self, text: &str) -> Option<String> {
        match decode_text(text) {
            Incoming::Rejected(response) => encode(&response),
            Incoming::Batch(batch) => {
                let mut responses = Vec::new();
                for message in batch {
                    if let Some(response) = self.handle_message(message).await {
                        responses.push(response);
                    }
                }
                if responses.is_empty() { None } else { encode(&responses) }
            }
            Incoming::Single(message) => self.handle_message(message).await.and_then(|r| encode(&r)),
        }
    }

    async fn handle_message(&self, message: Message) -> Option<Response> {
        let request = match message {
            Message::Request(request) => request,
            Message::Invalid(response) => return Some(response),
        };
        let outcome = dispatch::call(&self.runtime, self, &request.method, request.params).await;
        let id = request.id?;
        Some(match outcome {
            Ok(result) => Response::ok(id, result),
            Err(error) => Response::err(id, error),
        })
    }

    /// Queues a message for the client; fails once the client is gone.
    pub async fn send(&self, text: String) -> Result<(), ()> {
        self.outbox.send(text).await.map_err(|_| ())
    }

    /// Starts forwarding `stream` to the client; returns its id.
    pub(crate) fn add_subscription(&self, session_id: String, mut stream: EventStream) -> EventsSubscribeResponse {
        let subscription_id = new_id("sub");
        let cancel = self.closed.child_token();
        if let Ok(mut subs) = self.subscriptions.lock() {
            subs.insert(subscription_id.clone(), cancel.clone());
        }
        let outbox = self.outbox.clone();
        let id = subscription_id.clone();
        self.tasks.spawn(async move {
            loop {
                let next = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    next = stream.next() => next,
                };
                let notification = match next {
                    Ok(Some(BusMessage::Event(event))) => {
                        notification("events/event", &EventNotification { subscription_id: id.clone(), event })
                    }
                    Ok(Some(BusMessage::Delta { turn_id, text })) => notification(
                        "events/delta",
                        &DeltaNotification {
                            subscription_id: id.clone(),
                            session_id: session_id.clone(),
                            turn_id,
                            text,
                        },
                    ),
                    Ok(None) => break,
                    Err(error) => {
                        tracing::warn!(%error, subscription = %id, "subscription stopped");
                        break;
                    }
                };
                let Some(text) = notification else { continue };
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    sent = outbox.send(text) => if sent.is_err() { break },
                }
            }
        });
        EventsSubscribeResponse { subscription_id }
    }

    pub(crate) fn remove_subscription(&self, subscription_id: &str) -> bool {
        let removed = self.subscriptions.lock().ok().and_then(|mut subs| subs.remove(subscription_id));
        match removed {
            Some(cancel) => {
                cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// Ends every subscription and waits for their tasks.
    pub async fn close(&self) {
        self.closed.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

fn encode<T: serde::Serialize>(value: &T) -> Option<String> {
    serde_json::to_string(value).ok()
}

fn notification<T: serde::Serialize>(method: &str, params: &T) -> Option<String> {
    let params = serde_json::to_value(params).ok()?;
    encode(&Notification { jsonrpc: "2.0".into(), method: method.into(), params })
}
