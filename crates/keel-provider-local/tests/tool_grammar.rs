//! The tool-choice grammar built from tool schemas, and reading choices
//! back. No model is needed: the grammar comes from llama.cpp's JSON-schema
//! converter.

use keel_protocol::ToolSpec;
use keel_provider_local::tool_grammar::{ConstrainedReply, call_schema, parse_reply, reply_grammar};
use serde_json::{Value, json};

fn write_file() -> ToolSpec {
    ToolSpec {
        name: "write_file".into(),
        description: "Writes a file.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": false
        }),
    }
}

fn search() -> ToolSpec {
    ToolSpec {
        name: "search".into(),
        description: "Searches.".into(),
        parameters: json!({
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer"},
                "score": {"type": "number"},
                "exact": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "order": {"enum": ["newest", "oldest"]}
            },
            "required": ["query"],
            "additionalProperties": false
        }),
    }
}

/// The rule names a grammar defines.
fn rules(grammar: &str) -> Vec<&str> {
    grammar.lines().filter_map(|line| line.split_once(" ::= ").map(|(name, _)| name.trim())).collect()
}

#[test]
fn schema_offers_one_branch_per_tool() -> anyhow::Result<()> {
    let text = call_schema(&[write_file(), search()]);
    let schema: Value = serde_json::from_str(&text)?;
    let branches = schema["oneOf"].as_array().cloned().unwrap_or_default();
    assert_eq!(branches.len(), 2);
    assert_eq!(branches[0]["properties"]["name"], json!({"const": "write_file"}));
    assert_eq!(branches[0]["properties"]["arguments"], write_file().parameters);
    assert_eq!(branches[1]["properties"]["name"], json!({"const": "search"}));
    for branch in &branches {
        assert_eq!(branch["additionalProperties"], json!(false));
    }
    // The converter keeps property order: the tool is named before its arguments.
    let tool_at = text.find(r#""name""#).unwrap_or(usize::MAX);
    let arguments_at = text.find(r#""arguments""#).unwrap_or(0);
    assert!(tool_at < arguments_at, "{text}");
    Ok(())
}

#[test]
fn grammar_names_every_tool_and_every_property() -> anyhow::Result<()> {
    let grammar = reply_grammar(&[write_file(), search()])?;
    assert!(rules(&grammar).contains(&"root"), "{grammar}");
    assert!(grammar.starts_with(r#"root ::= "<tool_call>[" call? "]</tool_call>""#), "{grammar}");
    for literal in [
        r#"\"name\""#,
        r#"\"arguments\""#,
        r#"\"write_file\""#,
        r#"\"path\""#,
        r#"\"content\""#,
        r#"\"search\""#,
        r#"\"query\""#,
        r#"\"newest\""#,
        r#"\"oldest\""#,
    ] {
        assert!(grammar.contains(literal), "{literal} missing from\n{grammar}");
    }
    // Required arguments are not optional in the grammar, and come in the
    // order of the `required` list: the write_file arguments rule is
    // `"{" path "," content "}"` with no `?`.
    let arguments_rule = grammar
        .lines()
        .find(|line| {
            line.contains("-path-kv") && line.contains("-content-kv") && !line.starts_with("alternative-0-arguments-")
        })
        .unwrap_or_default();
    assert!(!arguments_rule.contains(")?"), "{arguments_rule}");
    let path_at = arguments_rule.find("-path-kv").unwrap_or(usize::MAX);
    let content_at = arguments_rule.find("-content-kv").unwrap_or(0);
    assert!(path_at < content_at, "{arguments_rule}");
    Ok(())
}

#[test]
fn grammar_without_tool_parameters_takes_an_empty_object() -> anyhow::Result<()> {
    let tool = ToolSpec { name: "now".into(), description: String::new(), parameters: Value::Null };
    let schema: Value = serde_json::from_str(&call_schema(std::slice::from_ref(&tool)))?;
    assert_eq!(schema["oneOf"][0]["properties"]["arguments"]["properties"], json!({}));
    let grammar = reply_grammar(&[tool])?;
    assert!(grammar.contains(r#"\"now\""#));
    Ok(())
}

#[test]
fn a_schema_the_converter_rejects_still_gives_a_grammar() -> anyhow::Result<()> {
    let odd = ToolSpec {
        name: "odd".into(),
        description: String::new(),
        parameters: json!({"$ref": "https://example.invalid/schema.json"}),
    };
    let grammar = reply_grammar(&[odd, write_file()])?;
    assert!(grammar.contains(r#"\"odd\""#) && grammar.contains(r#"\"write_file\""#), "{grammar}");
    Ok(())
}

#[test]
fn replies_are_read_strictly() {
    let tools = [write_file()];
    assert_eq!(parse_reply("<tool_call>[]</tool_call>", &tools), Some(ConstrainedReply::NoCall));
    assert_eq!(
        parse_reply(
            r#"<tool_call>[{ "name": "write_file", "arguments": {"path": "a.txt", "content": "x"} }]</tool_call>"#,
            &tools
        ),
        Some(ConstrainedReply::ToolCall {
            name: "write_file".into(),
            arguments: r#"{"content":"x","path":"a.txt"}"#.into()
        })
    );
    for invalid in [
        r#"<tool_call>[{"name": "write_file", "arguments": {"path": "cut off"#,
        r#"<tool_call>[{"name": "rm", "arguments": {}}]</tool_call>"#,
        r#"<tool_call>[{"name": "write_file", "arguments": "path"}]</tool_call>"#,
        r#"<tool_call>[{"name": "write_file"}]</tool_call>"#,
        r#"{"answer": "hi"}"#,
        r#"{"tool": "write_file", "arguments": {}}"#,
        "hello",
    ] {
        assert_eq!(parse_reply(invalid, &tools), None, "{invalid}");
    }
}
