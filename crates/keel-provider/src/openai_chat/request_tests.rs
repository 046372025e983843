//! Unit tests for the history-to-messages mapping and the request body.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use keel_protocol::{ContentPart, ImageRef, ToolSpec};
use serde_json::json;

use super::*;

fn call(id: &str, name: &str) -> Item {
    Item::FunctionCall { call_id: id.into(), name: name.into(), arguments: format!(r#"{{"id":"{id}"}}"#) }
}

fn output(id: &str) -> Item {
    Item::tool_output(id, format!("result {id}"))
}

fn wire_call(id: &str, name: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": format!(r#"{{"id":"{id}"}}"#)}})
}

#[test]
fn instructions_become_a_leading_system_message() {
    assert_eq!(
        to_chat_messages("Be brief", &[Item::user_text("hi")], &BTreeMap::new()),
        vec![json!({"role": "system", "content": "Be brief"}), json!({"role": "user", "content": "hi"}),]
    );
    assert_eq!(
        to_chat_messages("", &[Item::user_text("hi")], &BTreeMap::new()),
        vec![json!({"role": "user", "content": "hi"})]
    );
}

#[test]
fn message_parts_are_concatenated_and_roles_mapped() {
    let items = [
        Item::Message {
            role: Role::User,
            content: vec![
                ContentPart::InputText { text: "one ".into() },
                ContentPart::InputText { text: "two".into() },
            ],
            runtime_notice: None,
        },
        Item::Message {
            role: Role::Developer,
            content: vec![ContentPart::InputText { text: "dev".into() }],
            runtime_notice: None,
        },
        Item::Message {
            role: Role::System,
            content: vec![ContentPart::InputText { text: "sys".into() }],
            runtime_notice: Some("interrupted".into()),
        },
        Item::assistant_text("answer"),
    ];
    assert_eq!(
        to_chat_messages("", &items, &BTreeMap::new()),
        vec![
            json!({"role": "user", "content": "one two"}),
            json!({"role": "system", "content": "dev"}),
            json!({"role": "system", "content": "sys"}),
            json!({"role": "assistant", "content": "answer"}),
        ]
    );
}

#[test]
fn consecutive_calls_form_one_assistant_message_and_outputs_become_tool_messages() {
    let items = [Item::user_text("go"), call("c1", "read"), call("c2", "write"), output("c1"), output("c2")];
    assert_eq!(
        to_chat_messages("", &items, &BTreeMap::new()),
        vec![
            json!({"role": "user", "content": "go"}),
            json!({"role": "assistant", "content": null, "tool_calls": [wire_call("c1", "read"), wire_call("c2", "write")]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "result c1"}),
            json!({"role": "tool", "tool_call_id": "c2", "content": "result c2"}),
        ]
    );
}

#[test]
fn calls_merge_into_the_assistant_text_right_before_them() {
    let items = [
        Item::user_text("go"),
        Item::assistant_text("Let me look."),
        call("c1", "read"),
        call("c2", "read"),
        output("c1"),
        output("c2"),
        Item::assistant_text("Now writing."),
        call("c3", "write"),
        output("c3"),
        Item::assistant_text("Done."),
    ];
    assert_eq!(
        to_chat_messages("", &items, &BTreeMap::new()),
        vec![
            json!({"role": "user", "content": "go"}),
            json!({"role": "assistant", "content": "Let me look.", "tool_calls": [wire_call("c1", "read"), wire_call("c2", "read")]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "result c1"}),
            json!({"role": "tool", "tool_call_id": "c2", "content": "result c2"}),
            json!({"role": "assistant", "content": "Now writing.", "tool_calls": [wire_call("c3", "write")]}),
            json!({"role": "tool", "tool_call_id": "c3", "content": "result c3"}),
            json!({"role": "assistant", "content": "Done."}),
        ]
    );
}

#[test]
fn calls_after_a_user_message_or_a_tool_output_start_a_new_assistant_message() {
    let items = [call("c1", "a"), output("c1"), call("c2", "b")];
    assert_eq!(
        to_chat_messages("", &items, &BTreeMap::new()),
        vec![
            json!({"role": "assistant", "content": null, "tool_calls": [wire_call("c1", "a")]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "result c1"}),
            json!({"role": "assistant", "content": null, "tool_calls": [wire_call("c2", "b")]}),
        ]
    );
}

#[test]
fn tool_images_follow_the_last_tool_message_in_one_user_message() {
    let png = ImageData { mime_type: "image/png".into(), data: vec![0x89, b'P', b'N', b'G', 0, 255].into() };
    let available = BTreeMap::from([("img_1".to_string(), png.clone())]);
    let refs = vec![
        ImageRef { id: "img_1".into(), mime_type: "image/png".into(), bytes: 6 },
        ImageRef { id: "img_2".into(), mime_type: "image/jpeg".into(), bytes: 9 },
    ];
    let items = [
        call("c1", "screenshot"),
        call("c2", "read"),
        Item::FunctionCallOutput { call_id: "c1".into(), output: "two shots".into(), images: refs },
        output("c2"),
        Item::user_text("thanks"),
    ];
    let messages = to_chat_messages("", &items, &available);
    assert_eq!(
        messages,
        vec![
            json!({"role": "assistant", "content": null, "tool_calls": [wire_call("c1", "screenshot"), wire_call("c2", "read")]}),
            json!({"role": "tool", "tool_call_id": "c1",
                   "content": "two shots\n[image img_2 (image/jpeg) is no longer available]"}),
            json!({"role": "tool", "tool_call_id": "c2", "content": "result c2"}),
            json!({"role": "user", "content": [
                {"type": "text", "text": "Images returned by tool call c1:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORwD/"}},
            ]}),
            json!({"role": "user", "content": "thanks"}),
        ]
    );
    let url = messages[3]["content"][1]["image_url"]["url"].as_str().unwrap_or_default();
    let decoded = url.strip_prefix("data:image/png;base64,").map(|b64| STANDARD.decode(b64));
    assert_eq!(decoded, Some(Ok(png.data.to_vec())));
}

#[test]
fn images_of_a_trailing_run_of_outputs_are_sent_and_unavailable_ones_add_no_message() {
    let shot = |id: &str| ImageRef { id: id.into(), mime_type: "image/webp".into(), bytes: 2 };
    let webp = ImageData { mime_type: "image/webp".into(), data: vec![7u8, 7].into() };
    let available = BTreeMap::from([("img_a".to_string(), webp.clone()), ("img_b".to_string(), webp)]);
    let items = [
        call("c1", "a"),
        call("c2", "b"),
        Item::FunctionCallOutput { call_id: "c1".into(), output: String::new(), images: vec![shot("img_a")] },
        Item::FunctionCallOutput { call_id: "c2".into(), output: "b".into(), images: vec![shot("img_b"), shot("x")] },
    ];
    let messages = to_chat_messages("", &items, &available);
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[1], json!({"role": "tool", "tool_call_id": "c1", "content": ""}));
    let image = json!({"type": "image_url", "image_url": {"url": "data:image/webp;base64,Bwc="}});
    assert_eq!(
        messages[3],
        json!({"role": "user", "content": [
            {"type": "text", "text": "Images returned by tool call c1:"}, image,
            {"type": "text", "text": "Images returned by tool call c2:"}, image,
        ]})
    );
    let gone = [
        call("c1", "a"),
        Item::FunctionCallOutput { call_id: "c1".into(), output: "a".into(), images: vec![shot("img_z")] },
    ];
    assert_eq!(
        to_chat_messages("", &gone, &BTreeMap::new())[1],
        json!({"role": "tool", "tool_call_id": "c1", "content": "a\n[image img_z (image/webp) is no longer available]"})
    );
}

