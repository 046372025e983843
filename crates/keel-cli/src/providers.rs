//! Model providers configured from the environment.
//!
//! Every provider is registered; a request to one without credentials fails
//! with a clear auth error rather than at startup.
//! - `openai-chat`: OpenAI Chat Completions, `OPENAI_BASE_URL` (default the
//!   OpenAI API) and `OPENAI_API_KEY`; also Ollama, vLLM, llama.cpp's server
//!   and OpenRouter through their OpenAI-compatible endpoints.
//! - `openai`: the OpenAI Responses API, same variables.
//! - `anthropic`: the Anthropic Messages API, `ANTHROPIC_BASE_URL` and
//!   `ANTHROPIC_API_KEY`.
//! - `local`: GGUF models in-process through llama.cpp, from
//!   `KEEL_MODELS_DIR` (default `./models`; `scripts/fetch-model` fills it).

use std::sync::Arc;
use std::time::Duration;

use keel_provider::{Anthropic, AnthropicConfig, OpenAiChat, OpenAiChatConfig, OpenAiResponses, OpenAiResponsesConfig};
use keel_runtime::ProviderSet;
use keel_runtime::retry::RetryPolicy;

/// The model `keel run` uses when no provider is configured at all.
pub const LOCAL_DEFAULT: &str = "local:smollm2";

/// A duration in milliseconds from the environment, if set.
fn millis(name: &str) -> anyhow::Result<Option<Duration>> {
    match std::env::var(name) {
        Ok(value) => {
            let ms: u64 = value
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("{name} must be a number of milliseconds, got {value:?}"))?;
            Ok(Some(Duration::from_millis(ms)))
        }
        Err(_) => Ok(None),
    }
}

/// The retry policy, with the backoff knobs `KEEL_RETRY_BASE_MS` and
/// `KEEL_RETRY_AFTER_CAP_MS` (the largest `Retry-After` honoured) when set.
pub fn retry_from_env() -> anyhow::Result<RetryPolicy> {
    let mut policy = RetryPolicy::default();
    if let Some(base) = millis("KEEL_RETRY_BASE_MS")? {
        policy.base_delay = base;
        policy.max_delay = policy.max_delay.max(base);
    }
    if let Some(cap) = millis("KEEL_RETRY_AFTER_CAP_MS")? {
        policy.max_retry_after = cap;
    }
    Ok(policy)
}

/// The provider API keys in the environment, which must never be journaled.
pub fn secrets_from_env() -> Vec<(String, String)> {
    ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"]
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|value| (name.to_string(), value)))
        .collect()
}

/// Whether the environment names any remote provider.
pub fn any_remote_configured() -> bool {
    ["OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()))
}

/// The remote providers from their usual variables, with
/// `KEEL_PROVIDER_REQUEST_TIMEOUT_MS` (longest wait for response headers)
/// and `KEEL_PROVIDER_IDLE_TIMEOUT_MS` (longest silence mid-stream) applied
/// to all of them when set.
pub fn from_env() -> anyhow::Result<ProviderSet> {
    let request = millis("KEEL_PROVIDER_REQUEST_TIMEOUT_MS")?;
    let idle = millis("KEEL_PROVIDER_IDLE_TIMEOUT_MS")?;
    let mut chat = OpenAiChatConfig::from_env();
    let mut responses = OpenAiResponsesConfig::from_env();
    let mut anthropic = AnthropicConfig::from_env();
    if let Some(request) = request {
        (chat.request_timeout, responses.request_timeout, anthropic.request_timeout) = (request, request, request);
    }
    if let Some(idle) = idle {
        (chat.stream_idle_timeout, responses.stream_idle_timeout, anthropic.stream_idle_timeout) = (idle, idle, idle);
    }
    let set = ProviderSet::new()
        .with(Arc::new(OpenAiChat::new(chat)?))
        .with(Arc::new(OpenAiResponses::new(responses)?))
        .with(Arc::new(Anthropic::new(anthropic)?));
    Ok(with_local(set))
}

#[cfg(feature = "local")]
fn with_local(set: ProviderSet) -> ProviderSet {
    let local = keel_provider_local::LocalProvider::new(keel_provider_local::LocalConfig::from_env());
    set.with(Arc::new(local))
}

#[cfg(not(feature = "local"))]
fn with_local(set: ProviderSet) -> ProviderSet {
    set
}

/// How one remote provider family is configured in this environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteStatus {
    /// The providers it serves, as written before the `:` of a model.
    pub providers: &'static [&'static str],
    pub key_var: &'static str,
    pub base_url: String,
    /// Whether the base URL is the vendor's own (a key is then required).
    pub official: bool,
    pub has_key: bool,
}

impl RemoteStatus {
    /// Configured: a key is set, or the base URL points elsewhere (a local
    /// OpenAI-compatible server may need no key).
    pub fn configured(&self) -> bool {
        self.has_key || !self.official
    }
}

fn non_empty_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The remote provider families and how each is configured.
pub fn remote_status() -> Vec<RemoteStatus> {
    let openai = non_empty_var("OPENAI_BASE_URL");
    let anthropic = non_empty_var("ANTHROPIC_BASE_URL");
    vec![
        RemoteStatus {
            providers: &["openai-chat", "openai"],
            key_var: "OPENAI_API_KEY",
            official: openai.is_none(),
            base_url: openai.unwrap_or_else(|| keel_provider::openai_chat::DEFAULT_BASE_URL.to_string()),
            has_key: non_empty_var("OPENAI_API_KEY").is_some(),
        },
        RemoteStatus {
            providers: &["anthropic"],
            key_var: "ANTHROPIC_API_KEY",
            official: anthropic.is_none(),
            base_url: anthropic.unwrap_or_else(|| keel_provider::anthropic::DEFAULT_BASE_URL.to_string()),
            has_key: non_empty_var("ANTHROPIC_API_KEY").is_some(),
        },
    ]
}

/// Refuses, before anything starts, a model whose provider cannot work: its
/// vendor's API with no key set. A custom base URL with no key is let
/// through (local servers often need none) with a note on stderr.
pub fn check_model_credentials(model: &str) -> anyhow::Result<()> {
    let provider = model.split_once(':').map(|(p, _)| p).unwrap_or(model);
    let Some(status) = remote_status().into_iter().find(|s| s.providers.contains(&provider)) else {
        return Ok(());
    };
    if status.has_key {
        return Ok(());
    }
    if status.official {
        return Err(keel_runtime::RuntimeError::Config(format!(
            "{model} needs {key}, which is not set; requests would go to {url}. Set {key} (or point {base} at a server that needs no key), or leave --model out to use the local model",
            key = status.key_var,
            url = status.base_url,
            base = if status.key_var == "OPENAI_API_KEY" { "OPENAI_BASE_URL" } else { "ANTHROPIC_BASE_URL" },
        ))
        .into());
    }
    eprintln!("keel: {} is not set; sending {model} requests to {} without a key", status.key_var, status.base_url);
    Ok(())
}
