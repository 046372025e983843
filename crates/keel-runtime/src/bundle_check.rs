//! `keel validate`: every problem in a bundle, with file, line and a fix.
//!
//! Loading a bundle stops at the first syntax error; validation goes on to
//! check what the runtime would refuse later (unknown providers and tools,
//! malformed model names, empty instructions, zero limits, bad prices) and
//! reports all of it at once, so a person fixes a bundle in one pass. Lines
//! of semantic problems are found by locating the coworker's table and key
//! in the text; TOML syntax errors carry the parser's own position.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::bundle::{BUNDLE_FILE, BundleFile};

/// One thing wrong with a bundle.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
    pub hint: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {} (fix: {})", self.file.display(), self.message, self.hint),
            None => write!(f, "{}: {} (fix: {})", self.file.display(), self.message, self.hint),
        }
    }
}

/// Checks the bundle in `dir` against the providers and tools this keel has.
pub fn validate(dir: &Path, providers: &[String], tools: &[String]) -> Vec<Problem> {
    let file = dir.join(BUNDLE_FILE);
    let problem =
        |line: Option<usize>, message: String, hint: String| Problem { file: file.clone(), line, message, hint };
    let text = match std::fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) => {
            return vec![problem(
                None,
                format!("cannot read the bundle file: {e}"),
                format!("a bundle is a folder holding {BUNDLE_FILE}; check the path"),
            )];
        }
    };
    validate_text(&file, &text, providers, tools)
}

