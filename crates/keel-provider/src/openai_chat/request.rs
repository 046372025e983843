//! Building the Chat Completions request body from a [`ModelRequest`].
//!
//! keel's history is in the Responses API shape, where a function call is an
//! item of its own; Chat Completions instead hangs tool calls off an
//! assistant message and answers them with `tool` messages. All of that
//! translation happens in [`to_chat_messages`].
//!
//! Images a tool returned do not go into its `tool` message: most servers
//! speaking Chat Completions (and OpenAI's own reference) take text only
//! there. They follow the run of `tool` messages instead, in one `user`
//! message of `image_url` parts labelled by call id, since the `tool`
//! messages must directly follow the assistant message that made the calls.
//! The `tool` message keeps the output text, plus a placeholder for each
//! image that may not be shown, so an output without images is sent exactly
//! as before.

use std::collections::BTreeMap;

use keel_protocol::{Item, Role};
use serde_json::{Map, Value, json};

use crate::{ImageData, ModelRequest, images};

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
    body.insert(
        "messages".into(),
        Value::Array(to_chat_messages(&request.instructions, &request.items, &request.images)),
    );
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
/// - A `function_call_output` becomes a `tool` message. The images it may
///   show (those in `images`) go into one `user` message after the last of
///   the consecutive outputs: a text part naming the call, then its images
///   as `image_url` data URLs, for each output with images.
pub fn to_chat_messages(instructions: &str, items: &[Item], images: &BTreeMap<String, ImageData>) -> Vec<Value> {
    let mut messages = Vec::with_capacity(items.len() + 1);
    if !instructions.is_empty() {
        messages.push(json!({"role": "system", "content": instructions}));
    }
    // Whether the last message pushed may still receive tool calls: it is an
    // assistant message made from the previous item.
    let mut open_assistant = false;
    // The image parts of the current run of tool outputs, sent after it.
    let mut image_parts: Vec<Value> = Vec::new();
    for item in items {
        if !matches!(item, Item::FunctionCallOutput { .. }) {
            flush_image_parts(&mut messages, &mut image_parts);
        }
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
            Item::FunctionCallOutput { call_id, output, images: refs } => {
                let images::ToolOutput { text, attached } = images::tool_output(output, refs, images);
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": text}));
                if !attached.is_empty() {
                    let label = format!("Images returned by tool call {call_id}:");
                    image_parts.push(json!({"type": "text", "text": label}));
                    image_parts.extend(
                        attached
                            .into_iter()
                            .map(|image| json!({"type": "image_url", "image_url": {"url": images::data_url(image)}})),
                    );
                }
                open_assistant = false;
            }
        }
    }
    flush_image_parts(&mut messages, &mut image_parts);
    messages
}

/// Sends the collected tool images, if any, as one `user` message.
fn flush_image_parts(messages: &mut Vec<Value>, image_parts: &mut Vec<Value>) {
    if !image_parts.is_empty() {
        messages.push(json!({"role": "user", "content": std::mem::take(image_parts)}));
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
