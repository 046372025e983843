//! History items, in the shape of the OpenAI Responses API.
//!
//! A session's history is a list of [`Item`]s. Providers translate to and
//! from their own wire formats; everything else in keel speaks these.

use serde::{Deserialize, Serialize};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Assistant,
    System,
    Developer,
}

/// One part of a message's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    InputText { text: String },
    OutputText { text: String },
}

impl ContentPart {
    pub fn text(&self) -> &str {
        match self {
            ContentPart::InputText { text } | ContentPart::OutputText { text } => text,
        }
    }
}

/// One entry of a session's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    Message {
        role: Role,
        content: Vec<ContentPart>,
        /// Set when the runtime, not a person, wrote this message (for
        /// example an interrupted-call notice). Such text is never an
        /// instruction from the user.
        #[serde(default, skip_serializing_if = "Option::is_none", rename = "_runtime_notice")]
        runtime_notice: Option<String>,
    },
    FunctionCall {
        call_id: String,
        name: String,
        /// The arguments exactly as the model produced them: a JSON text
        /// that may be invalid, which is why it is kept as a string.
        arguments: String,
    },
    FunctionCallOutput {
        call_id: String,
        output: String,
        /// Images the tool returned, by reference: the bytes live only in
        /// the runtime's ephemeral image store, never in history.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<ImageRef>,
    },
}

/// What running a tool twice does, as the tool declares it. Recovery re-runs
/// an interrupted read-only or idempotent call, and asks a person about a
/// side-effecting one; by default a tool that is not read-only needs a
/// person's approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    ReadOnly,
    /// Safe to repeat: running it again leaves the same state.
    Idempotent,
    #[default]
    SideEffecting,
}

impl Effect {
    /// The effect in words, as used in decisions.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::ReadOnly => "read-only",
            Effect::Idempotent => "idempotent",
            Effect::SideEffecting => "side-effecting",
        }
    }
}

impl std::fmt::Display for Effect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An image a tool returned, as history records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRef {
    /// Unique within the runtime; the key of the image store.
    pub id: String,
    pub mime_type: String,
    pub bytes: u64,
}

impl Item {
    /// A tool's text output, without images.
    pub fn tool_output(call_id: impl Into<String>, output: impl Into<String>) -> Item {
        Item::FunctionCallOutput { call_id: call_id.into(), output: output.into(), images: Vec::new() }
    }

    /// A user message with one text part.
    pub fn user_text(text: impl Into<String>) -> Item {
        Item::Message {
            role: Role::User,
            content: vec![ContentPart::InputText { text: text.into() }],
            runtime_notice: None,
        }
    }

    /// An assistant message with one text part.
    pub fn assistant_text(text: impl Into<String>) -> Item {
        Item::Message {
            role: Role::Assistant,
            content: vec![ContentPart::OutputText { text: text.into() }],
            runtime_notice: None,
        }
    }

    /// The concatenated text of a message, or `None` for other items.
    pub fn message_text(&self) -> Option<String> {
        match self {
            Item::Message { content, .. } => Some(content.iter().map(ContentPart::text).collect::<String>()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn items_use_the_responses_wire_shape() {
        let call = Item::FunctionCall { call_id: "c1".into(), name: "write_file".into(), arguments: "{}".into() };
        assert_eq!(
            serde_json::to_value(&call).unwrap_or_default(),
            json!({"type":"function_call","call_id":"c1","name":"write_file","arguments":"{}"})
        );
        let parsed: Item = serde_json::from_value(json!({
            "type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parsed, Item::user_text("hi"));
    }
}

/// A tool as offered to a model: its model-visible name, what it does, and
/// the JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}
