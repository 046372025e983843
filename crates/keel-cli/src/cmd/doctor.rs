//! `keel doctor`: checks what keel needs on this machine and reports each
//! check with what to do about a failure.
//!
//! It runs the real thing where it can: a sandboxed runner is started on a
//! scratch workspace and runs a file tool and a command; each bundle's MCP
//! servers are started and listed. It does not open the state directory, so
//! it works beside a running `keel serve`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use keel_runner::{RunnerCommand, RunnerPool, SandboxPolicy};
use keel_runtime::{Bundle, McpServerState};
use serde_json::json;

#[derive(clap::Args)]
pub struct Args {
    /// Bundle directories whose MCP servers to check.
    #[arg(long)]
    bundle: Vec<PathBuf>,
    /// Print the checks as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct Check {
    name: String,
    ok: bool,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

fn check(name: impl Into<String>, ok: bool, detail: impl Into<String>, fix: Option<&str>) -> Check {
    Check { name: name.into(), ok, detail: detail.into(), fix: fix.map(String::from) }
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut checks = Vec::new();
    let abi = keel_runner::sandbox::kernel_abi();
    checks.push(check(
        "landlock",
        abi >= 1,
        if abi >= 1 { format!("Landlock ABI {abi}") } else { "the kernel offers no Landlock".into() },
        (abi < 1).then_some("run keel on Linux 5.13+ with Landlock enabled (lsm= boot parameter includes landlock)"),
    ));
    checks.push(sandbox_check().await);
    checks.push(model_check());
    // Remote providers are informational: not configuring one is fine (the
    // local model works offline), so they never fail the doctor.
    for status in crate::providers::remote_status() {
        let name = format!("provider {}", status.providers.join(", "));
        let detail = match (status.configured(), status.has_key) {
            (true, true) => format!("configured: {} is set, requests go to {}", status.key_var, status.base_url),
            (true, false) => format!("configured without a key: requests go to {}", status.base_url),
            (false, _) => format!("not configured ({} is not set)", status.key_var),
        };
        checks.push(check(name, true, detail, None));
    }
    for dir in &args.bundle {
        let bundle = match Bundle::load(dir) {
            Ok(bundle) => bundle,
            Err(e) => {
                checks.push(check(
                    format!("bundle {}", dir.display()),
                    false,
                    e.to_string(),
                    Some("run keel validate"),
                ));
                continue;
            }
        };
        let servers = keel_runtime::mcp::check_servers(std::slice::from_ref(&bundle)).await?;
        if servers.is_empty() {
            checks.push(check(format!("bundle {}", bundle.name), true, "no MCP servers", None));
        }
        for server in servers {
            let (ok, detail) = match &server.state {
                McpServerState::Ready => (true, format!("ready, {} tools", server.tools)),
                McpServerState::Failed { error, .. } => (false, error.clone()),
                other => (false, format!("{other:?}")),
            };
            let fix =
                (!ok).then_some("fix the server's command/args/env or url in [mcp_servers] and run keel doctor again");
            checks.push(check(format!("mcp server {}", server.name), ok, detail, fix));
        }
    }
    let healthy = checks.iter().all(|c| c.ok);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json!({ "ok": healthy, "checks": checks }))?);
    } else {
        for c in &checks {
            println!("{} {:<28} {}", if c.ok { "ok  " } else { "FAIL" }, c.name, c.detail);
            if let Some(fix) = &c.fix {
                println!("     {:<28} fix: {fix}", "");
            }
        }
    }
    Ok(if healthy { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Starts a real runner on a scratch workspace and runs a file tool and a
/// command in it.
async fn sandbox_check() -> Check {
    let name = "sandboxed runner";
    let fail = |detail: String| check(name, false, detail, Some("see the reason above; keel runs no tool unconfined"));
    let Ok(dir) = tempfile::tempdir() else { return fail("cannot make a scratch folder".into()) };
    let workspace = dir.path().join("ws");
    if let Err(e) = std::fs::create_dir_all(&workspace) {
        return fail(e.to_string());
    }
    let command = match RunnerCommand::this_executable() {
        Ok(command) => command,
        Err(e) => return fail(format!("cannot find keel's own executable: {e}")),
    };
    let pool = RunnerPool::new(command, Duration::from_secs(5));
    let mut env = std::collections::BTreeMap::new();
    env.insert("PATH".to_string(), "/usr/local/bin:/usr/bin:/bin".to_string());
    let policy = SandboxPolicy {
        workspace,
        read: Vec::new(),
        write: Vec::new(),
        network: false,
        env,
        scratch: dir.path().join("scratch"),
        shell: Default::default(),
    };
    let started = Instant::now();
    let first = pool.call("doctor", &policy, "fs.write_file", json!({"path": "probe.txt", "content": "ok"})).await;
    let spawn = started.elapsed();
    let reply = match first {
        Ok(reply) if !reply.is_error => reply,
        Ok(reply) => return fail(reply.text),
        Err(e) => return fail(e.to_string()),
    };
    let started = Instant::now();
    let shell = pool.call("doctor", &policy, "shell.run", json!({"command": "cat probe.txt"})).await;
    let round_trip = started.elapsed();
    match shell {
        Ok(out) if out.text.contains("\"stdout\":\"ok\"") => {
            let c = &reply.confinement;
            check(
                name,
                true,
                format!(
                    "{}, network {}, {}, environment {} (start {} ms, command {} ms)",
                    c.filesystem,
                    c.network,
                    c.processes,
                    c.environment,
                    spawn.as_millis(),
                    round_trip.as_millis()
                ),
                None,
            )
        }
        Ok(out) => fail(format!("a command in the sandbox failed: {}", out.text)),
        Err(e) => fail(e.to_string()),
    }
}

#[cfg(feature = "local")]
fn model_check() -> Check {
    let dir = keel_provider_local::LocalConfig::from_env().models_dir;
    // Shown absolute: a relative KEEL_MODELS_DIR is relative to the
    // current folder, which is easy to miss.
    let dir = std::path::absolute(&dir).unwrap_or(dir);
    let file = dir.join(keel_provider_local::SMOLLM2_FILE);
    let ok = file.is_file();
    check(
        "local model",
        ok,
        if ok { file.display().to_string() } else { format!("{} is missing", file.display()) },
        (!ok).then_some(
            "run scripts/setup or scripts/fetch-model in keel's checkout (they fill the XDG data folder), or set KEEL_MODELS_DIR to the folder holding the model",
        ),
    )
}

#[cfg(not(feature = "local"))]
fn model_check() -> Check {
    check("local model", true, "this keel was built without local models", None)
}
