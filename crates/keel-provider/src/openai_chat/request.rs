//! Building the Chat Completions request body from a [`ModelRequest`].
//!
//! keel's history is in the Responses API shape, where a function call is an
//! item of its own; Chat Completions instead hangs tool calls off an
//! assistant message and answers them with `tool` messages. All of that
//! translation happens in [`to_chat_messages`].

use keel_protocol::{Item, Role};
use serde_json::{Map, Value, json};

use crate::ModelRequest;

/// Which field carries the output token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxTokensField {
    /// `max_tokens`: understood by Ollama, vLLM, llama.cpp and older OpenAI
    /// models.
    MaxTokens,
    /// `max_completion_tokens`: required by OpenAI's reasoning models, which
    /// reject `max_tokens`.
    MaxCompletionTokens,
}

impl MaxTokensField {
    pub fn as_str(self) -> &'static str {
        match self {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

/// The JSON body of a streaming `POST /chat/completions`.
pub fn request_body(request: &ModelRequest, max_tokens_field: MaxTokensField) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), Value::String(request.model.clone()));
    body.insert("messages".into(), Value::Array(to_chat_messages(&request.instructions, &request.items)));
    body.insert("stream".into(), Value::Bool(true));
    body.insert("stream_options".into(), json!({"include_usage": true}));
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    }
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(limit) = request.max_output_tokens {
        body.insert(max_tokens_field.as_str().into(), Value::from(limit));
    }
    Value::Object(body)
}

/// Translates instructions and history into Chat Completions `messages`.
///
/// - Non-empty `instructions` become a leading `system` message.
/// - A message becomes `{role, content}` with its text parts concatenated.
///   `developer` messages are sent as `system`: OpenAI treats the two alike,
///   and local servers (llama.cpp, Ollama, vLLM chat templates) often reject
///   the `developer` role.
/// - Consecutive `function_call` items become one assistant message with
///   `tool_calls`, merged into the assistant text message right before them
///   when there is one, because that is how the model produced them.
/// - A `function_call_output` becomes a `tool` message.
pub fn to_chat_messages(instructions: &str, items: &[Item]) -> Vec<Value> {
    let mut messages = Vec::with_capacity(items.len() + 1);
    if !instructions.is_empty() {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    // Whether the last message pushed may still receive tool calls: it is an
    // assistant message made from the previous item.
    let mut open_assistant = false;
    for item in items {
        match item {
            Item::Message { role, content, .. } => {
                let text: String = content.iter().map(|part| part.text()).collect();
                let role = match role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                    Role::System | Role::Developer => "system",
                };
                messages.push(json!({"role": role, "content": text}));
                open_assistant = role == "assistant";
            }
            Item::FunctionCall { call_id, name, arguments } => {
                let call = json!({
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                });
                match messages.last_mut().filter(|_| open_assistant) {
                    Some(Value::Object(message)) => match message.get_mut("tool_calls") {
                        Some(Value::Array(calls)) => calls.push(call),
                        _ => {
                            message.insert("tool_calls".into(), Value::Array(vec![call]));
                        }
                    },
                    _ => {
                        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
                        open_assistant = true;
                    }
                }
            }
            Item::FunctionCallOutput { call_id, output } => {
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
                open_assistant = false;
            }
        }
    }
    messages
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
