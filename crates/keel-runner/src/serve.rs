//! The runner process: read the policy, confine, then answer tool calls
//! one at a time until stdin ends.
//!
//! A reason the runner cannot serve goes to keel in the hello line, and
//! keel returns it with the call; stderr gets it only when keel cannot be
//! told, so each failure is said once, by whoever handles it.

use std::io::{BufRead, Write};
use std::sync::{Arc, mpsc};

use base64::Engine;
use keel_tools::{ResourcePolicy, ToolContext, ToolOutput};

use crate::protocol::{Hello, Reply, Request, SandboxPolicy, WireImage};
use crate::{sandbox, shell};

fn say(out: &mut impl Write, line: &impl serde::Serialize) -> std::io::Result<()> {
    let mut text = serde_json::to_string(line).map_err(std::io::Error::other)?;
    text.push('\n');
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// Why a runner stopped before stdin ended.
enum Stop {
    /// Keel was told, in the [`Hello::Failed`] line; it returns the reason
    /// with the call, so printing it too would say it twice.
    Reported,
    /// Keel could not be told: stderr is the only place left.
    Unreported(String),
}

impl From<String> for Stop {
    fn from(message: String) -> Stop {
        Stop::Unreported(message)
    }
}

impl From<&str> for Stop {
    fn from(message: &str) -> Stop {
        Stop::Unreported(message.to_string())
    }
}

/// Tells keel why the runner cannot serve, falling back to stderr.
fn refuse(output: &mut impl Write, reason: String) -> Stop {
    match say(output, &Hello::Failed(reason.clone())) {
        Ok(()) => Stop::Reported,
        Err(_) => Stop::Unreported(reason),
    }
}

/// The runner's main; never returns.
pub fn serve() -> ! {
    let code = match run() {
        Ok(()) => 0,
        Err(Stop::Reported) => 3,
        Err(Stop::Unreported(message)) => {
            eprintln!("keel runner: {message}");
            3
        }
    };
    std::process::exit(code)
}

/// A file-tool call for the worker thread, and where to answer.
type Job = (String, serde_json::Value, mpsc::SyncSender<ToolOutput>);

fn run() -> Result<(), Stop> {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut output = std::io::stdout().lock();
    let mut line = String::new();
    input.read_line(&mut line).map_err(|e| format!("cannot read the policy: {e}"))?;
    let policy: SandboxPolicy = serde_json::from_str(&line).map_err(|e| format!("the policy is not valid: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the runner's executable: {e}"))?;
    let prepared = sandbox::confine_process(&policy).and_then(|(confinement, caps)| {
        let (ruleset, for_commands) = sandbox::ruleset(&policy, &exe)?;
        Ok((confinement, caps, ruleset, for_commands))
    });
    let (mut confinement, caps, ruleset, for_commands) = match prepared {
        Ok(prepared) => prepared,
        Err(reason) => return Err(refuse(&mut output, reason)),
    };
    if let Err(e) = std::env::set_current_dir(&policy.workspace) {
        return Err(refuse(&mut output, format!("cannot enter the workspace: {e}")));
    }
    // The file tools' thread confines itself before it takes any request.
    let (jobs, abi) = match file_worker(&policy, ruleset) {
        Ok(started) => started,
        Err(reason) => return Err(refuse(&mut output, reason)),
    };
    confinement.filesystem = format!("landlock-v{abi}");
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return Err(refuse(&mut output, format!("cannot start the runner's runtime: {e}"))),
    };
    say(&mut output, &Hello::Ready(confinement)).map_err(|e| e.to_string())?;
    let commands =
        shell::Commands { exe, ruleset: for_commands, limits: policy.shell.clone(), pid_max: caps.pid_max() };
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) => return Err(format!("cannot read a request: {e}").into()),
        }
        let request: Request = serde_json::from_str(&line).map_err(|e| format!("a request is not valid: {e}"))?;
        let result = if request.tool == "shell.run" {
            runtime.block_on(commands.run(&policy.workspace, request.arguments))
        } else {
            let (answer, answered) = mpsc::sync_channel(1);
            jobs.send((request.tool, request.arguments, answer)).map_err(|_| "the file tools' thread stopped")?;
            answered.recv().map_err(|_| "the file tools' thread stopped")?
        };
        let images = result
            .images
            .iter()
            .map(|image| WireImage {
                mime_type: image.mime_type.clone(),
                data: base64::engine::general_purpose::STANDARD.encode(&image.data),
            })
            .collect();
        let reply = Reply { id: request.id, text: result.text, is_error: result.is_error, images };
        say(&mut output, &reply).map_err(|e| format!("cannot answer: {e}"))?;
    }
}

/// Starts the thread that runs the file tools under Landlock; returns its
/// queue and the ABI Landlock enforced.
fn file_worker(policy: &SandboxPolicy, ruleset: landlock::RulesetCreated) -> Result<(mpsc::Sender<Job>, i64), String> {
    let (jobs, queue) = mpsc::channel::<Job>();
    let (ready, restricted) = mpsc::sync_channel::<Result<i64, String>>(1);
    let context = ToolContext {
        session_id: String::new(),
        workspace: policy.workspace.clone(),
        resources: Arc::new(ResourcePolicy {
            read: policy.read.clone(),
            write: policy.write.clone(),
            network: policy.network,
            env: Vec::new(),
            shell: policy.shell.clone(),
        }),
    };
    std::thread::Builder::new()
        .name("keel-file-tools".into())
        .spawn(move || {
            let abi = match sandbox::restrict_thread(ruleset) {
                Ok(abi) => abi,
                Err(reason) => {
                    let _ = ready.send(Err(reason));
                    return;
                }
            };
            // Threads this runtime starts inherit the confinement.
            let runtime =
                match tokio::runtime::Builder::new_current_thread().enable_all().max_blocking_threads(2).build() {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = ready.send(Err(format!("cannot start the file tools' runtime: {e}")));
                        return;
                    }
                };
            let _ = ready.send(Ok(abi));
            let tools = keel_tools::builtin::file_tools();
            while let Ok((name, arguments, answer)) = queue.recv() {
                let output = match tools.iter().find(|t| t.descriptor().name == name) {
                    Some(tool) => runtime.block_on(tool.call(&context, arguments)),
                    None => ToolOutput::error(format!("the runner has no tool named {name:?}")),
                };
                let _ = answer.send(output);
            }
        })
        .map_err(|e| format!("cannot start the file tools' thread: {e}"))?;
    let abi = restricted.recv().map_err(|_| "the file tools' thread stopped before it was confined".to_string())??;
    Ok((jobs, abi))
}
