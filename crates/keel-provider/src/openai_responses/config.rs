//! Settings of the Responses adapter, read from the environment variables
//! the OpenAI SDKs use.

use std::fmt;
use std::time::Duration;

use crate::openai_chat::DEFAULT_BASE_URL;
use crate::transport::env_var;

/// How to reach the Responses API.
#[derive(Clone, PartialEq)]
pub struct OpenAiResponsesConfig {
    /// The API root, such as `https://api.openai.com/v1`; requests go to
    /// `{base_url}/responses`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer <key>` when set.
    pub api_key: Option<String>,
    /// Longest wait for a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// Longest wait, after sending, for the response headers.
    pub request_timeout: Duration,
    /// Longest silence in the middle of a response before giving up on it;
    /// a long answer is never cut for taking long overall.
    pub stream_idle_timeout: Duration,
}

impl OpenAiResponsesConfig {
    /// Settings for `base_url` with the default timeouts (connect 10s,
    /// response headers 300s, stream silence 300s) and no API key.
    pub fn new(base_url: impl Into<String>) -> OpenAiResponsesConfig {
        OpenAiResponsesConfig {
            base_url: base_url.into(),
            api_key: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(300),
            stream_idle_timeout: Duration::from_secs(300),
        }
    }

    /// Settings from `OPENAI_BASE_URL` (default `https://api.openai.com/v1`)
    /// and `OPENAI_API_KEY`; empty values count as unset.
    pub fn from_env() -> OpenAiResponsesConfig {
        let base_url = env_var("OPENAI_BASE_URL").unwrap_or_else(|| DEFAULT_BASE_URL.to_owned());
        OpenAiResponsesConfig { api_key: env_var("OPENAI_API_KEY"), ..OpenAiResponsesConfig::new(base_url) }
    }

    pub fn with_api_key(mut self, api_key: impl Into<String>) -> OpenAiResponsesConfig {
        self.api_key = Some(api_key.into());
        self
    }
}

impl Default for OpenAiResponsesConfig {
    fn default() -> Self {
        OpenAiResponsesConfig::new(DEFAULT_BASE_URL)
    }
}

/// Hand-written so that logging a config never prints the key.
impl fmt::Debug for OpenAiResponsesConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiResponsesConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("stream_idle_timeout", &self.stream_idle_timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_openai_and_debug_output_hides_the_key() {
        let config = OpenAiResponsesConfig::default().with_api_key("sk-secret");
        assert_eq!(config.base_url, "https://api.openai.com/v1");
        let shown = format!("{config:?}");
        assert!(!shown.contains("sk-secret") && shown.contains("[redacted]"), "{shown}");
    }
}
