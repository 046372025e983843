//! What a tool call returns, and how an MCP `CallToolResult` becomes it.
//!
//! Models read text, so every content part that is not an image becomes
//! text: text parts as they are, anything else (embedded resources, resource
//! links, audio) as compact JSON, one part per line. Images are decoded here,
//! once, so the runtime deals in bytes and never in base64.

use std::fmt;

use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock, ImageContent};

/// The result of a tool call that ran.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct McpCallOutput {
    /// The text parts, joined with `"\n"`. Parts that are neither text nor
    /// images are rendered as compact JSON. When the server sent no content
    /// but structured content, this is that structured content as JSON.
    pub text: String,
    /// The tool reported failure (`isError`). The text says why; the model
    /// should see it like any other output.
    pub is_error: bool,
    pub images: Vec<McpImage>,
}

/// An image a tool returned, decoded from base64.
#[derive(Clone, PartialEq, Eq)]
pub struct McpImage {
    pub mime_type: String,
    pub data: Vec<u8>,
}

impl fmt::Debug for McpImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "McpImage({}, {} bytes)", self.mime_type, self.data.len())
    }
}

/// Converts an MCP tool result. Never fails: an image whose data is not
/// valid base64 becomes a line of text saying so, so the model learns that
/// the tool tried to show something.
pub(crate) fn call_output(result: CallToolResult) -> McpCallOutput {
    let mut lines: Vec<String> = Vec::with_capacity(result.content.len());
    let mut images = Vec::new();
    for block in &result.content {
        match block {
            ContentBlock::Text(text) => lines.push(text.text.clone()),
            ContentBlock::Image(image) => match decode_image(image) {
                Ok(image) => images.push(image),
                Err(error) => lines.push(format!("[an image ({}) could not be decoded: {error}]", image.mime_type)),
            },
            other => lines.push(compact_json(other)),
        }
    }
    if result.content.is_empty()
        && let Some(structured) = &result.structured_content
    {
        lines.push(compact_json(structured));
    }
    McpCallOutput { text: lines.join("\n"), is_error: result.is_error.unwrap_or(false), images }
}

fn decode_image(image: &ImageContent) -> Result<McpImage, base64::DecodeError> {
    // Some servers wrap their base64 at 76 columns; whitespace is never data.
    let compact: String = image.data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let data = base64::engine::general_purpose::STANDARD.decode(compact)?;
    Ok(McpImage { mime_type: image.mime_type.clone(), data })
}

fn compact_json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_else(|error| format!("[content that could not be shown: {error}]"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn result(value: serde_json::Value) -> CallToolResult {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn text_images_and_resources() {
        let output = call_output(result(json!({
            "content": [
                {"type": "text", "text": "first"},
                {"type": "image", "mimeType": "image/png", "data": "iVBORw0K\nGgo="},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "hello"}},
                {"type": "text", "text": "last"},
            ],
        })));
        assert!(!output.is_error);
        assert_eq!(output.images, [McpImage { mime_type: "image/png".into(), data: b"\x89PNG\r\n\x1a\n".to_vec() }]);
        let lines: Vec<&str> = output.text.lines().collect();
        assert_eq!(lines[0], "first");
        let resource: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(resource["resource"]["uri"], "file:///a.txt");
        assert_eq!(lines[2], "last");
    }

    #[test]
    fn bad_base64_is_reported_as_text() {
        let output = call_output(result(json!({
            "content": [{"type": "image", "mimeType": "image/png", "data": "not base64!"}],
            "isError": true,
        })));
        assert!(output.is_error);
        assert!(output.images.is_empty());
        assert!(output.text.contains("could not be decoded"), "{}", output.text);
    }

    #[test]
    fn structured_content_without_content() {
        let output = call_output(result(json!({"content": [], "structuredContent": {"sum": 3}})));
        assert_eq!(output.text, r#"{"sum":3}"#);
    }
}
