//! `keel validate`: check a bundle, or print the bundle JSON Schema.

use std::path::PathBuf;
use std::process::ExitCode;

use keel_runtime::bundle_check;

#[derive(clap::Args)]
pub struct Args {
    /// The bundle directory (holding keel.toml).
    #[arg(required_unless_present = "schema")]
    bundle: Option<PathBuf>,
    /// Print the JSON Schema of keel.toml instead.
    #[arg(long)]
    schema: bool,
    /// Print problems as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.schema {
        println!("{}", serde_json::to_string_pretty(&bundle_check::schema())?);
        return Ok(ExitCode::SUCCESS);
    }
    let Some(bundle) = args.bundle else { anyhow::bail!("name a bundle directory") };
    let providers = crate::providers::from_env()?.names();
    let tools: Vec<String> = keel_tools_names();
    let problems = bundle_check::validate(&bundle, &providers, &tools);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&problems)?);
    } else if problems.is_empty() {
        println!("{}: ok", bundle.display());
    } else {
        for problem in &problems {
            println!("{problem}");
        }
    }
    Ok(if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn keel_tools_names() -> Vec<String> {
    keel_runtime::builtin_tool_names()
}
