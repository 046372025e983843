//! OpenAI Chat Completions (placeholder, being written).
pub struct OpenAiChat;
pub struct OpenAiChatConfig;
