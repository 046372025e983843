//! `shell.run`: a command line run with `sh -c` inside the runner's
//! confinement, as the init of its own PID namespace.
//!
//! The command gets the runner's clean environment, `/dev/null` as stdin,
//! a timeout (the call's `timeout_secs`, capped by the policy) and an output
//! cap: stdout and stderr together may hold `output_limit_bytes`; a command
//! that prints more is stopped, since a model cannot use endless output and
//! it would otherwise fill memory. Stopping kills the init helper; the
//! command, its PID namespace's init, dies with it and takes every process
//! it started along.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use keel_tools::workspace::resolve;
use keel_tools::{ShellLimits, ToolOutput};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::sandbox;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShellArgs {
    command: String,
    #[serde(default)]
    workdir: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
}

/// Why a command stopped before it finished on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    Timeout,
    OutputLimit,
}

/// What commands run with.
pub struct Commands {
    /// The runner's executable, which doubles as each command's init.
    pub exe: PathBuf,
    /// The Landlock ruleset every command enforces before it executes.
    pub ruleset: OwnedFd,
    pub limits: ShellLimits,
    /// The `pid_max` each command's namespace gets, where the kernel keeps
    /// one per namespace ([`sandbox::ProcessCaps::pid_max`]).
    pub pid_max: Option<u64>,
}

impl Commands {
    /// Runs a `shell.run` call.
    pub async fn run(&self, workspace: &Path, arguments: Value) -> ToolOutput {
        run(self, workspace, arguments).await
    }
}

async fn run(commands: &Commands, workspace: &Path, arguments: Value) -> ToolOutput {
    let limits = &commands.limits;
    let args: ShellArgs = match serde_json::from_value(arguments) {
        Ok(args) => args,
        Err(e) => return ToolOutput::error(format!("invalid arguments: {e}")),
    };
    let workdir = match &args.workdir {
        Some(dir) => match resolve(workspace, dir) {
            Ok(dir) => dir,
            Err(e) => return ToolOutput::error(e.to_string()),
        },
        None => workspace.to_path_buf(),
    };
    let timeout =
        Duration::from_secs(args.timeout_secs.unwrap_or(limits.timeout_secs).clamp(1, limits.max_timeout_secs));
    let mut command = tokio::process::Command::new(&commands.exe);
    command
        .arg(crate::INIT_ARG)
        .arg(commands.ruleset.as_raw_fd().to_string())
        .arg(commands.pid_max.map_or_else(|| "-".to_string(), |n| n.to_string()))
        .arg("/bin/sh")
        .arg("-c")
        .arg(&args.command)
        .current_dir(&workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    sandbox::spawn_init(&mut command, commands.ruleset.as_raw_fd());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return ToolOutput::error(format!("cannot start the command: {e}")),
    };
    let pid = child.id();
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return ToolOutput::error("cannot capture the command's output");
    };
    let cap = usize::try_from(limits.output_limit_bytes).unwrap_or(usize::MAX);
    let mut out = Capture::new(stdout);
    let mut err = Capture::new(stderr);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut stopped = None;
    // Read both streams until both end, the output cap is passed, or the
    // deadline comes.
    while !(out.done && err.done) {
        tokio::select! {
            _ = &mut deadline => { stopped = Some(Stopped::Timeout); break; }
            _ = out.step(), if !out.done => {}
            _ = err.step(), if !err.done => {}
        }
        if out.data.len() + err.data.len() > cap {
            stopped = Some(Stopped::OutputLimit);
            break;
        }
    }
    if stopped.is_some()
        && let Some(pid) = pid
    {
        sandbox::kill(pid);
    }
    let status = match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
        Ok(Ok(status)) => Some(status),
        _ => None,
    };
    render(out.data, err.data, cap, status, stopped, timeout)
}

struct Capture<R> {
    reader: R,
    data: Vec<u8>,
    done: bool,
}

impl<R: AsyncRead + Unpin> Capture<R> {
    fn new(reader: R) -> Capture<R> {
        Capture { reader, data: Vec::new(), done: false }
    }

    async fn step(&mut self) {
        let mut chunk = [0u8; 8192];
        match self.reader.read(&mut chunk).await {
            Ok(0) | Err(_) => self.done = true,
            Ok(n) => self.data.extend_from_slice(&chunk[..n]),
        }
    }
}

fn render(
    mut stdout: Vec<u8>,
    mut stderr: Vec<u8>,
    cap: usize,
    status: Option<std::process::ExitStatus>,
    stopped: Option<Stopped>,
    timeout: Duration,
) -> ToolOutput {
    let truncated = stdout.len() + stderr.len() > cap;
    stdout.truncate(cap);
    stderr.truncate(cap.saturating_sub(stdout.len()));
    let exit_code = match stopped {
        Some(_) => None,
        None => status.and_then(|s| s.code()),
    };
    let note = match stopped {
        Some(Stopped::Timeout) => Some(format!(
            "the command was stopped after {} s (timeout); every process it started was killed",
            timeout.as_secs()
        )),
        Some(Stopped::OutputLimit) => Some(format!(
            "the command was stopped after printing more than {cap} bytes; every process it started was killed. Redirect large output to a file and read parts of it"
        )),
        None if exit_code.is_none() => Some("the command was killed by a signal".into()),
        None => None,
    };
    let mut body = json!({
        "exit_code": exit_code,
        "stdout": String::from_utf8_lossy(&stdout),
        "stderr": String::from_utf8_lossy(&stderr),
    });
    if truncated {
        body["output_truncated"] = json!(true);
    }
    if let Some(note) = note {
        body["note"] = json!(note);
    }
    ToolOutput { text: body.to_string(), is_error: exit_code != Some(0), ..ToolOutput::default() }
}
