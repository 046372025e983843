//! Tool policy: whether a tool call runs, waits for a person, or is refused.
//!
//! A coworker's bundle names a policy per tool entry, either a bare verdict
//! (`"fs.write_file" = "allow"`) or a table of allow rules with a fallback
//! (`"shell.run" = { policy = "ask", allow_commands = ["git status"] }`).
//! [`evaluate`] turns one call into a [`Decision`] that names the rule that
//! decided, so the person approving and the journal both see why.
//!
//! Allow rules only ever widen `ask` to `allow`; they cannot widen `deny`,
//! and anything they cannot read with certainty falls back to the policy
//! verdict. Matching is lexical: no file is looked at and no shell is run.
//!
//! # Commands
//!
//! A rule in `allow_commands` matches a `command` whose words start with the
//! rule's words, both split like `sh` splits them: single quotes, double
//! quotes (where `\` escapes only `$`, `` ` ``, `"` and `\`), and `\` escapes
//! outside quotes. A command that `sh` would do anything with beyond running
//! those words never matches, so `ls; rm -rf ~` is not an `ls`. Refused,
//! outside single quotes unless escaped by a backslash:
//!
//! - operators: `;` `&` `|` `<` `>` `(` `)` `{` `}` anywhere (so `&&`, `||`,
//!   `>>`, `<<`, `<(`, `2>` and brace groups or brace expansion too), and a
//!   newline anywhere, even quoted or escaped;
//! - expansions: `$` in any form (`$VAR`, `${`, `$(`, `$((`, `$'`), backticks
//!   (also inside double quotes, where `sh` still expands them), glob
//!   characters `*` `?` `[`, and `~` at the start of a word or after `=` or
//!   `:` (tilde expansion);
//! - `#` at the start of a word (a comment);
//! - any other control character anywhere, an unterminated quote, and a
//!   trailing backslash.
//!
//! What remains is a simple command whose argument vector is exactly the
//! words read, so a prefix match means what it says. The rules themselves are
//! split the same way; a rule that fails to split, or is empty, matches
//! nothing. Note that a rule constrains the command line only: `shell.run`'s
//! `workdir` still chooses where it runs.
//!
//! # Paths
//!
//! A rule in `allow_paths` names a folder relative to the workspace (`docs`,
//! `docs/` and `./docs` are the same; `.` is the whole workspace). A `path`
//! matches when, with `.` and `..` resolved lexically the way the file tools
//! resolve them, it is relative, never climbs above the workspace, and lies
//! in that folder or is that folder. Absolute paths never match, even ones
//! inside the workspace; they are asked.
//!
//! A call with both a `command` and a `path` is allowed only if each is.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, IntoDeserializer, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// What a policy says about a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Allow,
    Ask,
    Deny,
}

impl Verdict {
    /// The verdict as written in bundles.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Ask => "ask",
            Verdict::Deny => "deny",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a tool behaves if run twice (declared by the tool).
pub use keel_protocol::Effect;

/// A tool's policy as written in a bundle: either a bare verdict string
/// (`"allow"` | `"ask"` | `"deny"`) or a table of rules, for example
/// `{ policy = "ask", allow_commands = ["git status", "ls"], allow_paths = ["docs/"], expires_secs = 600 }`.
//
// Serialized untagged. Deserialized by hand with the same two shapes, so a
// mistake reports what is wrong (`unknown field `allow_command``) instead of
// serde's "did not match any variant"; the JSON Schema (untagged: either
// shape) describes both directions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum PolicySpec {
    Verdict(Verdict),
    Rules(RuleSpec),
}

/// The table form of a [`PolicySpec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The verdict for calls no allow rule matches; `ask` when absent.
    #[serde(default)]
    pub policy: Option<Verdict>,
    /// Command prefixes allowed for calls with a `command` argument.
    #[serde(default)]
    pub allow_commands: Vec<String>,
    /// Workspace folders allowed for calls with a `path` argument.
    #[serde(default)]
    pub allow_paths: Vec<String>,
    /// How long an approval given under this policy lasts.
    #[serde(default)]
    pub expires_secs: Option<u64>,
}

