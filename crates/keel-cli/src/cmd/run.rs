//! `keel run`: one task, answered on stdout.
//!
//! With no `--bundle`, the built-in assistant coworker is used (see
//! `builtin.rs`), so `keel run "..."` works from any directory. The task is
//! the arguments, or standard input when it is `-`. `--json` prints every
//! journal event of the session as one JSON object per line (as `keel
//! events` does) instead of the answer text.
//!
//! A call the policy asks about is put to the person at the terminal; when
//! stdin is not a terminal (or holds the task), `keel run` exits with code 3
//! and the question stays pending in the state directory.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use keel_protocol::EventKind;
use keel_protocol::ids::new_id;
use keel_runtime::{Bundle, BusMessage, NewSession, Runtime, RuntimeConfig};

#[derive(clap::Args)]
pub struct Args {
    /// The bundle directory that defines the coworker (default: the built-in assistant).
    #[arg(long)]
    bundle: Option<PathBuf>,
    /// The coworker's id in the bundle (default: the bundle's only coworker, or `assistant-example`).
    #[arg(long)]
    coworker: Option<String>,
    /// The folder the coworker may work in (default: the current folder).
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// Use this model (`provider:model`) instead of the coworker's.
    #[arg(long)]
    model: Option<String>,
    /// Print the session's journal events as JSON lines instead of the answer.
    #[arg(long)]
    json: bool,
    /// The task; `-` reads it from standard input. Flags may come before or
    /// after it; a task that itself starts with `-` follows `--`.
    #[arg(required = true, num_args = 1..)]
    text: Vec<String>,
}

/// The task text: the arguments, or all of stdin for `-`.
fn task_text(args: &[String]) -> anyhow::Result<(String, bool)> {
    if args.len() == 1 && args[0] == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| anyhow::anyhow!("cannot read the task from standard input: {e}"))?;
        if text.trim().is_empty() {
            return Err(
                keel_runtime::RuntimeError::InvalidParams("the task read from standard input is empty".into()).into()
            );
        }
        return Ok((text, true));
    }
    Ok((args.join(" "), false))
}

/// The coworker to run: the one asked for, else the bundle's only one, else
/// the built-in id when the bundle has it.
fn pick_coworker(bundle: &Bundle, asked: Option<String>) -> anyhow::Result<String> {
    if let Some(id) = asked {
        return Ok(id);
    }
    if bundle.coworkers.len() == 1 {
        return Ok(bundle.coworkers.keys().next().cloned().unwrap_or_default());
    }
    if bundle.coworkers.contains_key(crate::builtin::ASSISTANT_COWORKER) {
        return Ok(crate::builtin::ASSISTANT_COWORKER.to_string());
    }
    let ids: Vec<&str> = bundle.coworkers.keys().map(String::as_str).collect();
    Err(keel_runtime::RuntimeError::InvalidParams(format!(
        "the bundle defines several coworkers ({}); choose one with --coworker",
        ids.join(", ")
    ))
    .into())
}

