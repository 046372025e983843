//! What the server saw: every request, kept so tests can assert on exactly
//! what keel sent.

use serde_json::Value;

/// One request as received.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    pub method: String,
    /// The request target, including any query string.
    pub path: String,
    /// Header names lowercased, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The body parsed as JSON, when it is JSON.
    pub json: Option<Value>,
}

impl RecordedRequest {
    pub fn from_parts(method: String, path: String, headers: Vec<(String, String)>, body: Vec<u8>) -> RecordedRequest {
        let json = serde_json::from_slice(&body).ok();
        RecordedRequest { method, path, headers, body, json }
    }

    /// The first value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// The `messages` array of a Chat Completions (or Anthropic Messages)
    /// body, or the `input` array of a Responses body; empty otherwise.
    pub fn messages(&self) -> &[Value] {
        let json = self.json.as_ref();
        json.and_then(|j| j.get("messages").or_else(|| j.get("input")))
            .and_then(Value::as_array)
            .map_or(&[], Vec::as_slice)
    }

    /// Who spoke last: `user`, `assistant`, `system`, or `tool` when the
    /// last entry hands back a tool result, in any of the three formats
    /// (a Chat `tool` message, a Responses `function_call_output` item, an
    /// Anthropic user message of `tool_result` blocks).
    pub fn last_message_role(&self) -> Option<&str> {
        if let Some(input) = self.json.as_ref().and_then(|j| j.get("input")).filter(|input| input.is_string()) {
            return input.as_str().map(|_| "user");
        }
        let last = self.messages().last()?;
        if last.get("type").and_then(Value::as_str) == Some("function_call_output") {
            return Some("tool");
        }
        let role = last.get("role").and_then(Value::as_str)?;
        let has_tool_result = last
            .get("content")
            .and_then(Value::as_array)
            .is_some_and(|blocks| blocks.iter().any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result")));
        Some(if role == "user" && has_tool_result { "tool" } else { role })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(body: Value) -> RecordedRequest {
        RecordedRequest::from_parts("POST".into(), "/v1/x".into(), vec![], body.to_string().into_bytes())
    }

    #[test]
    fn the_last_role_is_found_in_every_format() {
        let chat = request(
            json!({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c", "content": "ok"}]}),
        );
        assert_eq!(chat.last_message_role(), Some("tool"));
        let responses = request(json!({"input": [{"type": "function_call_output", "call_id": "c", "output": "ok"}]}));
        assert_eq!(responses.last_message_role(), Some("tool"));
        let anthropic =
            request(json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}));
        assert_eq!(anthropic.last_message_role(), Some("tool"));
        assert_eq!(request(json!({"input": "hello"})).last_message_role(), Some("user"));
        assert_eq!(request(json!({"messages": []})).last_message_role(), None);
    }

    #[test]
    fn headers_are_found_case_insensitively() {
        let request = RecordedRequest::from_parts(
            "GET".into(),
            "/".into(),
            vec![("authorization".into(), "Bearer k".into())],
            vec![],
        );
        assert_eq!(request.header("Authorization"), Some("Bearer k"));
        assert_eq!(request.json, None);
    }
}
