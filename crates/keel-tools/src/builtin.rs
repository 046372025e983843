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
            let is_image = image_type(&path).is_some();
            let reading = path.clone();
            let read = tokio::task::spawn_blocking(move || read_regular(&reading, is_image)).await;
            match read {
                Ok(Ok((bytes, size))) if is_image && size <= IMAGE_LIMIT as u64 => {
                    let mime_type = image_type(&path).unwrap_or_default().to_string();
                    let text = format!("{} is an image ({mime_type}, {} bytes), attached", args.path, bytes.len());
                    ToolOutput { images: vec![ToolImage { mime_type, data: bytes }], ..ToolOutput::ok(text) }
                }
                // An image over the limit is described, never read as text:
                // its bytes (made "text" lossily) would reach the journal.
                Ok(Ok((_, size))) if is_image => ToolOutput::error(format!(
                    "{} is an image of {size} bytes, over the {IMAGE_LIMIT}-byte limit for images; it was not read",
                    args.path
                )),
                Ok(Ok((bytes, size))) => {
                    let shown = &bytes[..bytes.len().min(READ_LIMIT)];
                    let mut text = String::from_utf8_lossy(shown).into_owned();
                    if size > READ_LIMIT as u64 {
                        text.push_str(&format!("\n[keel: file cut at {READ_LIMIT} of {size} bytes]"));
                    }
                    ToolOutput::ok(text)
                }
                Ok(Err(e)) => ToolOutput::error(format!("cannot read {}: {e}", args.path)),
                Err(e) => ToolOutput::error(format!("cannot read {}: {e}", args.path)),
            }
        })
    }
}

/// Reads at most what `fs.read_file` returns of a regular file, with the
/// file's size. The file is opened non-blocking and checked on the open
/// descriptor (no window between check and read): a FIFO, a device or a
/// socket is refused at once instead of blocking the turn until someone
/// writes to it (a FIFO in the workspace hung a turn until interrupted), and
/// a huge file is never read whole.
fn read_regular(path: &std::path::Path, image: bool) -> std::io::Result<(Vec<u8>, u64)> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        let what =
            if meta.is_dir() { "a folder (use fs.list_dir)" } else { "not a regular file (a FIFO, device or socket)" };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {what}; fs.read_file reads regular files only"),
        ));
    }
    let limit = if image { IMAGE_LIMIT.max(READ_LIMIT) } else { READ_LIMIT };
    let mut bytes = Vec::with_capacity((meta.len() as usize).min(limit));
    file.take(limit as u64).read_to_end(&mut bytes)?;
    Ok((bytes, meta.len()))
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

    /// A FIFO in the workspace used to block `fs.read_file` (and the turn)
    /// until someone wrote to it; now it is refused at once. The regular
    /// file beside it is the positive control.
    #[tokio::test]
    async fn a_fifo_is_refused_at_once_not_waited_on() {
        let (dir, ctx) = context();
        let fifo = dir.path().join("pipe");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap_or_else(|e| panic!("{e}"));
        assert!(made.success());
        std::fs::write(dir.path().join("plain.txt"), "plain").unwrap_or_else(|e| panic!("{e}"));
        let out = tokio::time::timeout(std::time::Duration::from_secs(5), ReadFile.call(&ctx, json!({"path":"pipe"})))
            .await
            .unwrap_or_else(|_| panic!("fs.read_file blocked on a FIFO"));
        assert!(out.is_error && out.text.contains("not a regular file"), "{}", out.text);
        assert_eq!(ReadFile.call(&ctx, json!({"path":"plain.txt"})).await, ToolOutput::ok("plain"));
        let out = ReadFile.call(&ctx, json!({"path":"."})).await;
        assert!(out.is_error && out.text.contains("folder"), "{}", out.text);
    }

    /// An image over the image limit is neither attached nor read as text
    /// (its bytes, made text, used to reach the journal); one under it is
    /// attached (the positive control).
    #[tokio::test]
    async fn an_image_over_the_limit_is_described_not_read() {
        let (dir, ctx) = context();
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend(std::iter::repeat_n(0xABu8, IMAGE_LIMIT));
        std::fs::write(dir.path().join("huge.png"), &png).unwrap_or_else(|e| panic!("{e}"));
        let out = ReadFile.call(&ctx, json!({"path":"huge.png"})).await;
        assert!(out.is_error && out.text.contains("over the"), "{}", out.text);
        assert!(out.images.is_empty());
        assert!(out.text.len() < 200 && !out.text.contains('\u{fffd}'), "no image bytes: {}", out.text);
        std::fs::write(dir.path().join("small.png"), &png[..64]).unwrap_or_else(|e| panic!("{e}"));
        let out = ReadFile.call(&ctx, json!({"path":"small.png"})).await;
        assert_eq!(out.images.len(), 1, "{}", out.text);
    }

    /// A file past the limit is cut, and only the limit is read.
    #[tokio::test]
    async fn a_large_file_is_cut_with_its_size() {
        let (dir, ctx) = context();
        std::fs::write(dir.path().join("big.txt"), "x".repeat(READ_LIMIT + 10)).unwrap_or_else(|e| panic!("{e}"));
        let out = ReadFile.call(&ctx, json!({"path":"big.txt"})).await;
        assert!(!out.is_error);
        assert!(
            out.text.ends_with(&format!("[keel: file cut at {READ_LIMIT} of {} bytes]", READ_LIMIT + 10)),
            "{}",
            &out.text[out.text.len() - 80..]
        );
    }
}
