//! Grammar-constrained tool calls in the shape small models were trained on.
//!
//! With tools declared, a turn's model step runs in two phases (see the
//! crate docs). The first may only write a call list in SmolLM2's own
//! function-calling format, `<tool_call>[{"name": "<tool>", "arguments":
//! {...}}]</tool_call>`, or the empty list `<tool_call>[]</tool_call>` when no
//! tool is needed; the arguments follow the tool's JSON schema. Only an empty
//! list leads to the second phase, a plain-text answer.
//!
//! Why this shape. An earlier grammar let the model write either
//! `{"answer": "..."}` or `{"tool": ..., "arguments": ...}`, so the first
//! choice was between the keys `answer` and `tool`; on the demo task ("Write a
//! file hello.txt that greets the reader...") SmolLM2-135M chose `answer`
//! (logit 32.9 against 27.4 for the first tool name) and said it had written a
//! file it never wrote. In the format it was trained on, the choice is
//! between opening a call (`{`) and closing an empty list (`]`), and it opens
//! the call. Tools are shown under their own names (`write_file`, not
//! `fs__write_file`) when that is unambiguous within the request, because
//! the decision between tools then falls on the verb the person used rather
//! than on a shared `fs__` prefix; [`LocalNames`] maps them back.
//!
//! The call's schema (a `oneOf` of one branch per tool) becomes a GBNF grammar
//! through llama.cpp's own JSON-schema converter, which covers far more of
//! JSON Schema than keel's tools use. The schema text is assembled by hand
//! rather than through `serde_json::Value` because the converter keeps
//! property order: `name` must come before `arguments` so the model picks
//! the tool first, and a tool's properties follow its `required` list
//! (`path` before `content`) rather than the alphabetical order `serde_json`
//! keeps them in.

use keel_protocol::ToolSpec;
use serde_json::Value;

use crate::error::{LocalError, Result};

/// Opens a call list.
pub const CALLS_OPEN: &str = "<tool_call>[";
/// Closes a call list.
pub const CALLS_CLOSE: &str = "]</tool_call>";

/// What the first phase wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConstrainedReply {
    /// `<tool_call>[]</tool_call>`: answer without a tool.
    NoCall,
    /// One call: the model-visible name, the arguments as compact JSON text.
    ToolCall { name: String, arguments: String },
}

/// The names the local model sees for a request's tools: a tool's own part
/// (`write_file` of `fs__write_file`) when no other tool of the request has
/// the same one, else the model-visible name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalNames {
    /// (shown name, model-visible name), in the request's order.
    pairs: Vec<(String, String)>,
}

impl LocalNames {
    pub fn new(tools: &[ToolSpec]) -> LocalNames {
        let short = |name: &str| name.rsplit_once("__").map(|(_, tool)| tool.to_string()).unwrap_or_default();
        let pairs = tools
            .iter()
            .map(|tool| {
                let own = short(&tool.name);
                let unique = !own.is_empty()
                    && tools.iter().filter(|other| short(&other.name) == own).count() == 1
                    && !tools.iter().any(|other| other.name == own);
                (if unique { own } else { tool.name.clone() }, tool.name.clone())
            })
            .collect();
        LocalNames { pairs }
    }

    /// The name shown for a model-visible name (itself when unknown).
    pub fn shown<'a>(&'a self, visible: &'a str) -> &'a str {
        self.pairs.iter().find(|(_, v)| v == visible).map(|(shown, _)| shown.as_str()).unwrap_or(visible)
    }

    /// The model-visible name of a shown name.
    pub fn visible(&self, shown: &str) -> Option<&str> {
        self.pairs.iter().find(|(s, _)| s == shown).map(|(_, visible)| visible.as_str())
    }
}

/// The JSON schema of one call, as JSON text.
pub fn call_schema(tools: &[ToolSpec]) -> String {
    call_schema_with(tools, |tool| arguments_schema(&tool.parameters))
}

fn call_schema_with(tools: &[ToolSpec], arguments: impl Fn(&ToolSpec) -> String) -> String {
    let names = LocalNames::new(tools);
    let branches: Vec<String> = tools
        .iter()
        .map(|tool| {
            let name = Value::String(names.shown(&tool.name).to_string());
            format!(
                r#"{{"type": "object", "properties": {{"name": {{"const": {name}}}, "arguments": {arguments}}}, "required": ["name", "arguments"], "additionalProperties": false}}"#,
                arguments = arguments(tool),
            )
        })
        .collect();
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

/// The GBNF grammar (root rule `root`) of the first phase when `tools` are
/// declared: a call list holding one call or none.
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
    let schema = call_schema_with(tools, convertible);
    let call = llama_cpp_2::json_schema_to_grammar(&schema).map_err(|error| LocalError::Grammar(error.to_string()))?;
    // The converter names its top rule `root`; it becomes `call`, inside the
    // list. No other rule of the converter's output is called `call`: its
    // rule names come from schema positions (`root-...`, `space`, ...).
    let call = call.replacen("root ::=", "call ::=", 1);
    let literal = |text: &str| Value::String(text.to_string()).to_string();
    Ok(format!("root ::= {} call? {}\n{call}", literal(CALLS_OPEN), literal(CALLS_CLOSE)))
}

/// Reads what the first phase wrote. `None` when it is not a complete call
/// list, which happens only when generation stopped at the token limit
/// before the grammar was satisfied.
pub fn parse_reply(text: &str, tools: &[ToolSpec]) -> Option<ConstrainedReply> {
    let inner = text.trim().strip_prefix(CALLS_OPEN)?.strip_suffix(CALLS_CLOSE)?.trim();
    if inner.is_empty() {
        return Some(ConstrainedReply::NoCall);
    }
    let Value::Object(mut object) = serde_json::from_str::<Value>(inner).ok()? else {
        return None;
    };
    if object.len() != 2 {
        return None;
    }
    let Some(Value::String(shown)) = object.remove("name") else {
        return None;
    };
    let arguments = object.remove("arguments").filter(Value::is_object)?;
    let name = LocalNames::new(tools).visible(&shown)?.to_string();
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

#[cfg(test)]
mod reply_tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str) -> ToolSpec {
        ToolSpec { name: name.into(), description: String::new(), parameters: json!({"type": "object"}) }
    }

    #[test]
    fn tools_show_their_own_names_when_unambiguous() {
        let tools = [tool("fs__write_file"), tool("fs__read_file"), tool("a__search"), tool("b__search")];
        let names = LocalNames::new(&tools);
        assert_eq!(names.shown("fs__write_file"), "write_file");
        assert_eq!(names.shown("a__search"), "a__search", "two tools share `search`");
        assert_eq!(names.visible("write_file"), Some("fs__write_file"));
        assert_eq!(names.visible("b__search"), Some("b__search"));
        assert_eq!(names.visible("search"), None);
    }

    #[test]
    fn call_lists_parse_to_a_call_or_none() {
        let tools = [tool("fs__write_file")];
        assert_eq!(parse_reply("<tool_call>[]</tool_call>", &tools), Some(ConstrainedReply::NoCall));
        assert_eq!(
            parse_reply(r#"<tool_call>[{"name": "write_file", "arguments": {"path": "a"}}]</tool_call>"#, &tools),
            Some(ConstrainedReply::ToolCall { name: "fs__write_file".into(), arguments: r#"{"path":"a"}"#.into() })
        );
        assert_eq!(parse_reply(r#"<tool_call>[{"name": "write_file", "arg"#, &tools), None, "cut short");
        assert_eq!(parse_reply(r#"<tool_call>[{"name": "nope", "arguments": {}}]</tool_call>"#, &tools), None);
    }
}
