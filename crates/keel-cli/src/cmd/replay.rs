//! `keel replay`: runs a recorded session's turns again against the model
//! answers and tool results in its journal, and checks keel makes the same
//! decisions. Reads the state directory read-only, so it works beside a
//! running `keel serve`; nothing reaches a provider and no tool runs.

use std::path::PathBuf;
use std::process::ExitCode;

use keel_runtime::replay::{Recording, ReplayReport, replay};

#[derive(clap::Args)]
pub struct Args {
    /// Session id or name, or a run archive file.
    session: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn run(state: PathBuf, args: Args) -> anyhow::Result<ExitCode> {
    let recording = if std::path::Path::new(&args.session).is_file() {
        let archive = crate::cmd::archive::read(std::path::Path::new(&args.session))?;
        let state = archive.fold()?;
        let (events, compactions) = keel_runtime::archive::journal_events(&archive);
        Recording::read(state.session, &events, &compactions)
    } else {
        let inspector = crate::cmd::inspect::open_for(&state, &args.session)?;
        let session = inspector.find(&args.session).await?;
        let events = inspector.all_events(&session.id).await?;
        let compactions = inspector.compactions(&session.id).await?;
        Recording::read(session, &events, &compactions)
    };
    let scratch = tempfile::tempdir()?;
    let report = replay(&recording, scratch.path()).await?;
    print_report(&report, args.json)?;
    Ok(if report.matched { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Prints a replay report, as JSON or one line a turn.
pub fn print_report(report: &ReplayReport, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
        return Ok(());
    }
    for turn in &report.turns {
        let calls = turn.recorded.calls.len();
        print!("{}  {:<10}  {} calls, {}", turn.turn_id, turn.result, calls, turn.recorded.status);
        if let Some(reason) = &turn.reason {
            print!(" ({reason})");
        }
        println!();
        if turn.result == "mismatched"
            && let Some(replayed) = &turn.replayed
        {
            println!("  recorded: {}", serde_json::to_string(&turn.recorded)?);
            println!("  replayed: {}", serde_json::to_string(replayed)?);
        }
    }
    let replayed = report.turns.iter().filter(|t| t.result != "skipped").count();
    if report.matched {
        println!("replayed {replayed} turns of {}: every decision matches the recording", report.session_id);
    } else {
        println!("replayed {replayed} turns of {}: decisions differ from the recording", report.session_id);
    }
    Ok(())
}
