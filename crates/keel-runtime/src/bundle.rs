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
    /// Model round trips allowed per turn.
    #[serde(default)]
    pub max_steps: Option<u32>,
}

impl CoworkerSpec {
    /// SHA-256 of the definition's canonical JSON, as `sha256:<hex>`.
    pub fn digest(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let hash = Sha256::digest(&json);
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BundleFile {
    #[serde(default)]
    bundle: BundleHeader,
    #[serde(default)]
    coworkers: BTreeMap<String, CoworkerSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BundleHeader {
    #[serde(default)]
    name: Option<String>,
}

/// A loaded bundle.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub root: PathBuf,
    pub name: String,
    pub coworkers: BTreeMap<String, CoworkerSpec>,
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
        Ok(Bundle { root, name, coworkers: parsed.coworkers })
    }
}
