//! `keel serve`: the JSON-RPC server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use keel_runtime::{Runtime, RuntimeConfig};
use tokio_util::sync::CancellationToken;

#[derive(clap::Args)]
pub struct Args {
    /// A bundle directory to serve (repeatable).
    #[arg(long = "bundle")]
    bundles: Vec<PathBuf>,
    /// Address for the WebSocket listener.
    #[arg(long, default_value = "127.0.0.1:7446")]
    listen: SocketAddr,
    /// Allow listening on a non-loopback address.
    #[arg(long)]
    allow_remote: bool,
    /// Serve one client on stdin/stdout instead of WebSocket.
    #[arg(long)]
    stdio: bool,
    /// Use this model (`provider:model`) for every coworker.
    #[arg(long)]
    model: Option<String>,
}

pub async fn run(state: PathBuf, args: Args) -> anyhow::Result<ExitCode> {
    if !args.stdio && !args.listen.ip().is_loopback() && !args.allow_remote {
        anyhow::bail!(
            "refusing to listen on {} which is not a loopback address; pass --allow-remote if you mean it",
            args.listen
        );
    }
    let mut config = RuntimeConfig::new(&state);
    config.bundles = args.bundles;
    config.providers = crate::providers::from_env()?;
    config.retry = crate::providers::retry_from_env()?;
    config.secrets = crate::providers::secrets_from_env();
    config.model_override = args.model;
    let (telemetry, telemetry_guard) = crate::telemetry::start()?;
    config.telemetry = telemetry;
    let runtime = Runtime::open(config).await?;
    let recovered = runtime.recover().await?;
    if recovered > 0 {
        tracing::info!(recovered, "turns interrupted by the last stop are recoverable; resume them with turn/resume");
    }
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    let signal_task = tokio::spawn(async move {
        wait_for_signal().await;
        signals.cancel();
    });
    if args.stdio {
        keel_server::stdio::serve_stdio(runtime.clone(), shutdown.clone()).await?;
    } else {
        let (token, token_path) = keel_runtime::state_dir::token(&state)?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let address = listener.local_addr()?;
        // Where `keel inbox`, `approve`, `deny` and `msg` find this server;
        // removed on a clean stop (a stale one is harmless: the lock says
        // whether a keel owns the state).
        let endpoint = state.join(crate::cmd::client::ENDPOINT_FILE);
        std::fs::write(&endpoint, format!("ws://{address}\n"))
            .with_context(|| format!("cannot write {}", endpoint.display()))?;
        eprintln!("keel: serving JSON-RPC on ws://{address}");
        eprintln!("keel: state directory {}", state.display());
        eprintln!("keel: the API token is in {} (send it as Authorization: Bearer <token>)", token_path.display());
        keel_server::ws::serve_ws(listener, runtime.clone(), token, shutdown.clone()).await;
        let _ = std::fs::remove_file(&endpoint);
    }
    signal_task.abort();
    runtime.shutdown().await;
    crate::telemetry::finish(telemetry_guard).await;
    Ok(ExitCode::SUCCESS)
}

async fn wait_for_signal() {
    let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(signal) => signal,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
