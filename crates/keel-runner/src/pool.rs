//! The runtime's side: runner processes per session, spawned on demand,
//! reused while busy, stopped when idle.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use base64::Engine;
use keel_tools::ToolImage;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

use crate::protocol::{Confinement, Hello, Reply, Request, SandboxPolicy};

/// How to start a runner: a program and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl RunnerCommand {
    /// This process's own executable with [`crate::RUNNER_ARG`]; the binary
    /// must call [`crate::run_if_requested`] at the top of `main`.
    pub fn this_executable() -> std::io::Result<RunnerCommand> {
        Ok(RunnerCommand { program: std::env::current_exe()?, args: vec![crate::RUNNER_ARG.into()] })
    }
}

/// Why a call could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("cannot start the tool runner {program}: {reason}")]
    Spawn { program: String, reason: String },
    #[error("the tool was not run: the sandbox could not be set up: {0}")]
    Confinement(String),
    #[error("the tool runner stopped during the call ({0}); the tool may have partly run")]
    Died(String),
    #[error("the tool runner answered something unreadable: {0}")]
    Protocol(String),
}

/// A tool call's answer and the confinement it ran under.
#[derive(Debug, Clone)]
pub struct RunnerReply {
    pub text: String,
    pub is_error: bool,
    pub images: Vec<ToolImage>,
    pub confinement: Confinement,
}

struct Runner {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    policy: SandboxPolicy,
    confinement: Confinement,
    next_id: u64,
}

struct Parked {
    runner: Runner,
    since: Instant,
}

struct Inner {
    command: RunnerCommand,
    idle: Duration,
    parked: Mutex<HashMap<String, Parked>>,
}

/// Runner processes by session.
#[derive(Clone)]
pub struct RunnerPool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RunnerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerPool").field("command", &self.inner.command).field("idle", &self.inner.idle).finish()
    }
}

fn lock(parked: &Mutex<HashMap<String, Parked>>) -> MutexGuard<'_, HashMap<String, Parked>> {
    parked.lock().unwrap_or_else(PoisonError::into_inner)
}

/// How long a runner has to confine itself and say so.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

impl RunnerPool {
    /// A pool that stops a session's runner after `idle` without calls.
    /// Must be created inside a Tokio runtime (it starts a reaper task).
    pub fn new(command: RunnerCommand, idle: Duration) -> RunnerPool {
        let inner = Arc::new(Inner { command, idle, parked: Mutex::new(HashMap::new()) });
        let weak = Arc::downgrade(&inner);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(reap(weak, idle));
        }
        RunnerPool { inner }
    }

    /// Calls `tool` in `session_id`'s runner, starting one under `policy`
    /// if the session has none (or had one under another policy).
    ///
    /// If the returned future is dropped mid-call (the turn was cancelled)
    /// the runner is killed, and with it whatever the call started.
    pub async fn call(
        &self,
        session_id: &str,
        policy: &SandboxPolicy,
        tool: &str,
        arguments: Value,
    ) -> Result<RunnerReply, RunnerError> {
        let parked = lock(&self.inner.parked).remove(session_id);
        let reusable = parked.map(|p| p.runner).and_then(|mut r| {
            let alive = matches!(r.child.try_wait(), Ok(None));
            (alive && r.policy == *policy).then_some(r)
        });
        let mut runner = match reusable {
            Some(runner) => runner,
            None => self.spawn(policy).await?,
        };
        runner.next_id += 1;
        let request = Request { id: runner.next_id, tool: tool.to_string(), arguments };
        let reply = exchange(&mut runner, &request).await?;
        let images = decode_images(&reply)?;
        let answer =
            RunnerReply { text: reply.text, is_error: reply.is_error, images, confinement: runner.confinement.clone() };
        lock(&self.inner.parked).insert(session_id.to_string(), Parked { runner, since: Instant::now() });
        Ok(answer)
    }

    /// Starts a runner. It asks the kernel to kill it when the thread that
    /// spawned it exits; that is a Tokio worker thread, which lives as long
    /// as the runtime, so in effect the runner dies with keel.
    async fn spawn(&self, policy: &SandboxPolicy) -> Result<Runner, RunnerError> {
        let command = &self.inner.command;
        let spawn_failed =
            |reason: String| RunnerError::Spawn { program: command.program.display().to_string(), reason };
        std::fs::create_dir_all(&policy.scratch)
            .map_err(|e| spawn_failed(format!("cannot create the scratch folder {}: {e}", policy.scratch.display())))?;
        let mut child = tokio::process::Command::new(&command.program)
            .args(&command.args)
            .env_clear()
            .envs(&policy.env)
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| spawn_failed(e.to_string()))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(spawn_failed("no pipes to the runner".into()));
        };
        let mut stdout = BufReader::new(stdout).lines();
        let mut line = serde_json::to_string(policy).map_err(|e| RunnerError::Protocol(e.to_string()))?;
        line.push('\n');
        let hello = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await?;
            stdout.next_line().await
        };
        let hello = match tokio::time::timeout(HELLO_TIMEOUT, hello).await {
            Ok(Ok(Some(hello))) => hello,
            Ok(Ok(None)) | Ok(Err(_)) => return Err(RunnerError::Confinement(exit_reason(&mut child).await)),
            Err(_) => return Err(RunnerError::Confinement("the runner did not report its confinement in time".into())),
        };
        match serde_json::from_str::<Hello>(&hello) {
            Ok(Hello::Ready(confinement)) => {
                Ok(Runner { child, stdin, stdout, policy: policy.clone(), confinement, next_id: 0 })
            }
            Ok(Hello::Failed(reason)) => Err(RunnerError::Confinement(reason)),
            Err(e) => Err(RunnerError::Protocol(format!("{e}: {hello}"))),
        }
    }

    /// Stops `session_id`'s runner, if it has one.
    pub fn stop(&self, session_id: &str) {
        lock(&self.inner.parked).remove(session_id);
    }

    /// Stops every idle runner.
    pub fn stop_all(&self) {
        lock(&self.inner.parked).clear();
    }

    /// Runners alive and idle.
    pub fn idle_runners(&self) -> usize {
        lock(&self.inner.parked).len()
    }
}

