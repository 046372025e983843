//! keel's side of `scripts/bench-side-by-side`, which runs the same workload
//! on keel and on LangGraph (`bench/langgraph/bench.py`) against one external
//! wire-format server and prints both.
//!
//! The workload matches the Python side step for step: a coworker with one
//! read-only in-process tool, `bench.lookup` (the model sees `bench__lookup`),
//! registered through [`RuntimeConfig::extra_tools`] so that it runs inside
//! keel's process as the Python tool function runs inside LangGraph's. A turn
//! is one user message; the server answers it with a call of the tool, then
//! answers the tool result with text: two model round trips per turn.
//!
//! Three commands, each printing one JSON object on stdout:
//! - `turns`: N sessions, one warm-up turn each, then T timed turns in every
//!   session at once. Per-turn times are taken by the caller, from
//!   `start_turn` to the `turn_finished` event.
//! - `prepare`: N sessions with one finished turn each, then a turn started in
//!   every session against a server that never answers; prints once every
//!   session's model request is on the wire, then waits to be killed.
//! - `recover`: opens the state directory in a fresh process and makes every
//!   interrupted turn recoverable (`Runtime::open` + `Runtime::recover`).
//!
//! Memory and disk are measured by the script, from outside, the same way for
//! both sides.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Subcommand;
use keel_protocol::ids::new_id;
use keel_provider::{OpenAiChat, OpenAiChatConfig};
use keel_runtime::{BusMessage, ProviderSet, Runtime, RuntimeConfig};
use keel_tools::{BoxFuture, Tool, ToolContext, ToolDescriptor, ToolOutput};
use serde_json::{Value, json};

use crate::{percentile, round};

#[derive(Subcommand)]
pub(crate) enum SideBySide {
    /// Concurrent sessions through full turns against an external server.
    Turns {
        /// The server's API root, such as http://127.0.0.1:41234/v1.
        #[arg(long)]
        provider_url: String,
        /// A state directory that does not exist yet.
        #[arg(long)]
        state: PathBuf,
        #[arg(long, default_value_t = 1000)]
        sessions: usize,
        /// Timed turns per session, after one warm-up turn each.
        #[arg(long, default_value_t = 3)]
        turns: usize,
    },
    /// Sessions with a finished turn and a turn in flight; waits to be killed.
    Prepare {
        #[arg(long)]
        provider_url: String,
        /// A server that holds every request open (a long latency).
        #[arg(long)]
        hang_url: String,
        #[arg(long)]
        state: PathBuf,
        #[arg(long, default_value_t = 10_000)]
        sessions: usize,
    },
    /// Opens a state directory and makes every interrupted turn recoverable.
    Recover {
        #[arg(long)]
        provider_url: String,
        #[arg(long)]
        state: PathBuf,
    },
}

pub(crate) async fn run(command: SideBySide) -> Result<()> {
    let report = match command {
        SideBySide::Turns { provider_url, state, sessions, turns } => {
            turns_report(&provider_url, &state, sessions, turns).await?
        }
        SideBySide::Prepare { provider_url, hang_url, state, sessions } => {
            return prepare(&provider_url, &hang_url, &state, sessions).await;
        }
        SideBySide::Recover { provider_url, state } => recover(&provider_url, &state).await?,
    };
    println!("{report}");
    Ok(())
}

/// The tiny tool both sides run in-process: a fixed weather report.
struct Lookup;

impl Tool for Lookup {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor {
            name: "bench.lookup".into(),
            description: "Looks up today's weather for a city".into(),
            version: "1".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city"}},
                "required": ["city"],
            }),
            effect: keel_protocol::Effect::ReadOnly,
        }
    }

    fn call<'a>(&'a self, _: &'a ToolContext, arguments: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let city = arguments["city"].as_str().unwrap_or("unknown");
            ToolOutput::ok(json!({"city": city, "forecast": "sunny", "temp_c": 21}).to_string())
        })
    }
}

/// The system prompt, the same text the Python side sends.
const INSTRUCTIONS: &str = "You are a weather assistant. Use the lookup tool, then answer in one sentence.";

/// A runtime whose one coworker, `bench`, uses `bench.lookup` through
/// `provider_url`. The bundle is written into `bundle_dir`.
async fn open(state: &Path, provider_url: &str, bundle_dir: &Path) -> Result<Runtime> {
    let toml = format!(
        "[coworkers.bench]\nmodel = \"openai-chat:bench\"\ninstructions = {INSTRUCTIONS:?}\ntools = [\"bench.lookup\"]\n\n[coworkers.bench.policies]\n\"bench.lookup\" = \"allow\"\n"
    );
    std::fs::write(bundle_dir.join("keel.toml"), toml).context("write the bench bundle")?;
    let chat = OpenAiChat::new(OpenAiChatConfig::new(provider_url))?;
    let mut config = RuntimeConfig::new(state);
    config.bundles = vec![bundle_dir.to_path_buf()];
    config.providers = ProviderSet::new().with(Arc::new(chat));
    config.extra_tools = vec![Arc::new(Lookup)];
    Ok(Runtime::open(config).await?)
}

