//! Binding a coworker's tools for a turn.
//!
//! Tools come from three places: keel's built-ins (`fs.*`, `shell.run`),
//! which run in the sandboxed runner ([`RunnerTool`]); tools an embedder
//! registers in-process (`RuntimeConfig::extra_tools`); and MCP servers.
//! A session pins each tool's descriptor digest when it is created. Each
//! turn binds what the session pinned: a pinned tool whose descriptor
//! changed makes the session outdated (a person upgrades it); a pinned MCP
//! tool whose server is down is left out of that request, and the model is
//! told so in the live tool status, without failing the session.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use keel_protocol::ToolSpec;
use keel_runner::{RunnerError, RunnerPool, SandboxPolicy};
use keel_tools::naming::NameTable;
use keel_tools::{BoxFuture, Tool, ToolContext, ToolDescriptor, ToolOutput};
use serde_json::{Value, json};

use crate::bundle::{CoworkerSpec, digest_json};
use crate::error::{Result, RuntimeError};
use crate::runtime::Runtime;

/// `sha256:` of a descriptor, as pinned.
pub fn descriptor_digest(descriptor: &ToolDescriptor) -> String {
    digest_json(&serde_json::to_value(descriptor).unwrap_or_default())
}

/// A built-in tool, called in the session's runner process.
pub(crate) struct RunnerTool {
    descriptor: ToolDescriptor,
    pool: RunnerPool,
    /// Where each session's scratch folder (its `HOME` and `TMPDIR`) lives.
    scratch_root: PathBuf,
}

impl RunnerTool {
    pub(crate) fn all(pool: &RunnerPool, scratch_root: PathBuf) -> Vec<Arc<dyn Tool>> {
        keel_tools::builtin_descriptors()
            .into_iter()
            .map(|descriptor| {
                Arc::new(RunnerTool { descriptor, pool: pool.clone(), scratch_root: scratch_root.clone() })
                    as Arc<dyn Tool>
            })
            .collect()
    }

    fn policy(&self, context: &ToolContext) -> std::result::Result<SandboxPolicy, String> {
        let resources = &context.resources;
        for dir in resources.read.iter().chain(&resources.write) {
            if !dir.is_dir() {
                return Err(format!(
                    "the resource policy grants {}, which is not a folder; fix the coworker's resources in its bundle",
                    dir.display()
                ));
            }
        }
        let scratch = self.scratch_root.join(&context.session_id);
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string());
        env.insert("HOME".to_string(), scratch.display().to_string());
        env.insert("TMPDIR".to_string(), scratch.display().to_string());
        env.insert("LANG".to_string(), "C.UTF-8".to_string());
        for name in &resources.env {
            if let Ok(value) = std::env::var(name) {
                env.insert(name.clone(), value);
            }
        }
        Ok(SandboxPolicy {
            workspace: context.workspace.clone(),
            read: resources.read.clone(),
            write: resources.write.clone(),
            network: resources.network,
            env,
            scratch,
            shell: resources.shell.clone(),
        })
    }
}

impl Tool for RunnerTool {
    fn descriptor(&self) -> ToolDescriptor {
        self.descriptor.clone()
    }

    fn call<'a>(&'a self, context: &'a ToolContext, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let policy = match self.policy(context) {
                Ok(policy) => policy,
                Err(reason) => return ToolOutput { not_run: true, ..ToolOutput::error(reason) },
            };
            match self.pool.call(&context.session_id, &policy, &self.descriptor.name, arguments).await {
                Ok(reply) => ToolOutput {
                    text: reply.text,
                    is_error: reply.is_error,
                    images: reply.images,
                    sandbox: serde_json::to_value(&reply.confinement).ok(),
                    not_run: false,
                },
                Err(error @ (RunnerError::Confinement(_) | RunnerError::Spawn { .. })) => {
                    ToolOutput { not_run: true, ..ToolOutput::error(error.to_string()) }
                }
                Err(error) => ToolOutput::error(error.to_string()),
            }
        })
    }
}

