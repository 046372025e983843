//! `keel`: the command-line interface to the keel runtime.
//!
//! Data goes to stdout, diagnostics to stderr. Exit codes: 0 success, 1 the
//! task or command failed, 2 bad usage or configuration, 130 interrupted.

mod builtin;
mod cmd;
mod providers;
mod telemetry;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "keel", version, about = "A durable runtime for AI coworkers")]
struct Cli {
    /// The state directory (default: $XDG_STATE_HOME/keel or ~/.local/state/keel).
    #[arg(long, global = true, env = "KEEL_STATE_DIR")]
    state: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the JSON-RPC API over WebSocket (default) or stdio.
    Serve(cmd::serve::Args),
    /// Run one task with a coworker and stream its answer to stdout.
    Run(cmd::run::Args),
    /// List sessions.
    Sessions(cmd::inspect::SessionsArgs),
    /// Show a session: its turn, history, attempts and tool calls.
    Show(cmd::inspect::ShowArgs),
    /// Print a session's journal events, optionally following new ones.
    Events(cmd::inspect::EventsArgs),
    /// Show every tool call of a session: who let it run and how it ended, secrets redacted.
    Audit(cmd::audit::Args),
    /// Write a session's portable run archive (docs/archive.md).
    Export(cmd::archive::ExportArgs),
    /// Load a run archive into this state directory (stop `keel serve` first).
    Import(cmd::archive::ImportArgs),
    /// Replay a session against its recorded model answers and tool results, and check keel decides the same.
    Replay(cmd::replay::Args),
    /// Check a bundle and report every problem with file, line and a fix.
    Validate(cmd::validate::Args),
    /// Questions waiting for a person, across sessions (needs `keel serve`).
    Inbox(cmd::client::InboxArgs),
    /// Allow a waiting call (`--for-session` to grant the tool).
    Approve(cmd::client::DecideArgs),
    /// Deny a waiting call (`--message` tells the model why).
    Deny(cmd::client::DecideArgs),
    /// Send a message to a session's running turn (`turn/steer`).
    Msg(cmd::client::MsgArgs),
    /// Compact a session's context now (`session/compact`; needs `keel serve`).
    Compact(cmd::client::CompactArgs),
    /// Check this machine: the sandbox, the local model, and the MCP
    /// servers of the given bundles.
    Doctor(cmd::doctor::Args),
}

/// mimalloc: the turn loop allocates many small, short-lived JSON values and
/// glibc's allocator spent a fifth of the benchmark's CPU on them.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // A runner (the sandboxed process built-in tools run in) is this same
    // executable started with a marker argument; it never returns.
    keel_runner::run_if_requested();
    let cli = Cli::parse();
    let verbose = matches!(cli.command, Command::Serve(_));
    init_logging(verbose);
    let state = cli.state.unwrap_or_else(keel_runtime::state_dir::default_state_dir);
    let runtime = match tokio::runtime::Builder::new_multi_thread().max_blocking_threads(32).enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("keel: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => cmd::serve::run(state, args).await,
            Command::Run(args) => cmd::run::run(state, args).await,
            Command::Sessions(args) => cmd::inspect::sessions(state, args).await,
            Command::Show(args) => cmd::inspect::show(state, args).await,
            Command::Events(args) => cmd::inspect::events(state, args).await,
            Command::Audit(args) => cmd::audit::run(state, args).await,
            Command::Validate(args) => cmd::validate::run(args),
            Command::Doctor(args) => cmd::doctor::run(args).await,
            Command::Inbox(args) => cmd::client::inbox(state, args).await,
            Command::Approve(args) => cmd::client::decide(state, args, true).await,
            Command::Deny(args) => cmd::client::decide(state, args, false).await,
            Command::Msg(args) => cmd::client::msg(state, args).await,
            Command::Replay(args) => cmd::replay::run(state, args).await,
            Command::Export(args) => cmd::archive::export(state, args).await,
            Command::Import(args) => cmd::archive::import(state, args).await,
            Command::Compact(args) => cmd::client::compact(state, args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("keel: {error:#}");
            let usage = error.downcast_ref::<keel_runtime::RuntimeError>().is_some_and(|e| {
                matches!(e, keel_runtime::RuntimeError::Config(_) | keel_runtime::RuntimeError::InvalidParams(_))
            });
            ExitCode::from(if usage { 2 } else { 1 })
        }
    }
}

fn init_logging(verbose: bool) {
    let level = std::env::var("KEEL_LOG").ok().and_then(|l| l.parse::<tracing::Level>().ok()).unwrap_or(if verbose {
        tracing::Level::INFO
    } else {
        tracing::Level::WARN
    });
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_max_level(level).with_target(false).init();
}
