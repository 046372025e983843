//! A coworker's resource policy: what its tools may touch beyond the
//! session's workspace.
//!
//! Written in a bundle as `[coworkers.<id>.resources]`; the sandboxed runner
//! turns it into Landlock rules, a network namespace and process limits.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Folders, network and environment a coworker's tools may use.
///
/// The default is the tightest useful policy: the workspace read-write,
/// system folders read-only, no network, no variables from keel's
/// environment.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcePolicy {
    /// Folders readable beyond the workspace (absolute paths).
    #[serde(default)]
    pub read: Vec<PathBuf>,
    /// Folders readable and writable beyond the workspace (absolute paths).
    #[serde(default)]
    pub write: Vec<PathBuf>,
    /// Whether tools may use the network. Off: the runner lives in a
    /// network namespace with no interfaces.
    #[serde(default)]
    pub network: bool,
    /// Names of keel's environment variables passed through to tools;
    /// nothing else of keel's environment reaches them.
    #[serde(default)]
    pub env: Vec<String>,
    /// Limits on `shell.run` commands.
    #[serde(default)]
    pub shell: ShellLimits,
}

/// Limits on `shell.run` commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ShellLimits {
    /// Timeout when the call names none.
    #[schemars(range(min = 1))]
    pub timeout_secs: u64,
    /// The longest timeout a call may ask for (at least `timeout_secs`).
    #[schemars(range(min = 1))]
    pub max_timeout_secs: u64,
    /// Output kept per command (stdout and stderr together); a command that
    /// prints more is stopped.
    pub output_limit_bytes: u64,
    /// Processes a command may run at once (a fork bomb hits this; at
    /// least 300 where the kernel caps a PID namespace).
    pub max_processes: u64,
    /// Largest file a command may write.
    pub max_file_bytes: u64,
}

impl Default for ShellLimits {
    fn default() -> ShellLimits {
        ShellLimits {
            timeout_secs: 60,
            max_timeout_secs: 600,
            output_limit_bytes: 64 * 1024,
            max_processes: 512,
            max_file_bytes: 1024 * 1024 * 1024,
        }
    }
}
