//! Stdio servers: spawning the child process and ending it.
//!
//! Three rules, each for a reason:
//! - **Clean environment.** The child sees `PATH`, `HOME` and `LANG` from
//!   keel's environment and the server's configured `env`, nothing else.
//!   keel's own environment holds model API keys; an MCP server is
//!   third-party code and gets only what its configuration grants it.
//! - **Own process group.** `npx some-server` is a tree (npm, then node);
//!   killing only the direct child would orphan the real server. The child
//!   leads a new process group and every kill goes to the whole group, so it
//!   also cannot receive the terminal's Ctrl-C meant for keel.
//! - **Killed on drop.** [`StdioChild`] kills the group when dropped,
//!   synchronously, so no runtime or task is needed for it: a hub dropped
//!   without `shutdown`, or a runtime torn down mid-start, leaves no orphan.
//!
//! The child's stderr is read line by line into the tracing log (target
//! `keel_mcp`) and its last lines are kept, because when a server fails to
//! start (`npx` cannot find the package, a missing API key) the reason is
//! almost always there.
//!
//! We spawn the child ourselves instead of using rmcp's `TokioChildProcess`
//! to keep the exit status (for the error message), to signal the group
//! rather than the leader, and because its drop needs a running runtime.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::task::JoinHandle;

/// The variables a stdio server inherits from keel's environment, when set.
pub(crate) const INHERITED_VARIABLES: [&str; 3] = ["PATH", "HOME", "LANG"];

/// Longest stderr line kept, in bytes; a server dumping a minified bundle
/// into an exception must not fill the error message.
const MAX_STDERR_LINE: usize = 500;

/// How long to wait for the rest of stderr after the process exited.
const STDERR_DRAIN: Duration = Duration::from_millis(300);

/// The environment of a stdio server: the [`INHERITED_VARIABLES`] that
/// `parent` has, then `configured`, which wins on conflict.
pub(crate) fn child_env(
    parent: impl Fn(&str) -> Option<OsString>,
    configured: &BTreeMap<String, String>,
) -> BTreeMap<OsString, OsString> {
    let mut env: BTreeMap<OsString, OsString> =
        INHERITED_VARIABLES.iter().filter_map(|name| parent(name).map(|value| (OsString::from(name), value))).collect();
    env.extend(configured.iter().map(|(name, value)| (name.into(), value.into())));
    env
}

/// What to run.
pub(crate) struct StdioCommand<'a> {
    pub server: &'a str,
    pub command: &'a str,
    pub args: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub cwd: Option<&'a PathBuf>,
    pub stderr_tail_lines: usize,
}

/// A spawned server: its process, and the pipes the MCP transport takes.
pub(crate) struct Spawned {
    pub child: StdioChild,
    pub stdout: ChildStdout,
    pub stdin: ChildStdin,
}

pub(crate) fn spawn(spec: &StdioCommand<'_>) -> Result<Spawned, String> {
    if let Some(cwd) = spec.cwd
        && !cwd.is_dir()
    {
        return Err(format!("cannot start `{}`: working directory {} does not exist", spec.command, cwd.display()));
    }
    let env = child_env(|name| std::env::var_os(name), spec.env);
    let mut command = Command::new(spec.command);
    command
        .args(spec.args)
        .env_clear()
        .envs(&env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(cwd) = spec.cwd {
        command.current_dir(cwd);
    }
    let mut child = command.spawn().map_err(|error| spawn_error(spec.command, &env, &error))?;
    // Guard the group before anything else can fail.
    let group = ProcessGroup { leader: child.id().and_then(|pid| Pid::from_raw(pid.try_into().ok()?)) };
    let (Some(stdout), Some(stdin), Some(stderr)) = (child.stdout.take(), child.stdin.take(), child.stderr.take())
    else {
        return Err(format!("cannot start `{}`: its standard streams could not be captured", spec.command));
    };
    let tail = StderrTail::new(spec.stderr_tail_lines);
    let reader = tokio::spawn(read_stderr(spec.server.to_owned(), BufReader::new(stderr), tail.clone()));
    Ok(Spawned { child: StdioChild { child, group, tail, reader: Some(reader) }, stdout, stdin })
}

fn spawn_error(command: &str, env: &BTreeMap<OsString, OsString>, error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::NotFound if command.contains('/') => {
            format!("cannot start `{command}`: no such file; check the command's path")
        }
        io::ErrorKind::NotFound => {
            let path = env.get(&OsString::from("PATH")).map(|path| path.to_string_lossy().into_owned());
            format!(
                "cannot start `{command}`: command not found; install it or fix PATH (PATH={})",
                path.as_deref().unwrap_or("<unset>")
            )
        }
        io::ErrorKind::PermissionDenied => {
            format!("cannot start `{command}`: permission denied; check that it is an executable file")
        }
        _ => format!("cannot start `{command}`: {error}"),
    }
}

/// A running stdio server process. Dropping it kills its process group.
pub(crate) struct StdioChild {
    child: Child,
    group: ProcessGroup,
    tail: StderrTail,
    reader: Option<JoinHandle<()>>,
}

impl StdioChild {
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Waits until the process exits.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// After [`wait`](Self::wait) returned: kills what is left of the group
    /// and says how the process ended, with its last stderr lines.
    pub async fn exit_reason(&mut self, status: io::Result<ExitStatus>) -> String {
        self.group.kill(Signal::KILL);
        self.group.disarm();
        let what = match status {
            Ok(status) => format!("the server process ended ({status})"),
            Err(error) => format!("the server process could not be waited for ({error})"),
        };
        self.explain(what).await
    }

