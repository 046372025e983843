//! `keel audit`: every tool call of a session, who let it run, and what
//! came of it, with secrets redacted.
//!
//! Read-only like `keel show`: it opens the state directory without taking
//! it over, so it works beside a running `keel serve`.

use std::path::PathBuf;
use std::process::ExitCode;

use keel_runtime::audit::{AuditEntry, AuditFilter, Decider, Outcome, audit};
use keel_store_sqlite::SqliteStore;
use serde_json::Value;

/// How many characters of the arguments a line shows.
const ARGUMENTS_WIDTH: usize = 160;

#[derive(clap::Args)]
pub struct Args {
    /// Session id or name.
    session: String,
    /// Only calls of this tool: a qualified name (`shell.run`) or `server.*`.
    #[arg(long)]
    tool: Option<String>,
    /// Only calls decided by: policy, grant, person or keel.
    #[arg(long = "by")]
    decided_by: Option<Decider>,
    /// Only calls that ended so: completed, error, rejected, interrupted or
    /// pending.
    #[arg(long)]
    outcome: Option<Outcome>,
    /// Only calls of this turn.
    #[arg(long)]
    turn: Option<String>,
    /// Only the most recent N calls.
    #[arg(long)]
    limit: Option<usize>,
    /// Print the entries as a JSON array.
    #[arg(long)]
    json: bool,
}

pub async fn run(state: PathBuf, args: Args) -> anyhow::Result<ExitCode> {
    let session = crate::cmd::inspect::open_for(&state, &args.session)?.find(&args.session).await?;
    let store = SqliteStore::open_read_only(&state)?;
    let filter = AuditFilter {
        tool: args.tool,
        decided_by: args.decided_by,
        outcome: args.outcome,
        turn_id: args.turn,
        limit: args.limit,
    };
    let entries = audit(&store, &session.id, &filter).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(ExitCode::SUCCESS);
    }
    for entry in &entries {
        println!("{}", line(entry));
    }
    Ok(ExitCode::SUCCESS)
}

/// `2025-11-30T09:12:03Z  shell.run  completed  policy allow_commands: "ls"  landlock-v7/isolated  {"command":"ls"}`
fn line(entry: &AuditEntry) -> String {
    let arguments = serde_json::to_string(&entry.arguments).unwrap_or_default();
    format!(
        "{}  {:<18}  {:<11}  {}  {}  {}",
        utc(entry.at_ms),
        entry.tool,
        entry.outcome.as_str(),
        decider(&entry.decided_by),
        confinement(entry.confinement.as_ref()),
        truncate(&arguments, ARGUMENTS_WIDTH)
    )
}

/// Who decided, in a few words: `policy <rule>`, `grant <interaction>`,
/// `person <decision>`, `keel`.
fn decider(decided_by: &Value) -> String {
    let field = |name: &str| decided_by[name].as_str().unwrap_or_default();
    let detail = match field("by") {
        "policy" => field("rule"),
        "grant" => field("interaction_id"),
        _ => field("decision"),
    };
    let by = Some(field("by")).filter(|by| !by.is_empty()).unwrap_or("?");
    if detail.is_empty() { by.to_string() } else { format!("{by} {detail}") }
}

/// `landlock-v7/isolated`, or `-` when the call did not run in a sandbox.
fn confinement(sandbox: Option<&Value>) -> String {
    let Some(sandbox) = sandbox else { return "-".into() };
    let parts: Vec<&str> = ["filesystem", "network"].iter().filter_map(|key| sandbox[*key].as_str()).collect();
    if parts.is_empty() { "sandboxed".into() } else { parts.join("/") }
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

/// `YYYY-MM-DDTHH:MM:SSZ` from Unix milliseconds.
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_764_494_523_999), "2025-11-30T09:22:03Z");
    }

    #[test]
    fn deciders_read_in_a_few_words() {
        assert_eq!(
            decider(&json!({"by": "policy", "rule": "allow_commands: \"ls\""})),
            "policy allow_commands: \"ls\""
        );
        assert_eq!(
            decider(&json!({"by": "person", "decision": "allow_once", "interaction_id": "int_1"})),
            "person allow_once"
        );
        assert_eq!(decider(&json!({"by": "grant", "interaction_id": "int_1"})), "grant int_1");
        assert_eq!(decider(&json!({"by": "keel", "reason": "no tool"})), "keel");
        assert_eq!(
            confinement(Some(&json!({"filesystem": "landlock-v7", "network": "isolated"}))),
            "landlock-v7/isolated"
        );
        assert_eq!(confinement(None), "-");
    }
}