impl<'de> Deserialize<'de> for PolicySpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SpecVisitor;

        impl<'de> Visitor<'de> for SpecVisitor {
            type Value = PolicySpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#""allow", "ask", "deny" or a table of rules"#)
            }

            fn visit_str<E: de::Error>(self, value: &str) -> Result<PolicySpec, E> {
                Verdict::deserialize(value.into_deserializer()).map(PolicySpec::Verdict)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PolicySpec, A::Error> {
                RuleSpec::deserialize(de::value::MapAccessDeserializer::new(map)).map(PolicySpec::Rules)
            }
        }

        deserializer.deserialize_any(SpecVisitor)
    }
}

/// The outcome, with the rule that decided (shown to people and journaled).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    pub verdict: Verdict,
    pub rule: String,
}

/// The verdict for a tool without a policy: reading is allowed, anything
/// else is asked.
pub fn default_verdict(effect: Effect) -> Verdict {
    match effect {
        Effect::ReadOnly => Verdict::Allow,
        Effect::Idempotent | Effect::SideEffecting => Verdict::Ask,
    }
}

/// Which spec applies to qualified tool `tool` (`server.name`) from a
/// coworker's `policies` map: the exact name wins over `<server>.*`, where
/// the server is the part before the first `.`, as in tool names.
pub fn find<'a>(policies: &'a BTreeMap<String, PolicySpec>, tool: &str) -> Option<&'a PolicySpec> {
    if let Some(spec) = policies.get(tool) {
        return Some(spec);
    }
    let (server, _) = tool.split_once('.')?;
    policies.get(&format!("{server}.*"))
}

/// How long an approval lasts under `spec`, if it says.
pub fn expires_secs(spec: Option<&PolicySpec>) -> Option<u64> {
    match spec {
        Some(PolicySpec::Rules(rules)) => rules.expires_secs,
        Some(PolicySpec::Verdict(_)) | None => None,
    }
}

/// Decides a call of `tool` with `arguments` under `spec` (see the module
/// docs for how allow rules match).
pub fn evaluate(spec: Option<&PolicySpec>, tool: &str, effect: Effect, arguments: &Value) -> Decision {
    match spec {
        None => {
            let verdict = default_verdict(effect);
            Decision { verdict, rule: format!("default for {effect} tools: {verdict}") }
        }
        Some(PolicySpec::Verdict(verdict)) => {
            Decision { verdict: *verdict, rule: format!("policy {tool} = {verdict}") }
        }
        Some(PolicySpec::Rules(rules)) => evaluate_rules(rules, tool, arguments),
    }
}

fn evaluate_rules(rules: &RuleSpec, tool: &str, arguments: &Value) -> Decision {
    let fallback = rules.policy.unwrap_or(Verdict::Ask);
    let policy = match rules.policy {
        Some(verdict) => format!("policy {tool} = {verdict}"),
        None => format!("policy {tool} = ask (the default)"),
    };
    if fallback == Verdict::Deny {
        return Decision { verdict: Verdict::Deny, rule: format!("{policy}; allow rules cannot widen a deny") };
    }
    if rules.allow_commands.is_empty() && rules.allow_paths.is_empty() {
        return Decision { verdict: fallback, rule: policy };
    }
    let otherwise = |reason: String| Decision { verdict: fallback, rule: format!("{reason}; {policy}") };
    let command = arguments.get("command");
    let path = arguments.get("path");
    if command.is_none() && path.is_none() {
        return otherwise("the call has no command or path for allow rules to match".into());
    }
    let mut allowed_by = Vec::new();
    if let Some(command) = command {
        match allowing_command(&rules.allow_commands, command) {
            Ok(rule) => allowed_by.push(format!("allow_commands: {rule:?}")),
            Err(reason) => return otherwise(reason),
        }
    }
    if let Some(path) = path {
        match allowing_path(&rules.allow_paths, path) {
            Ok(rule) => allowed_by.push(format!("allow_paths: {rule:?}")),
            Err(reason) => return otherwise(reason),
        }
    }
    Decision { verdict: Verdict::Allow, rule: allowed_by.join(", ") }
}

