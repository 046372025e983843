//! Decoding one received text (a stdio line or a WebSocket text frame) into
//! JSON-RPC requests, before anything is dispatched.
//!
//! This is every parsing step the server takes, and nothing else: it needs
//! no runtime and does no I/O, so [`Connection`](crate::Connection) runs it
//! first and dispatches what comes out, and the fuzz targets and tests can
//! call it alone. Each message that is not a valid request is answered here,
//! with the error response the client receives.

use keel_protocol::rpc::{Request, Response, code};
use serde_json::Value;

use crate::errors::plain;

/// What one received text holds.
#[derive(Debug, Clone)]
pub enum Incoming {
    /// A single message.
    Single(Message),
    /// A batch of one or more messages, in order.
    Batch(Vec<Message>),
    /// Text that is not JSON, or an empty batch: the only answer is this
    /// error response.
    Rejected(Response),
}

/// One message of a text: a request to dispatch, or the error response to a
/// message that is not a valid request.
#[derive(Debug, Clone)]
pub enum Message {
    /// A well-formed request; a notification when its `id` is absent.
    Request(Request),
    /// Not a valid JSON-RPC 2.0 request; answered with this response.
    Invalid(Response),
}

/// Decodes one received text: the server's whole parsing path, exposed for
/// fuzzing and tests.
pub fn decode_text(text: &str) -> Incoming {
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => {
            let error = plain(code::PARSE_ERROR, format!("parse error: {e}; send one JSON-RPC 2.0 message per line"));
            return Incoming::Rejected(Response::err(Value::Null, error));
        }
    };
    match value {
        Value::Array(batch) if batch.is_empty() => {
            Incoming::Rejected(Response::err(Value::Null, plain(code::INVALID_REQUEST, "invalid request: empty batch")))
        }
        // Each answer is at least as large as its request and some are far
        // larger: 20,000 `session/get`s in one batch made a 33 MB response
        // and grew keel's memory sevenfold. A batch past the cap is refused
        // whole, before any of it runs.
        Value::Array(batch) if batch.len() > MAX_BATCH => Incoming::Rejected(Response::err(
            Value::Null,
            plain(
                code::INVALID_REQUEST,
                format!(
                    "invalid request: a batch of {} messages is over the limit of {MAX_BATCH}; send it in smaller batches",
                    batch.len()
                ),
            ),
        )),
        Value::Array(batch) => Incoming::Batch(batch.into_iter().map(decode_message).collect()),
        message => Incoming::Single(decode_message(message)),
    }
}

/// The most messages one batch may hold.
pub const MAX_BATCH: usize = 100;

/// Decodes one message of a text (the text itself, or one batch element).
fn decode_message(value: Value) -> Message {
    let id_hint = value.get("id").cloned().filter(valid_id).unwrap_or(Value::Null);
    let request: Request = match serde_json::from_value(value) {
        Ok(request) => request,
        Err(e) => {
            let error = plain(code::INVALID_REQUEST, format!("invalid request: {e}"));
            return Message::Invalid(Response::err(id_hint, error));
        }
    };
    if request.jsonrpc != "2.0" {
        let error = plain(code::INVALID_REQUEST, "invalid request: jsonrpc must be \"2.0\"");
        return Message::Invalid(Response::err(id_hint, error));
    }
    if let Some(id) = &request.id
        && !valid_id(id)
    {
        let error = plain(code::INVALID_REQUEST, "invalid request: id must be a string, a number or null");
        return Message::Invalid(Response::err(Value::Null, error));
    }
    Message::Request(request)
}

fn valid_id(id: &Value) -> bool {
    matches!(id, Value::String(_) | Value::Number(_) | Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_code(response: &Response) -> Option<i64> {
        serde_json::to_value(response).ok()?.get("error")?.get("code")?.as_i64()
    }

    #[test]
    fn texts_that_are_not_json_or_empty_batches_are_rejected_whole() {
        for text in ["", "{", "[]", "nul"] {
            match decode_text(text) {
                Incoming::Rejected(response) => assert!(error_code(&response).is_some(), "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_batch_over_the_cap_is_refused_whole_and_one_at_the_cap_is_not() {
        let one = r#"{"jsonrpc":"2.0","id":1,"method":"session/list"}"#;
        let batch = |n: usize| format!("[{}]", vec![one; n].join(","));
        let Incoming::Rejected(response) = decode_text(&batch(MAX_BATCH + 1)) else { panic!("not refused") };
        assert_eq!(error_code(&response), Some(code::INVALID_REQUEST));
        let text = serde_json::to_string(&response).unwrap_or_default();
        assert!(text.contains(&format!("limit of {MAX_BATCH}")), "{text}");
        assert!(matches!(decode_text(&batch(MAX_BATCH)), Incoming::Batch(messages) if messages.len() == MAX_BATCH));
    }

    #[test]
    fn batches_keep_every_element_in_order() {
        let text = r#"[{"jsonrpc":"2.0","id":1,"method":"session/list"},1,{"jsonrpc":"1.0","id":"x","method":"m"}]"#;
        let Incoming::Batch(messages) = decode_text(text) else { panic!("not a batch") };
        assert!(matches!(&messages[0], Message::Request(r) if r.method == "session/list"));
        assert!(matches!(&messages[1], Message::Invalid(r) if error_code(r) == Some(code::INVALID_REQUEST)));
        assert!(matches!(&messages[2], Message::Invalid(r) if error_code(r) == Some(code::INVALID_REQUEST)));
    }

    #[test]
    fn notifications_and_null_ids_are_told_apart() {
        let Incoming::Single(Message::Request(notification)) =
            decode_text(r#"{"jsonrpc":"2.0","method":"turn/start"}"#)
        else {
            panic!("not a request")
        };
        assert_eq!(notification.id, None);
        let Incoming::Single(Message::Request(null_id)) =
            decode_text(r#"{"jsonrpc":"2.0","id":null,"method":"turn/start"}"#)
        else {
            panic!("not a request")
        };
        assert_eq!(null_id.id, Some(Value::Null));
        let Incoming::Single(Message::Invalid(_)) = decode_text(r#"{"jsonrpc":"2.0","id":[1],"method":"m"}"#) else {
            panic!("an array id was accepted")
        };
    }
}
