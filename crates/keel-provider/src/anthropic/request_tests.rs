//! Unit tests for the history-to-messages mapping and the request body.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use keel_protocol::{ContentPart, ImageRef, ToolSpec};

use super::*;

fn call(id: &str, arguments: &str) -> Item {
    Item::FunctionCall { call_id: id.into(), name: "read".into(), arguments: arguments.into() }
}

fn output(id: &str, text: &str) -> Item {
    Item::FunctionCallOutput { call_id: id.into(), output: text.into(), images: Vec::new() }
}

fn message(role: Role, text: &str, notice: Option<&str>) -> Item {
    Item::Message {
        role,
        content: vec![ContentPart::InputText { text: text.into() }],
        runtime_notice: notice.map(Into::into),
    }
}

fn text(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

fn tool_use(id: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": "read", "input": input})
}

fn tool_result(id: &str, content: &str) -> Value {
    json!({"type": "tool_result", "tool_use_id": id, "content": content})
}

#[test]
fn a_tool_round_trip_alternates_roles_with_merged_blocks() {
    let items = [
        Item::user_text("read a and b"),
        Item::assistant_text("Reading both."),
        call("c1", r#"{"path":"a"}"#),
        call("c2", r#"{"path":"b"}"#),
        output("c1", "A"),
        output("c2", "B"),
        Item::assistant_text("A and B."),
        Item::user_text("thanks"),
    ];
    let mapped = to_anthropic_messages("Be brief", &items, &BTreeMap::new());
    assert_eq!(mapped.system, "Be brief");
    assert_eq!(
        mapped.messages,
        vec![
            json!({"role": "user", "content": [text("read a and b")]}),
            json!({"role": "assistant", "content": [
                text("Reading both."), tool_use("c1", json!({"path": "a"})), tool_use("c2", json!({"path": "b"}))]}),
            json!({"role": "user", "content": [tool_result("c1", "A"), tool_result("c2", "B")]}),
            json!({"role": "assistant", "content": [text("A and B.")]}),
            json!({"role": "user", "content": [text("thanks")]}),
        ]
    );
}

#[test]
fn calls_without_text_start_their_own_assistant_message() {
    let mapped = to_anthropic_messages("", &[Item::user_text("go"), call("c1", "{}")], &BTreeMap::new());
    assert_eq!(
        mapped.messages,
        vec![
            json!({"role": "user", "content": [text("go")]}),
            json!({"role": "assistant", "content": [tool_use("c1", json!({}))]}),
        ]
    );
}

#[test]
fn system_goes_to_system_and_developer_and_notices_become_user_text() {
    let items = [
        message(Role::System, "Use metric units.", None),
        Item::user_text("hi"),
        message(Role::Developer, "Prefer short answers.", None),
        Item::assistant_text("Hello."),
        message(Role::System, "The previous tool call was interrupted.", Some("interrupted")),
    ];
    let mapped = to_anthropic_messages("You are keel.", &items, &BTreeMap::new());
    assert_eq!(mapped.system, "You are keel.\n\nUse metric units.");
    assert_eq!(
        mapped.messages,
        vec![
            json!({"role": "user", "content": [text("hi"), text("Prefer short answers.")]}),
            json!({"role": "assistant", "content": [text("Hello.")]}),
            json!({"role": "user", "content": [text("The previous tool call was interrupted.")]}),
        ]
    );
    assert_eq!(to_anthropic_messages("", &[message(Role::System, "only", None)], &BTreeMap::new()).system, "only");
}

#[test]
fn tool_results_go_before_text_in_a_user_message() {
    let items = [
        call("c1", "{}"),
        message(Role::User, "A call was interrupted.", Some("interrupted")),
        output("c1", "late result"),
    ];
    let mapped = to_anthropic_messages("", &items, &BTreeMap::new());
    assert_eq!(
        mapped.messages[1],
        json!({"role": "user", "content": [tool_result("c1", "late result"), text("A call was interrupted.")]})
    );
}

#[test]
fn odd_arguments_and_empty_texts_are_sent_defensively() {
    let items = [
        Item::user_text(""),
        call("c1", "{not json"),
        call("c2", "[1, 2]"),
        call("c3", "  "),
        output("c1", ""),
        output("c2", "ok"),
        output("c3", "ok"),
    ];
    let mapped = to_anthropic_messages("", &items, &BTreeMap::new());
    assert_eq!(
        mapped.messages,
        vec![
            json!({"role": "assistant", "content": [
                tool_use("c1", json!({"_invalid_arguments": "{not json"})),
                tool_use("c2", json!({"_invalid_arguments": "[1, 2]"})),
                tool_use("c3", json!({})),
            ]}),
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "c1"}, tool_result("c2", "ok"), tool_result("c3", "ok")]}),
        ]
    );
}