/// The first rule that allows `command`, or why none does.
fn allowing_command<'a>(rules: &'a [String], command: &Value) -> Result<&'a str, String> {
    let Value::String(command) = command else {
        return Err("the command is not a string, so no allow_commands rule matches".into());
    };
    if rules.is_empty() {
        return Err("allow_commands is empty".into());
    }
    let words = split_command(command).map_err(|refusal| refusal.to_string())?;
    if words.is_empty() {
        return Err("an empty command matches no allow_commands rule".into());
    }
    rules
        .iter()
        .find(|rule| split_command(rule).is_ok_and(|prefix| !prefix.is_empty() && words.starts_with(&prefix)))
        .map(String::as_str)
        .ok_or_else(|| "the command matches no allow_commands rule".into())
}

/// Why a command line never matches an allow rule.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Refusal {
    Operator(String),
    Expansion(String),
    Backtick,
    Glob(char),
    Comment,
    Newline,
    ControlCharacter(char),
    Unterminated(&'static str),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Operator(op) => write!(f, "shell operator `{op}` never matches an allow rule"),
            Refusal::Expansion(text) => write!(f, "shell expansion `{text}` never matches an allow rule"),
            Refusal::Backtick => f.write_str("command substitution with backticks never matches an allow rule"),
            Refusal::Glob(c) => write!(f, "shell glob `{c}` never matches an allow rule"),
            Refusal::Comment => f.write_str("shell comment `#` never matches an allow rule"),
            Refusal::Newline => f.write_str("a newline (a command separator) never matches an allow rule"),
            Refusal::ControlCharacter(c) => {
                write!(f, "control character U+{:04X} in the command never matches an allow rule", u32::from(*c))
            }
            Refusal::Unterminated(what) => write!(f, "unterminated {what} in the command never matches an allow rule"),
        }
    }
}

/// Operators of two characters, named whole in refusals.
const TWO_CHAR_OPERATORS: [&str; 14] =
    ["&&", "||", ">>", "<<", ";;", ";&", "|&", "&>", ">&", "<&", "<>", ">|", "<(", ">("];

