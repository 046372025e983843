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
//! tools = ["read_file", "write_file", "list_dir"]
//! max_steps = 16
//! ```
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
    /// Names of the tools this coworker may call.
    #[serde(default)]
    pub tools: Vec<String>,
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
    /// SHA-256 of each listed tool's schema, pinned when a session is
    /// created. Not written in bundles: keel fills it.
    #[serde(default)]
    pub tool_digests: BTreeMap<String, String>,
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

impl CoworkerSpec {
    /// Fills `tool_digests` from the tools as they are now.
    pub fn pin_tools(&mut self, tools: &keel_tools::Registry) {
        self.tool_digests = self
            .tools
            .iter()
            .filter_map(|name| {
                tools
                    .get(name)
                    .map(|t| (name.clone(), digest_json(&serde_json::to_value(t.spec()).unwrap_or_default())))
            })
            .collect();
    }
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
        let parsed: BundleFile = toml::from_str(&text).map_err(|e| {
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
        Ok(Bundle { root, name, coworkers, prices: parsed.prices })
    }
}
