//! `keel-bench tools`: what a tool call costs keel, apart from the tool.
//!
//! - runner spawn: the first call of a session starts a runner process and
//!   confines it (namespaces, Landlock) before it answers;
//! - runner reuse: later calls are a pipe round trip to the same runner
//!   (`fs.list_dir` on an empty workspace: a no-op tool);
//! - shell: `shell.run` of `true`, which adds a command's init helper, its
//!   PID namespace and the command's own exec;
//! - MCP: `echo` on the reference server-everything over stdio, through the
//!   hub keel uses (needs `scripts/mcp-servers`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use keel_runner::{RunnerCommand, RunnerPool, SandboxPolicy};
use serde_json::json;

use crate::percentile;

fn policy(root: &Path, session: &str) -> Result<SandboxPolicy> {
    let workspace = root.join(session);
    std::fs::create_dir_all(&workspace)?;
    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), "/usr/local/bin:/usr/bin:/bin".to_string());
    Ok(SandboxPolicy {
        workspace,
        read: Vec::new(),
        write: Vec::new(),
        network: false,
        env,
        scratch: root.join("scratch").join(session),
        shell: Default::default(),
    })
}

fn report(what: &str, mut micros: Vec<f64>) {
    micros.sort_by(f64::total_cmp);
    println!(
        "{what:<34} n={:<5} p50 {:>8.1} µs  p99 {:>8.1} µs",
        micros.len(),
        percentile(&micros, 50.0),
        percentile(&micros, 99.0)
    );
}

pub async fn bench(calls: usize) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let pool = RunnerPool::new(RunnerCommand::this_executable()?, Duration::from_secs(600));
    let noop = json!({"path": "."});
    let mut spawn = Vec::new();
    for n in 0..20 {
        let session = format!("spawn{n}");
        let started = Instant::now();
        let reply = pool.call(&session, &policy(dir.path(), &session)?, "fs.list_dir", noop.clone()).await?;
        anyhow::ensure!(!reply.is_error, "{}", reply.text);
        spawn.push(started.elapsed().as_secs_f64() * 1e6);
        pool.stop(&session);
    }
    report("runner spawn + first call", spawn);
    let reused = policy(dir.path(), "reused")?;
    pool.call("reused", &reused, "fs.list_dir", noop.clone()).await?;
    let mut round_trips = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        pool.call("reused", &reused, "fs.list_dir", noop.clone()).await?;
        round_trips.push(started.elapsed().as_secs_f64() * 1e6);
    }
    report("runner reuse: no-op round trip", round_trips);
    let mut shell = Vec::new();
    for _ in 0..(calls / 10).max(10) {
        let started = Instant::now();
        let reply = pool.call("reused", &reused, "shell.run", json!({"command": "true"})).await?;
        anyhow::ensure!(!reply.is_error, "{}", reply.text);
        shell.push(started.elapsed().as_secs_f64() * 1e6);
    }
    report("shell.run `true` (own PID ns)", shell);
    pool.stop_all();
    mcp(calls).await
}

async fn mcp(calls: usize) -> Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mcp-servers");
    let output = std::process::Command::new(&script).output().context("run scripts/mcp-servers")?;
    if !output.status.success() {
        println!("MCP: skipped, scripts/mcp-servers failed: {}", String::from_utf8_lossy(&output.stderr).trim());
        return Ok(());
    }
    let dir = PathBuf::from(String::from_utf8(output.stdout)?.trim());
    let index = dir.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    let server =
        keel_mcp::McpServerConfig::stdio("everything", "node", vec![index.display().to_string(), "stdio".to_string()]);
    let started = Instant::now();
    let hub = keel_mcp::McpHub::start(vec![server]);
    hub.settled().await;
    let ready = started.elapsed();
    anyhow::ensure!(!hub.tools().is_empty(), "server-everything did not start: {:?}", hub.status());
    let mut echo = Vec::with_capacity(calls);
    for _ in 0..calls {
        let started = Instant::now();
        hub.call("everything", "echo", json!({"message": "ping"})).await?;
        echo.push(started.elapsed().as_secs_f64() * 1e6);
    }
    println!("MCP server-everything ready in {} ms", ready.as_millis());
    report("MCP echo round trip (stdio)", echo);
    hub.shutdown().await;
    Ok(())
}