pub async fn run(state: PathBuf, args: Args) -> anyhow::Result<ExitCode> {
    let (text, task_from_stdin) = task_text(&args.text)?;
    let bundle_dir = match args.bundle {
        Some(dir) => dir,
        None => {
            keel_runtime::state_dir::ensure(&state)?;
            crate::builtin::assistant_bundle(&state)?
        }
    };
    let bundle = Bundle::load(&bundle_dir)?;
    let coworker = pick_coworker(&bundle, args.coworker)?;
    let Some(spec) = bundle.coworkers.get(&coworker) else {
        let ids: Vec<&str> = bundle.coworkers.keys().map(String::as_str).collect();
        return Err(keel_runtime::RuntimeError::InvalidParams(format!(
            "no coworker {coworker:?} in {}; it defines: {}",
            bundle_dir.display(),
            ids.join(", ")
        ))
        .into());
    };
    let mut config = RuntimeConfig::new(&state);
    config.bundles = vec![bundle_dir];
    config.providers = crate::providers::from_env()?;
    config.retry = crate::providers::retry_from_env()?;
    config.secrets = crate::providers::secrets_from_env();
    config.model_override = match args.model {
        Some(model) => Some(model),
        None if !crate::providers::any_remote_configured() => {
            eprintln!(
                "keel: no provider is configured (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...); using the local model {}",
                crate::providers::LOCAL_DEFAULT
            );
            Some(crate::providers::LOCAL_DEFAULT.to_string())
        }
        None => None,
    };
    let model = config.model_override.clone().unwrap_or_else(|| spec.model.clone());
    crate::providers::check_model_credentials(&model)?;
    let (telemetry, telemetry_guard) = crate::telemetry::start()?;
    config.telemetry = telemetry;
    let runtime = Runtime::open(config).await?;
    runtime.recover().await?;
    let workspace = match args.workspace {
        Some(dir) => dir,
        None => std::env::current_dir()?,
    };
    let session = runtime
        .create_session(NewSession {
            name: format!("run: {}", text.trim().chars().take(40).collect::<String>()),
            coworker,
            workspace: workspace.display().to_string(),
            attended: true,
            compaction: None,
        })
        .await?;
    let mut events = runtime.subscribe(&session.id, 0).await?;
    let started = runtime.start_turn(&session.id, &new_id("sub"), &text).await?;
    eprintln!("keel: session {} turn {}", session.id, started.turn_id);
    if model.starts_with("local:") {
        eprintln!(
            "keel: {model} runs in this process; loading it and the first answer take a while (15-60 s on 2 cores)"
        );
    }
    let output = Output { json: args.json, can_ask: !task_from_stdin && std::io::stdin().is_terminal() };
    let code = tokio::select! {
        code = follow(&runtime, &session.id, &mut events, &started.turn_id, output) => code?,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("\nkeel: interrupting the turn");
            runtime.interrupt_turn(&session.id).await?;
            ExitCode::from(130)
        }
    };
    runtime.shutdown().await;
    crate::telemetry::finish(telemetry_guard).await;
    Ok(code)
}

/// How `follow` reports.
#[derive(Clone, Copy)]
struct Output {
    /// Journal events as JSON lines on stdout instead of the answer text.
    json: bool,
    /// Whether a person at this terminal can answer questions.
    can_ask: bool,
}

/// Asks the person at the terminal about a parked call. Returns false when
/// nobody can answer here (stdin is not a terminal).
async fn ask_at_terminal(
    runtime: &Runtime,
    session_id: &str,
    interaction: &serde_json::Value,
    can_ask: bool,
) -> anyhow::Result<bool> {
    let id = interaction["id"].as_str().unwrap_or_default();
    let request = &interaction["request"];
    eprintln!(
        "keel: approval needed for {}({}) because {}",
        request["tool"].as_str().unwrap_or("?"),
        request["arguments"].as_str().unwrap_or(""),
        request["reason"].as_str().unwrap_or("the policy asks")
    );
    if !can_ask {
        eprintln!(
            "keel: stdin is not a terminal (or held the task), so nobody can answer here; the question {id} stays pending in the state directory (answer it through `keel serve` and interaction/respond)"
        );
        return Ok(false);
    }
    loop {
        eprint!("keel: [a]llow once, allow for the [s]ession, or [d]eny? ");
        let line = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map(|_| line)
        })
        .await??;
        let decision = match line.trim() {
            "a" | "allow" => keel_protocol::DecisionKind::AllowOnce,
            "s" | "session" => keel_protocol::DecisionKind::AllowForSession,
            "d" | "deny" | "" => keel_protocol::DecisionKind::Deny,
            _ => continue,
        };
        runtime.respond_interaction(session_id, id, decision, None).await?;
        return Ok(true);
    }
}

/// How long `follow` stays silent before saying it is still waiting.
const QUIET_NOTICE: Duration = Duration::from_secs(15);

