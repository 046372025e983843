//! Model providers configured from the environment.
//!
//! `openai-chat` is always registered: it reads `OPENAI_BASE_URL` (default
//! the OpenAI API) and `OPENAI_API_KEY`, which also covers Ollama, vLLM,
//! llama.cpp's server and OpenRouter through their OpenAI-compatible
//! endpoints.

use std::sync::Arc;

use keel_provider::{OpenAiChat, OpenAiChatConfig};
use std::time::Duration;

use keel_runtime::ProviderSet;
use keel_runtime::retry::RetryPolicy;

/// The retry policy, with the backoff knobs `KEEL_RETRY_BASE_MS` and
/// `KEEL_RETRY_AFTER_CAP_MS` (the largest `Retry-After` honoured) when set.
pub fn retry_from_env() -> anyhow::Result<RetryPolicy> {
    let mut policy = RetryPolicy::default();
    let millis = |name: &str| -> anyhow::Result<Option<Duration>> {
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
    };
    if let Some(base) = millis("KEEL_RETRY_BASE_MS")? {
        policy.base_delay = base;
        policy.max_delay = policy.max_delay.max(base);
    }
    if let Some(cap) = millis("KEEL_RETRY_AFTER_CAP_MS")? {
        policy.max_retry_after = cap;
    }
    Ok(policy)
}

pub fn from_env() -> anyhow::Result<ProviderSet> {
    let chat = OpenAiChat::new(OpenAiChatConfig::from_env())?;
    Ok(ProviderSet::new().with(Arc::new(chat)))
}
