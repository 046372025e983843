//! keel's sandboxed tool runner.
//!
//! Built-in tools never run in the runtime's process. The runtime asks a
//! [`RunnerPool`] to call them; the pool keeps one runner process per
//! session (started on the session's first tool call, stopped after it has
//! been idle a while, replaced when the session's policy changes) and talks
//! to it over pipes ([`protocol`]). A runner is keel's own executable
//! started with [`RUNNER_ARG`]; a binary that hosts runners calls
//! [`run_if_requested`] first thing in `main`.
//!
//! A runner confines itself before it reads its first request
//! ([`sandbox`]): Landlock for the file system, its own network namespace
//! unless the policy allows the network, process and file-size limits, a
//! clean environment chosen by the runtime. If any part cannot be set up
//! the runner says why and exits, and the call fails with that reason:
//! keel never runs a tool unconfined. Each `shell.run` command runs as the
//! init of a fresh PID namespace, so a timeout, an output flood or a
//! cancelled turn kills the whole process tree ([`shell`]).
//!
//! Spawn or reuse: a runner costs one process start and one confinement
//! (a few milliseconds); reusing it per session makes the common call a
//! pipe round trip. `keel-bench runner` measures both.

pub mod pool;
pub mod protocol;
pub mod sandbox;
pub mod serve;
pub mod shell;

pub use pool::{RunnerCommand, RunnerError, RunnerPool, RunnerReply};
pub use protocol::{Confinement, SandboxPolicy};

/// The argument that makes keel's executable a runner.
pub const RUNNER_ARG: &str = "__keel-runner";
/// The argument that makes keel's executable a command's PID-namespace
/// init helper.
pub const INIT_ARG: &str = "__keel-runner-init";

/// Becomes a runner (or a command's init helper) if this process was
/// started as one, and never returns then. Call it first thing in `main`,
/// before any thread starts.
pub fn run_if_requested() {
    let mut args = std::env::args();
    let _program = args.next();
    match args.next().as_deref() {
        Some(RUNNER_ARG) => serve::serve(),
        Some(INIT_ARG) => {
            let rest: Vec<String> = args.collect();
            sandbox::run_init(&rest)
        }
        _ => {}
    }
}
