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
//!
//! The JSON Schema of `keel.toml` (`keel validate --schema`) is derived from
//! these types with schemars, so their doc comments are its descriptions and
//! it cannot drift from what the loader accepts; the `#[schemars]`
//! attributes add only the value rules `keel validate` checks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Result, RuntimeError};

/// The bundle file inside a bundle directory.
pub const BUNDLE_FILE: &str = "keel.toml";

/// `provider:model`, as `keel validate` requires.
const MODEL_PATTERN: &str = "^[a-z0-9-]+:.+$";

/// One coworker's definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CoworkerSpec {
    /// What the coworker is for, shown to people choosing one.
    #[serde(default)]
    pub description: String,
    /// `provider:model`, for example `openai-chat:gpt-4o-mini`.
    #[schemars(regex(pattern = MODEL_PATTERN))]
    pub model: String,
    /// The system instructions: who the coworker is and how it works.
    #[schemars(regex(pattern = r"\S"))]
    pub instructions: String,
    /// The tools this coworker may call: qualified names (`fs.read_file`)
    /// or `<server>.*` for every tool of an MCP server.
    #[serde(default)]
    #[schemars(inner(regex(pattern = r"^[A-Za-z0-9_-]+\..+$")))]
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
    /// denied; unset waits indefinitely. A policy's `expires_secs` wins.
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
    #[schemars(regex(pattern = MODEL_PATTERN))]
    pub summary_model: Option<String>,
    /// Models to move to, in order, when the first one fails for good
    /// (auth, out of credit, unreachable after retries).
    #[serde(default)]
    #[schemars(inner(regex(pattern = MODEL_PATTERN)))]
    pub fallback_models: Vec<String>,
    /// Model round trips allowed per turn.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub max_steps: Option<u32>,
    /// The output limit sent with each request.
    #[serde(default)]
    #[schemars(range(min = 1))]
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
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaintSpec {
    /// The label of each tool's output, by tool entry.
    #[serde(default)]
    pub sources: BTreeMap<String, keel_protocol::session::Sensitivity>,
    /// Tools that send data out, with the most sensitive data each may carry.
    #[serde(default)]
    pub outbound: BTreeMap<String, keel_protocol::session::Sensitivity>,
    /// What an outbound call above its clearance gets; `ask` when unset.
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Input tokens.
    #[schemars(range(min = 0))]
    pub input: f64,
    /// Output tokens, reasoning included.
    #[schemars(range(min = 0))]
    pub output: f64,
    /// Cached input; defaults to the input price.
    #[serde(default)]
    #[schemars(range(min = 0))]
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

/// A bundle's `keel.toml`: coworkers, the MCP servers their tools come
/// from, and model prices.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "keel bundle (keel.toml)", extend("$id" = "https://keel.dev/schemas/bundle.schema.json"))]
#[schemars(transform = at_least_one_coworker)]
pub(crate) struct BundleFile {
    #[serde(default)]
    pub bundle: BundleHeader,
    /// Coworkers by id; a bundle defines at least one.
    #[serde(default)]
    pub coworkers: BTreeMap<String, CoworkerSpec>,
    /// Prices by `provider:model`.
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
    /// MCP servers by name; their tools are `<name>.<tool>`.
    #[serde(default)]
    pub mcp_servers: BTreeMap<String, McpServerSpec>,
}

/// The parser takes a file without coworkers so that `keel validate` can
/// say what is missing; loading refuses it, so the schema requires one.
fn at_least_one_coworker(schema: &mut schemars::Schema) {
    schema.insert("required".into(), serde_json::json!(["coworkers"]));
    let coworkers = schema.get_mut("properties").and_then(|properties| properties.get_mut("coworkers"));
    if let Some(coworkers) = coworkers.and_then(serde_json::Value::as_object_mut) {
        coworkers.remove("default");
        coworkers.insert("minProperties".into(), 1.into());
    }
}

/// An MCP server, as common MCP clients configure one: a command to start
/// (stdio), or a URL (streamable HTTP). One flat table rather than an
/// untagged enum so a mistake gets `keel validate`'s message, not serde's
/// "did not match any variant"; the schema requires exactly one of the two.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("oneOf" = [{"required": ["command"]}, {"required": ["url"]}]))]
pub struct McpServerSpec {
    /// The program of a local server, spoken to over stdio.
    #[serde(default)]
    pub command: Option<String>,
    /// The command's arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The server's whole environment beside `PATH`, `HOME` and `LANG`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working folder of the command; relative paths are from the bundle.
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The streamable HTTP endpoint of a remote server.
    #[serde(default)]
    #[schemars(regex(pattern = "^https?://"))]
    pub url: Option<String>,
    /// HTTP headers sent to a `url` server, for example `Authorization`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// How long the server may take to start and list its tools.
    #[serde(default)]
    pub startup_timeout_secs: Option<u64>,
    /// How long one tool call may take.
    #[serde(default)]
    pub call_timeout_secs: Option<u64>,
}

/// The `[bundle]` table.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BundleHeader {
    /// The bundle's name; the folder's name when unset.
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
