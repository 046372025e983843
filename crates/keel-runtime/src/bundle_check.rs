//! `keel validate`: every problem in a bundle, with file, line and a fix.
//!
//! Loading a bundle stops at the first syntax error; validation goes on to
//! check what the runtime would refuse later (unknown providers and tools,
//! malformed model names, empty instructions, zero limits, bad prices) and
//! reports all of it at once, so a person fixes a bundle in one pass. Lines
//! of semantic problems are found by locating the coworker's table and key
//! in the text; TOML syntax errors carry the parser's own position.
//!
//! [`schema`] is the JSON Schema of the same file for editors, derived from
//! the loader's types (crate::bundle) rather than written beside them.

use std::fmt;
use std::path::{Path, PathBuf};

use schemars::Schema;
use schemars::generate::SchemaSettings;
use schemars::transform::transform_subschemas;
use serde_json::Value;

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
/// `docs/bundle.schema.json`: derived from the types the loader
/// deserializes (crate::bundle), so it names exactly the fields, shapes and
/// defaults the loader takes, plus the value rules `keel validate` checks.
pub fn schema() -> Value {
    let settings = SchemaSettings::draft2020_12().with_transform(toml_has_no_null);
    settings.into_generator().into_root_schema_for::<BundleFile>().to_value()
}

