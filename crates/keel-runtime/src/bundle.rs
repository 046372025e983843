//! Bundles: directories that define coworkers.
//!
//! A bundle holds a `keel.toml`:
//!
//! ```toml
//! [bundle]
//! name = "assistant"
//!
//! [coworkers.assistant-example]
//! description = "A general assistant"
//! model = "openai-chat:gpt-4o-mini"
//! instructions = "You are a careful assistant..."
//! tools = ["fs.read_file", "fs.write_file", "shell.run", "github.*"]
//! max_steps = 16
//!
//! [coworkers.assistant-example.resources]
//! read = ["/usr/share/dict"]   # readable beyond the workspace
//! write = []                   # writable beyond the workspace
//! network = false              # tools run without a network
//! env = ["GITHUB_TOKEN"]       # variables passed through to tools
//!
//! [mcp_servers.github]         # the shape common MCP clients use
//! command = "npx"
//! args = ["-y", "@modelcontextprotocol/server-github"]
//! env = { GITHUB_PERSONAL_ACCESS_TOKEN = "..." }
//! # or: url = "https://host/mcp", headers = { Authorization = "Bearer ..." }
//! ```
//!
//! Tools are named `server.tool`: keel's built-ins are `fs.*` and
//! `shell.run`; an MCP server's tools are `<server>.<tool>`, and
//! `<server>.*` takes every tool the server offers.
//!
//! When a session is created its coworker's definition is copied into the
//! session (pinned) with a SHA-256 digest, so editing the bundle later does not
//! change sessions that already exist.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Result, RuntimeError};

/// The bundle file inside a bundle directory.
pub const BUNDLE_FILE: &str = "keel.toml";

/// One coworker's definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoworkerSpec {
    #[serde(default)]
    pub description: String,
    /// `provider:model`, for example `openai-chat:gpt-4o-mini`.
    pub model: String,
    pub instructions: String,
    /// The tools this coworker may call: qualified names (`fs.read_file`)
    /// or `<server>.*` for every tool of an MCP server.
    #[serde(default)]
    pub tools: Vec<String>,
    /// What its tools may touch beyond the workspace.
    #[serde(default)]
    pub resources: keel_tools::ResourcePolicy,
    /// Policies by tool entry (`fs.write_file`, `shell.run`, `github.*`):
    /// `"allow"`, `"ask"`, `"deny"`, or a table with allow rules. A tool
    /// with none is allowed if read-only and asked about otherwise.
    #[serde(default)]
    pub policies: BTreeMap<String, keel_core::PolicySpec>,
    /// How long a person has to answer an approval before it counts as
    /// denied; `None` waits indefinitely. A policy's `expires_secs` wins.
    #[serde(default)]
    pub approval_timeout_secs: Option<u64>,
    /// Where sensitive data comes from and which tools send data out.
    #[serde(default)]
    pub taint: TaintSpec,
    /// Compaction defaults for its sessions (`session/create` may override).
    #[serde(default)]
    pub compaction: Option<keel_protocol::CompactionSettings>,
    /// The model that writes compaction summaries (`provider:model`);
    /// the coworker's own model when unset. A cheaper or local model works:
    /// the person's messages and the working state are kept verbatim
    /// whatever it writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_model: Option<String>,
    /// Models to move to, in order, when the first one fails for good
    /// (auth, out of credit, unreachable after retries).
    #[serde(default)]
    pub fallback_models: Vec<String>,
    /// Model round trips allowed per turn.
    #[serde(default)]
    pub max_steps: Option<u32>,
    /// The output limit sent with each request.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// Prices of this coworker's models: its own `prices` table, completed
    /// from the bundle's `[prices]`, and pinned into each session with the
    /// rest of the definition.
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
    /// SHA-256 of each tool's descriptor (name, description, version,
    /// input schema) by qualified name, pinned when a session is created.
    /// Not written in bundles: keel fills it.
    #[serde(default)]
    pub tool_digests: BTreeMap<String, String>,
}

/// Taint tracking for a coworker.
///
/// ```toml
/// [coworkers.<id>.taint]
/// sources = { "gmail.*" = "private", "fs.read_file" = "internal" }   # label of a tool's output
/// outbound = { "slack.post" = "internal", "shell.run" = "public" }     # tools that send data out, and the most sensitive data each may carry
/// on_violation = "ask"                                                  # ask | deny | allow
/// ```
///
/// A tool's output gets the label of its `sources` entry (public when it has
/// none); the model's answers get the highest label in the context they were
/// written from. An outbound call made while the context holds data above
/// the tool's clearance is asked about, denied or allowed as `on_violation`
/// says, and the decision is journaled with the call.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaintSpec {
    #[serde(default)]
    pub sources: BTreeMap<String, keel_protocol::session::Sensitivity>,
    #[serde(default)]
    pub outbound: BTreeMap<String, keel_protocol::session::Sensitivity>,
    #[serde(default)]
    pub on_violation: Option<keel_core::Verdict>,
}