async fn exchange(runner: &mut Runner, request: &Request) -> Result<Reply, RunnerError> {
    let mut line = serde_json::to_string(request).map_err(|e| RunnerError::Protocol(e.to_string()))?;
    line.push('\n');
    let sent = async {
        runner.stdin.write_all(line.as_bytes()).await?;
        runner.stdin.flush().await
    };
    if sent.await.is_err() {
        return Err(RunnerError::Died(exit_reason(&mut runner.child).await));
    }
    let answer = match runner.stdout.next_line().await {
        Ok(Some(answer)) => answer,
        Ok(None) | Err(_) => return Err(RunnerError::Died(exit_reason(&mut runner.child).await)),
    };
    let reply: Reply = serde_json::from_str(&answer).map_err(|e| RunnerError::Protocol(e.to_string()))?;
    if reply.id != request.id {
        return Err(RunnerError::Protocol(format!("answer {} to request {}", reply.id, request.id)));
    }
    Ok(reply)
}

fn decode_images(reply: &Reply) -> Result<Vec<ToolImage>, RunnerError> {
    reply
        .images
        .iter()
        .map(|image| {
            let data = base64::engine::general_purpose::STANDARD
                .decode(&image.data)
                .map_err(|e| RunnerError::Protocol(format!("an image is not base64: {e}")))?;
            Ok(ToolImage { mime_type: image.mime_type.clone(), data })
        })
        .collect()
}

/// How a runner ended, waiting briefly for it.
async fn exit_reason(child: &mut Child) -> String {
    match tokio::time::timeout(Duration::from_secs(2), child.wait()).await {
        Ok(Ok(status)) => {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (_, Some(signal)) => format!("killed by signal {signal}"),
                (Some(code), _) => format!("exit code {code}"),
                _ => status.to_string(),
            }
        }
        _ => "it closed its output".into(),
    }
}

async fn reap(pool: Weak<Inner>, idle: Duration) {
    let period = (idle / 2).max(Duration::from_millis(50));
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = pool.upgrade() else { return };
        let now = Instant::now();
        lock(&inner.parked).retain(|_, p| now.duration_since(p.since) < idle);
    }
}
