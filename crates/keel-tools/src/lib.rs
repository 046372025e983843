//! Tools a coworker can call, and the registry that names them.
//!
//! A tool describes itself with a [`ToolDescriptor`]: a qualified name
//! `server.tool` (built-ins are `fs.read_file`, `shell.run`, ...; an MCP
//! server's tools are `<server>.<tool>`), a description, a version and the
//! JSON Schema of its input. The model sees each tool under the name
//! [`naming::model_visible_name`] derives (`fs__read_file`), which a
//! [`Registry`] maps back. A tool runs with a [`ToolContext`] naming the
//! session, its workspace and its resource policy. Failures are ordinary
//! outputs with `is_error` set: the model reads them and adapts.
//!
//! The built-in file and shell tools are implemented here and in
//! `keel-runner`, and the runtime only ever calls them through the sandboxed
//! runner process; this crate's implementations run inside that process.

pub mod builtin;
pub mod naming;
pub mod resources;
pub mod schema;
pub mod search;
pub mod workspace;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use keel_protocol::ToolSpec;
use serde_json::Value;

pub use resources::{ResourcePolicy, ShellLimits};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where and for whom a tool runs.
#[derive(Debug, Clone)]
pub struct ToolContext {
    pub session_id: String,
    /// The session's workspace; tools may not reach outside it.
    pub workspace: PathBuf,
    /// What the session may touch beyond the workspace.
    pub resources: Arc<ResourcePolicy>,
}

impl ToolContext {
    /// A context with the default (workspace-only, no network) policy.
    pub fn new(session_id: impl Into<String>, workspace: impl Into<PathBuf>) -> ToolContext {
        ToolContext {
            session_id: session_id.into(),
            workspace: workspace.into(),
            resources: Arc::new(ResourcePolicy::default()),
        }
    }
}

/// An image a tool returned. Its bytes live only in memory: the journal
/// records a reference, never the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct ToolImage {
    pub mime_type: String,
    pub data: Vec<u8>,
}

impl std::fmt::Debug for ToolImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ToolImage({}, {} bytes)", self.mime_type, self.data.len())
    }
}

/// The result of a tool call, as the model will read it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolOutput {
    pub text: String,
    pub is_error: bool,
    pub images: Vec<ToolImage>,
    /// How the call was confined (the runner's report), journaled with the
    /// call's result.
    pub sandbox: Option<Value>,
    /// Set when the tool was certainly not run (for example its sandbox
    /// could not be set up): the ledger records the call as rejected, not
    /// as one whose effect may have happened.
    pub not_run: bool,
}

impl ToolOutput {
    pub fn ok(text: impl Into<String>) -> ToolOutput {
        ToolOutput { text: text.into(), ..ToolOutput::default() }
    }

    /// An error output in the shape every keel tool uses: `{"error": "..."}`.
    pub fn error(message: impl AsRef<str>) -> ToolOutput {
        ToolOutput {
            text: serde_json::json!({ "error": message.as_ref() }).to_string(),
            is_error: true,
            ..ToolOutput::default()
        }
    }
}

/// What a tool is, independent of how a model sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolDescriptor {
    /// `server.tool`, for example `fs.write_file`.
    pub name: String,
    pub description: String,
    /// Changes when the tool's behaviour changes in a way a pinned session
    /// should notice; pinned with the schema.
    pub version: String,
    /// JSON Schema of the arguments.
    pub input_schema: Value,
    /// What running it twice does.
    #[serde(default)]
    pub effect: keel_protocol::Effect,
}

impl ToolDescriptor {
    /// The server part and the tool part of the qualified name, split at the
    /// first dot (server names have none; tool names may).
    pub fn split_name(&self) -> (&str, &str) {
        split_qualified(&self.name)
    }

    /// The provider-facing spec, under the model-visible name.
    pub fn model_spec(&self) -> ToolSpec {
        let (server, tool) = self.split_name();
        ToolSpec {
            name: naming::model_visible_name(server, tool),
            description: self.description.clone(),
            parameters: self.input_schema.clone(),
        }
    }
}

/// Splits `server.tool` at its first dot; a name without one is a tool of
/// the server `""`.
pub fn split_qualified(name: &str) -> (&str, &str) {
    name.split_once('.').unwrap_or(("", name))
}

/// A callable tool.
///
/// The two hooks are asked afresh before every model request, retries
/// included, and their answers are never stored in history: they describe
/// the world now (is the account connected?), not when the call was made.
pub trait Tool: Send + Sync {
    fn descriptor(&self) -> ToolDescriptor;
    fn call<'a>(&'a self, context: &'a ToolContext, arguments: Value) -> BoxFuture<'a, ToolOutput>;

    /// Live context for the model about this tool in `session_id`, for
    /// example whether the account it needs is connected.
    fn model_context(&self, _session_id: &str) -> Option<Value> {
        None
    }

    /// Whether images this tool returned may be shown to the model now.
    fn images_allowed(&self, _session_id: &str) -> bool {
        true
    }
}

/// Tools by qualified name.
#[derive(Clone, Default)]
pub struct Registry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl Registry {
    /// Adds or replaces a tool under its qualified name.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.descriptor().name, tool);
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<dyn Tool>)> {
        self.tools.iter().map(|(name, tool)| (name.as_str(), tool))
    }
}

/// The descriptors of keel's built-in tools, which run in the sandboxed
/// runner: the file tools of [`builtin`] and [`search`], and `shell.run`.
pub fn builtin_descriptors() -> Vec<ToolDescriptor> {
    let mut all: Vec<ToolDescriptor> = builtin::file_tools().iter().map(|t| t.descriptor()).collect();
    all.push(builtin::shell_descriptor());
    all
}

/// Whether a bundle's tool entry (`fs.read_file`, or `everything.*` for
/// every tool of a server) covers the qualified name `name`.
pub fn entry_matches(entry: &str, name: &str) -> bool {
    match entry.strip_suffix(".*") {
        Some(server) => split_qualified(name).0 == server,
        None => entry == name,
    }
}