/// Checks `text`, the contents of the bundle file `file`: everything
/// [`validate`] does after reading the file. For fuzzing and tests.
pub fn validate_text(file: &Path, text: &str, providers: &[String], tools: &[String]) -> Vec<Problem> {
    let problem =
        |line: Option<usize>, message: String, hint: String| Problem { file: file.to_path_buf(), line, message, hint };
    let parsed: BundleFile = match toml::from_str(text) {
        Ok(parsed) => parsed,
        Err(e) => {
            let line = e.span().map(|s| line_at(text, s.start));
            let message = e.message().to_string();
            let hint = if message.contains("unknown field") {
                "remove or rename the field; `keel validate --schema` prints every field a bundle may have".to_string()
            } else if message.contains("missing field") {
                "add the field named above".to_string()
            } else {
                "fix the TOML syntax at this line".to_string()
            };
            return vec![problem(line, message, hint)];
        }
    };
    let mut problems = Vec::new();
    if parsed.coworkers.is_empty() {
        problems.push(problem(None, "the bundle defines no coworkers".into(), "add a [coworkers.<id>] table".into()));
    }
    let check_model = |id: &str, key: &str, model: &str, problems: &mut Vec<Problem>| match model.split_once(':') {
        None => problems.push(problem(
            key_line(text, id, key),
            format!("coworker {id:?}: the model {model:?} does not name a provider"),
            "write it as provider:model, for example openai-chat:gpt-4o-mini or local:smollm2".into(),
        )),
        Some((provider, _)) if !providers.iter().any(|p| p == provider) => problems.push(problem(
            key_line(text, id, key),
            format!("coworker {id:?}: unknown provider {provider:?} in {model:?}"),
            format!("use one of: {}", providers.join(", ")),
        )),
        Some(_) => {}
    };
    for (id, spec) in &parsed.coworkers {
        check_model(id, "model", &spec.model, &mut problems);
        for fallback in &spec.fallback_models {
            check_model(id, "fallback_models", fallback, &mut problems);
        }
        if let Some(summary) = &spec.summary_model {
            check_model(id, "summary_model", summary, &mut problems);
        }
        for tool in &spec.tools {
            let (server, _) = keel_tools::split_qualified(tool);
            let known = tools.iter().any(|t| t == tool) || parsed.mcp_servers.contains_key(server);
            if !known {
                let bare = tools.iter().find(|t| keel_tools::split_qualified(t).1 == tool);
                let hint = match bare {
                    Some(qualified) => format!("tools are named server.tool: write {qualified:?}"),
                    None if tool.ends_with(".*") => {
                        format!("declare the MCP server with [mcp_servers.{}]", tool.trim_end_matches(".*"))
                    }
                    None => format!(
                        "use one of: {}, or <server>.<tool> / <server>.* for a server in [mcp_servers]",
                        tools.join(", ")
                    ),
                };
                problems.push(problem(
                    key_line(text, id, "tools"),
                    format!("coworker {id:?}: unknown tool {tool:?}"),
                    hint,
                ));
            }
        }
        for (key, paths) in [("read", &spec.resources.read), ("write", &spec.resources.write)] {
            for path in paths.iter().filter(|p| !p.is_absolute()) {
                problems.push(problem(
                    sub_key_line(text, id, "resources", key),
                    format!("coworker {id:?}: resources.{key} holds the relative path {path:?}"),
                    "write absolute paths; the workspace itself needs no entry".into(),
                ));
            }
        }
        let shell = &spec.resources.shell;
        if shell.timeout_secs == 0 || shell.max_timeout_secs < shell.timeout_secs {
            problems.push(problem(
                sub_key_line(text, id, "resources.shell", "timeout_secs"),
                format!("coworker {id:?}: shell timeouts must satisfy 0 < timeout_secs <= max_timeout_secs"),
                "for example timeout_secs = 60 and max_timeout_secs = 600".into(),
            ));
        }
        if spec.instructions.trim().is_empty() {
            problems.push(problem(
                key_line(text, id, "instructions"),
                format!("coworker {id:?}: the instructions are empty"),
                "say who the coworker is and how it should work".into(),
            ));
        }
        for (key, value) in [("max_steps", spec.max_steps), ("max_output_tokens", spec.max_output_tokens)] {
            if value == Some(0) {
                problems.push(problem(
                    key_line(text, id, key),
                    format!("coworker {id:?}: {key} is 0, so no turn could do anything"),
                    format!("remove {key} for the default, or set it to at least 1"),
                ));
            }
        }
    }
    for (name, server) in &parsed.mcp_servers {
        let line = text.lines().position(|l| l.contains("[mcp_servers.") && l.contains(name.as_str())).map(|i| i + 1);
        let plain = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !plain {
            problems.push(problem(
                line,
                format!("MCP server {name:?}: the name may hold only letters, digits, '-' and '_'"),
                "rename the server; its tools are called <server>.<tool>".into(),
            ));
        }
        if name == "fs" || name == "shell" {
            problems.push(problem(
                line,
                format!("MCP server {name:?}: the name is taken by keel's built-in tools"),
                "rename the server".into(),
            ));
        }
        match (&server.command, &server.url) {
            (Some(_), Some(_)) => problems.push(problem(
                line,
                format!("MCP server {name:?}: both command and url are set"),
                "keep command (a local server over stdio) or url (streamable HTTP), not both".into(),
            )),
            (None, None) => problems.push(problem(
                line,
                format!("MCP server {name:?}: neither command nor url is set"),
                "set command = \"...\" (with args) for a local server, or url = \"https://...\"".into(),
            )),
            (None, Some(url)) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                problems.push(problem(
                    line,
                    format!("MCP server {name:?}: the url {url:?} is not http(s)"),
                    "give the server's streamable HTTP endpoint, for example http://127.0.0.1:3001/mcp".into(),
                ))
            }
            _ => {}
        }
        if server.command.is_none() && (!server.args.is_empty() || !server.env.is_empty()) {
            problems.push(problem(
                line,
                format!("MCP server {name:?}: args and env apply to a command, and there is none"),
                "remove them, or set command".into(),
            ));
        }
    }
    for (model, price) in &parsed.prices {
        let line = text.lines().position(|l| l.contains("[prices.") && l.contains(model.as_str())).map(|i| i + 1);
        if !model.contains(':') {
            problems.push(problem(
                line,
                format!("price for {model:?}: not a provider:model name"),
                "name the model as provider:model".into(),
            ));
        }
        if [Some(price.input), Some(price.output), price.cached_input]
            .into_iter()
            .flatten()
            .any(|p| p < 0.0 || !p.is_finite())
        {
            problems.push(problem(
                line,
                format!("price for {model:?}: a price is negative"),
                "prices are US dollars per million tokens, 0 or more".into(),
            ));
        }
    }
    problems
}