/// Splits a command line into the words `sh` would run, or says why it is
/// more than a simple command (see the module docs).
fn split_command(line: &str) -> Result<Vec<String>, Refusal> {
    let chars: Vec<char> = line.chars().collect();
    let mut words = Vec::new();
    let mut word = String::new();
    // Whether a word has started; `''` is an empty word, not nothing.
    let mut in_word = false;
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        check_control(c)?;
        match c {
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                i += 1;
            }
            '\\' => {
                let &escaped = chars.get(i + 1).ok_or(Refusal::Unterminated("backslash"))?;
                check_control(escaped)?;
                word.push(escaped);
                in_word = true;
                i += 2;
            }
            '\'' => {
                let close =
                    chars[i + 1..].iter().position(|&q| q == '\'').ok_or(Refusal::Unterminated("single quote"))?;
                for &quoted in &chars[i + 1..i + 1 + close] {
                    check_control(quoted)?;
                    word.push(quoted);
                }
                in_word = true;
                i += close + 2;
            }
            '"' => {
                i = read_double_quoted(&chars, i + 1, &mut word)?;
                in_word = true;
            }
            ';' | '&' | '|' | '<' | '>' | '(' | ')' | '{' | '}' => {
                let pair: String = chars[i..chars.len().min(i + 2)].iter().collect();
                let op = if TWO_CHAR_OPERATORS.contains(&pair.as_str()) { pair } else { c.to_string() };
                return Err(Refusal::Operator(op));
            }
            '$' => return Err(Refusal::Expansion(dollar_expansion(&chars[i..]))),
            '`' => return Err(Refusal::Backtick),
            '*' | '?' | '[' => return Err(Refusal::Glob(c)),
            '~' if !in_word || matches!(i.checked_sub(1).map(|p| chars[p]), Some('=' | ':')) => {
                return Err(Refusal::Expansion("~".into()));
            }
            '#' if !in_word => return Err(Refusal::Comment),
            _ => {
                word.push(c);
                in_word = true;
                i += 1;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

/// Reads a double-quoted string starting after its opening quote into
/// `word`; returns the index after the closing quote.
fn read_double_quoted(chars: &[char], mut i: usize, word: &mut String) -> Result<usize, Refusal> {
    loop {
        let &c = chars.get(i).ok_or(Refusal::Unterminated("double quote"))?;
        check_control(c)?;
        match c {
            '"' => return Ok(i + 1),
            '$' => return Err(Refusal::Expansion(dollar_expansion(&chars[i..]))),
            '`' => return Err(Refusal::Backtick),
            '\\' => match chars.get(i + 1) {
                Some(&escaped @ ('$' | '`' | '"' | '\\')) => {
                    word.push(escaped);
                    i += 2;
                }
                // Elsewhere a backslash is itself; what follows is read as usual.
                _ => {
                    word.push('\\');
                    i += 1;
                }
            },
            _ => {
                word.push(c);
                i += 1;
            }
        }
    }
}

fn check_control(c: char) -> Result<(), Refusal> {
    match c {
        '\n' => Err(Refusal::Newline),
        '\t' => Ok(()),
        c if c.is_control() => Err(Refusal::ControlCharacter(c)),
        _ => Ok(()),
    }
}

/// The expansion starting at a `$`, for naming it in a refusal.
fn dollar_expansion(from: &[char]) -> String {
    match from.get(1) {
        Some('(') if from.get(2) == Some(&'(') => "$((".into(),
        Some(&c @ ('(' | '{' | '\'' | '"')) => format!("${c}"),
        Some(&c) if c.is_ascii_alphabetic() || c == '_' => {
            let name: String =
                from[1..].iter().take_while(|n| n.is_ascii_alphanumeric() || **n == '_').take(32).collect();
            format!("${name}")
        }
        Some(&c) if !c.is_whitespace() && !c.is_control() => format!("${c}"),
        _ => "$".into(),
    }
}

/// The first rule that allows `path`, or why none does.
fn allowing_path<'a>(rules: &'a [String], path: &Value) -> Result<&'a str, String> {
    let Value::String(path) = path else {
        return Err("the path is not a string, so no allow_paths rule matches".into());
    };
    if rules.is_empty() {
        return Err("allow_paths is empty".into());
    }
    let parts = match workspace_path(path) {
        Ok(parts) => parts,
        Err(PathRefusal::Empty) => return Err("an empty path matches no allow_paths rule".into()),
        Err(PathRefusal::ControlCharacter) => {
            return Err("a path with a control character never matches allow_paths".into());
        }
        Err(PathRefusal::Absolute) => return Err(format!("absolute path {path} never matches allow_paths")),
        Err(PathRefusal::Escapes) => return Err(format!("path {path} is outside allow_paths")),
    };
    rules
        .iter()
        .find(|rule| workspace_path(rule).is_ok_and(|folder| parts.starts_with(&folder)))
        .map(String::as_str)
        .ok_or_else(|| format!("path {path} is outside allow_paths"))
}

/// Why a path is not a place inside the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathRefusal {
    Empty,
    ControlCharacter,
    Absolute,
    Escapes,
}