/// Runs `turns` turns in each session, all sessions at once, and returns
/// each turn's time as the caller sees it: from `start_turn` to the
/// `turn_finished` event. With one session they come in order.
async fn drive(runtime: &Runtime, sessions: &[String], turns: usize) -> Result<Vec<Duration>> {
    let mut tasks = tokio::task::JoinSet::new();
    for session in sessions {
        let runtime = runtime.clone();
        let session = session.clone();
        tasks.spawn(async move {
            let mut events = runtime.subscribe(&session, runtime.snapshot_last_seq(&session).await?).await?;
            let mut times = Vec::with_capacity(turns);
            for _ in 0..turns {
                let clock = Instant::now();
                let started = runtime.start_turn(&session, &new_id("sub"), "What's the weather in Paris?").await?;
                wait_for(&mut events, "turn_finished", |data| {
                    anyhow::ensure!(data["status"] == "completed", "turn {} ended {data}", started.turn_id);
                    Ok(())
                })
                .await?;
                times.push(clock.elapsed());
            }
            anyhow::Ok(times)
        });
    }
    let mut all = Vec::with_capacity(sessions.len() * turns);
    while let Some(result) = tasks.join_next().await {
        all.extend(result??);
    }
    Ok(all)
}

/// Reads events until one of `kind`, which `check` inspects.
async fn wait_for(
    events: &mut keel_runtime::EventStream,
    kind: &str,
    check: impl FnOnce(&Value) -> Result<()>,
) -> Result<()> {
    loop {
        match events.next().await? {
            Some(BusMessage::Event(event)) if event.kind == kind => return check(&event.data),
            Some(_) => {}
            None => anyhow::bail!("the event stream closed before {kind}"),
        }
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn quantiles(mut values: Vec<f64>) -> Value {
    values.sort_by(f64::total_cmp);
    let mean = if values.is_empty() { 0.0 } else { values.iter().sum::<f64>() / values.len() as f64 };
    json!({"p50": round(percentile(&values, 50.0)), "p99": round(percentile(&values, 99.0)), "mean": round(mean)})
}

async fn turns_report(provider_url: &str, state: &Path, sessions: usize, turns: usize) -> Result<Value> {
    let scratch = tempfile::tempdir()?;
    let workspace = scratch.path().join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let runtime = open(state, provider_url, scratch.path()).await?;
    let ids = crate::create_sessions(&runtime, "bench", sessions, &workspace).await?;
    drive(&runtime, &ids, 1).await?;
    runtime.metrics().take_timings();
    runtime.metrics().sample_timings(true);
    let clock = Instant::now();
    let walls = drive(&runtime, &ids, turns).await?;
    let elapsed = clock.elapsed();
    // Shutting down waits for every driver, so every timing is recorded.
    runtime.shutdown().await;
    let provider: Vec<Duration> = runtime.metrics().take_timings().iter().map(|t| t.provider).collect();
    anyhow::ensure!(provider.len() == walls.len(), "{} timings for {} turns", provider.len(), walls.len());
    let provider_total: Duration = provider.iter().sum();
    let wall_total: Duration = walls.iter().sum();
    let done = walls.len();
    // One session runs its turns one after another, so the runtime's
    // timings pair with the caller's in order; with many they cannot be
    // paired, and only the mean is exact.
    let overhead = if sessions == 1 {
        quantiles(walls.iter().zip(&provider).map(|(w, p)| millis(w.saturating_sub(*p))).collect())
    } else {
        json!({"p50": null, "p99": null, "mean": round(millis(wall_total.saturating_sub(provider_total)) / done as f64)})
    };
    Ok(json!({
        "side": "keel",
        "sessions": sessions,
        "turns": done,
        "warmup_turns": sessions,
        "seconds": round(elapsed.as_secs_f64()),
        "turns_per_second": round(done as f64 / elapsed.as_secs_f64()),
        "turn_ms": quantiles(walls.iter().map(|w| millis(*w)).collect()),
        "overhead_ms_per_turn": overhead,
        "provider_ms_per_turn": round(millis(provider_total) / done as f64),
        "synchronous": "FULL",
    }))
}

async fn prepare(provider_url: &str, hang_url: &str, state: &Path, sessions: usize) -> Result<()> {
    let scratch = tempfile::tempdir()?;
    let workspace = scratch.path().join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let clock = Instant::now();
    let ids = {
        let runtime = open(state, provider_url, scratch.path()).await?;
        let ids = crate::create_sessions(&runtime, "bench", sessions, &workspace).await?;
        for chunk in ids.chunks(1000) {
            drive(&runtime, chunk, 1).await?;
        }
        runtime.shutdown().await;
        ids
    };
    let history_seconds = clock.elapsed().as_secs_f64();
    let runtime = open(state, hang_url, scratch.path()).await?;
    let mut tasks = tokio::task::JoinSet::new();
    for session in ids {
        let runtime = runtime.clone();
        tasks.spawn(async move {
            let mut events = runtime.subscribe(&session, runtime.snapshot_last_seq(&session).await?).await?;
            runtime.start_turn(&session, &new_id("sub"), "And in Lyon?").await?;
            // Journaled just before the request is sent.
            wait_for(&mut events, "model_attempt_started", |_| Ok(())).await
        });
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    println!(
        "{}",
        json!({"side": "keel", "ready": true, "sessions": sessions, "history_seconds": round(history_seconds)})
    );
    // Killed here by the script, every turn in flight.
    std::future::pending::<()>().await;
    Ok(())
}

async fn recover(provider_url: &str, state: &Path) -> Result<Value> {
    let scratch = tempfile::tempdir()?;
    let clock = Instant::now();
    let runtime = open(state, provider_url, scratch.path()).await?;
    let open_seconds = clock.elapsed().as_secs_f64();
    let recovered = runtime.recover().await?;
    let seconds = clock.elapsed().as_secs_f64();
    let sessions = runtime.list_sessions().len();
    runtime.shutdown().await;
    Ok(json!({
        "side": "keel",
        "sessions": sessions,
        "recoverable_turns": recovered,
        "open_seconds": round(open_seconds),
        "seconds": round(seconds),
    }))
}
