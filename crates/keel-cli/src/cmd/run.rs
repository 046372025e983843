//! `keel run`: one task, answered on stdout.
//!
//! A call the policy asks about is put to the person at the terminal; when
//! stdin is not a terminal, `keel run` exits with code 3 and the question
//! stays pending in the state directory.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use keel_protocol::EventKind;
use keel_protocol::ids::new_id;
use keel_runtime::{BusMessage, NewSession, Runtime, RuntimeConfig};

#[derive(clap::Args)]
pub struct Args {
    /// The bundle directory that defines the coworker.
    #[arg(long, default_value = "examples/assistant")]
    bundle: PathBuf,
    /// The coworker's id in the bundle.
    #[arg(long, default_value = "assistant-example")]
    coworker: String,
    /// The folder the coworker may work in (default: the current folder).
    #[arg(long)]
    workspace: Option<PathBuf>,
    /// Use this model (`provider:model`) instead of the coworker's.
    #[arg(long)]
    model: Option<String>,
    /// The task.
    #[arg(required = true, trailing_var_arg = true)]
    text: Vec<String>,
}

pub async fn run(state: PathBuf, args: Args) -> anyhow::Result<ExitCode> {
    let mut config = RuntimeConfig::new(&state);
    config.bundles = vec![args.bundle];
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
    let (telemetry, telemetry_guard) = crate::telemetry::start()?;
    config.telemetry = telemetry;
    let runtime = Runtime::open(config).await?;
    runtime.recover().await?;
    let workspace = match args.workspace {
        Some(dir) => dir,
        None => std::env::current_dir()?,
    };
    let text = args.text.join(" ");
    let session = runtime
        .create_session(NewSession {
            name: format!("run: {}", text.chars().take(40).collect::<String>()),
            coworker: args.coworker,
            workspace: workspace.display().to_string(),
            attended: true,
            compaction: None,
        })
        .await?;
    let mut events = runtime.subscribe(&session.id, 0).await?;
    let started = runtime.start_turn(&session.id, &new_id("sub"), &text).await?;
    eprintln!("keel: session {} turn {}", session.id, started.turn_id);
    let code = tokio::select! {
        code = follow(&runtime, &session.id, &mut events, &started.turn_id) => code?,
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

/// Asks the person at the terminal about a parked call. Returns false when
/// nobody can answer here (stdin is not a terminal).
async fn ask_at_terminal(runtime: &Runtime, session_id: &str, interaction: &serde_json::Value) -> anyhow::Result<bool> {
    use std::io::IsTerminal;
    let id = interaction["id"].as_str().unwrap_or_default();
    let request = &interaction["request"];
    eprintln!(
        "keel: approval needed for {}({}) because {}",
        request["tool"].as_str().unwrap_or("?"),
        request["arguments"].as_str().unwrap_or(""),
        request["reason"].as_str().unwrap_or("the policy asks")
    );
    if !std::io::stdin().is_terminal() {
        eprintln!(
            "keel: stdin is not a terminal, so nobody can answer here; the question {id} stays pending in the state directory (answer it through `keel serve` and interaction/respond)"
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

/// Prints streamed text and tool activity until the turn finishes.
async fn follow(
    runtime: &Runtime,
    session_id: &str,
    events: &mut keel_runtime::EventStream,
    turn_id: &str,
) -> anyhow::Result<ExitCode> {
    let mut stdout = std::io::stdout();
    let mut streamed_since_item = false;
    while let Some(message) = events.next().await? {
        match message {
            BusMessage::Delta { text, .. } => {
                streamed_since_item = true;
                let _ = stdout.write_all(text.as_bytes());
                let _ = stdout.flush();
            }
            BusMessage::Event(event) => {
                if event.data.get("turn_id").and_then(|t| t.as_str()) != Some(turn_id) {
                    continue;
                }
                match event.kind.as_str() {
                    k if k == EventKind::ItemAdded.as_str() => {
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
                        if !ask_at_terminal(runtime, session_id, &interaction).await? {
                            return Ok(ExitCode::from(3));
                        }
                    }
                    k if k == EventKind::ToolCallIntended.as_str() => {
                        eprintln!(
                            "keel: -> {}({})",
                            event.data["name"].as_str().unwrap_or("?"),
                            event.data["arguments"].as_str().unwrap_or("")
                        );
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
