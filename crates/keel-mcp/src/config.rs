//! What the hub is told: one [`McpServerConfig`] per server, and a
//! [`HubConfig`] for the policies shared by all of them (restart backoff, how
//! long to wait for a server to exit, how often to check an HTTP session).
//!
//! `Debug` never prints environment values or header values: those are where
//! API keys live, and configs end up in logs.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// One MCP server the hub connects to.
#[derive(Clone, PartialEq, Eq)]
pub struct McpServerConfig {
    /// The server's name in keel, e.g. `everything`. Tools are addressed as
    /// (server, tool), so names must be unique within a hub.
    pub name: String,
    pub transport: McpTransport,
    /// How long spawning (or connecting), the MCP handshake and the first
    /// `tools/list` may take together before the attempt counts as failed.
    pub startup_timeout: Duration,
    /// How long one `tools/call` may take before it is cancelled.
    pub call_timeout: Duration,
}

impl McpServerConfig {
    pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
    pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

    /// A stdio server with default timeouts, no extra environment and the
    /// parent's working directory.
    pub fn stdio(name: impl Into<String>, command: impl Into<String>, args: Vec<String>) -> McpServerConfig {
        McpServerConfig::new(
            name,
            McpTransport::Stdio { command: command.into(), args, env: BTreeMap::new(), cwd: None },
        )
    }

    /// A streamable HTTP server with default timeouts and no extra headers.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> McpServerConfig {
        McpServerConfig::new(name, McpTransport::Http { url: url.into(), headers: BTreeMap::new() })
    }

    pub fn new(name: impl Into<String>, transport: McpTransport) -> McpServerConfig {
        McpServerConfig {
            name: name.into(),
            transport,
            startup_timeout: McpServerConfig::DEFAULT_STARTUP_TIMEOUT,
            call_timeout: McpServerConfig::DEFAULT_CALL_TIMEOUT,
        }
    }
}

impl fmt::Debug for McpServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServerConfig")
            .field("name", &self.name)
            .field("transport", &self.transport)
            .field("startup_timeout", &self.startup_timeout)
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

/// How to reach a server.
#[derive(Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// A child process speaking JSON-RPC on its stdin and stdout. It gets a
    /// clean environment: `PATH`, `HOME` and `LANG` from keel's own (when
    /// set), then `env`; nothing else of keel's environment.
    Stdio { command: String, args: Vec<String>, env: BTreeMap<String, String>, cwd: Option<PathBuf> },
    /// A streamable HTTP endpoint (MCP 2025-03-26 and later), e.g.
    /// `http://127.0.0.1:3001/mcp`. `headers` go with every request
    /// (typically `Authorization`).
    Http { url: String, headers: BTreeMap<String, String> },
}

impl fmt::Debug for McpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            McpTransport::Stdio { command, args, env, cwd } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &Redacted(env))
                .field("cwd", cwd)
                .finish(),
            McpTransport::Http { url, headers } => {
                f.debug_struct("Http").field("url", url).field("headers", &Redacted(headers)).finish()
            }
        }
    }
}

/// Prints a map's keys with every value hidden.
struct Redacted<'a>(&'a BTreeMap<String, String>);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.0.keys().map(|key| (key, "<redacted>"))).finish()
    }
}

/// Policies shared by every server of a hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubConfig {
    pub backoff: Backoff,
    /// How many of a stdio server's last stderr lines to keep for the error
    /// shown when it fails.
    pub stderr_tail_lines: usize,
    /// On shutdown, how long a stdio server may take to exit after its stdin
    /// closes before it gets SIGTERM, and again before SIGKILL.
    pub exit_grace: Duration,
    /// How often a ready HTTP server is pinged. A stdio server's death is
    /// seen at once (its process exits); an HTTP server's only when a
    /// request fails, so the ping bounds how long its tools stay listed
    /// after it went away. `None` turns pinging off.
    pub http_ping_interval: Option<Duration>,
}

impl Default for HubConfig {
    fn default() -> HubConfig {
        HubConfig {
            backoff: Backoff::default(),
            stderr_tail_lines: 20,
            exit_grace: Duration::from_secs(2),
            http_ping_interval: Some(Duration::from_secs(30)),
        }
    }
}

/// Exponential backoff between attempts to (re)start a server.
///
/// The delay before attempt `n` (counting from 0 after the last healthy
/// spell) is `initial * 2^n`, capped at `max`. A server that stayed ready
/// for longer than `max` is considered healthy again and starts from
/// `initial` the next time it fails: a server that crashes at once after
/// every start therefore backs off, and one that crashes once a day does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(60) }
    }
}

impl Backoff {
    /// Shortest delay used, whatever the configuration says: a zero delay
    /// would respawn a crashing server in a busy loop.
    pub const FLOOR: Duration = Duration::from_millis(10);

    /// The delay before retry number `attempt` (0 for the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max).max(Backoff::FLOOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let backoff = Backoff::default();
        let delays: Vec<u64> = (0..9).map(|n| backoff.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(60));
        let zero = Backoff { initial: Duration::ZERO, max: Duration::ZERO };
        assert_eq!(zero.delay(0), Backoff::FLOOR);
    }

    #[test]
    fn debug_hides_secrets() {
        let mut config = McpServerConfig::stdio("gh", "gh-mcp", vec![]);
        if let McpTransport::Stdio { env, .. } = &mut config.transport {
            env.insert("GITHUB_TOKEN".into(), "ghp_secret".into());
        }
        let printed = format!("{config:?}");
        assert!(printed.contains("GITHUB_TOKEN"), "{printed}");
        assert!(!printed.contains("ghp_secret"), "{printed}");

        let mut config = McpServerConfig::http("remote", "https://example.test/mcp");
        if let McpTransport::Http { headers, .. } = &mut config.transport {
            headers.insert("Authorization".into(), "Bearer sk-secret".into());
        }
        let printed = format!("{config:?}");
        assert!(!printed.contains("sk-secret"), "{printed}");
    }
}
