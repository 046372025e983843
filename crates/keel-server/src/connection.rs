//! One client connection: decoding, dispatch and owned subscriptions.

use std::collections::HashMap;
use std::sync::Mutex;

use keel_protocol::ids::new_id;
use keel_protocol::rpc::{
    DeltaNotification, EventNotification, EventsSubscribeResponse, Notification, Request, Response, code,
};
use keel_runtime::{BusMessage, EventStream, Runtime};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::dispatch;
use crate::errors::plain;

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
        let value: Value = match serde_json::from_str(text) {
            Ok(value) => value,
            Err(e) => {
                let error =
                    plain(code::PARSE_ERROR, format!("parse error: {e}; send one JSON-RPC 2.0 message per line"));
                return encode(&Response::err(Value::Null, error));
            }
        };
        match value {
            Value::Array(batch) if batch.is_empty() => {
                encode(&Response::err(Value::Null, plain(code::INVALID_REQUEST, "invalid request: empty batch")))
            }
            Value::Array(batch) => {
                let mut responses = Vec::new();
                for message in batch {
                    if let Some(response) = self.handle_value(message).await {
                        responses.push(response);
                    }
                }
                if responses.is_empty() { None } else { encode(&responses) }
            }
            message => self.handle_value(message).await.and_then(|r| encode(&r)),
        }
    }

    async fn handle_value(&self, value: Value) -> Option<Response> {
        let id_hint = value.get("id").cloned().filter(valid_id).unwrap_or(Value::Null);
        let request: Request = match serde_json::from_value(value) {
            Ok(request) => request,
            Err(e) => {
                let error = plain(code::INVALID_REQUEST, format!("invalid request: {e}"));
                return Some(Response::err(id_hint, error));
            }
        };
        if request.jsonrpc != "2.0" {
            let error = plain(code::INVALID_REQUEST, "invalid request: jsonrpc must be \"2.0\"");
            return Some(Response::err(id_hint, error));
        }
        if let Some(id) = &request.id
            && !valid_id(id)
        {
            let error = plain(code::INVALID_REQUEST, "invalid request: id must be a string, a number or null");
            return Some(Response::err(Value::Null, error));
        }
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

fn valid_id(id: &Value) -> bool {
    matches!(id, Value::String(_) | Value::Number(_) | Value::Null)
}

fn encode<T: serde::Serialize>(value: &T) -> Option<String> {
    serde_json::to_string(value).ok()
}

fn notification<T: serde::Serialize>(method: &str, params: &T) -> Option<String> {
    let params = serde_json::to_value(params).ok()?;
    encode(&Notification { jsonrpc: "2.0".into(), method: method.into(), params })
}