    /// `what`, followed by the last lines of stderr once the pipe has
    /// drained (briefly: a grandchild may hold it open).
    pub async fn explain(&mut self, what: String) -> String {
        if let Some(reader) = self.reader.as_mut()
            && tokio::time::timeout(STDERR_DRAIN, reader).await.is_ok()
        {
            self.reader = None;
        }
        self.tail.append_to(what)
    }

    /// Ends the process the MCP way: its stdin is already closed (the
    /// transport closed it), so wait `grace`, then SIGTERM the group and
    /// wait `grace` again, then SIGKILL it.
    pub async fn stop(mut self, grace: Duration) {
        for signal in [Signal::TERM, Signal::KILL] {
            if tokio::time::timeout(grace, self.child.wait()).await.is_ok() {
                break;
            }
            self.group.kill(signal);
        }
        // Reap the leader (SIGKILL was sent if it got this far) and take
        // down anything it left behind.
        let _ = tokio::time::timeout(grace, self.child.wait()).await;
        self.group.kill(Signal::KILL);
        self.group.disarm();
    }
}

impl Drop for StdioChild {
    fn drop(&mut self) {
        self.group.kill(Signal::KILL);
        if let Some(reader) = self.reader.take() {
            reader.abort();
        }
    }
}

/// The process group led by a stdio server. Signals go to the whole group.
struct ProcessGroup {
    leader: Option<Pid>,
}

impl ProcessGroup {
    fn kill(&self, signal: Signal) {
        if let Some(leader) = self.leader {
            // ESRCH (nothing left in the group) is the expected outcome.
            let _ = kill_process_group(leader, signal);
        }
    }

    /// Forgets the group once it is known to be gone, so that a later drop
    /// cannot signal an unrelated group that reused the id.
    fn disarm(&mut self) {
        self.leader = None;
    }
}

/// The last lines a server wrote to stderr.
#[derive(Clone)]
struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    capacity: usize,
}

impl StderrTail {
    fn new(capacity: usize) -> StderrTail {
        StderrTail { lines: Arc::new(Mutex::new(VecDeque::with_capacity(capacity))), capacity }
    }

    fn push(&self, line: String) {
        if self.capacity == 0 {
            return;
        }
        // std Mutex: held for a push, never across an await.
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() == self.capacity {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    fn append_to(&self, what: String) -> String {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.is_empty() {
            return what;
        }
        let mut message = format!("{what}; its last stderr lines:");
        for line in lines.iter() {
            message.push_str("\n  ");
            message.push_str(line);
        }
        message
    }
}

async fn read_stderr(server: String, mut stderr: BufReader<tokio::process::ChildStderr>, tail: StderrTail) {
    let mut buffer = Vec::new();
    loop {
        buffer.clear();
        match stderr.read_until(b'\n', &mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut line = String::from_utf8_lossy(&buffer).trim_end().to_owned();
        if line.is_empty() {
            continue;
        }
        if line.len() > MAX_STDERR_LINE {
            let mut end = MAX_STDERR_LINE;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            line.truncate(end);
            line.push('…');
        }
        tracing::info!(target: "keel_mcp", server = %server, "stderr: {line}");
        tail.push(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_keeps_only_the_allowed_variables_and_the_configured_ones() {
        let parent = |name: &str| match name {
            "PATH" => Some(OsString::from("/usr/bin")),
            "HOME" => Some(OsString::from("/home/keel")),
            "OPENAI_API_KEY" => Some(OsString::from("sk-secret")),
            _ => None,
        };
        let configured = BTreeMap::from([
            ("GITHUB_TOKEN".to_owned(), "ghp_granted".to_owned()),
            ("HOME".to_owned(), "/tmp/server-home".to_owned()),
        ]);
        let env = child_env(parent, &configured);
        let env: Vec<(&str, &str)> =
            env.iter().map(|(name, value)| (name.to_str().unwrap(), value.to_str().unwrap())).collect();
        assert_eq!(env, [("GITHUB_TOKEN", "ghp_granted"), ("HOME", "/tmp/server-home"), ("PATH", "/usr/bin")]);
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let tail = StderrTail::new(2);
        assert_eq!(tail.append_to("exited".into()), "exited");
        for line in ["one", "two", "three"] {
            tail.push(line.into());
        }
        assert_eq!(tail.append_to("exited".into()), "exited; its last stderr lines:\n  two\n  three");
    }

    #[tokio::test]
    async fn missing_command_says_so() {
        let env = BTreeMap::new();
        let spec = StdioCommand {
            server: "missing",
            command: "keel-mcp-no-such-command",
            args: &[],
            env: &env,
            cwd: None,
            stderr_tail_lines: 5,
        };
        let Err(error) = spawn(&spec) else { panic!("spawned a command that does not exist") };
        assert!(error.contains("command not found"), "{error}");
    }

    #[tokio::test]
    async fn exit_reason_has_status_and_stderr() {
        let env = BTreeMap::new();
        let args = ["-c".to_owned(), "echo 'npm ERR! 404 Not Found' >&2; exit 3".to_owned()];
        let spec =
            StdioCommand { server: "sh", command: "sh", args: &args, env: &env, cwd: None, stderr_tail_lines: 5 };
        let Spawned { mut child, .. } = spawn(&spec).unwrap();
        let status = child.wait().await;
        let reason = child.exit_reason(status).await;
        assert!(reason.contains("exit status: 3"), "{reason}");
        assert!(reason.ends_with("\n  npm ERR! 404 Not Found"), "{reason}");
    }
}