/// The components of a workspace-relative path with `.` and `..` resolved
/// lexically; `.` is the workspace itself (no components).
fn workspace_path(path: &str) -> Result<Vec<&str>, PathRefusal> {
    if path.trim().is_empty() {
        return Err(PathRefusal::Empty);
    }
    if path.chars().any(char::is_control) {
        return Err(PathRefusal::ControlCharacter);
    }
    if path.starts_with('/') {
        return Err(PathRefusal::Absolute);
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop().ok_or(PathRefusal::Escapes)?;
            }
            part => parts.push(part),
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rules(policy: Option<Verdict>, commands: &[&str], paths: &[&str]) -> PolicySpec {
        PolicySpec::Rules(RuleSpec {
            policy,
            allow_commands: commands.iter().map(|c| c.to_string()).collect(),
            allow_paths: paths.iter().map(|p| p.to_string()).collect(),
            expires_secs: None,
        })
    }

    fn shell(spec: &PolicySpec, command: &str) -> Decision {
        evaluate(Some(spec), "shell.run", Effect::SideEffecting, &json!({ "command": command }))
    }

    fn file(spec: &PolicySpec, path: &str) -> Decision {
        evaluate(Some(spec), "fs.write_file", Effect::SideEffecting, &json!({ "path": path, "content": "x" }))
    }

    #[test]
    fn verdicts_are_written_in_snake_case() {
        for (verdict, text) in [(Verdict::Allow, "allow"), (Verdict::Ask, "ask"), (Verdict::Deny, "deny")] {
            assert_eq!(serde_json::to_value(verdict).ok(), Some(json!(text)));
            assert_eq!(serde_json::from_value::<Verdict>(json!(text)).ok(), Some(verdict));
            assert_eq!(verdict.to_string(), text);
        }
        assert!(serde_json::from_value::<Verdict>(json!("Allow")).is_err());
        assert_eq!(serde_json::to_value(Effect::ReadOnly).ok(), Some(json!("read_only")));
        assert_eq!(Effect::default(), Effect::SideEffecting);
    }

    #[test]
    fn without_a_spec_reading_is_allowed_and_the_rest_asked() {
        let cases = [
            (Effect::ReadOnly, Verdict::Allow, "default for read-only tools: allow"),
            (Effect::Idempotent, Verdict::Ask, "default for idempotent tools: ask"),
            (Effect::SideEffecting, Verdict::Ask, "default for side-effecting tools: ask"),
        ];
        for (effect, verdict, rule) in cases {
            assert_eq!(default_verdict(effect), verdict);
            assert_eq!(evaluate(None, "fs.read_file", effect, &json!({})), Decision { verdict, rule: rule.into() });
        }
    }

    #[test]
    fn a_bare_verdict_decides_every_call() {
        for verdict in [Verdict::Allow, Verdict::Ask, Verdict::Deny] {
            let spec = PolicySpec::Verdict(verdict);
            let decision = evaluate(Some(&spec), "fs.write_file", Effect::ReadOnly, &json!({ "path": "docs/a" }));
            assert_eq!(decision, Decision { verdict, rule: format!("policy fs.write_file = {verdict}") });
        }
    }

    #[test]
    fn exact_names_win_over_server_wildcards() {
        let policies: BTreeMap<String, PolicySpec> = [
            ("fs.*".to_string(), PolicySpec::Verdict(Verdict::Ask)),
            ("fs.write_file".to_string(), PolicySpec::Verdict(Verdict::Deny)),
            ("github.issues.create".to_string(), PolicySpec::Verdict(Verdict::Allow)),
        ]
        .into();
        let cases = [
            ("fs.write_file", Some(Verdict::Deny)),
            ("fs.read_file", Some(Verdict::Ask)),
            ("github.issues.create", Some(Verdict::Allow)),
            ("github.issues.close", None),
            ("shell.run", None),
            ("fs", None),
            ("fsx.read", None),
        ];
        for (tool, expected) in cases {
            let found = find(&policies, tool).map(|spec| match spec {
                PolicySpec::Verdict(v) => *v,
                PolicySpec::Rules(_) => Verdict::Allow,
            });
            assert_eq!(found, expected, "{tool}");
        }
    }

    #[test]
    fn expiry_comes_from_the_table_form_only() {
        let table = PolicySpec::Rules(RuleSpec { expires_secs: Some(600), ..RuleSpec::default() });
        assert_eq!(expires_secs(Some(&table)), Some(600));
        assert_eq!(expires_secs(Some(&PolicySpec::Verdict(Verdict::Allow))), None);
        assert_eq!(expires_secs(None), None);
    }

    #[derive(Debug, Deserialize)]
    struct Bundle {
        policies: BTreeMap<String, PolicySpec>,
    }

    fn parse(text: &str) -> Result<BTreeMap<String, PolicySpec>, String> {
        toml::from_str::<Bundle>(text).map(|b| b.policies).map_err(|e| e.to_string())
    }

    #[test]
    fn bundles_write_policies_bare_or_as_tables() {
        let policies = parse(
            r#"
            [policies]
            "fs.write_file" = "allow"
            "fs.*" = "deny"
            "shell.run" = { policy = "ask", allow_commands = ["git status", "cargo test"], expires_secs = 600 }

            [policies."notes.write"]
            allow_paths = ["notes/"]
            "#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policies["fs.write_file"], PolicySpec::Verdict(Verdict::Allow));
        assert_eq!(policies["fs.*"], PolicySpec::Verdict(Verdict::Deny));
        assert_eq!(
            policies["shell.run"],
            PolicySpec::Rules(RuleSpec {
                policy: Some(Verdict::Ask),
                allow_commands: vec!["git status".into(), "cargo test".into()],
                allow_paths: Vec::new(),
                expires_secs: Some(600),
            })
        );
        assert_eq!(policies["notes.write"], rules(None, &[], &["notes/"]));
        // The same shapes come back out of JSON.
        for spec in policies.values() {
            let json = serde_json::to_value(spec).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(serde_json::from_value::<PolicySpec>(json).ok().as_ref(), Some(spec));
        }
    }

    #[test]
    fn bundle_mistakes_are_named() {
        let cases = [
            (r#"policies = { "shell.run" = { allow_command = ["ls"] } }"#, "allow_command"),
            (r#"policies = { "shell.run" = { policy = "maybe" } }"#, "maybe"),
            (r#"policies = { "fs.write_file" = "alow" }"#, "alow"),
            (r#"policies = { "fs.write_file" = "Allow" }"#, "Allow"),
            (r#"policies = { "fs.write_file" = 1 }"#, "table of rules"),
        ];
        for (text, named) in cases {
            match parse(text) {
                Ok(p) => panic!("{text} parsed as {p:?}"),
                Err(e) => assert!(e.contains(named), "{text}: {e}"),
            }
        }
    }

    #[test]
    fn command_rules_match_whole_leading_words() {
        let spec = rules(None, &["git status", "ls", "cargo test"], &[]);
        let allowed = [
            ("git status", "git status"),
            ("git status --short", "git status"),
            ("git  status", "git status"),
            ("  git\tstatus  ", "git status"),
            ("'git' status", "git status"),
            ("\"git\" st'at'us", "git status"),
            ("g\\it status", "git status"),
            ("ls", "ls"),
            ("ls -la src", "ls"),
            ("ls 'a;b'", "ls"),
            ("ls \"a;b\"", "ls"),
            ("ls 'a $(b) `c` *'", "ls"),
            ("ls \"a\\$b\"", "ls"),
            ("ls a\\;b", "ls"),
            ("ls \"\"", "ls"),
            ("ls a#b", "ls"),
            ("ls HEAD~1", "ls"),
            ("cargo test -p keel-core", "cargo test"),
        ];
        for (command, rule) in allowed {
            let decision = shell(&spec, command);
            assert_eq!(decision.verdict, Verdict::Allow, "{command:?}: {}", decision.rule);
            assert_eq!(decision.rule, format!("allow_commands: {rule:?}"), "{command:?}");
        }
    }

    #[test]
    fn commands_that_are_not_a_rule_plus_words_are_asked() {
        let spec = rules(None, &["git status", "ls", "cat", "echo"], &[]);
        let asked = [
            ("git statusx", "matches no allow_commands rule"),
            ("git", "matches no allow_commands rule"),
            ("git push", "matches no allow_commands rule"),
            ("gitstatus", "matches no allow_commands rule"),
            ("ls; rm -rf ~", "shell operator `;`"),
            ("ls;", "shell operator `;`"),
            ("ls && rm x", "shell operator `&&`"),
            ("ls || rm x", "shell operator `||`"),
            ("ls & rm x", "shell operator `&`"),
            ("ls | sh", "shell operator `|`"),
            ("ls > out", "shell operator `>`"),
            ("ls >> out", "shell operator `>>`"),
            ("cat x > /etc/y", "shell operator `>`"),
            ("cat 2>/dev/null", "shell operator `>`"),
            ("cat < /etc/shadow", "shell operator `<`"),
            ("cat <(rm x)", "shell operator `<(`"),
            ("ls (x)", "shell operator `(`"),
            ("ls { x; }", "shell operator `{`"),
            ("ls a{b,c}", "shell operator `{`"),
            ("ls $(whoami)", "shell expansion `$(`"),
            ("ls $((1+1))", "shell expansion `$((`"),
            ("ls `whoami`", "backticks"),
            ("echo $HOME", "shell expansion `$HOME`"),
            ("echo ${HOME}", "shell expansion `${`"),
            ("echo $1", "shell expansion `$1`"),
            ("echo $'\\x41'", "shell expansion `$'`"),
            ("echo a$", "shell expansion `$`"),
            ("ls \"$(x)\"", "shell expansion `$(`"),
            ("ls \"$HOME\"", "shell expansion `$HOME`"),
            ("ls \"`x`\"", "backticks"),
            ("ls *", "shell glob `*`"),
            ("ls a?", "shell glob `?`"),
            ("ls [ab]", "shell glob `[`"),
            ("ls ~", "shell expansion `~`"),
            ("ls ~/x", "shell expansion `~`"),
            ("ls a=~/x", "shell expansion `~`"),
            ("ls # comment", "shell comment `#`"),
            ("ls\nrm -rf ~", "newline"),
            ("ls 'a\nb'", "newline"),
            ("ls \\\nrm", "newline"),
            ("ls\r", "U+000D"),
            ("ls 'x", "unterminated single quote"),
            ("ls \"x", "unterminated double quote"),
            ("ls \"x\\\"", "unterminated double quote"),
            ("ls x\\", "unterminated backslash"),
            ("", "empty command"),
            ("   ", "empty command"),
        ];
        for (command, reason) in asked {
            let decision = shell(&spec, command);
            assert_eq!(decision.verdict, Verdict::Ask, "{command:?}");
            assert!(decision.rule.contains(reason), "{command:?}: {}", decision.rule);
            assert!(decision.rule.ends_with("; policy shell.run = ask (the default)"), "{}", decision.rule);
        }
    }

    #[test]
    fn rules_that_cannot_be_read_match_nothing() {
        let spec = rules(None, &["", "ls *", "ls | cat", "'ls"], &[]);
        for command in ["ls", "ls *", "ls | cat", "'ls"] {
            assert_eq!(shell(&spec, command).verdict, Verdict::Ask, "{command:?}");
        }
    }

    #[test]
    fn path_rules_match_folders_inside_the_workspace() {
        let spec = rules(None, &[], &["docs/", "notes", "./src/keel"]);
        let cases = [
            ("docs/a.md", Some("docs/")),
            ("./docs/a.md", Some("docs/")),
            ("docs", Some("docs/")),
            ("docs/", Some("docs/")),
            ("docs//deep/./a.md", Some("docs/")),
            ("notes/x/../y", Some("notes")),
            ("tmp/../docs/a", Some("docs/")),
            ("src/keel/lib.rs", Some("./src/keel")),
            ("src/lib.rs", None),
            ("docs/../secret", None),
            ("docs/../../x", None),
            ("../docs/a", None),
            ("/abs/docs/a", None),
            ("/docs/a", None),
            ("docs2/a", None),
            ("docsx", None),
            (".", None),
            ("", None),
            ("docs/a\nb", None),
        ];
        for (path, rule) in cases {
            let decision = file(&spec, path);
            match rule {
                Some(rule) => assert_eq!(
                    decision,
                    Decision { verdict: Verdict::Allow, rule: format!("allow_paths: {rule:?}") },
                    "{path:?}"
                ),
                None => assert_eq!(decision.verdict, Verdict::Ask, "{path:?}: {}", decision.rule),
            }
        }
        assert!(file(&spec, "../x").rule.starts_with("path ../x is outside allow_paths;"));
        assert!(file(&spec, "/abs/docs/a").rule.starts_with("absolute path /abs/docs/a never matches"));
    }

    #[test]
    fn the_whole_workspace_can_be_allowed_but_never_beyond() {
        let spec = rules(None, &[], &["."]);
        for path in [".", "a", "a/b/../c"] {
            assert_eq!(file(&spec, path).verdict, Verdict::Allow, "{path:?}");
        }
        for path in ["..", "a/../..", "/etc/passwd"] {
            assert_eq!(file(&spec, path).verdict, Verdict::Ask, "{path:?}");
        }
        let escaping = rules(None, &[], &["..", "/", ""]);
        for path in ["a", "../a"] {
            assert_eq!(file(&escaping, path).verdict, Verdict::Ask, "{path:?}");
        }
    }

    #[test]
    fn deny_with_rules_stays_deny() {
        let spec = rules(Some(Verdict::Deny), &["ls"], &["docs"]);
        assert_eq!(shell(&spec, "ls").verdict, Verdict::Deny);
        assert_eq!(file(&spec, "docs/a").verdict, Verdict::Deny);
        assert_eq!(shell(&spec, "ls").rule, "policy shell.run = deny; allow rules cannot widen a deny");
    }

    #[test]
    fn unmatched_calls_get_the_policy_verdict() {
        let allow = rules(Some(Verdict::Allow), &["ls"], &[]);
        let decision = shell(&allow, "rm x");
        assert_eq!(decision.verdict, Verdict::Allow);
        assert_eq!(decision.rule, "the command matches no allow_commands rule; policy shell.run = allow");

        let ask = rules(Some(Verdict::Ask), &["ls"], &["docs"]);
        let other_shapes = [json!({}), json!({ "query": "x" }), json!("ls"), json!(null)];
        for arguments in other_shapes {
            let decision = evaluate(Some(&ask), "web.search", Effect::ReadOnly, &arguments);
            assert_eq!(decision.verdict, Verdict::Ask, "{arguments}");
            assert!(decision.rule.starts_with("the call has no command or path"), "{}", decision.rule);
        }
        let not_strings = [json!({ "command": ["ls"] }), json!({ "path": 3 })];
        for arguments in not_strings {
            assert_eq!(evaluate(Some(&ask), "x.y", Effect::ReadOnly, &arguments).verdict, Verdict::Ask, "{arguments}");
        }
        let no_rules = PolicySpec::Rules(RuleSpec { policy: Some(Verdict::Allow), ..RuleSpec::default() });
        assert_eq!(
            shell(&no_rules, "rm -rf /"),
            Decision { verdict: Verdict::Allow, rule: "policy shell.run = allow".into() }
        );
        assert_eq!(shell(&PolicySpec::Rules(RuleSpec::default()), "ls").verdict, Verdict::Ask);
    }

    #[test]
    fn either_rule_kind_may_allow_but_a_call_with_both_fields_needs_both() {
        let spec = rules(None, &["ls"], &["docs"]);
        assert_eq!(shell(&spec, "ls").verdict, Verdict::Allow);
        assert_eq!(file(&spec, "docs/a").verdict, Verdict::Allow);
        let call = |command: &str, path: &str| {
            evaluate(Some(&spec), "x.both", Effect::SideEffecting, &json!({ "command": command, "path": path }))
        };
        assert_eq!(
            call("ls", "docs/a"),
            Decision { verdict: Verdict::Allow, rule: r#"allow_commands: "ls", allow_paths: "docs""#.into() }
        );
        assert_eq!(call("ls", "src/a").verdict, Verdict::Ask);
        assert_eq!(call("rm x", "docs/a").verdict, Verdict::Ask);
        let paths_only = rules(None, &[], &["docs"]);
        assert_eq!(
            evaluate(Some(&paths_only), "x.both", Effect::ReadOnly, &json!({ "command": "ls", "path": "docs" }))
                .verdict,
            Verdict::Ask
        );
    }
}
