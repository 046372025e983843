//! Settings of the Chat Completions adapter, and reading them from the
//! environment variables the OpenAI SDKs use.

use std::fmt;
use std::time::Duration;

use super::MaxTokensField;
use crate::ConfigError;
use crate::transport::env_var;

/// OpenAI's own endpoint, the default base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// How to reach a Chat Completions server.
#[derive(Clone, PartialEq)]
pub struct OpenAiChatConfig {
    /// The API root, such as `https://api.openai.com/v1` or
    /// `http://localhost:11434/v1`; requests go to `{base_url}/chat/completions`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer <key>` when set. Local servers usually
    /// need none.
    pub api_key: Option<String>,
    /// Longest wait for a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// Longest wait, after sending, for the response headers. The body of a
    /// stream is bounded by `stream_idle_timeout` instead, so a long answer
    /// is never cut for taking long overall.
    pub request_timeout: Duration,
    /// Longest silence in the middle of a response before giving up on it.
    pub stream_idle_timeout: Duration,
    /// Which field carries [`ModelRequest::max_output_tokens`](crate::ModelRequest);
    /// `None` picks by host: `max_completion_tokens` for api.openai.com,
    /// whose reasoning models reject `max_tokens`, and `max_tokens`
    /// everywhere else, which is what compatible servers understand.
    pub max_tokens_field: Option<MaxTokensField>,
}

impl OpenAiChatConfig {
    /// Settings for `base_url` with default timeouts (connect 10s, response
    /// headers 300s, stream silence 300s), no API key, and the token-limit
    /// field chosen by host.
    pub fn new(base_url: impl Into<String>) -> OpenAiChatConfig {
        OpenAiChatConfig {
            base_url: base_url.into(),
            api_key: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(300),
            stream_idle_timeout: Duration::from_secs(300),
            max_tokens_field: None,
        }
    }

    /// Settings from `OPENAI_BASE_URL` (default [`DEFAULT_BASE_URL`]) and
    /// `OPENAI_API_KEY`; empty values count as unset.
    pub fn from_env() -> OpenAiChatConfig {
        let mut config =
            OpenAiChatConfig::new(env_var("OPENAI_BASE_URL").unwrap_or_else(|| DEFAULT_BASE_URL.to_owned()));
        config.api_key = env_var("OPENAI_API_KEY");
        config
    }

    pub fn with_api_key(mut self, api_key: impl Into<String>) -> OpenAiChatConfig {
        self.api_key = Some(api_key.into());
        self
    }
}

impl Default for OpenAiChatConfig {
    fn default() -> Self {
        OpenAiChatConfig::new(DEFAULT_BASE_URL)
    }
}

/// Hand-written so that logging a config never prints the key.
impl fmt::Debug for OpenAiChatConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiChatConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("stream_idle_timeout", &self.stream_idle_timeout)
            .field("max_tokens_field", &self.max_tokens_field)
            .finish()
    }
}

/// The token-limit field for `endpoint`, unless the settings name one.
pub(super) fn max_tokens_field(config: &OpenAiChatConfig, endpoint: &reqwest::Url) -> MaxTokensField {
    match config.max_tokens_field {
        Some(field) => field,
        None if endpoint.host_str() == Some("api.openai.com") => MaxTokensField::MaxCompletionTokens,
        None => MaxTokensField::MaxTokens,
    }
}

/// `{base_url}/chat/completions`, tolerating a trailing slash.
pub(super) fn endpoint(base_url: &str) -> Result<reqwest::Url, ConfigError> {
    crate::transport::endpoint(base_url, "chat/completions")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_tolerates_a_trailing_slash() {
        for base in ["http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1/", " http://127.0.0.1:8080/v1// "] {
            assert_eq!(endpoint(base).map(|u| u.to_string()), Ok("http://127.0.0.1:8080/v1/chat/completions".into()));
        }
    }

    #[test]
    fn non_http_base_urls_are_rejected() {
        for base in ["ftp://example.com/v1", "localhost:8080", "", "http://x/v1?key=1"] {
            assert!(matches!(endpoint(base), Err(ConfigError::InvalidBaseUrl { .. })), "{base}");
        }
    }

    #[test]
    fn openai_gets_max_completion_tokens_and_others_max_tokens() -> Result<(), ConfigError> {
        let field = |config: OpenAiChatConfig| endpoint(&config.base_url).map(|url| max_tokens_field(&config, &url));
        assert_eq!(field(OpenAiChatConfig::default())?, MaxTokensField::MaxCompletionTokens);
        let local = OpenAiChatConfig::new("http://localhost:11434/v1");
        assert_eq!(field(local.clone())?, MaxTokensField::MaxTokens);
        let chosen = OpenAiChatConfig { max_tokens_field: Some(MaxTokensField::MaxCompletionTokens), ..local };
        assert_eq!(field(chosen)?, MaxTokensField::MaxCompletionTokens);
        Ok(())
    }

    #[test]
    fn debug_output_hides_the_key() {
        let config = OpenAiChatConfig::default().with_api_key("sk-secret");
        assert!(!format!("{config:?}").contains("sk-secret"));
    }
}
