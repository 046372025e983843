//! `keel sessions`, `keel show`, `keel events`: read-only views that work
//! beside a running server.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use keel_protocol::Item;
use keel_runtime::Inspector;

#[derive(clap::Args)]
pub struct SessionsArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct ShowArgs {
    /// Session id or name, or a run archive file.
    session: String,
    /// Print the full snapshot as JSON.
    #[arg(long)]
    json: bool,
    /// The state right after this journal seq (`keel events` lists them).
    #[arg(long)]
    at: Option<u64>,
}

#[derive(clap::Args)]
pub struct EventsArgs {
    /// Session id or name.
    session: String,
    /// Only events after this seq.
    #[arg(long, default_value_t = 0)]
    after: u64,
    /// Keep printing new events as they are committed.
    #[arg(long)]
    follow: bool,
}

/// Whether `state` holds a keel database at all. A state directory that
/// keel never wrote to has no sessions yet: not an error.
pub fn has_database(state: &std::path::Path) -> bool {
    state.join("runtime.sqlite3").is_file()
}

/// Opens `state` to read the session `wanted`, with a plain "no such
/// session" when the state directory has none at all.
pub fn open_for(state: &std::path::Path, wanted: &str) -> anyhow::Result<Inspector> {
    if !has_database(state) {
        return Err(keel_runtime::RuntimeError::NotFound { what: "session", id: wanted.to_string() })
            .map_err(|e| anyhow::anyhow!("{e}: {} has no sessions yet", state.display()));
    }
    Ok(Inspector::open(state)?)
}

pub async fn sessions(state: PathBuf, args: SessionsArgs) -> anyhow::Result<ExitCode> {
    if !has_database(&state) {
        if args.json {
            println!("[]");
        } else {
            eprintln!("keel: no sessions yet in {}", state.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let inspector = Inspector::open(&state)?;
    let sessions = inspector.sessions().await?;
    if sessions.is_empty() && !args.json {
        eprintln!("keel: no sessions yet in {}", state.display());
        return Ok(ExitCode::SUCCESS);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&sessions)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<30}  {:<24}  {:<20}  {:>7}  {:>10}", "ID", "NAME", "COWORKER", "ITEMS", "TOKENS");
    for s in sessions {
        let tokens = s.usage.input_tokens + s.usage.output_tokens;
        println!(
            "{:<30}  {:<24}  {:<20}  {:>7}  {:>10}",
            s.id,
            truncate(&s.name, 24),
            truncate(&s.coworker, 20),
            s.history_len,
            tokens
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
        cut.push('~');
        cut
    }
}

pub async fn show(state: PathBuf, args: ShowArgs) -> anyhow::Result<ExitCode> {
    let is_archive = std::path::Path::new(&args.session).is_file();
    if args.at.is_some() || is_archive {
        let archive = if is_archive {
            crate::cmd::archive::read(std::path::Path::new(&args.session))?
        } else {
            open_for(&state, &args.session)?.archive(&args.session).await?
        };
        let point = match args.at {
            Some(seq) => archive.materialize(seq)?,
            None => archive.fold()?,
        };
        return show_point(&point, args.json);
    }
    let inspector = open_for(&state, &args.session)?;
    let snapshot = inspector.snapshot(&args.session).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&snapshot)?);
        return Ok(ExitCode::SUCCESS);
    }
    let s = &snapshot.session;
    println!("session   {} ({})", s.id, s.name);
    println!("coworker  {}  model {}", s.coworker, s.coworker_spec["model"].as_str().unwrap_or("?"));
    println!("workspace {}", s.workspace);
    println!(
        "usage     {} input, {} output, {} cached, {} reasoning tokens; cost ${:.6}",
        s.usage.input_tokens,
        s.usage.output_tokens,
        s.usage.cached_input_tokens,
        s.usage.reasoning_tokens,
        s.usage.cost_micro_usd as f64 / 1e6
    );
    if let Some(turn) = &snapshot.turn {
        print!("turn      {} {} after {} model round trips", turn.id, turn.status.as_str(), turn.steps);
        if let Some(error) = &turn.error {
            print!(" ({}: {})", error.kind, error.message);
        }
        println!();
    }
    for pending in snapshot.interactions.iter().filter(|i| i["status"] == "pending") {
        println!(
            "waiting   {} {} {}({}): {}",
            pending["id"].as_str().unwrap_or("?"),
            pending["kind"].as_str().unwrap_or("?"),
            pending["request"]["tool"].as_str().unwrap_or("?"),
            pending["request"]["arguments"].as_str().unwrap_or(""),
            pending["request"]["reason"].as_str().unwrap_or("")
        );
    }
    if let Some(context) = &snapshot.context {
        println!(
            "context   {} of {} tokens used ({}), compacts past {}",
            context.used_tokens, context.cap_tokens, context.tokenizer, context.threshold_tokens
        );
    }
    if let Some(record) = &snapshot.compaction {
        println!(
            "compacted #{} ({}): history before item {} is sent as a summary{}; {} -> {} tokens",
            record.number,
            record.reason.as_str(),
            record.boundary,
            if record.trimmed { " (trimmed, no summary)" } else { "" },
            record.tokens_before,
            record.tokens_after
        );
    }
    println!("history");
    let names = qualified_names(&s.coworker_spec);
    for (index, item) in snapshot.history.iter().enumerate() {
        println!("  {index:>4}  {}", describe(item, &names));
    }
    println!(
        "attempts  {} ({} failed)",
        snapshot.attempts.len(),
        snapshot.attempts.iter().filter(|a| a.error.is_some()).count()
    );
    for attempt in &snapshot.attempts {
        println!(
            "  step {} try {} {} {} ({} in / {} out){}",
            attempt.step,
            attempt.attempt,
            attempt.model,
            attempt.status.as_str(),
            attempt.usage.input_tokens,
            attempt.usage.output_tokens,
            attempt.error.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
        );
    }
    println!("events    {}", snapshot.last_seq);
    Ok(ExitCode::SUCCESS)
}