/// The 1-based line holding byte `offset`.
fn line_at(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The line of `key` inside `[coworkers.<id>]`, or of the table header.
fn key_line(text: &str, id: &str, key: &str) -> Option<usize> {
    table_key_line(text, &[format!("[coworkers.{id}]"), format!("[coworkers.\"{id}\"]")], key)
}

/// The line of `key` in the coworker's subtable `sub` (for example
/// `resources`), else of `sub` itself in the coworker's table.
fn sub_key_line(text: &str, id: &str, sub: &str, key: &str) -> Option<usize> {
    let headers = [format!("[coworkers.{id}.{sub}]"), format!("[coworkers.\"{id}\".{sub}]")];
    table_key_line(text, &headers, key).or_else(|| key_line(text, id, sub.split('.').next().unwrap_or(sub)))
}

/// The line of `key` in the table opened by one of `headers`, or of the
/// header itself; `None` if no such table.
fn table_key_line(text: &str, headers: &[String], key: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| headers.iter().any(|h| l.trim() == h))?;
    for (offset, line) in lines[start + 1..].iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            break;
        }
        if let Some(rest) = trimmed.strip_prefix(key)
            && rest.trim_start().starts_with('=')
        {
            return Some(start + offset + 2);
        }
    }
    Some(start + 1)
}

