//! Building the Responses request body from a [`ModelRequest`].
//!
//! keel's items are Responses items already; the translation only drops
//! keel's own `_runtime_notice` field, sends a runtime notice as a
//! `developer` message (it is the runtime speaking, not the user), and
//! types each text part by its role: `output_text` for the assistant,
//! `input_text` for everyone else, as the API requires.

use keel_protocol::{Item, Role};
use serde_json::{Map, Value, json};

use crate::ModelRequest;

/// The JSON body of a streaming `POST /responses`.
pub fn request_body(request: &ModelRequest) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), Value::String(request.model.clone()));
    if !request.instructions.is_empty() {
        body.insert("instructions".into(), Value::String(request.instructions.clone()));
    }
    body.insert("input".into(), Value::Array(to_responses_input(&request.items)));
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    body.insert("stream".into(), Value::Bool(true));
    body.insert("store".into(), Value::Bool(false));
    if let Some(limit) = request.max_output_tokens {
        body.insert("max_output_tokens".into(), Value::from(limit));
    }
    Value::Object(body)
}

/// Translates history into Responses `input` items, one for one.
pub fn to_responses_input(items: &[Item]) -> Vec<Value> {
    items
        .iter()
        .map(|item| match item {
            Item::Message { role, content, runtime_notice } => {
                let role = match (role, runtime_notice) {
                    (_, Some(_)) | (Role::Developer, None) => "developer",
                    (Role::User, None) => "user",
                    (Role::Assistant, None) => "assistant",
                    (Role::System, None) => "system",
                };
                let part_type = if role == "assistant" { "output_text" } else { "input_text" };
                let parts: Vec<Value> =
                    content.iter().map(|part| json!({"type": part_type, "text": part.text()})).collect();
                json!({"type": "message", "role": role, "content": parts})
            }
            Item::FunctionCall { call_id, name, arguments } => {
                json!({"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments})
            }
            Item::FunctionCallOutput { call_id, output } => {
                json!({"type": "function_call_output", "call_id": call_id, "output": output})
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use keel_protocol::{ContentPart, ToolSpec};

    use super::*;

    #[test]
    fn items_map_one_for_one_with_parts_typed_by_role() {
        let items = [
            Item::user_text("hi"),
            Item::Message {
                role: Role::Assistant,
                content: vec![
                    ContentPart::InputText { text: "a".into() },
                    ContentPart::OutputText { text: "b".into() },
                ],
                runtime_notice: None,
            },
            Item::FunctionCall { call_id: "c1".into(), name: "read".into(), arguments: "{\"p\":1}".into() },
            Item::FunctionCallOutput { call_id: "c1".into(), output: "done".into() },
            Item::Message {
                role: Role::User,
                content: vec![ContentPart::InputText { text: "the tool call was interrupted".into() }],
                runtime_notice: Some("interrupted".into()),
            },
            Item::Message {
                role: Role::System,
                content: vec![ContentPart::InputText { text: "sys".into() }],
                runtime_notice: None,
            },
        ];
        assert_eq!(
            to_responses_input(&items),
            vec![
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}),
                json!({"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}]}),
                json!({"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{\"p\":1}"}),
                json!({"type": "function_call_output", "call_id": "c1", "output": "done"}),
                json!({"type": "message", "role": "developer", "content": [
                    {"type": "input_text", "text": "the tool call was interrupted"}]}),
                json!({"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys"}]}),
            ]
        );
    }

    #[test]
    fn empty_instructions_tools_and_limit_are_left_out() {
        let mut request = ModelRequest {
            model: "gpt-5".into(),
            instructions: String::new(),
            items: vec![Item::user_text("hi")],
            tools: vec![],
            max_output_tokens: None,
        };
        let input = json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]);
        assert_eq!(request_body(&request), json!({"model": "gpt-5", "input": input, "stream": true, "store": false}));
        request.instructions = "Be brief".into();
        request.max_output_tokens = Some(64);
        request.tools.push(ToolSpec {
            name: "t".into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
        });
        assert_eq!(
            request_body(&request),
            json!({"model": "gpt-5", "instructions": "Be brief", "input": input, "stream": true, "store": false,
                   "max_output_tokens": 64,
                   "tools": [{"type": "function", "name": "t", "description": "d", "parameters": {"type": "object"}}]})
        );
    }
}
