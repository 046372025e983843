//! `keel-bench`: how fast and how light keel is, measured end to end.
//!
//! `keel-bench turns` drives concurrent sessions through full turns (one
//! tool call each, so two model round trips) against a local zero-latency
//! server speaking the OpenAI Chat Completions streaming format, with durable
//! commits, and prints turns/s, events/s, the runtime's overhead per model
//! round trip and peak RSS. `keel-bench idle` loads a state directory of many
//! sessions in a fresh process and prints the memory each one costs.
//!
//! Overhead per round trip = (turn wall time − time inside provider HTTP
//! requests) / round trips. It counts everything keel does around the model:
//! journaling, tool execution, history assembly, request encoding.

mod compaction;
mod parse;
mod side_by_side;
mod tools;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use keel_protocol::ids::new_id;
use keel_provider::{OpenAiChat, OpenAiChatConfig};
use keel_runtime::{BusMessage, NewSession, ProviderSet, Runtime, RuntimeConfig};
use keel_testkit::{MockServer, responders};
use serde_json::json;

#[derive(Parser)]
#[command(name = "keel-bench", about = "keel's throughput, overhead and memory benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Option<Bench>,
}

#[derive(Subcommand)]
enum Bench {
    /// Concurrent sessions through full turns.
    Turns {
        #[arg(long, default_value_t = 200)]
        sessions: usize,
        #[arg(long, default_value_t = 10)]
        turns: usize,
    },
    /// Memory per idle session after loading a state directory.
    Idle {
        #[arg(long, default_value_t = 10_000)]
        sessions: usize,
    },
    /// Streaming cost per 1,000 tokens for each remote wire format.
    Parse {
        #[arg(long, default_value_t = 200)]
        requests: usize,
    },
    /// Tokens per second of the in-process local model.
    #[cfg(feature = "local")]
    Local {
        #[arg(long, default_value = "smollm2")]
        model: String,
    },
    /// Tool-call overhead: runner spawn and reuse, a sandboxed command, an
    /// MCP call to the reference server.
    Tools {
        #[arg(long, default_value_t = 1000)]
        calls: usize,
    },
    /// Compaction quality: planted facts kept, tokens reclaimed, time taken.
    Compaction {
        /// The model that writes the summaries.
        #[arg(long, default_value = "local:smollm2")]
        summary_model: String,
        /// How many of the scenarios to run (up to 3).
        #[arg(long, default_value_t = 3)]
        scenarios: usize,
        /// Fail if a fact keel keeps by construction was lost.
        #[arg(long)]
        strict: bool,
    },
    /// keel's side of `scripts/bench-side-by-side`, against an external server.
    SideBySide {
        #[command(subcommand)]
        command: side_by_side::SideBySide,
    },
    /// Internal: open a state directory and report memory (used by `idle`).
    #[command(hide = true)]
    Load { state: PathBuf },
}

/// mimalloc: the turn loop allocates many small, short-lived JSON values and
/// glibc's allocator spent a fifth of the benchmark's CPU on them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<()> {
    keel_runner::run_if_requested();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().max_blocking_threads(32).enable_all().build()?;
    runtime.block_on(async {
        match cli.command {
            Some(Bench::Turns { sessions, turns }) => turns_bench(sessions, turns).await,
            Some(Bench::Idle { sessions }) => idle_bench(sessions).await,
            Some(Bench::Load { state }) => load(&state).await,
            Some(Bench::SideBySide { command }) => side_by_side::run(command).await,
            Some(Bench::Parse { requests }) => parse::bench(requests).await,
            Some(Bench::Tools { calls }) => tools::bench(calls).await,
            Some(Bench::Compaction { summary_model, scenarios, strict }) => {
                compaction::bench(&summary_model, scenarios, strict).await
            }
            #[cfg(feature = "local")]
            Some(Bench::Local { model }) => parse::local(&model).await,
            None => {
                // Latency without contention, then throughput at saturation.
                turns_bench(1, 50).await?;
                turns_bench(200, 10).await?;
                parse::bench(200).await?;
                tools::bench(1000).await?;
                idle_bench(10_000).await
            }
        }
    })
}

fn bundle() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/assistant")
}

async fn open(state: &Path, base_url: &str) -> Result<Runtime> {
    let chat = OpenAiChat::new(OpenAiChatConfig { base_url: base_url.to_string(), ..OpenAiChatConfig::default() })?;
    let mut config = RuntimeConfig::new(state);
    config.bundles = vec![bundle()];
    config.providers = ProviderSet::new().with(Arc::new(chat));
    config.model_override = Some("openai-chat:bench".into());
    Ok(Runtime::open(config).await?)
}