/// Prints a materialised point of a run.
fn show_point(point: &keel_runtime::archive::RunState, json: bool) -> anyhow::Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string_pretty(point)?);
        return Ok(ExitCode::SUCCESS);
    }
    let s = &point.session;
    println!("session   {} ({}) at seq {}", s.id, s.name, point.seq);
    println!("usage     {} input, {} output tokens", point.usage.input_tokens, point.usage.output_tokens);
    for turn in &point.turns {
        println!("turn      {} {}", turn.turn_id, turn.status.as_str());
    }
    for pending in point.interactions.iter().filter(|i| i.status == keel_protocol::InteractionStatus::Pending) {
        println!("waiting   {} {}: {}", pending.id, pending.request.tool, pending.request.reason);
    }
    if let Some(owner) = &point.owner {
        println!("owner     machine {} process {} ({})", owner.machine_id, owner.process_id, owner.instance_id);
    }
    println!("history");
    let names = qualified_names(&s.coworker_spec);
    for (index, item) in point.history.iter().enumerate() {
        println!("  {index:>4}  {}", describe(item, &names));
    }
    Ok(ExitCode::SUCCESS)
}

/// Model-visible tool names (`fs__write_file`) back to the qualified names
/// bundles and docs use (`fs.write_file`), from the session's pinned tools.
fn qualified_names(spec: &serde_json::Value) -> std::collections::HashMap<String, String> {
    spec["tool_digests"]
        .as_object()
        .into_iter()
        .flat_map(|tools| tools.keys())
        .map(|qualified| {
            let (server, tool) = keel_tools::split_qualified(qualified);
            (keel_tools::naming::model_visible_name(server, tool), qualified.clone())
        })
        .collect()
}

fn describe(item: &Item, names: &std::collections::HashMap<String, String>) -> String {
    let one_line = |text: &str| truncate(&text.replace('\n', " "), 100);
    match item {
        Item::Message { role, runtime_notice, .. } => {
            let who = if runtime_notice.is_some() { "runtime".to_string() } else { format!("{role:?}").to_lowercase() };
            format!("{who:<9} {}", one_line(&item.message_text().unwrap_or_default()))
        }
        Item::FunctionCall { name, arguments, .. } => {
            let name = names.get(name).unwrap_or(name);
            format!("call      {name}({})", one_line(arguments))
        }
        Item::FunctionCallOutput { output, .. } => format!("output    {}", one_line(output)),
    }
}

pub async fn events(state: PathBuf, args: EventsArgs) -> anyhow::Result<ExitCode> {
    let inspector = open_for(&state, &args.session)?;
    let session = inspector.find(&args.session).await?;
    let mut after = args.after;
    loop {
        let batch = inspector.events(&session.id, after, 1000).await?;
        for event in &batch {
            println!("{}", serde_json::to_string(event)?);
            after = event.seq;
        }
        if batch.len() == 1000 {
            continue;
        }
        if !args.follow {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
