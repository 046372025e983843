//! The built-in tools that change and search files: `edit_file` (exact
//! match replacement), `glob` and `grep`.
//!
//! `edit_file` refuses an `old_text` that is absent or ambiguous (unless
//! `replace_all`), so a model never edits a place it did not mean. `glob`
//! and `grep` stop at a result cap with a note saying so.
//!
//! `glob` and `grep` walk with the `ignore` crate, as ripgrep does:
//! - `.gitignore` and `.ignore` files inside the workspace are honoured, at
//!   every level, whether or not the workspace is a git repository (a
//!   `.ignore` rule wins over a `.gitignore` one in the same folder). No
//!   ignore file outside the workspace is read: not git's global excludes,
//!   not `.git/info/exclude`, not a parent folder's `.gitignore`. They are
//!   registered as custom ignore file names because the crate's git options
//!   probe every ancestor folder up to `/` even when parents are off.
//! - [`SKIPPED_FOLDERS`] (version-control metadata, `node_modules`) are
//!   skipped even when no ignore file names them.
//! - Hidden files are searched, as before (only `.git` was skipped):
//!   `.github/`, `.env.example` and the like are often what the model is
//!   looking for.
//! - Symbolic links are not followed, and the walk starts at the canonical
//!   workspace, so it cannot leave it; a folder the model names is first
//!   resolved by [`crate::workspace::resolve`].
//! - What the model names explicitly is searched even if ignored, like
//!   `rg PATTERN build/`: `grep` on an ignored file or folder, and `glob`
//!   with a pattern that starts inside one (`node_modules/foo/*.js`) or has
//!   no wildcard at all. Ignore rules still apply below a named folder, but
//!   those of the folders above it do not.

use std::path::Path;

use ignore::{DirEntry, WalkBuilder};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::builtin::parse_path;
use crate::{BoxFuture, Tool, ToolContext, ToolDescriptor, ToolOutput};

/// Most paths `glob` returns and most lines `grep` returns.
pub const MATCH_LIMIT: usize = 500;
/// Files larger than this are skipped by `grep`.
pub const GREP_FILE_LIMIT: u64 = 4 * 1024 * 1024;
/// Folders `glob` and `grep` never enter unless named: huge, and never what
/// the model is after.
pub const SKIPPED_FOLDERS: [&str; 4] = [".git", ".hg", ".svn", "node_modules"];

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
            let root = match context.workspace.canonicalize() {
                Ok(root) => root,
                Err(e) => return ToolOutput::error(format!("the workspace cannot be opened: {e}")),
            };
            let wild = |part: &String| part.contains(['*', '?']);
            // The folders the pattern names before its first wildcard: the
            // walk starts there, and they are searched even if ignored.
            let literal = pattern.iter().take_while(|part| !wild(part)).count().min(pattern.len() - 1);
            let named = match pattern[..literal].join("/") {
                prefix if prefix.is_empty() => root.clone(),
                prefix => match crate::workspace::resolve(&root, &prefix) {
                    Ok(named) => named,
                    Err(e) => return ToolOutput::error(e.to_string()),
                },
            };
            let exact = !pattern.iter().any(wild);
            let found = tokio::task::spawn_blocking(move || {
                let mut found = Vec::new();
                if exact {
                    // No wildcard: the path itself, ignored or not, if it is a file.
                    let file = named.join(&pattern[pattern.len() - 1]);
                    if file.symlink_metadata().is_ok_and(|m| m.is_file())
                        && let Ok(relative) = file.strip_prefix(&root)
                    {
                        found.push(relative.to_string_lossy().replace('\\', "/"));
                    }
                    return found;
                }
                walk(&root, &named, &mut |relative, _| {
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

/// Visits every regular file under `start` (a folder in the canonical
/// workspace `root`), with its path relative to `root`, until `visit`
/// returns false; see the module docs for what is skipped.
fn walk(root: &Path, start: &Path, visit: &mut dyn FnMut(&str, &Path) -> bool) {
    // From the root, so the ignore files of the folders above `start` apply;
    // only the way down to `start` and what lies below it is entered.
    let mut reached = start == root;
    let target = start.to_path_buf();
    let on_the_way = move |entry: &DirEntry| entry.path().starts_with(&target) || target.starts_with(entry.path());
    for entry in walker(root, on_the_way).flatten() {
        if entry.path() == start && entry.file_type().is_some_and(|t| t.is_dir()) {
            reached = true;
        }
        if !visit_file(root, &entry, visit) {
            return;
        }
    }
    if !reached {
        // `start` is ignored (or is a link to a folder in the workspace):
        // named explicitly, it is searched anyway.
        for entry in walker(start, |_| true).flatten() {
            if !visit_file(root, &entry, visit) {
                return;
            }
        }
    }
}

/// The walk from `top` (which is always entered), into what `keep` accepts.
fn walker(top: &Path, keep: impl Fn(&DirEntry) -> bool + Send + Sync + 'static) -> ignore::Walk {
    WalkBuilder::new(top)
        // Off: hidden-file skipping, parent folders' ignore files, git's
        // global and repository excludes. On again: the two ignore files.
        .standard_filters(false)
        .add_custom_ignore_filename(".gitignore")
        .add_custom_ignore_filename(".ignore")
        // A no-op with the git options off; stated for the reader: a
        // workspace need not be a repository for its .gitignore to count.
        .require_git(false)
        .follow_links(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .filter_entry(move |entry| !SKIPPED_FOLDERS.iter().any(|name| entry.file_name() == *name) && keep(entry))
        .build()
}

/// Calls `visit` if `entry` is a regular file (not a link); false to stop.
fn visit_file(root: &Path, entry: &DirEntry, visit: &mut dyn FnMut(&str, &Path) -> bool) -> bool {
    if !entry.file_type().is_some_and(|t| t.is_file()) {
        return true;
    }
    let path = entry.path();
    let relative = path.strip_prefix(root).unwrap_or(path).to_string_lossy().replace('\\', "/");
    visit(&relative, path)
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
