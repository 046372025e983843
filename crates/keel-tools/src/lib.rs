//! Tools a coworker can call, and the registry that names them.
//!
//! A tool describes itself with a [`ToolSpec`] (the model-visible name, a
//! description and the JSON Schema of its arguments) and runs with a
//! [`ToolContext`] that confines it to the session's workspace. Failures are
//! ordinary outputs with `is_error` set: the model reads them and adapts.

pub mod builtin;
pub mod naming;
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

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where and for whom a tool runs.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The session's workspace; tools may not reach outside it.
    pub workspace: PathBuf,
}

/// The result of a tool call, as the model will read it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub text: String,
    pub is_error: bool,
}

impl ToolOutput {
    pub fn ok(text: impl Into<String>) -> ToolOutput {
        ToolOutput { text: text.into(), is_error: false }
    }

    /// An error output in the shape every keel tool uses: `{"error": "..."}`.
    pub fn error(message: impl AsRef<str>) -> ToolOutput {
        ToolOutput { text: serde_json::json!({ "error": message.as_ref() }).to_string(), is_error: true }
    }
}

/// A callable tool.
///
/// The two hooks are asked afresh before every model request, retries
/// included, and their answers are never stored in history: they describe
/// the world now (is the account connected?), not when the call was made.
pub trait Tool: Send + Sync {
    fn spec(&self) -> ToolSpec;
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

/// Tools by model-visible name.
#[derive(Clone, Default)]
pub struct Registry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl Registry {
    /// A registry holding the built-in workspace tools.
    pub fn builtin() -> Registry {
        let mut registry = Registry::default();
        registry.register(Arc::new(builtin::ReadFile));
        registry.register(Arc::new(builtin::WriteFile));
        registry.register(Arc::new(builtin::ListDir));
        registry.register(Arc::new(search::EditFile));
        registry.register(Arc::new(search::Glob));
        registry.register(Arc::new(search::Grep));
        registry
    }

    /// Adds or replaces a tool under its spec's name.
    pub fn register(&mut self, tool: Arc<dyn Tool>) {
        self.tools.insert(tool.spec().name, tool);
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }
}
