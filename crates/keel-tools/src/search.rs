//! The built-in tools that change and search files: `edit_file` (exact
//! match replacement), `glob` and `grep`.
//!
//! `edit_file` refuses an `old_text` that is absent or ambiguous (unless
//! `replace_all`), so a model never edits a place it did not mean. `glob`
//! and `grep` walk the workspace without following symbolic links, skip
//! `.git`, and stop at a result cap with a note saying so.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::builtin::parse_path;
use crate::{BoxFuture, Tool, ToolContext, ToolDescriptor, ToolOutput};

/// Most paths `glob` returns and most lines `grep` returns.
pub const MATCH_LIMIT: usize = 500;
/// Files larger than this are skipped by `grep`.
pub const GREP_FILE_LIMIT: u64 = 4 * 1024 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old_text: String,
    new_text: String,
    #[serde(default)]
    replace_all: bool,
}

/// Replaces exact text in a workspace file.
pub struct EditFile;

impl Tool for EditFile {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: "fs.edit_file".into(),
            effect: keel_protocol::Effect::SideEffecting,
            version: "1".into(),
            description:
                "Replace exact text in a workspace file. old_text must occur exactly once unless replace_all is true."
                    .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path relative to the workspace"},
                    "old_text": {"type": "string", "description": "The exact text to replace"},
                    "new_text": {"type": "string", "description": "The replacement"},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence"}
                },
                "required": ["path", "old_text", "new_text"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(&'a self, context: &'a ToolContext, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let (args, path) = match parse_path::<EditArgs>(context, arguments, |a| &a.path) {
                Ok(parsed) => parsed,
                Err(output) => return output,
            };
            if args.old_text.is_empty() {
                return ToolOutput::error("old_text is empty; give the exact text to replace");
            }
            let text = match tokio::fs::read_to_string(&path).await {
                Ok(text) => text,
                Err(e) => return ToolOutput::error(format!("cannot read {}: {e}", args.path)),
            };
            let count = text.matches(&args.old_text).count();
            if count == 0 {
                return ToolOutput::error(format!(
                    "old_text was not found in {}; read the file and copy the text exactly",
                    args.path
                ));
            }
            if count > 1 && !args.replace_all {
                return ToolOutput::error(format!(
                    "old_text occurs {count} times in {}; include more surrounding text to make it unique, or set replace_all",
                    args.path
                ));
            }
            let edited = text.replace(&args.old_text, &args.new_text);
            match tokio::fs::write(&path, edited).await {
                Ok(()) => ToolOutput::ok(format!("replaced {count} occurrence(s) in {}", args.path)),
                Err(e) => ToolOutput::error(format!("cannot write {}: {e}", args.path)),
            }
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GlobArgs {
    pattern: String,
}

/// Finds workspace paths matching a glob pattern.
pub struct Glob;

impl Tool for Glob {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: "fs.glob".into(),
            effect: keel_protocol::Effect::ReadOnly,
            version: "1".into(),
            description: "List workspace files matching a glob pattern: * and ? match within a name, ** matches any folders. Example: src/**/*.rs".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"pattern": {"type": "string", "description": "Glob pattern relative to the workspace"}},
                "required": ["pattern"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(&'a self, context: &'a ToolContext, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let args: GlobArgs = match crate::builtin::parse(arguments) {
                Ok(args) => args,
                Err(output) => return output,
            };
            let pattern: Vec<String> = args.pattern.trim_start_matches("./").split('/').map(String::from).collect();
            if pattern.iter().any(|part| part == "..") || args.pattern.starts_with('/') {
                return ToolOutput::error("the pattern must stay inside the workspace: no leading / and no ..");
            }
            let root = context.workspace.clone();
            let found = tokio::task::spawn_blocking(move || {
                let mut found = Vec::new();
                walk(&root, &root, &mut |relative, _| {
                    let parts: Vec<&str> = relative.split('/').collect();
                    if glob_match(&pattern, &parts) {
                        found.push(relative.to_string());
                    }
                    found.len() <= MATCH_LIMIT
                });
                found
            })
            .await
            .unwrap_or_default();
            listing(found, "paths")
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
}

/// Searches workspace files for a regular expression.
pub struct Grep;

impl Tool for Grep {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: "fs.grep".into(),
            effect: keel_protocol::Effect::ReadOnly,
            version: "1".into(),
            description: "Search workspace text files for a regular expression; prints path:line: text for each match."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "A regular expression (Rust regex syntax)"},
                    "path": {"type": "string", "description": "A file or folder to search, relative to the workspace; default the whole workspace"}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(&'a self, context: &'a ToolContext, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let args: GrepArgs = match crate::builtin::parse(arguments) {
                Ok(args) => args,
                Err(output) => return output,
            };
            let regex = match regex::RegexBuilder::new(&args.pattern).size_limit(1 << 20).build() {
                Ok(regex) => regex,
                Err(e) => return ToolOutput::error(format!("invalid pattern: {e}")),
            };
            let start = match crate::workspace::resolve(&context.workspace, args.path.as_deref().unwrap_or(".")) {
                Ok(start) => start,
                Err(e) => return ToolOutput::error(e.to_string()),
            };
            let root = match context.workspace.canonicalize() {
                Ok(root) => root,
                Err(e) => return ToolOutput::error(format!("the workspace cannot be opened: {e}")),
            };
            let found = tokio::task::spawn_blocking(move || {
                let mut found = Vec::new();
                let mut search = |relative: &str, file: &Path| {
                    if std::fs::metadata(file).map(|m| m.len() > GREP_FILE_LIMIT).unwrap_or(true) {
                        return true;
                    }
                    let Ok(text) = std::fs::read_to_string(file) else { return true };
                    for (number, line) in text.lines().enumerate() {
                        if regex.is_match(line) {
                            found.push(format!(
                                "{relative}:{}: {}",
                                number + 1,
                                line.chars().take(300).collect::<String>()
                            ));
                            if found.len() > MATCH_LIMIT {
                                return false;
                            }
                        }
                    }
                    true
                };
                if start.is_file() {
                    let relative = start.strip_prefix(&root).unwrap_or(&start).display().to_string();
                    search(&relative, &start);
                } else {
                    walk(&root, &start, &mut search);
                }
                found
            })
            .await
            .unwrap_or_default();
            listing(found, "matching lines")
        })
    }
}