#[test]
fn a_tool_result_with_images_has_a_text_block_and_base64_image_blocks() {
    let png = ImageData { mime_type: "image/png".into(), data: vec![0x89, b'P', b'N', b'G', 0, 255].into() };
    let available = BTreeMap::from([("img_1".to_string(), png.clone())]);
    let refs = vec![
        ImageRef { id: "img_1".into(), mime_type: "image/png".into(), bytes: 6 },
        ImageRef { id: "img_2".into(), mime_type: "image/jpeg".into(), bytes: 9 },
    ];
    let items =
        [call("c1", "{}"), Item::FunctionCallOutput { call_id: "c1".into(), output: "two shots".into(), images: refs }];
    let mapped = to_anthropic_messages("", &items, &available);
    assert_eq!(
        mapped.messages[1],
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": [
            text("two shots\n[image img_2 (image/jpeg) is no longer available]"),
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORwD/"}},
        ]}]})
    );
    let data = mapped.messages[1]["content"][0]["content"][1]["source"]["data"].as_str().unwrap_or_default();
    assert_eq!(STANDARD.decode(data).ok(), Some(png.data.to_vec()));
}

#[test]
fn a_tool_result_without_images_to_show_keeps_string_content() {
    let plain = [call("c1", "{}"), output("c1", "A")];
    assert_eq!(
        serde_json::to_string(&to_anthropic_messages("", &plain, &BTreeMap::new()).messages[1]).unwrap_or_default(),
        r#"{"content":[{"content":"A","tool_use_id":"c1","type":"tool_result"}],"role":"user"}"#
    );
    let expired = ImageRef { id: "img_3".into(), mime_type: "image/png".into(), bytes: 1 };
    let png = ImageData { mime_type: "image/png".into(), data: vec![1u8].into() };
    let available = BTreeMap::from([("img_4".to_string(), png)]);
    let shown = ImageRef { id: "img_4".into(), ..expired.clone() };
    let items = [
        call("c1", "{}"),
        call("c2", "{}"),
        Item::FunctionCallOutput { call_id: "c1".into(), output: String::new(), images: vec![expired] },
        Item::FunctionCallOutput { call_id: "c2".into(), output: String::new(), images: vec![shown] },
    ];
    assert_eq!(
        to_anthropic_messages("", &items, &available).messages[1],
        json!({"role": "user", "content": [
            tool_result("c1", "[image img_3 (image/png) is no longer available]"),
            {"type": "tool_result", "tool_use_id": "c2", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AQ=="}}]},
        ]})
    );
}

#[test]
fn the_body_has_tools_max_tokens_and_stream() {
    let mut request = ModelRequest {
        model: "claude-test".into(),
        instructions: String::new(),
        items: vec![Item::user_text("hi")],
        tools: vec![],
        max_output_tokens: None,
        images: Default::default(),
    };
    assert_eq!(
        request_body(&request, 4096),
        json!({"model": "claude-test", "messages": [{"role": "user", "content": [text("hi")]}],
               "max_tokens": 4096, "stream": true})
    );
    request.instructions = "sys".into();
    request.max_output_tokens = Some(100);
    request.tools.push(ToolSpec { name: "t".into(), description: "d".into(), parameters: json!({"type": "object"}) });
    assert_eq!(
        request_body(&request, 4096),
        json!({"model": "claude-test", "system": "sys", "messages": [{"role": "user", "content": [text("hi")]}],
               "tools": [{"name": "t", "description": "d", "input_schema": {"type": "object"}}],
               "max_tokens": 100, "stream": true})
    );
}