/// The JSON Schema of `keel.toml` (draft 2020-12), as published in
/// `docs/bundle.schema.json`.
pub fn schema() -> Value {
    let price = json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["input", "output"],
        "properties": {
            "input": {"type": "number", "minimum": 0, "description": "US dollars per million input tokens"},
            "output": {"type": "number", "minimum": 0, "description": "US dollars per million output tokens"},
            "cached_input": {"type": "number", "minimum": 0, "description": "US dollars per million cached input tokens; defaults to input"}
        }
    });
    let model = json!({"type": "string", "pattern": "^[a-z0-9-]+:.+$", "description": "provider:model, for example openai-chat:gpt-4o-mini"});
    let strings = json!({"type": "array", "items": {"type": "string"}});
    let string_map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    let seconds = json!({"type": "integer", "minimum": 1});
    let resources = json!({
        "type": "object",
        "additionalProperties": false,
        "description": "What the coworker's tools may touch beyond the workspace",
        "properties": {
            "read": {"type": "array", "items": {"type": "string"}, "description": "Absolute folders readable beyond the workspace"},
            "write": {"type": "array", "items": {"type": "string"}, "description": "Absolute folders readable and writable beyond the workspace"},
            "network": {"type": "boolean", "default": false, "description": "Whether tools may use the network"},
            "env": {"type": "array", "items": {"type": "string"}, "description": "Names of keel's environment variables passed through to tools"},
            "shell": {
                "type": "object",
                "additionalProperties": false,
                "properties": {
                    "timeout_secs": {"type": "integer", "minimum": 1, "default": 60},
                    "max_timeout_secs": {"type": "integer", "minimum": 1, "default": 600},
                    "output_limit_bytes": {"type": "integer", "minimum": 1, "default": 65536},
                    "max_processes": {"type": "integer", "minimum": 1, "default": 512},
                    "max_file_bytes": {"type": "integer", "minimum": 1, "default": 1073741824u64}
                }
            }
        }
    });
    let mcp_server = json!({
        "type": "object",
        "additionalProperties": false,
        "description": "An MCP server: command (stdio) or url (streamable HTTP)",
        "properties": {
            "command": {"type": "string"},
            "args": strings,
            "env": string_map,
            "cwd": {"type": "string"},
            "url": {"type": "string", "pattern": "^https?://"},
            "headers": string_map,
            "startup_timeout_secs": seconds,
            "call_timeout_secs": seconds
        },
        "oneOf": [{"required": ["command"]}, {"required": ["url"]}]
    });
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://keel.dev/schemas/bundle.schema.json",
        "title": "keel bundle (keel.toml)",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "bundle": {
                "type": "object",
                "additionalProperties": false,
                "properties": {"name": {"type": "string"}}
            },
            "coworkers": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["model", "instructions"],
                    "properties": {
                        "description": {"type": "string"},
                        "model": model,
                        "instructions": {"type": "string", "minLength": 1},
                        "tools": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z0-9_-]+\\..+$"}, "uniqueItems": true, "description": "Qualified tool names (fs.read_file) or <server>.* for every tool of an MCP server"},
                        "resources": resources,
                        "policies": {
                            "type": "object",
                            "description": "Policy per tool entry (fs.write_file, shell.run, <server>.*); tools without one are allowed if read-only, asked about otherwise",
                            "additionalProperties": {
                                "oneOf": [
                                    {"enum": ["allow", "ask", "deny"]},
                                    {
                                        "type": "object",
                                        "additionalProperties": false,
                                        "properties": {
                                            "policy": {"enum": ["allow", "ask", "deny"], "default": "ask", "description": "For calls no allow rule matches"},
                                            "allow_commands": {"type": "array", "items": {"type": "string"}, "description": "Command prefixes matched token by token; shell operators and expansions never match"},
                                            "allow_paths": {"type": "array", "items": {"type": "string"}, "description": "Workspace folders file tools may use without asking"},
                                            "expires_secs": {"type": "integer", "minimum": 1, "description": "An unanswered approval counts as denied after this long"}
                                        }
                                    }
                                ]
                            }
                        },
                        "approval_timeout_secs": {"type": "integer", "minimum": 1, "description": "Default expiry of approvals; none waits indefinitely"},
                        "taint": {
                            "type": "object",
                            "additionalProperties": false,
                            "description": "Sensitive sources, outbound tools and what happens when sensitive data would leave",
                            "properties": {
                                "sources": {"type": "object", "additionalProperties": {"enum": ["public", "internal", "private"]}, "description": "Label of each tool's output (tool entry -> label)"},
                                "outbound": {"type": "object", "additionalProperties": {"enum": ["public", "internal", "private"]}, "description": "Tools that send data out -> the most sensitive data each may carry"},
                                "on_violation": {"enum": ["allow", "ask", "deny"], "default": "ask"}
                            }
                        },
                        "compaction": {
                            "type": "object",
                            "additionalProperties": false,
                            "description": "Compaction defaults for the coworker's sessions",
                            "properties": {
                                "cap_tokens": {"type": "integer", "minimum": 1, "description": "Context cap in tokens; default the model's context window"},
                                "auto_trim_on_failure": {"type": "boolean", "default": true, "description": "In an unattended session, trim mechanically when a summary fails"},
                                "threshold_percent": {"type": "integer", "minimum": 10, "maximum": 100, "default": 80, "description": "Compact when the next request would pass this share of the cap"}
                            }
                        },
                        "summary_model": model,
                        "fallback_models": {"type": "array", "items": model},
                        "max_steps": {"type": "integer", "minimum": 1},
                        "max_output_tokens": {"type": "integer", "minimum": 1},
                        "prices": {"type": "object", "additionalProperties": price}
                    }
                }
            },
            "prices": {"type": "object", "additionalProperties": price},
            "mcp_servers": {"type": "object", "additionalProperties": mcp_server}
        },
        "required": ["coworkers"]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(toml: &str) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join(BUNDLE_FILE), toml).unwrap_or_else(|e| panic!("{e}"));
        let tools = crate::builtin_tool_names();
        validate(dir.path(), &["openai".to_string()], &tools).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn tools_resources_and_mcp_servers_are_checked_with_lines_and_fixes() {
        let found = problems(
            r#"[coworkers.a]
model = "openai:m"
instructions = "x"
tools = ["read_file", "github.*", "fs.write_file", "docs.search"]

[coworkers.a.resources]
read = ["relative/dir"]

[mcp_servers.docs]
url = "ftp://example"

[mcp_servers.fs]
command = "x"
url = "http://127.0.0.1:1/mcp"
"#,
        );
        let expect = [
            ":4: coworker \"a\": unknown tool \"read_file\" (fix: tools are named server.tool: write \"fs.read_file\")",
            ":4: coworker \"a\": unknown tool \"github.*\" (fix: declare the MCP server with [mcp_servers.github])",
            ":7: coworker \"a\": resources.read holds the relative path \"relative/dir\"",
            ":9: MCP server \"docs\": the url \"ftp://example\" is not http(s)",
            ":12: MCP server \"fs\": the name is taken by keel's built-in tools",
            ":12: MCP server \"fs\": both command and url are set",
        ];
        for e in expect {
            assert!(found.iter().any(|p| p.contains(e)), "missing {e:?} in {found:#?}");
        }
        assert_eq!(found.len(), expect.len(), "{found:#?}");
    }

    #[test]
    fn a_good_bundle_with_an_mcp_server_has_no_problems() {
        let found = problems(
            "[coworkers.a]\nmodel = \"openai:m\"\ninstructions = \"x\"\ntools = [\"shell.run\", \"gh.*\"]\n\n[mcp_servers.gh]\ncommand = \"npx\"\nargs = [\"-y\", \"server\"]\n",
        );
        assert!(found.is_empty(), "{found:#?}");
    }
}
