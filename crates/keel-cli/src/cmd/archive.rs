//! `keel export`, `keel import`: portable run archives (docs/archive.md).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use keel_runtime::archive::Archive;
use keel_runtime::{Runtime, RuntimeConfig};

#[derive(clap::Args)]
pub struct ExportArgs {
    /// Session id or name.
    session: String,
    /// The archive file to write.
    file: PathBuf,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// The archive file to read.
    file: PathBuf,
    /// The folder the session works in here (default: the recorded one).
    #[arg(long)]
    workspace: Option<String>,
    /// Print the imported session as JSON.
    #[arg(long)]
    json: bool,
}

/// Reads the state directory read-only, so it works beside `keel serve`.
pub async fn export(state: PathBuf, args: ExportArgs) -> anyhow::Result<ExitCode> {
    let inspector = crate::cmd::inspect::open_for(&state, &args.session)?;
    let records = inspector.export(&args.session, &args.file).await?;
    if args.json {
        let out = serde_json::json!({"session": args.session, "file": args.file, "records": records});
        println!("{out}");
        return Ok(ExitCode::SUCCESS);
    }
    println!("exported {} records of session {} to {}", records, args.session, args.file.display());
    Ok(ExitCode::SUCCESS)
}

/// Needs the state directory to itself: stop `keel serve` first.
pub async fn import(state: PathBuf, args: ImportArgs) -> anyhow::Result<ExitCode> {
    let archive = read(&args.file)?;
    let runtime = Runtime::open(RuntimeConfig::new(&state)).await?;
    let imported = runtime.import_archive(&archive, args.workspace.as_deref()).await;
    runtime.shutdown().await;
    let session = imported?;
    if args.json {
        println!("{}", serde_json::to_string(&serde_json::json!({"session": session}))?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("imported session {} ({}) into {}", session.id, session.name, state.display());
    Ok(ExitCode::SUCCESS)
}

/// Reads an archive, saying so when its tail was torn.
pub fn read(file: &std::path::Path) -> anyhow::Result<Archive> {
    let archive = Archive::read(file).with_context(|| format!("cannot read the archive {}", file.display()))?;
    if let Some(torn) = &archive.torn_tail {
        eprintln!(
            "keel: the archive's tail is torn at byte {} ({}); using the {} complete records before it",
            torn.offset,
            torn.reason,
            archive.records.len()
        );
    }
    Ok(archive)
}
