//! Model providers configured from the environment.
//!
//! `openai-chat` is always registered: it reads `OPENAI_BASE_URL` (default
//! the OpenAI API) and `OPENAI_API_KEY`, which also covers Ollama, vLLM,
//! llama.cpp's server and OpenRouter through their OpenAI-compatible
//! endpoints.

use std::sync::Arc;

use keel_provider::{OpenAiChat, OpenAiChatConfig};
use keel_runtime::ProviderSet;

pub fn from_env() -> anyhow::Result<ProviderSet> {
    let chat = OpenAiChat::new(OpenAiChatConfig::from_env())?;
    Ok(ProviderSet::new().with(Arc::new(chat)))
}
