//! What keel and a runner say to each other: one JSON object per line.
//!
//! 1. keel writes the [`SandboxPolicy`] as the first line of the runner's
//!    stdin;
//! 2. the runner confines itself and answers [`Hello::Ready`] with the
//!    [`Confinement`] in force, or [`Hello::Failed`] and exits;
//! 3. then, one at a time, keel writes a [`Request`] and the runner answers
//!    a [`Reply`] with the same id.
//!
//! End of stdin tells the runner to exit. Images travel base64-encoded.

use std::collections::BTreeMap;
use std::path::PathBuf;

use keel_tools::ShellLimits;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Everything a runner needs to confine itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPolicy {
    /// The session's workspace: readable and writable.
    pub workspace: PathBuf,
    /// Extra readable folders.
    pub read: Vec<PathBuf>,
    /// Extra readable and writable folders.
    pub write: Vec<PathBuf>,
    pub network: bool,
    /// The runner's whole environment, resolved by keel (the pass-through
    /// variables of the policy, plus `PATH`, `HOME`, `TMPDIR`, `LANG`).
    pub env: BTreeMap<String, String>,
    /// A private scratch folder, readable and writable, used as `HOME` and
    /// `TMPDIR`.
    pub scratch: PathBuf,
    pub shell: ShellLimits,
}

/// How a runner is confined, as journaled with each tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    /// `landlock-v<abi>`: the Landlock ABI the file rules were enforced at.
    pub filesystem: String,
    /// `isolated` (own network namespace, no interfaces) or `allowed`.
    pub network: String,
    /// `pid-namespace`: each command runs as the init of its own PID
    /// namespace, so the whole tree dies with it. Then what caps processes
    /// ([`crate::sandbox::ProcessCaps`]): `+pid_max:<n>` (at most `n` per
    /// command), `+rlimit:<n>` (at most `n` for the runner's threads and
    /// all its commands together), or `+uncapped` (only the timeout stops
    /// a fork bomb).
    pub processes: String,
    /// `clean`: only the policy's variables.
    pub environment: String,
}

/// The runner's first line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hello {
    Ready(Confinement),
    Failed(String),
}

/// One tool call.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    /// Qualified tool name, for example `fs.read_file`.
    pub tool: String,
    pub arguments: Value,
}

/// An image in a reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireImage {
    pub mime_type: String,
    /// Base64 (standard alphabet, padded).
    pub data: String,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Reply {
    pub id: u64,
    pub text: String,
    pub is_error: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<WireImage>,
}
