//! The built-in workspace tools `fs.read_file`, `fs.write_file` and
//! `fs.list_dir`, the list of every built-in file tool, and the descriptor
//! of `shell.run` (whose implementation lives in `keel-runner`, the only
//! place commands run).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::workspace::resolve;
use std::sync::Arc;

use crate::{BoxFuture, Tool, ToolContext, ToolDescriptor, ToolImage, ToolOutput};

/// Largest image `read_file` returns as an image.
pub const IMAGE_LIMIT: usize = 5 * 1024 * 1024;

/// Every built-in file tool.
pub fn file_tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(ReadFile),
        Arc::new(WriteFile),
        Arc::new(ListDir),
        Arc::new(crate::search::EditFile),
        Arc::new(crate::search::Glob),
        Arc::new(crate::search::Grep),
    ]
}

/// The descriptor of `shell.run`.
pub fn shell_descriptor() -> ToolDescriptor {
    ToolDescriptor {
        name: "shell.run".into(),
        effect: keel_protocol::Effect::SideEffecting,
        description: "Run a shell command (sh -c) in the workspace and return its exit code, stdout and stderr. \
                      The command runs sandboxed: only the workspace is writable, and the network is off unless \
                      the coworker's policy allows it."
            .into(),
        version: "1".into(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command line, run with sh -c"},
                "workdir": {"type": "string", "description": "Folder to run in, relative to the workspace; default the workspace"},
                "timeout_secs": {"type": "integer", "minimum": 1, "description": "Stop the command after this many seconds"}
            },
            "required": ["command"],
            "additionalProperties": false
        }),
    }
}

/// The image type of a file name, for files `read_file` returns as images.
fn image_type(path: &std::path::Path) -> Option<&'static str> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    Some(match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        _ => return None,
    })
}

/// Largest file `read_file` returns whole; longer files are cut with a note.
pub const READ_LIMIT: usize = 256 * 1024;
/// Most entries `list_dir` returns.
pub const LIST_LIMIT: usize = 1000;

pub(crate) fn parse<T: for<'de> Deserialize<'de>>(arguments: Value) -> Result<T, ToolOutput> {
    serde_json::from_value(arguments).map_err(|e| ToolOutput::error(format!("invalid arguments: {e}")))
}

/// Parses the arguments and resolves their path inside the workspace.
pub(crate) fn parse_path<T: for<'de> Deserialize<'de>>(
    context: &ToolContext,
    arguments: Value,
    path_of: impl Fn(&T) -> &String,
) -> Result<(T, std::path::PathBuf), ToolOutput> {
    let args: T = parse(arguments)?;
    let path = resolve(&context.workspace, path_of(&args)).map_err(|e| ToolOutput::error(e.to_string()))?;
    Ok((args, path))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathArgs {
    path: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

/// Reads a UTF-8 text file from the workspace.
pub struct ReadFile;

impl Tool for ReadFile {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: "fs.read_file".into(),
            effect: keel_protocol::Effect::ReadOnly,
            version: "1".into(),
            description: "Read a text file from the workspace. Paths are relative to the workspace.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"path": {"type": "string", "description": "File path relative to the workspace"}},
                "required": ["path"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(&'a self, context: &'a ToolContext, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let (args, path) = match parse_path::<PathArgs>(context, arguments, |a| &a.path) {
                Ok(parsed) => parsed,
                Err(output) => return output,
            };
            match tokio::fs::read(&path).await {
                Ok(bytes) if image_type(&path).is_some() && bytes.len() <= IMAGE_LIMIT => {
                    let mime_type = image_type(&path).unwrap_or_default().to_string();
                    let text = format!("{} is an image ({mime_type}, {} bytes), attached", args.path, bytes.len());
                    ToolOutput { images: vec![ToolImage { mime_type, data: bytes }], ..ToolOutput::ok(text) }
                }
                Ok(bytes) => {
                    let cut = bytes.len() > READ_LIMIT;
                    let shown = &bytes[..bytes.len().min(READ_LIMIT)];
                    let mut text = String::from_utf8_lossy(shown).into_owned();
                    if cut {
                        text.push_str(&format!("\n[keel: file cut at {READ_LIMIT} of {} bytes]", bytes.len()));
                    }
                    ToolOutput::ok(text)
                }
                Err(e) => ToolOutput::error(format!("cannot read {}: {e}", args.path)),
            }
        })
    }
}

/// Writes a text file in the workspace, creating parent folders.
pub struct WriteFile;

impl Tool for WriteFile {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: "fs.write_file".into(),
            effect: keel_protocol::Effect::Idempotent,
            version: "1".into(),
            description: "Create or overwrite a text file in the workspace. Parent folders are created.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path relative to the workspace"},
                    "content": {"type": "string", "description": "The whole new content of the file"}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(&'a self, context: &'a ToolContext, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let (args, path) = match parse_path::<WriteArgs>(context, arguments, |a| &a.path) {
                Ok(parsed) => parsed,
                Err(output) => return output,
            };
            if let Some(parent) = path.parent()
                && let Err(e) = tokio::fs::create_dir_all(parent).await
            {
                return ToolOutput::error(format!("cannot create the folder for {}: {e}", args.path));
            }
            match tokio::fs::write(&path, args.content.as_bytes()).await {
                Ok(()) => ToolOutput::ok(format!("wrote {} bytes to {}", args.content.len(), args.path)),
                Err(e) => ToolOutput::error(format!("cannot write {}: {e}", args.path)),
            }
        })
    }
}

