//! Building the Responses request body from a [`ModelRequest`].
//!
//! keel's items are Responses items already; the translation only drops
//! keel's own `_runtime_notice` field, sends a runtime notice as a
//! `developer` message (it is the runtime speaking, not the user), and
//! types each text part by its role: `output_text` for the assistant,
//! `input_text` for everyone else, as the API requires.
//!
//! A tool output with images it may show sends `output` as a list of parts,
//! an `input_text` and one `input_image` data URL per image, the form the
//! API takes for tool results that are not only text; placeholders for the
//! images it may not show go into the text. Without any image to show,
//! `output` stays a plain string.

use std::collections::BTreeMap;

use keel_protocol::{ImageRef, Item, Role};
use serde_json::{Map, Value, json};

use crate::{ImageData, ModelRequest, images};

/// The JSON body of a streaming `POST /responses`.
pub fn request_body(request: &ModelRequest) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), Value::String(request.model.clone()));
    if !request.instructions.is_empty() {
        body.insert("instructions".into(), Value::String(request.instructions.clone()));
    }
    body.insert("input".into(), Value::Array(to_responses_input(&request.items, &request.images)));
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

/// Translates history into Responses `input` items, one for one. `images`
/// holds the bytes of the tool-result images the model may see now.
pub fn to_responses_input(items: &[Item], images: &BTreeMap<String, ImageData>) -> Vec<Value> {
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
            Item::FunctionCallOutput { call_id, output, images: refs } => {
                json!({"type": "function_call_output", "call_id": call_id, "output": tool_output(output, refs, images)})
            }
        })
        .collect()
}

/// A `function_call_output`'s `output`: the text alone when there is no
/// image to show, else the text part (left out when empty) and the images.
fn tool_output(output: &str, refs: &[ImageRef], available: &BTreeMap<String, ImageData>) -> Value {
    let images::ToolOutput { text, attached } = images::tool_output(output, refs, available);
    if attached.is_empty() {
        return Value::String(text.into_owned());
    }
    let text_part = (!text.is_empty()).then(|| json!({"type": "input_text", "text": text}));
    let image_parts =
        attached.into_iter().map(|image| json!({"type": "input_image", "image_url": images::data_url(image)}));
    Value::Array(text_part.into_iter().chain(image_parts).collect())
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
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
            Item::FunctionCallOutput { call_id: "c1".into(), output: "done".into(), images: Vec::new() },
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
            to_responses_input(&items, &BTreeMap::new()),
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
    fn an_output_with_images_becomes_text_and_image_parts() {
        let png = ImageData { mime_type: "image/png".into(), data: vec![0x89, b'P', b'N', b'G', 0, 255].into() };
        let available = BTreeMap::from([("img_1".to_string(), png.clone())]);
        let refs = vec![
            ImageRef { id: "img_1".into(), mime_type: "image/png".into(), bytes: 6 },
            ImageRef { id: "img_2".into(), mime_type: "image/jpeg".into(), bytes: 9 },
        ];
        let items = [Item::FunctionCallOutput { call_id: "c1".into(), output: "two shots".into(), images: refs }];
        let input = to_responses_input(&items, &available);
        assert_eq!(
            input,
            vec![json!({"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_text", "text": "two shots\n[image img_2 (image/jpeg) is no longer available]"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORwD/"},
            ]})]
        );
        let url = input[0]["output"][1]["image_url"].as_str().unwrap_or_default();
        let decoded = url.strip_prefix("data:image/png;base64,").map(|b64| STANDARD.decode(b64));
        assert_eq!(decoded, Some(Ok(png.data.to_vec())));
    }

    #[test]
    fn an_output_without_images_to_show_stays_a_string() {
        let plain = [Item::tool_output("c1", "done")];
        assert_eq!(
            serde_json::to_string(&to_responses_input(&plain, &BTreeMap::new())).unwrap_or_default(),
            r#"[{"call_id":"c1","output":"done","type":"function_call_output"}]"#
        );
        let expired = ImageRef { id: "img_3".into(), mime_type: "image/png".into(), bytes: 1 };
        let gone = [Item::FunctionCallOutput { call_id: "c1".into(), output: String::new(), images: vec![expired] }];
        assert_eq!(
            to_responses_input(&gone, &BTreeMap::new()),
            vec![json!({"type": "function_call_output", "call_id": "c1",
                        "output": "[image img_3 (image/png) is no longer available]"})]
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
            images: Default::default(),
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
