//! Settings of the Anthropic adapter, read from the environment variables
//! the Anthropic SDKs use.

use std::fmt;
use std::time::Duration;

use crate::ConfigError;
use crate::transport::env_var;

/// Anthropic's own API, the default base URL.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header sent by default.
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";
/// The output limit sent when a request sets none: the API requires one.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// How to reach the Anthropic Messages API.
#[derive(Clone, PartialEq)]
pub struct AnthropicConfig {
    /// The API root, such as `https://api.anthropic.com`; requests go to
    /// `{base_url}/v1/messages`. A base URL that already ends in `/v1` is
    /// accepted too.
    pub base_url: String,
    /// Sent as `x-api-key` when set.
    pub api_key: Option<String>,
    /// Sent as `anthropic-version`.
    pub anthropic_version: String,
    /// `max_tokens` for requests that set no output limit.
    pub max_tokens: u32,
    /// Longest wait for a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// Longest wait, after sending, for the response headers.
    pub request_timeout: Duration,
    /// Longest silence in the middle of a response before giving up on it;
    /// a long answer is never cut for taking long overall.
    pub stream_idle_timeout: Duration,
}

impl AnthropicConfig {
    /// Settings for `base_url` with API version 2023-06-01, a default
    /// `max_tokens` of 4096, the default timeouts (connect 10s, response
    /// headers 300s, stream silence 300s) and no API key.
    pub fn new(base_url: impl Into<String>) -> AnthropicConfig {
        AnthropicConfig {
            base_url: base_url.into(),
            api_key: None,
            anthropic_version: DEFAULT_ANTHROPIC_VERSION.to_owned(),
            max_tokens: DEFAULT_MAX_TOKENS,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(300),
            stream_idle_timeout: Duration::from_secs(300),
        }
    }

    /// Settings from `ANTHROPIC_BASE_URL` (default [`DEFAULT_BASE_URL`])
    /// and `ANTHROPIC_API_KEY`; empty values count as unset.
    pub fn from_env() -> AnthropicConfig {
        let base_url = env_var("ANTHROPIC_BASE_URL").unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        AnthropicConfig { api_key: env_var("ANTHROPIC_API_KEY"), ..AnthropicConfig::new(base_url) }
    }

    pub fn with_api_key(mut self, api_key: impl Into<String>) -> AnthropicConfig {
        self.api_key = Some(api_key.into());
        self
    }
}

impl Default for AnthropicConfig {
    fn default() -> Self {
        AnthropicConfig::new(DEFAULT_BASE_URL)
    }
}

/// Hand-written so that logging a config never prints the key.
impl fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("anthropic_version", &self.anthropic_version)
            .field("max_tokens", &self.max_tokens)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("stream_idle_timeout", &self.stream_idle_timeout)
            .finish()
    }
}

/// `{base_url}/v1/messages`, or `{base_url}/messages` when the base URL
/// already names the API version.
pub(super) fn endpoint(base_url: &str) -> Result<reqwest::Url, ConfigError> {
    let has_version = base_url.trim().trim_end_matches('/').ends_with("/v1");
    crate::transport::endpoint(base_url, if has_version { "messages" } else { "v1/messages" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_found_with_or_without_the_version() {
        for base in ["https://api.anthropic.com", "https://api.anthropic.com/", "https://api.anthropic.com/v1/"] {
            assert_eq!(endpoint(base).map(|u| u.to_string()), Ok("https://api.anthropic.com/v1/messages".into()));
        }
        assert_eq!(
            endpoint("http://127.0.0.1:9/proxy").map(|u| u.to_string()),
            Ok("http://127.0.0.1:9/proxy/v1/messages".into())
        );
        assert!(matches!(endpoint("ftp://x"), Err(ConfigError::InvalidBaseUrl { .. })));
    }

    #[test]
    fn defaults_match_the_api_and_debug_output_hides_the_key() {
        let config = AnthropicConfig::default().with_api_key("sk-ant-secret");
        assert_eq!(
            (config.base_url.as_str(), config.anthropic_version.as_str(), config.max_tokens),
            ("https://api.anthropic.com", "2023-06-01", 4096)
        );
        let shown = format!("{config:?}");
        assert!(!shown.contains("sk-ant-secret") && shown.contains("[redacted]"), "{shown}");
    }
}