/// Removes the `null` schemars allows for every `Option`: TOML has no null,
/// an unset option is an absent key. Defaults lose their nulls too (an
/// unset option's default is left to the description).
fn toml_has_no_null(schema: &mut Schema) {
    fn strip_nulls(value: &mut Value) {
        if let Value::Object(members) = value {
            members.retain(|_, member| !member.is_null());
            members.values_mut().for_each(strip_nulls);
        }
    }
    if let Some(object) = schema.as_object_mut() {
        if let Some(Value::Array(types)) = object.get_mut("type") {
            types.retain(|kind| kind != "null");
            if let [only] = types.as_slice() {
                let only = only.clone();
                object.insert("type".into(), only);
            }
        }
        if let Some(Value::Array(values)) = object.get_mut("enum") {
            values.retain(|value| !value.is_null());
        }
        match object.get_mut("default") {
            Some(Value::Null) => drop(object.remove("default")),
            Some(default) => strip_nulls(default),
            None => {}
        }
        // `Option<T>` of a referenced `T` is `anyOf: [T, null]`; keep `T`.
        if let Some(Value::Array(choices)) = object.get_mut("anyOf") {
            choices.retain(|choice| choice.get("type").is_none_or(|kind| kind != "null"));
            if let [Value::Object(only)] = choices.as_slice() {
                let only = only.clone();
                object.remove("anyOf");
                for (key, value) in only {
                    object.entry(key).or_insert(value);
                }
            }
        }
    }
    transform_subschemas(&mut toml_has_no_null, schema);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::bundle::Bundle;

    /// The repository's root, from this crate's folder.
    fn repo_root() -> &'static Path {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
    }

    fn validator() -> jsonschema::Validator {
        jsonschema::draft202012::new(&schema()).unwrap_or_else(|e| panic!("the bundle schema does not compile: {e}"))
    }

    fn toml_to_json(text: &str) -> Value {
        toml::from_str::<Value>(text).unwrap_or_else(|e| panic!("not TOML: {e}"))
    }

    /// Set `KEEL_WRITE_SCHEMA=1` to rewrite the published file instead.
    #[test]
    fn the_published_schema_is_the_derived_one() {
        let path = repo_root().join("docs/bundle.schema.json");
        let derived = schema();
        if std::env::var_os("KEEL_WRITE_SCHEMA").is_some() {
            let text = serde_json::to_string_pretty(&derived).unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(&path, text + "\n").unwrap_or_else(|e| panic!("{e}"));
        }
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let published: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            published == derived,
            "docs/bundle.schema.json is not the schema the code derives; regenerate it with \
             `KEEL_WRITE_SCHEMA=1 cargo test -p keel-runtime --lib the_published_schema` \
             or `keel validate --schema > docs/bundle.schema.json`"
        );
        assert_eq!(derived["$schema"], "https://json-schema.org/draft/2020-12/schema");
        assert_eq!(derived["$id"], "https://keel.dev/schemas/bundle.schema.json");
    }

    #[test]
    fn the_example_bundle_matches_the_schema_and_an_unknown_field_does_not() {
        let dir = repo_root().join("examples/assistant");
        let text = std::fs::read_to_string(dir.join(BUNDLE_FILE)).unwrap_or_else(|e| panic!("{e}"));
        assert!(Bundle::load(&dir).is_ok(), "the loader refuses the example bundle");
        let mut example = toml_to_json(&text);
        let validator = validator();
        let errors: Vec<String> = validator.iter_errors(&example).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{errors:#?}");

        example["coworkers"]["assistant-example"]["temperature"] = json!(0.2);
        assert!(!validator.is_valid(&example));
    }

    const COWORKER: &str = "[coworkers.a]\nmodel = \"openai:m\"\ninstructions = \"x\"\n";

    /// A bundle setting every field the loader knows.
    const EVERY_FIELD: &str = r#"
[bundle]
name = "b"

[prices."openai:m"]
input = 1
output = 2.5
cached_input = 0.5

[mcp_servers.gh]
command = "npx"
args = ["-y"]
env = { A = "1" }
cwd = "srv"
startup_timeout_secs = 5
call_timeout_secs = 9

[mcp_servers.web]
url = "https://h/mcp"
headers = { Authorization = "Bearer t" }

[coworkers.a]
description = "d"
model = "openai:m"
instructions = "x"
tools = ["fs.read_file", "gh.*"]
approval_timeout_secs = 60
summary_model = "openai:s"
fallback_models = ["openai:f"]
max_steps = 3
max_output_tokens = 100
tool_digests = { "fs.read_file" = "sha256:00" }

[coworkers.a.resources]
read = ["/r"]
write = ["/w"]
network = true
env = ["E"]
shell = { timeout_secs = 5, max_timeout_secs = 50, output_limit_bytes = 9, max_processes = 300, max_file_bytes = 1 }

[coworkers.a.policies]
"fs.write_file" = "allow"
"shell.run" = { policy = "deny", allow_commands = ["ls"], allow_paths = ["docs"], expires_secs = 60 }

[coworkers.a.taint]
sources = { "gh.*" = "private" }
outbound = { "web.post" = "internal" }
on_violation = "deny"

[coworkers.a.compaction]
cap_tokens = 1000
auto_trim_on_failure = false
threshold_percent = 50

[coworkers.a.prices."openai:f"]
input = 0
output = 0
"#;

    /// Bundles the loader takes (and `keel validate` passes) and bundles it
    /// refuses: the schema must say the same about each.
    #[test]
    fn the_schema_accepts_exactly_what_the_loader_and_validate_accept() {
        let with = |extra: &str| format!("{COWORKER}{extra}");
        let cases = [
            ("a minimal bundle", with(""), true),
            ("every field", EVERY_FIELD.to_string(), true),
            ("no coworkers", "[bundle]\nname = \"b\"\n".to_string(), false),
            ("an unknown top-level table", with("[extras]\n"), false),
            ("an unknown coworker field", with("temperature = 0.2\n"), false),
            ("a missing model", "[coworkers.a]\ninstructions = \"x\"\n".to_string(), false),
            ("a model without a provider", "[coworkers.a]\nmodel = \"m\"\ninstructions = \"x\"\n".to_string(), false),
            ("blank instructions", "[coworkers.a]\nmodel = \"openai:m\"\ninstructions = \" \\n\"\n".to_string(), false),
            ("max_steps = 0", with("max_steps = 0\n"), false),
            ("a number as text", with("max_steps = \"3\"\n"), false),
            ("an unknown resource", with("[coworkers.a.resources]\nnetwrok = true\n"), false),
            ("a zero shell timeout", with("[coworkers.a.resources.shell]\ntimeout_secs = 0\n"), false),
            ("an unknown verdict", with("[coworkers.a.policies]\n\"fs.write_file\" = \"maybe\"\n"), false),
            ("a misspelt rule", with("[coworkers.a.policies]\n\"shell.run\" = { allow_command = [\"ls\"] }\n"), false),
            ("an unknown label", with("[coworkers.a.taint]\nsources = { \"fs.read_file\" = \"secret\" }\n"), false),
            ("an unknown compaction field", with("[coworkers.a.compaction]\ncap = 1\n"), false),
            ("command and url", with("[mcp_servers.x]\ncommand = \"c\"\nurl = \"http://h\"\n"), false),
            ("neither command nor url", with("[mcp_servers.x]\nheaders = {}\n"), false),
            ("an ftp url", with("[mcp_servers.x]\nurl = \"ftp://h\"\n"), false),
            ("a negative price", with("[prices.\"openai:m\"]\ninput = -1\noutput = 1\n"), false),
            ("a price without output", with("[prices.\"openai:m\"]\ninput = 1\n"), false),
        ];
        let validator = validator();
        let tools = crate::builtin_tool_names();
        let providers = ["openai".to_string()];
        for (name, text, valid) in cases {
            let loads = Bundle::from_text(Path::new("b"), &text).is_ok();
            let passes = loads && validate_text(Path::new(BUNDLE_FILE), &text, &providers, &tools).is_empty();
            assert_eq!(passes, valid, "{name}: the case is wrong about the loader and keel validate\n{text}");
            let errors: Vec<String> = validator.iter_errors(&toml_to_json(&text)).map(|e| e.to_string()).collect();
            assert_eq!(errors.is_empty(), valid, "{name}: the schema disagrees with the loader: {errors:#?}\n{text}");
        }
    }

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