impl TaintSpec {
    /// The entry of `map` for qualified `tool`: exact names win over
    /// `<server>.*`.
    fn find<'a, T>(map: &'a BTreeMap<String, T>, tool: &str) -> Option<&'a T> {
        map.get(tool).or_else(|| {
            let server = keel_tools::split_qualified(tool).0;
            map.get(&format!("{server}.*"))
        })
    }

    /// The label of `tool`'s output.
    pub fn source_label(&self, tool: &str) -> keel_protocol::session::Sensitivity {
        Self::find(&self.sources, tool).copied().unwrap_or_default()
    }

    /// The clearance of `tool` if it sends data out.
    pub fn clearance(&self, tool: &str) -> Option<keel_protocol::session::Sensitivity> {
        Self::find(&self.outbound, tool).copied()
    }
}

/// What a model costs, in US dollars per million tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Cached input; defaults to the input price.
    #[serde(default)]
    pub cached_input: Option<f64>,
}

impl Price {
    /// The cost of `usage` in millionths of a dollar. Dollars per million
    /// tokens times tokens is exactly micro-dollars. Reasoning tokens are
    /// billed as output and are already counted in `output_tokens`.
    pub fn micro_usd(&self, usage: &keel_protocol::Usage) -> u64 {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let fresh = usage.input_tokens - cached;
        let cost = fresh as f64 * self.input
            + cached as f64 * self.cached_input.unwrap_or(self.input)
            + usage.output_tokens as f64 * self.output;
        cost.round().max(0.0) as u64
    }
}

impl CoworkerSpec {
    /// SHA-256 of the definition's canonical JSON, as `sha256:<hex>`.
    pub fn digest(&self) -> String {
        digest_json(&serde_json::to_value(self).unwrap_or_default())
    }
}

/// `sha256:<hex>` of a JSON value's compact text.
pub fn digest_json(value: &serde_json::Value) -> String {
    let hash = Sha256::digest(value.to_string().as_bytes());
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BundleFile {
    #[serde(default)]
    pub bundle: BundleHeader,
    #[serde(default)]
    pub coworkers: BTreeMap<String, CoworkerSpec>,
    /// Prices by `provider:model`.
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerSpec>,
}

/// An MCP server, as common MCP clients configure one: a command to start
/// (stdio), or a URL (streamable HTTP).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// The server's whole environment beside `PATH`, `HOME` and `LANG`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working folder of the command; relative paths are from the bundle.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub startup_timeout_secs: Option<u64>,
    #[serde(default)]
    pub call_timeout_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BundleHeader {
    #[serde(default)]
    pub name: Option<String>,
}

/// A loaded bundle.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub root: PathBuf,
    pub name: String,
    pub coworkers: BTreeMap<String, CoworkerSpec>,
    pub prices: BTreeMap<String, Price>,
    pub mcp_servers: BTreeMap<String, McpServerSpec>,
}

impl Bundle {
    /// Loads `<dir>/keel.toml`, reporting the file and line of any problem.
    pub fn load(dir: &Path) -> Result<Bundle> {
        let file = dir.join(BUNDLE_FILE);
        let text = std::fs::read_to_string(&file).map_err(|e| {
            RuntimeError::Config(format!(
                "cannot read the bundle file {}: {e}; a bundle is a folder holding {BUNDLE_FILE}",
                file.display()
            ))
        })?;
        Bundle::from_text(dir, &text)
    }

    /// Loads a bundle whose `keel.toml` in `dir` holds `text`: everything
    /// [`Bundle::load`] does after reading the file. For fuzzing and tests.
    pub fn from_text(dir: &Path, text: &str) -> Result<Bundle> {
        let file = dir.join(BUNDLE_FILE);
        let parsed: BundleFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            RuntimeError::Config(format!(
                "{}{}: {}",
                file.display(),
                line.map(|l| format!(":{l}")).unwrap_or_default(),
                e.message()
            ))
        })?;
        if parsed.coworkers.is_empty() {
            return Err(RuntimeError::Config(format!(
                "{} defines no coworkers; add a [coworkers.<id>] table",
                file.display()
            )));
        }
        let root = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        let name = parsed
            .bundle
            .name
            .unwrap_or_else(|| root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
        let mut coworkers = parsed.coworkers;
        for spec in coworkers.values_mut() {
            for model in std::iter::once(&spec.model).chain(&spec.fallback_models) {
                if let Some(price) = parsed.prices.get(model) {
                    spec.prices.entry(model.clone()).or_insert_with(|| price.clone());
                }
            }
        }
        let mut mcp_servers = parsed.mcp_servers;
        for server in mcp_servers.values_mut() {
            if let Some(cwd) = &server.cwd
                && cwd.is_relative()
            {
                server.cwd = Some(root.join(cwd));
            }
        }
        Ok(Bundle { root, name, coworkers, prices: parsed.prices, mcp_servers })
    }
}