fn listing(mut found: Vec<String>, what: &str) -> ToolOutput {
    if found.is_empty() {
        return ToolOutput::ok(format!("no {what}"));
    }
    let cut = found.len() > MATCH_LIMIT;
    found.truncate(MATCH_LIMIT);
    if cut {
        found.push(format!("[keel: stopped at {MATCH_LIMIT} {what}]"));
    }
    ToolOutput::ok(found.join("\n"))
}

/// Visits every regular file under `dir` (no symlinks, no `.git`), with its
/// path relative to `root`, until `visit` returns false.
fn walk(root: &Path, dir: &Path, visit: &mut dyn FnMut(&str, &Path) -> bool) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return true };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for path in entries {
        let Ok(meta) = path.symlink_metadata() else { continue };
        if meta.file_type().is_symlink() || path.file_name().is_some_and(|n| n == ".git") {
            continue;
        }
        if meta.is_dir() {
            if !walk(root, &path, visit) {
                return false;
            }
        } else if meta.is_file() {
            let relative = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().replace('\\', "/");
            if !visit(&relative, &path) {
                return false;
            }
        }
    }
    true
}

/// Matches path parts against pattern parts; `**` matches zero or more parts.
fn glob_match(pattern: &[String], parts: &[&str]) -> bool {
    match pattern.split_first() {
        None => parts.is_empty(),
        Some((first, rest)) if first == "**" => (0..=parts.len()).any(|skip| glob_match(rest, &parts[skip..])),
        Some((first, rest)) => match parts.split_first() {
            Some((part, remaining)) => name_match(first.as_bytes(), part.as_bytes()) && glob_match(rest, remaining),
            None => false,
        },
    }
}

/// `*` and `?` within one path part.
fn name_match(pattern: &[u8], name: &[u8]) -> bool {
    match pattern.split_first() {
        None => name.is_empty(),
        Some((b'*', rest)) => (0..=name.len()).any(|skip| name_match(rest, &name[skip..])),
        Some((b'?', rest)) => !name.is_empty() && name_match(rest, &name[1..]),
        Some((c, rest)) => name.first() == Some(c) && name_match(rest, &name[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> (tempfile::TempDir, ToolContext) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let workspace = dir.path().to_path_buf();
        std::fs::create_dir_all(workspace.join("src/deep")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(workspace.join("src/a.rs"), "fn main() {}\n// TODO one\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(workspace.join("src/deep/b.rs"), "// TODO two\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(workspace.join("notes.txt"), "x x\n").unwrap_or_else(|e| panic!("{e}"));
        (dir, ToolContext::new("s", workspace))
    }

    #[test]
    fn globs_match_names_and_folders() {
        let p = |s: &str| s.split('/').map(String::from).collect::<Vec<_>>();
        assert!(glob_match(&p("src/**/*.rs"), &["src", "a.rs"]));
        assert!(glob_match(&p("src/**/*.rs"), &["src", "deep", "b.rs"]));
        assert!(!glob_match(&p("src/*.rs"), &["src", "deep", "b.rs"]));
        assert!(glob_match(&p("?otes.*"), &["notes.txt"]));
    }

    #[tokio::test]
    async fn glob_grep_and_edit_work_inside_the_workspace() {
        let (_d, ctx) = context();
        assert_eq!(Glob.call(&ctx, json!({"pattern": "src/**/*.rs"})).await, ToolOutput::ok("src/a.rs\nsrc/deep/b.rs"));
        assert_eq!(
            Grep.call(&ctx, json!({"pattern": "TODO \\w+"})).await,
            ToolOutput::ok("src/a.rs:2: // TODO one\nsrc/deep/b.rs:1: // TODO two")
        );
        assert!(Glob.call(&ctx, json!({"pattern": "../*"})).await.is_error);
        assert!(Grep.call(&ctx, json!({"pattern": "x", "path": "../"})).await.is_error);
        let ambiguous = EditFile.call(&ctx, json!({"path": "notes.txt", "old_text": "x", "new_text": "y"})).await;
        assert!(ambiguous.is_error && ambiguous.text.contains("2 times"));
        let all = EditFile
            .call(&ctx, json!({"path": "notes.txt", "old_text": "x", "new_text": "y", "replace_all": true}))
            .await;
        assert!(!all.is_error);
        assert_eq!(std::fs::read_to_string(ctx.workspace.join("notes.txt")).unwrap_or_default(), "y y\n");
        let missing = EditFile.call(&ctx, json!({"path": "notes.txt", "old_text": "zzz", "new_text": "y"})).await;
        assert!(missing.is_error && missing.text.contains("not found"));
    }
}
