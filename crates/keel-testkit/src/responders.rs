//! Ready-made fallback responders, which answer once the reply queue is
//! empty. They add no latency, so benchmarks measure keel, not the mock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{RecordedRequest, Reply};

/// Computes a reply for a request; see [`crate::MockServerBuilder::fallback`].
pub type Responder = Arc<dyn Fn(&RecordedRequest) -> Reply + Send + Sync>;

/// The agent loop in its smallest form: a request whose last message is
/// from the user gets one call of `tool_name` with `arguments`; a request
/// that hands back a tool result (or anything else) gets the text answer
/// "Done.". Call ids are `call_1`, `call_2`, ... across the server's life.
pub fn tool_then_answer(
    tool_name: impl Into<String>,
    arguments: impl Into<String>,
) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    tool_then_answer_with(tool_name, arguments, "Done.")
}

/// [`tool_then_answer`] with a chosen final answer.
pub fn tool_then_answer_with(
    tool_name: impl Into<String>,
    arguments: impl Into<String>,
    answer: impl Into<String>,
) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    let (tool_name, arguments, answer) = (tool_name.into(), arguments.into(), answer.into());
    let calls = AtomicU64::new(0);
    move |request| match request.last_message_role() {
        Some("user") => {
            let number = calls.fetch_add(1, Ordering::Relaxed) + 1;
            Reply::tool_call(format!("call_{number}"), tool_name.as_str(), arguments.as_str())
        }
        _ => Reply::text(&answer),
    }
}

/// Answers every request with a copy of `reply`.
pub fn always(reply: Reply) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |_| reply.clone()
}

/// The default fallback: a 400 that says no reply was scripted, so a test
/// that sends more requests than it expected fails at once and clearly.
pub fn unscripted() -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    |request| {
        let message = format!(
            "keel mock server: no scripted reply left for {} {}; push a Reply or set a fallback responder",
            request.method, request.path
        );
        Reply::api_error(400, "mock_unscripted", message)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::errors::ApiError;
    use crate::reply::ReplyBody;

    fn request(last_role: &str) -> RecordedRequest {
        let body = json!({"messages": [{"role": "system", "content": "s"}, {"role": last_role, "content": "x"}]});
        RecordedRequest::from_parts("POST".into(), "/v1/chat/completions".into(), vec![], body.to_string().into_bytes())
    }

    #[test]
    fn a_user_turn_gets_a_tool_call_and_a_tool_result_gets_the_answer() {
        let responder = tool_then_answer_with("write_file", "{}", "All done");
        assert_eq!(responder(&request("user")), Reply::tool_call("call_1", "write_file", "{}"));
        assert_eq!(responder(&request("user")), Reply::tool_call("call_2", "write_file", "{}"));
        assert_eq!(responder(&request("tool")), Reply::text("All done"));
    }

    #[test]
    fn the_default_fallback_explains_itself() {
        let reply = unscripted()(&request("user"));
        match reply.body {
            ReplyBody::ApiError(ApiError::Custom { status: 400, message, .. }) => {
                assert!(message.contains("no scripted reply left"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }
}
