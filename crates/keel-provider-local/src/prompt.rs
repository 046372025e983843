//! keel's history as chat turns for the model's own chat template.
//!
//! Small local models know three roles: system, user and assistant. Tool use
//! is rendered in those: a function call becomes an assistant turn holding the
//! same JSON object the grammar makes the model write, and its output becomes a
//! user turn that names the tool and the call and asks for an answer. When
//! tools are declared, the system turn lists them as a JSON array inside
//! `<tools>` tags (the shape SmolLM2 saw in training; it picks tools far more
//! reliably from it than from prose) and states the exact JSON shape of a
//! reply.
//!
//! The models run here read text only, so an image a tool returned becomes a
//! line after the tool's output saying it was left out, whether or not the
//! request carries its bytes: the model learns that the tool produced
//! something it cannot see, instead of nothing.

use std::collections::HashMap;

use keel_protocol::{ImageRef, Item, Role, ToolSpec};
use keel_provider::ModelRequest;

/// One turn for the chat template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTurn {
    /// `system`, `user` or `assistant`.
    pub role: &'static str,
    pub content: String,
}

impl ChatTurn {
    fn new(role: &'static str, content: impl Into<String>) -> ChatTurn {
        ChatTurn { role, content: content.into() }
    }
}

/// Closes every tool-result turn.
const AFTER_RESULT: &str = "Use this result to answer my request.";

/// The turns for `request`'s tool choice (or its answer, without tools),
/// system turn first when there is one.
pub fn chat_turns(request: &ModelRequest) -> Vec<ChatTurn> {
    turns_with(request, &system_text(&request.instructions, &request.tools))
}

/// The turns for the plain answer after a choice of no call: the same
/// conversation under the instructions alone.
pub fn answer_turns(request: &ModelRequest) -> Vec<ChatTurn> {
    turns_with(request, request.instructions.trim())
}

fn turns_with(request: &ModelRequest, system: &str) -> Vec<ChatTurn> {
    let names = crate::tool_grammar::LocalNames::new(&request.tools);
    let mut turns = Vec::with_capacity(request.items.len() + 1);
    if !system.is_empty() {
        turns.push(ChatTurn::new("system", system));
    }
    let mut call_names: HashMap<&str, &str> = HashMap::new();
    for item in &request.items {
        match item {
            Item::Message { role, .. } => {
                let text = item.message_text().unwrap_or_default();
                let role = match role {
                    Role::User => "user",
                    Role::Assistant => "assistant",
                    Role::System | Role::Developer => "system",
                };
                turns.push(ChatTurn::new(role, text));
            }
            Item::FunctionCall { call_id, name, arguments } => {
                let shown = names.shown(name);
                call_names.insert(call_id, shown);
                turns.push(ChatTurn::new("assistant", call_json(shown, arguments)));
            }
            Item::FunctionCallOutput { call_id, output, images } => {
                let output = with_omitted_images(output, images);
                // In the user's voice, since small models know no tool role;
                // without the closing line SmolLM2 tends to repeat the call.
                let text = match call_names.get(call_id.as_str()) {
                    Some(name) => format!("Tool result for {name} ({call_id}):\n{output}\n\n{AFTER_RESULT}"),
                    None => format!("Tool result ({call_id}):\n{output}\n\n{AFTER_RESULT}"),
                };
                turns.push(ChatTurn::new("user", text));
            }
        }
    }
    turns
}

/// A tool's output followed by one line per image it returned, saying the
/// image was left out.
fn with_omitted_images(output: &str, images: &[ImageRef]) -> String {
    let mut text = output.to_string();
    for image in images {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&format!("[image {} ({}) omitted: this model cannot see images]", image.id, image.mime_type));
    }
    text
}

/// A past call in the shape the grammar makes the model write, `name`
/// first. Arguments that are not valid JSON (a model may once have produced
/// such) are kept as a string so the turn itself stays valid JSON.
fn call_json(name: &str, arguments: &str) -> String {
    let arguments = match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(value) => value,
        Err(_) => serde_json::Value::String(arguments.to_string()),
    };
    let name = serde_json::Value::String(name.to_string());
    format!(
        "{}{{\"name\": {name}, \"arguments\": {arguments}}}{}",
        crate::tool_grammar::CALLS_OPEN,
        crate::tool_grammar::CALLS_CLOSE
    )
}