/// A tool bound for a turn.
#[derive(Clone)]
pub(crate) struct Bound {
    pub qualified: String,
    pub tool: Arc<dyn Tool>,
}

/// The tools of one turn, by model-visible name.
#[derive(Clone, Default)]
pub(crate) struct TurnTools {
    pub specs: Vec<ToolSpec>,
    pub by_name: HashMap<String, Bound>,
    /// Pinned tools left out because their server is down, with why.
    pub unavailable: BTreeMap<String, String>,
}

impl Runtime {
    /// Every tool keel can call right now, by qualified name.
    pub(crate) fn current_tools(&self) -> BTreeMap<String, Arc<dyn Tool>> {
        let mut all: BTreeMap<String, Arc<dyn Tool>> =
            self.inner.tools.iter().map(|(name, tool)| (name.to_string(), tool.clone())).collect();
        for tool in self.inner.mcp.tools() {
            all.entry(tool.descriptor().name).or_insert(tool);
        }
        all
    }

    /// Pins the digests of the tools `spec` lists, as they are now.
    pub(crate) fn pin_tools(&self, spec: &mut CoworkerSpec) -> Result<()> {
        let current = self.current_tools();
        let mut pinned = BTreeMap::new();
        for entry in &spec.tools {
            let matched: Vec<_> = current.iter().filter(|(name, _)| keel_tools::entry_matches(entry, name)).collect();
            if matched.is_empty()
                && !entry.ends_with(".*")
                && !self.inner.mcp.is_server(keel_tools::split_qualified(entry).0)
            {
                return Err(RuntimeError::Config(format!(
                    "the coworker lists the tool {entry:?}, which keel does not have; known tools: {}",
                    current.keys().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
            for (name, tool) in matched {
                pinned.insert(name.clone(), descriptor_digest(&tool.descriptor()));
            }
        }
        spec.tool_digests = pinned;
        Ok(())
    }

    /// Binds the tools a session pinned, refusing a session whose tools
    /// changed since.
    pub(crate) fn bind_tools(&self, spec: &CoworkerSpec) -> Result<TurnTools> {
        let current = self.current_tools();
        let mut table = NameTable::default();
        let mut bound = TurnTools::default();
        for (name, pinned) in &spec.tool_digests {
            let (server, _) = keel_tools::split_qualified(name);
            let Some(tool) = current.get(name) else {
                if let Some(reason) = self.inner.mcp.down_reason(server) {
                    bound.unavailable.insert(name.clone(), reason);
                    continue;
                }
                return Err(RuntimeError::Outdated(format!(
                    "the tool {name:?} is gone since this session was created; a person must accept the change with session/upgrade before the session runs again"
                )));
            };
            let descriptor = tool.descriptor();
            if descriptor_digest(&descriptor) != *pinned {
                return Err(RuntimeError::Outdated(format!(
                    "the tool {name:?} changed since this session was created; a person must accept the new version with session/upgrade before the session runs again"
                )));
            }
            let (server, tool_name) = descriptor.split_name();
            let model_name = table.assign(server, tool_name).map_err(RuntimeError::Config)?;
            let mut model_spec = descriptor.model_spec();
            model_spec.name = model_name.clone();
            bound.specs.push(model_spec);
            bound.by_name.insert(model_name, Bound { qualified: name.clone(), tool: tool.clone() });
        }
        Ok(bound)
    }
}

impl TurnTools {
    /// The live status of the turn's tools: each tool's own context, and
    /// which pinned tools are unavailable now.
    pub(crate) fn live_context(&self, session_id: &str) -> serde_json::Map<String, Value> {
        let mut live = serde_json::Map::new();
        for spec in &self.specs {
            if let Some(context) = self.by_name.get(&spec.name).and_then(|b| b.tool.model_context(session_id)) {
                live.insert(spec.name.clone(), context);
            }
        }
        for (name, reason) in &self.unavailable {
            let (server, tool) = keel_tools::split_qualified(name);
            let model_name = keel_tools::naming::model_visible_name(server, tool);
            live.insert(model_name, json!({ "available": false, "reason": reason }));
        }
        live
    }
}
