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