/// Lists a workspace folder.
pub struct ListDir;

impl Tool for ListDir {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: "fs.list_dir".into(),
            effect: keel_protocol::Effect::ReadOnly,
            version: "1".into(),
            description: "List the entries of a folder in the workspace. Folders end with '/'.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Folder path relative to the workspace; '.' is the workspace itself"}},
                "required": ["path"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(&'a self, context: &'a ToolContext, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let (args, path) = match parse_path::<PathArgs>(context, arguments, |a| &a.path) {
                Ok(parsed) => parsed,
                Err(output) => return output,
            };
            let mut reader = match tokio::fs::read_dir(&path).await {
                Ok(reader) => reader,
                Err(e) => return ToolOutput::error(format!("cannot list {}: {e}", args.path)),
            };
            let mut names = Vec::new();
            let mut more = false;
            loop {
                match reader.next_entry().await {
                    Ok(Some(entry)) => {
                        if names.len() == LIST_LIMIT {
                            more = true;
                            break;
                        }
                        let mut name = entry.file_name().to_string_lossy().into_owned();
                        if entry.file_type().await.map(|t| t.is_dir()).unwrap_or(false) {
                            name.push('/');
                        }
                        names.push(name);
                    }
                    Ok(None) => break,
                    Err(e) => return ToolOutput::error(format!("cannot list {}: {e}", args.path)),
                }
            }
            names.sort();
            if more {
                names.push(format!("[keel: listing cut at {LIST_LIMIT} entries]"));
            }
            ToolOutput::ok(names.join("\n"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context() -> (tempfile::TempDir, ToolContext) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let workspace = dir.path().to_path_buf();
        (dir, ToolContext::new("s", workspace))
    }

    #[tokio::test]
    async fn write_then_read_then_list() {
        let (_d, ctx) = context();
        let out = WriteFile.call(&ctx, json!({"path":"a/b.txt","content":"hi"})).await;
        assert!(!out.is_error, "{}", out.text);
        assert_eq!(ReadFile.call(&ctx, json!({"path":"a/b.txt"})).await, ToolOutput::ok("hi"));
        assert_eq!(ListDir.call(&ctx, json!({"path":"."})).await, ToolOutput::ok("a/"));
        assert_eq!(ListDir.call(&ctx, json!({"path":"a"})).await, ToolOutput::ok("b.txt"));
    }

    #[tokio::test]
    async fn bad_arguments_and_escapes_are_tool_errors() {
        let (_d, ctx) = context();
        let out = WriteFile.call(&ctx, json!({"path":"x"})).await;
        assert!(out.is_error && out.text.contains("invalid arguments"));
        let out = ReadFile.call(&ctx, json!({"path":"../../etc/passwd"})).await;
        assert!(out.is_error && out.text.contains("outside the workspace"));
        let out = ReadFile.call(&ctx, json!({"path":"missing.txt"})).await;
        assert!(out.is_error && out.text.contains("cannot read"));
    }
}