/// Prints streamed text and tool activity (or, with `--json`, every journal
/// event) until the turn finishes.
async fn follow(
    runtime: &Runtime,
    session_id: &str,
    events: &mut keel_runtime::EventStream,
    turn_id: &str,
    output: Output,
) -> anyhow::Result<ExitCode> {
    let mut stdout = std::io::stdout();
    let mut streamed_since_item = false;
    let started = Instant::now();
    loop {
        let message = match tokio::time::timeout(QUIET_NOTICE, events.next()).await {
            Ok(message) => message?,
            Err(_) => {
                eprintln!("keel: still working ({} s so far)", started.elapsed().as_secs());
                continue;
            }
        };
        let Some(message) = message else { break };
        match message {
            BusMessage::Delta { text, .. } => {
                if output.json {
                    continue;
                }
                streamed_since_item = true;
                let _ = stdout.write_all(text.as_bytes());
                let _ = stdout.flush();
            }
            BusMessage::Event(event) => {
                if output.json {
                    let _ = writeln!(stdout, "{}", serde_json::to_string(&event)?);
                    let _ = stdout.flush();
                }
                if event.data.get("turn_id").and_then(|t| t.as_str()) != Some(turn_id) {
                    continue;
                }
                match event.kind.as_str() {
                    k if k == EventKind::ItemAdded.as_str() && !output.json => {
                        let item = &event.data["item"];
                        if item["type"] == "message" && item["role"] == "assistant" {
                            if !streamed_since_item {
                                let text: String = item["content"]
                                    .as_array()
                                    .map(|parts| parts.iter().filter_map(|p| p["text"].as_str()).collect())
                                    .unwrap_or_default();
                                let _ = stdout.write_all(text.as_bytes());
                            }
                            let _ = stdout.write_all(b"\n");
                            let _ = stdout.flush();
                        }
                        streamed_since_item = false;
                    }
                    k if k == EventKind::ModelRetrying.as_str() => {
                        if streamed_since_item {
                            println!();
                            streamed_since_item = false;
                        }
                        eprintln!(
                            "keel: the model request failed ({}); retrying in {} ms",
                            event.data["reason"].as_str().unwrap_or("?"),
                            event.data["delay_ms"]
                        );
                    }
                    k if k == EventKind::ModelSwitched.as_str() => {
                        eprintln!(
                            "keel: switching to {} ({})",
                            event.data["to"].as_str().unwrap_or("?"),
                            event.data["reason"].as_str().unwrap_or("?")
                        );
                    }
                    k if k == EventKind::TurnWaiting.as_str() => {
                        let pending = runtime.inbox(Some(session_id));
                        let Some(interaction) = pending.first() else { continue };
                        let interaction = serde_json::to_value(interaction)?;
                        if !ask_at_terminal(runtime, session_id, &interaction, output.can_ask).await? {
                            return Ok(ExitCode::from(3));
                        }
                    }
                    k if k == EventKind::ToolCallIntended.as_str() => {
                        // The qualified name (`fs.write_file`), as bundles
                        // and docs write it, not the model-visible one.
                        let tool = event.data["tool"].as_str().or(event.data["name"].as_str()).unwrap_or("?");
                        eprintln!("keel: -> {tool}({})", event.data["arguments"].as_str().unwrap_or(""));
                    }
                    k if (k == EventKind::ToolCallFinished.as_str() && event.data["is_error"] == true)
                        || k == EventKind::ToolCallRejected.as_str() =>
                    {
                        let tool = event.data["tool"].as_str().or(event.data["name"].as_str()).unwrap_or("?");
                        eprintln!("keel: <- {tool} failed");
                    }
                    k if k == EventKind::TurnFinished.as_str() => {
                        let status = event.data["status"].as_str().unwrap_or("unknown");
                        if status == "completed" {
                            return Ok(ExitCode::SUCCESS);
                        }
                        let message = event.data["error"]["message"].as_str().unwrap_or("no error recorded");
                        eprintln!("keel: the turn ended {status}: {message}");
                        return Ok(ExitCode::from(1));
                    }
                    _ => {}
                }
            }
        }
    }
    anyhow::bail!("the event stream ended before the turn finished")
}