async fn start_mock() -> Result<MockServer> {
    Ok(MockServer::builder()
        .fallback(responders::tool_then_answer("fs__write_file", r#"{"path":"bench.txt","content":"keel"}"#))
        .record_requests(false)
        .start()
        .await?)
}

/// Creates `count` unattended sessions of `coworker`.
pub(crate) async fn create_sessions(
    runtime: &Runtime,
    coworker: &str,
    count: usize,
    workspace: &Path,
) -> Result<Vec<String>> {
    let mut ids = Vec::with_capacity(count);
    for n in 0..count {
        let info = runtime
            .create_session(NewSession {
                name: format!("bench-{n}"),
                coworker: coworker.into(),
                workspace: workspace.display().to_string(),
                attended: false,
                compaction: None,
            })
            .await?;
        ids.push(info.id);
    }
    Ok(ids)
}

/// Runs `turns` turns in each session, all sessions at once.
async fn drive(runtime: &Runtime, sessions: &[String], turns: usize) -> Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for session in sessions {
        let runtime = runtime.clone();
        let session = session.clone();
        tasks.spawn(async move {
            let mut events = runtime.subscribe(&session, runtime.snapshot_last_seq(&session).await?).await?;
            for _ in 0..turns {
                let started = runtime.start_turn(&session, &new_id("sub"), "write the file").await?;
                loop {
                    match events.next().await? {
                        Some(BusMessage::Event(e)) if e.kind == "turn_finished" => {
                            anyhow::ensure!(
                                e.data["status"] == "completed",
                                "turn {} ended {}",
                                started.turn_id,
                                e.data
                            );
                            break;
                        }
                        Some(_) => {}
                        None => anyhow::bail!("event stream closed"),
                    }
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(result) = tasks.join_next().await {
        result??;
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn turns_bench(sessions: usize, turns: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let mock = start_mock().await?;
    let runtime = open(&dir.path().join("state"), &mock.base_url()).await?;
    let ids = create_sessions(&runtime, "assistant-example", sessions, &workspace).await?;
    // Warm up connections and caches with one turn per session.
    drive(&runtime, &ids, 1).await?;
    runtime.metrics().take_timings();
    runtime.metrics().sample_timings(true);
    let events_before = total_events(&runtime, &ids).await?;
    let clock = Instant::now();
    drive(&runtime, &ids, turns).await?;
    let elapsed = clock.elapsed();
    let events = total_events(&runtime, &ids).await? - events_before;
    let timings = runtime.metrics().take_timings();
    let mut overhead: Vec<f64> =
        timings.iter().map(|t| t.wall.saturating_sub(t.provider).as_secs_f64() * 1000.0 / 2.0).collect();
    overhead.sort_by(|a, b| a.total_cmp(b));
    let done = sessions * turns;
    let report = json!({
        "bench": "turns",
        "sessions": sessions,
        "turns": done,
        "seconds": round(elapsed.as_secs_f64()),
        "turns_per_second": round(done as f64 / elapsed.as_secs_f64()),
        "events_per_second": round(events as f64 / elapsed.as_secs_f64()),
        "events_per_turn": round(events as f64 / done as f64),
        "overhead_ms_per_round_trip": {"p50": round(percentile(&overhead, 50.0)), "p99": round(percentile(&overhead, 99.0))},
        "peak_rss_mib": round(peak_rss_kib()? as f64 / 1024.0),
        "synchronous": "FULL",
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    runtime.shutdown().await;
    Ok(())
}

async fn total_events(runtime: &Runtime, ids: &[String]) -> Result<u64> {
    let mut total = 0;
    for id in ids {
        total += runtime.snapshot_last_seq(id).await?;
    }
    Ok(total)
}

async fn idle_bench(sessions: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let state = dir.path().join("state");
    {
        let mock = start_mock().await?;
        let runtime = open(&state, &mock.base_url()).await?;
        let ids = create_sessions(&runtime, "assistant-example", sessions, &workspace).await?;
        // One finished turn each, so every session has history and a turn.
        for chunk in ids.chunks(500) {
            drive(&runtime, chunk, 1).await?;
        }
        runtime.shutdown().await;
    }
    let output = std::process::Command::new(std::env::current_exe()?)
        .arg("load")
        .arg(&state)
        .output()
        .context("run the load phase")?;
    anyhow::ensure!(output.status.success(), "load phase failed: {}", String::from_utf8_lossy(&output.stderr));
    let loaded: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let per_session = loaded["rss_growth_kib"].as_f64().unwrap_or(0.0) / sessions as f64;
    let report = json!({
        "bench": "idle",
        "sessions": sessions,
        "rss_before_open_kib": loaded["rss_before_kib"],
        "rss_after_open_kib": loaded["rss_after_kib"],
        "kib_per_idle_session": round(per_session),
        "open_seconds": loaded["open_seconds"],
        "database_bytes": std::fs::metadata(state.join("runtime.sqlite3"))?.len(),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

async fn load(state: &Path) -> Result<()> {
    let mock = start_mock().await?;
    let before = current_rss_kib()?;
    let clock = Instant::now();
    let runtime = open(state, &mock.base_url()).await?;
    let open_seconds = clock.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = current_rss_kib()?;
    println!(
        "{}",
        json!({
            "sessions": runtime.list_sessions().len(),
            "rss_before_kib": before,
            "rss_after_kib": after,
            "rss_growth_kib": after.saturating_sub(before),
            "open_seconds": round(open_seconds),
        })
    );
    Ok(())
}

pub(crate) fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

fn status_field_kib(field: &str) -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("no {field} in /proc/self/status"))
}

fn peak_rss_kib() -> Result<u64> {
    status_field_kib("VmHWM:")
}

fn current_rss_kib() -> Result<u64> {
    status_field_kib("VmRSS:")
}