/// The instructions, followed by the tool listing and the call format when
/// there are tools (SmolLM2's function-calling prompt, in its own words).
fn system_text(instructions: &str, tools: &[ToolSpec]) -> String {
    let instructions = instructions.trim();
    if tools.is_empty() {
        return instructions.to_string();
    }
    let mut text = String::new();
    if !instructions.is_empty() {
        text.push_str(instructions);
        text.push_str("\n\n");
    }
    let names = crate::tool_grammar::LocalNames::new(tools);
    // The listing follows the shape small instruct models saw in training:
    // a JSON array of {name, description, parameters} inside <tools> tags.
    let listed: Vec<String> = tools
        .iter()
        .map(|tool| {
            format!(
                r#"{{"name": {}, "description": {}, "parameters": {}}}"#,
                serde_json::Value::String(names.shown(&tool.name).to_string()),
                serde_json::Value::String(tool.description.trim().to_string()),
                crate::tool_grammar::arguments_schema(&tool.parameters),
            )
        })
        .collect();
    text.push_str(
        "You are given a request and a set of possible functions. Based on the request, you will need to make a function/tool call to achieve the purpose.\n\n\
         You have access to the following tools:\n<tools>[",
    );
    text.push_str(&listed.join(", "));
    text.push_str(
        "]</tools>\n\nThe output MUST strictly adhere to the following format, and NO other text MUST be included.\n\
         Please make sure the parameter type is correct. If no function call is needed, please make the tool calls an empty list '[]'.\n\
         <tool_call>[\n{\"name\": \"func_name1\", \"arguments\": {\"argument1\": \"value1\", \"argument2\": \"value2\"}}\n]</tool_call>",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_provider::ImageData;
    use serde_json::json;

    fn request(items: Vec<Item>, tools: Vec<ToolSpec>) -> ModelRequest {
        ModelRequest {
            model: "smollm2".into(),
            instructions: "Be brief.".into(),
            items,
            tools,
            max_output_tokens: None,
            images: Default::default(),
        }
    }

    #[test]
    fn messages_keep_their_roles_and_order() {
        let turns = chat_turns(&request(vec![Item::user_text("hi"), Item::assistant_text("hello")], vec![]));
        assert_eq!(
            turns,
            vec![
                ChatTurn::new("system", "Be brief."),
                ChatTurn::new("user", "hi"),
                ChatTurn::new("assistant", "hello")
            ]
        );
    }

    #[test]
    fn tool_calls_and_results_become_text_turns() {
        let items = vec![
            Item::user_text("write it"),
            Item::FunctionCall {
                call_id: "call_1".into(),
                name: "write_file".into(),
                arguments: r#"{"path":"a"}"#.into(),
            },
            Item::FunctionCallOutput { call_id: "call_1".into(), output: "ok".into(), images: Vec::new() },
        ];
        let tool = ToolSpec {
            name: "write_file".into(),
            description: "Writes a file.".into(),
            parameters: json!({"type": "object"}),
        };
        let turns = chat_turns(&request(items, vec![tool]));
        assert_eq!(turns.len(), 4);
        let system = &turns[0].content;
        assert!(system.starts_with("Be brief.\n\nYou are given a request"), "{system}");
        let listing =
            r#"[{"name": "write_file", "description": "Writes a file.", "parameters": {"type":"object"}}]</tools>"#;
        assert!(system.contains(listing), "{system}");
        assert!(system.contains("an empty list '[]'"), "{system}");
        assert_eq!(
            turns[2],
            ChatTurn::new("assistant", r#"<tool_call>[{"name": "write_file", "arguments": {"path":"a"}}]</tool_call>"#)
        );
        assert_eq!(
            turns[3],
            ChatTurn::new("user", format!("Tool result for write_file (call_1):\nok\n\n{AFTER_RESULT}"))
        );
    }

    #[test]
    fn images_in_a_tool_result_become_omitted_lines_even_when_their_bytes_are_sent() {
        let shot = |id: &str| ImageRef { id: id.into(), mime_type: "image/png".into(), bytes: 3 };
        let items = vec![
            Item::FunctionCall { call_id: "call_1".into(), name: "screenshot".into(), arguments: "{}".into() },
            Item::FunctionCallOutput {
                call_id: "call_1".into(),
                output: "two shots".into(),
                images: vec![shot("img_3"), shot("img_4")],
            },
        ];
        let mut request = request(items, vec![]);
        let png = ImageData { mime_type: "image/png".into(), data: vec![1u8, 2, 3].into() };
        request.images.insert("img_3".into(), png);
        let turns = chat_turns(&request);
        assert_eq!(
            turns[2],
            ChatTurn::new(
                "user",
                format!(
                    "Tool result for screenshot (call_1):\ntwo shots\n\
                     [image img_3 (image/png) omitted: this model cannot see images]\n\
                     [image img_4 (image/png) omitted: this model cannot see images]\n\n{AFTER_RESULT}"
                )
            )
        );
    }

    #[test]
    fn no_system_turn_without_instructions_or_tools() {
        let mut request = request(vec![Item::user_text("hi")], vec![]);
        request.instructions.clear();
        assert_eq!(chat_turns(&request), vec![ChatTurn::new("user", "hi")]);
    }
}