#[test]
fn an_output_without_images_is_sent_exactly_as_before() {
    let items = [call("c1", "read"), output("c1")];
    assert_eq!(
        serde_json::to_string(&to_chat_messages("", &items, &BTreeMap::new())).unwrap_or_default(),
        r#"[{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{\"id\":\"c1\"}","name":"read"},"id":"c1","type":"function"}]},{"content":"result c1","role":"tool","tool_call_id":"c1"}]"#
    );
}

#[test]
fn the_body_streams_with_usage_and_lists_tools() {
    let request = ModelRequest {
        model: "gpt-4o-mini".into(),
        instructions: "sys".into(),
        items: vec![Item::user_text("hi")],
        tools: vec![ToolSpec {
            name: "write_file".into(),
            description: "Writes a file".into(),
            parameters: json!({"type": "object"}),
        }],
        max_output_tokens: Some(256),
        images: Default::default(),
    };
    assert_eq!(
        request_body(&request, MaxTokensField::MaxTokens),
        json!({
            "model": "gpt-4o-mini",
            "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [{"type": "function", "function": {"name": "write_file", "description": "Writes a file", "parameters": {"type": "object"}}}],
            "max_tokens": 256,
        })
    );
    let bare = ModelRequest { tools: vec![], max_output_tokens: None, ..request.clone() };
    let body = request_body(&bare, MaxTokensField::MaxTokens);
    assert_eq!(body.get("tools"), None);
    assert_eq!(body.get("max_tokens"), None);
    let body = request_body(&request, MaxTokensField::MaxCompletionTokens);
    assert_eq!(body.get("max_completion_tokens"), Some(&json!(256)));
}
