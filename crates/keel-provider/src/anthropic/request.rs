//! Building the Messages request body from a [`ModelRequest`].
//!
//! All of the history translation is [`to_anthropic_messages`]; the rules
//! are written on it. The body adds the model, the tools (`input_schema`
//! instead of `parameters`) and `max_tokens`, which the API requires.

use std::collections::BTreeMap;

use keel_protocol::{ImageRef, Item, Role};
use serde_json::{Map, Value, json};

use crate::{ImageData, ModelRequest, images};

/// The `system` prompt and the `messages` of a Messages request.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicMessages {
    /// The instructions, then every `system` message of the history, in
    /// order, separated by blank lines. Empty means no `system` field.
    pub system: String,
    /// Alternating `user` and `assistant` messages of content blocks.
    pub messages: Vec<Value>,
}

/// The JSON body of a streaming `POST /v1/messages`. `default_max_tokens`
/// applies when the request sets no output limit.
pub fn request_body(request: &ModelRequest, default_max_tokens: u32) -> Value {
    let AnthropicMessages { system, messages } =
        to_anthropic_messages(&request.instructions, &request.items, &request.images);
    let mut body = Map::new();
    body.insert("model".into(), Value::String(request.model.clone()));
    if !system.is_empty() {
        body.insert("system".into(), Value::String(system));
    }
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|tool| json!({"name": tool.name, "description": tool.description, "input_schema": tool.parameters}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    body.insert("max_tokens".into(), Value::from(request.max_output_tokens.unwrap_or(default_max_tokens)));
    body.insert("stream".into(), Value::Bool(true));
    Value::Object(body)
}

/// Translates instructions and history into the Messages API's `system`
/// and `messages`.
///
/// - `system` messages join the instructions in `system`; `developer`
///   messages and runtime notices (whatever their role) become user text,
///   since the API has no other place for them mid-conversation.
/// - User and assistant messages become one `text` block each, their parts
///   concatenated; empty text is dropped, as the API rejects empty blocks.
/// - A `function_call` becomes a `tool_use` block of the assistant, with its
///   arguments parsed into `input`. Arguments that are not a JSON object
///   (keel rejects those before they get here, but a history may be old)
///   are sent as `{"_invalid_arguments": "<raw text>"}`; empty arguments
///   as `{}`.
/// - A `function_call_output` becomes a `tool_result` block of the user.
///   Its `content` is the output text; when it has images it may show (those
///   in `images`), a list of a `text` block and one base64 `image` block per
///   image instead. Images it may not show become placeholder lines of the
///   text.
/// - Adjacent blocks of the same role merge into one message, because the
///   API requires user and assistant to alternate: an assistant text and
///   the calls after it form one message, parallel results form one user
///   message. Within a user message, tool results go before text, as the
///   API also requires.
pub fn to_anthropic_messages(
    instructions: &str,
    items: &[Item],
    images: &BTreeMap<String, ImageData>,
) -> AnthropicMessages {
    let mut system = instructions.to_owned();
    let mut messages: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for item in items {
        let (role, block) = match item {
            Item::Message { role, content, runtime_notice } => {
                let text: String = content.iter().map(|part| part.text()).collect();
                let role = match (role, runtime_notice) {
                    (Role::System, None) => {
                        if !text.is_empty() {
                            if !system.is_empty() {
                                system.push_str("\n\n");
                            }
                            system.push_str(&text);
                        }
                        continue;
                    }
                    (Role::Assistant, None) => "assistant",
                    _ => "user",
                };
                if text.is_empty() {
                    continue;
                }
                (role, json!({"type": "text", "text": text}))
            }
            Item::FunctionCall { call_id, name, arguments } => {
                ("assistant", json!({"type": "tool_use", "id": call_id, "name": name, "input": tool_input(arguments)}))
            }
            Item::FunctionCallOutput { call_id, output, images: refs } => {
                ("user", tool_result(call_id, output, refs, images))
            }
        };
        match messages.last_mut() {
            Some((last_role, blocks)) if *last_role == role => {
                if is_tool_result(&block) {
                    let at = blocks.iter().take_while(|b| is_tool_result(b)).count();
                    blocks.insert(at, block);
                } else {
                    blocks.push(block);
                }
            }
            _ => messages.push((role, vec![block])),
        }
    }
    let messages = messages.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    AnthropicMessages { system, messages }
}

/// A `tool_result` block: `content` is the text alone when there is no image
/// to show, else a `text` block and the `image` blocks.
fn tool_result(call_id: &str, output: &str, refs: &[ImageRef], available: &BTreeMap<String, ImageData>) -> Value {
    let images::ToolOutput { text, attached } = images::tool_output(output, refs, available);
    let mut block = json!({"type": "tool_result", "tool_use_id": call_id});
    if attached.is_empty() {
        // An empty string would become an empty text block, which the API
        // rejects; no content means "no output" just as well.
        if !text.is_empty() {
            block["content"] = Value::String(text.into_owned());
        }
        return block;
    }
    // Likewise, no empty text block before the images.
    let text_block = (!text.is_empty()).then(|| json!({"type": "text", "text": text}));
    let image_blocks = attached.into_iter().map(|image| {
        json!({
            "type": "image",
            "source": {"type": "base64", "media_type": image.mime_type, "data": images::base64_data(image)},
        })
    });
    block["content"] = Value::Array(text_block.into_iter().chain(image_blocks).collect());
    block
}

fn is_tool_result(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some("tool_result")
}

/// A call's arguments as the `input` object the API requires.
fn tool_input(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return json!({});
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(input @ Value::Object(_)) => input,
        _ => json!({"_invalid_arguments": arguments}),
    }
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
