//! Grammar-constrained replies: with tools declared, the model can only write
//! one JSON object, either `{"answer": "<text>"}` or
//! `{"tool": "<declared name>", "arguments": {...}}` whose arguments follow that
//! tool's JSON schema.
//!
//! The reply shape is written as one JSON schema (a `oneOf` of the answer and
//! one branch per tool) and turned into a GBNF grammar by llama.cpp's own
//! JSON-schema converter, which covers far more of JSON Schema than keel's
//! tools use. The schema text is assembled by hand rather than through
//! `serde_json::Value` because the converter keeps property order: `tool` must
//! come before `arguments` so the model picks the tool first, and a tool's
//! properties follow its `required` list (`path` before `content`) rather
//! than the alphabetical order `serde_json` keeps them in.

use keel_protocol::ToolSpec;
use serde_json::Value;

use crate::error::{LocalError, Result};

/// What a constrained reply said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConstrainedReply {
    /// `{"answer": text}`.
    Answer(String),
    /// `{"tool": name, "arguments": {...}}`, the arguments as compact JSON text.
    ToolCall { name: String, arguments: String },
}

/// The JSON schema every constrained reply follows, as JSON text.
pub fn reply_schema(tools: &[ToolSpec]) -> String {
    reply_schema_with(tools, |tool| arguments_schema(&tool.parameters))
}

fn reply_schema_with(tools: &[ToolSpec], arguments: impl Fn(&ToolSpec) -> String) -> String {
    let mut branches = vec![
        r#"{"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"], "additionalProperties": false}"#
            .to_string(),
    ];
    for tool in tools {
        let name = Value::String(tool.name.clone());
        branches.push(format!(
            r#"{{"type": "object", "properties": {{"tool": {{"const": {name}}}, "arguments": {arguments}}}, "required": ["tool", "arguments"], "additionalProperties": false}}"#,
            arguments = arguments(tool),
        ));
    }
    format!(r#"{{"oneOf": [{}]}}"#, branches.join(", "))
}

/// A tool's parameter schema, or a schema for "no arguments" when the tool
/// declares none.
pub(crate) fn arguments_schema(parameters: &Value) -> String {
    match parameters {
        Value::Object(map) if !map.is_empty() => schema_text(parameters),
        _ => r#"{"type": "object", "properties": {}, "additionalProperties": false}"#.to_string(),
    }
}

/// `schema` as compact JSON text, with the keys of every `properties` object
/// in the order of the sibling `required` list, then the others.
pub(crate) fn schema_text(schema: &Value) -> String {
    let mut out = String::new();
    write_schema(schema, &mut out);
    out
}

fn write_schema(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            out.push('{');
            for (index, (key, child)) in map.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_key(key, out);
                match child {
                    Value::Object(properties) if key == "properties" => {
                        write_properties(properties, map.get("required"), out)
                    }
                    _ => write_schema(child, out),
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_schema(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn write_properties(properties: &serde_json::Map<String, Value>, required: Option<&Value>, out: &mut String) {
    let required: Vec<&str> = required
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut names: Vec<&String> = properties.keys().collect();
    // Stable: properties not in `required` keep their (alphabetical) order.
    names.sort_by_key(|name| required.iter().position(|required| required == name).unwrap_or(usize::MAX));
    out.push('{');
    for (index, name) in names.into_iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        write_key(name, out);
        if let Some(schema) = properties.get(name) {
            write_schema(schema, out);
        }
    }
    out.push('}');
}

fn write_key(key: &str, out: &mut String) {
    out.push_str(&Value::String(key.to_string()).to_string());
    out.push(':');
}

/// The GBNF grammar (root rule `root`) for replies when `tools` are declared.
///
/// A tool whose schema llama.cpp cannot convert keeps the call shape but takes
/// any JSON object as arguments, with a warning, so one odd schema does not
/// take the other tools away from the model.
pub fn reply_grammar(tools: &[ToolSpec]) -> Result<String> {
    let convertible = |tool: &ToolSpec| {
        let schema = arguments_schema(&tool.parameters);
        match llama_cpp_2::json_schema_to_grammar(&schema) {
            Ok(_) => schema,
            Err(error) => {
                tracing::warn!(tool = %tool.name, %error, "tool schema not convertible to a grammar; allowing any object");
                r#"{"type": "object"}"#.to_string()
            }
        }
    };
    let schema = reply_schema_with(tools, convertible);
    llama_cpp_2::json_schema_to_grammar(&schema).map_err(|error| LocalError::Grammar(error.to_string()))
}

/// Reads a constrained reply. `None` when the text is not a complete reply of
/// the right shape, which happens only when generation stopped at the token
/// limit before the grammar was satisfied.
pub fn parse_reply(text: &str, tools: &[ToolSpec]) -> Option<ConstrainedReply> {
    let Value::Object(mut object) = serde_json::from_str::<Value>(text).ok()? else {
        return None;
    };
    if object.len() == 1
        && let Some(Value::String(answer)) = object.remove("answer")
    {
        return Some(ConstrainedReply::Answer(answer));
    }
    if object.len() != 2 {
        return None;
    }
    let Some(Value::String(name)) = object.remove("tool") else {
        return None;
    };
    let arguments = object.remove("arguments").filter(Value::is_object)?;
    if !tools.iter().any(|tool| tool.name == name) {
        return None;
    }
    Some(ConstrainedReply::ToolCall { name, arguments: arguments.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn properties_follow_the_required_list() {
        let schema = json!({
            "type": "object",
            "properties": {
                "b": {"type": "string"},
                "z": {"type": "object", "properties": {"y": {}, "x": {}, "properties": {}}, "required": ["y"]},
                "a": {"type": "string"},
                "path": {"type": "string"}
            },
            "required": ["path", "b"]
        });
        let text = schema_text(&schema);
        assert_eq!(serde_json::from_str::<Value>(&text).ok(), Some(schema));
        let positions = |within: &str, names: &[&str]| -> Vec<usize> {
            names.iter().map(|name| within.find(&format!("\"{name}\":")).unwrap_or(usize::MAX)).collect()
        };
        let top = positions(&text, &["path", "b", "a", "z"]);
        assert!(top.windows(2).all(|pair| pair[0] < pair[1]), "{text}");
        // Nested too, and a property named `properties` is just a property.
        assert!(text.contains(r#""properties":{"y":{},"properties":{},"x":{}}"#), "{text}");
    }
}
