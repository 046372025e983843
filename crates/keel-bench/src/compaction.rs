//! `keel-bench compaction`: does a compaction keep what matters, how many
//! tokens does it reclaim, and how long does it take?
//!
//! Each scenario is a scripted long session with planted facts of three
//! kinds: the person's constraints (in their messages), file names (in tool
//! calls that write files) and decisions (in the coworker's answers). The
//! turns run against a local server speaking the OpenAI Chat Completions
//! format (so the session is exactly the same every run); the compaction is
//! written by a real model, `--summary-model` (the local SmolLM2 by
//! default). After `session/compact`, one more turn goes out and the facts
//! are looked for in that request: the outbound view the model really gets.
//!
//! The person's messages and the working state are kept verbatim by
//! construction, so those facts must all survive; with `--strict` the
//! command fails if one does not. Decisions survive only through the
//! summary, so their count measures the summarizer.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use keel_protocol::ids::new_id;
use keel_provider::{OpenAiChat, OpenAiChatConfig};
use keel_runtime::{BusMessage, NewSession, ProviderSet, Runtime, RuntimeConfig};
use keel_testkit::{MockServer, Reply};
use serde_json::{Value, json};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Person,
    File,
    Decision,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Person => "person",
            Kind::File => "files",
            Kind::Decision => "decisions",
        }
    }
}

struct Turn {
    user: String,
    /// Files the coworker writes in this turn.
    writes: Vec<&'static str>,
    answer: String,
}

struct Scenario {
    name: &'static str,
    turns: Vec<Turn>,
    facts: Vec<(Kind, &'static str)>,
}

/// About `words` words of plausible, fact-free progress notes.
fn filler(seed: usize, words: usize) -> String {
    const AREAS: &[&str] = &[
        "introduction",
        "second section",
        "appendix",
        "glossary",
        "summary table",
        "open questions",
        "list of risks",
        "timeline",
        "notes from the last call",
        "checklist",
    ];
    const NOTES: &[&str] = &[
        "I went through the {} and tidied the wording.",
        "The {} reads more clearly now, and nothing in it changes the plan.",
        "I compared the {} with the earlier draft and kept the structure.",
        "A few sentences in the {} were shortened.",
        "The {} needed no change after a second look.",
    ];
    let mut text = String::new();
    let mut n = seed;
    while text.split_whitespace().count() < words {
        let note = NOTES[n % NOTES.len()].replace("{}", AREAS[(n * 3 + seed) % AREAS.len()]);
        text.push_str(&note);
        text.push(' ');
        n += 1;
    }
    text.trim_end().to_string()
}

fn turn(user: impl Into<String>, writes: Vec<&'static str>, answer: impl Into<String>) -> Turn {
    Turn { user: user.into(), writes, answer: answer.into() }
}

fn scenarios() -> Vec<Scenario> {
    let steps = |seed: usize| -> Vec<Turn> {
        (0..8).map(|n| turn(format!("Continue with step {}.", n + 2), vec![], filler(seed + n, 300))).collect()
    };
    let mut migration = vec![
        turn(
            "We are migrating the billing service. Constraint: never touch the production database directly; every change goes through a migration file.",
            vec!["migrations/0042_add_invoice_index.sql"],
            format!("Decision: we use PostgreSQL 16 logical replication for the cutover. {}", filler(1, 200)),
        ),
        turn(
            "The budget cap for this work is 4200 EUR, and the legal team must sign off before the cutover.",
            vec!["docs/rollback-plan.md"],
            format!("Decision: the cutover window is Saturday 02:00 UTC. {}", filler(2, 200)),
        ),
    ];
    migration.extend(steps(3));
    migration.push(turn("Where are we now?", vec![], "ok"));
    let mut report = vec![
        turn(
            "Write the Q3 revenue report. It must be written in British English and must not name any customer.",
            vec!["reports/q3-revenue.md"],
            format!("Decision: revenue is reported net of refunds. {}", filler(11, 200)),
        ),
        turn(
            "Use the numbers from the finance export, not from the dashboard.",
            vec!["data/q3-finance-export.csv"],
            format!("Decision: every chart uses a logarithmic scale. {}", filler(12, 200)),
        ),
    ];
    report.extend(steps(13));
    report.push(turn("Where are we now?", vec![], "ok"));
    let mut hiring = vec![
        turn(
            "Help me plan the hiring round. Interviews may only be scheduled on Tuesdays and Thursdays.",
            vec!["hiring/interview-schedule.md"],
            format!("Decision: we hire two backend engineers before any frontend role. {}", filler(21, 200)),
        ),
        turn(
            "Every candidate gets the same take-home task, capped at three hours.",
            vec!["hiring/take-home-task.md"],
            format!("Decision: the panel is Ana, Bruno and Chen. {}", filler(22, 200)),
        ),
    ];
    hiring.extend(steps(23));
    hiring.push(turn("Where are we now?", vec![], "ok"));
    vec![
        Scenario {
            name: "migration",
            turns: migration,
            facts: vec![
                (Kind::Person, "never touch the production database"),
                (Kind::Person, "4200 EUR"),
                (Kind::Person, "legal team must sign off"),
                (Kind::File, "migrations/0042_add_invoice_index.sql"),
                (Kind::File, "docs/rollback-plan.md"),
                (Kind::Decision, "PostgreSQL 16"),
                (Kind::Decision, "Saturday 02:00 UTC"),
            ],
        },
        Scenario {
            name: "report",
            turns: report,
            facts: vec![
                (Kind::Person, "British English"),
                (Kind::Person, "must not name any customer"),
                (Kind::Person, "finance export"),
                (Kind::File, "reports/q3-revenue.md"),
                (Kind::File, "data/q3-finance-export.csv"),
                (Kind::Decision, "net of refunds"),
                (Kind::Decision, "logarithmic"),
            ],
        },
        Scenario {
            name: "hiring",
            turns: hiring,
            facts: vec![
                (Kind::Person, "Tuesdays and Thursdays"),
                (Kind::Person, "capped at three hours"),
                (Kind::File, "hiring/interview-schedule.md"),
                (Kind::File, "hiring/take-home-task.md"),
                (Kind::Decision, "two backend engineers"),
                (Kind::Decision, "Ana, Bruno and Chen"),
            ],
        },
    ]
}

fn write_bundle(dir: &Path, summary_model: &str) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let toml = format!(
        r#"[bundle]
name = "compaction-eval"

[coworkers.analyst]
model = "openai-chat:gpt-4o-mini"
summary_model = "{summary_model}"
instructions = "You are a careful coworker. Keep to the person's constraints."
tools = ["fs.write_file", "fs.read_file"]

[coworkers.analyst.policies]
"fs.write_file" = "allow"
"#
    );
    std::fs::write(dir.join("keel.toml"), toml)?;
    Ok(())
}

async fn run_turn(runtime: &Runtime, mock: &MockServer, session: &str, turn: &Turn) -> Result<()> {
    for (n, path) in turn.writes.iter().enumerate() {
        let args = json!({ "path": path, "content": format!("draft of {path}\n") }).to_string();
        mock.push(Reply::tool_call(format!("call_{}_{n}", new_id("c")), "fs__write_file", args));
    }
    mock.push(Reply::text(&turn.answer));
    let mut events = runtime.subscribe(session, runtime.snapshot_last_seq(session).await?).await?;
    runtime.start_turn(session, &new_id("sub"), &turn.user).await?;
    loop {
        match events.next().await? {
            Some(BusMessage::Event(e)) if e.kind == "turn_finished" => {
                anyhow::ensure!(e.data["status"] == "completed", "turn ended {}", e.data);
                return Ok(());
            }
            Some(_) => {}
            None => bail!("event stream closed"),
        }
    }
}

/// Runs the evaluation; see the module docs.
pub async fn bench(summary_model: &str, count: usize, strict: bool) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let bundle = dir.path().join("bundle");
    write_bundle(&bundle, summary_model)?;
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace)?;
    let mock = MockServer::start().await?;
    let chat = OpenAiChat::new(OpenAiChatConfig { base_url: mock.base_url(), ..OpenAiChatConfig::default() })?;
    let providers = ProviderSet::new().with(Arc::new(chat));
    #[cfg(feature = "local")]
    let providers =
        providers.with(Arc::new(keel_provider_local::LocalProvider::new(keel_provider_local::LocalConfig::from_env())));
    let mut config = RuntimeConfig::new(dir.path().join("state"));
    config.bundles = vec![bundle];
    config.providers = providers;
    let runtime = Runtime::open(config).await?;
    let mut rows = Vec::new();
    let mut lost_guaranteed = Vec::new();
    let mut totals = [(0usize, 0usize); 3];
    for scenario in scenarios().into_iter().take(count) {
        let session = runtime
            .create_session(NewSession {
                name: scenario.name.into(),
                coworker: "analyst".into(),
                workspace: workspace.display().to_string(),
                attended: false,
                compaction: None,
            })
            .await?
            .id;
        let (last, earlier) = scenario.turns.split_last().context("a scenario needs turns")?;
        for turn in earlier {
            run_turn(&runtime, &mock, &session, turn).await?;
        }
        let clock = Instant::now();
        let compacted = runtime.compact_session(&session).await?;
        let seconds = clock.elapsed().as_secs_f64();
        anyhow::ensure!(compacted.status == "applied", "{}: compaction {}", scenario.name, compacted.status);
        let record = compacted.compaction.context("an applied compaction has a record")?;
        run_turn(&runtime, &mock, &session, last).await?;
        let sent = mock.requests().last().map(|r| String::from_utf8_lossy(&r.body).to_lowercase()).unwrap_or_default();
        let mut found = serde_json::Map::new();
        for (index, kind) in [Kind::Person, Kind::File, Kind::Decision].into_iter().enumerate() {
            let facts: Vec<&str> = scenario.facts.iter().filter(|(k, _)| *k == kind).map(|(_, f)| *f).collect();
            let kept: Vec<&str> = facts.iter().copied().filter(|f| sent.contains(&f.to_lowercase())).collect();
            if kind != Kind::Decision {
                lost_guaranteed
                    .extend(facts.iter().filter(|f| !kept.contains(f)).map(|f| format!("{}: {f}", scenario.name)));
            }
            totals[index].0 += kept.len();
            totals[index].1 += facts.len();
            found.insert(kind.name().into(), json!(format!("{}/{}", kept.len(), facts.len())));
        }
        let reclaimed = record.tokens_before.saturating_sub(record.tokens_after);
        rows.push(json!({
            "scenario": scenario.name,
            "tokens_before": record.tokens_before,
            "tokens_after": record.tokens_after,
            "reclaimed_tokens": reclaimed,
            "reclaimed_percent": crate::round(100.0 * reclaimed as f64 / record.tokens_before.max(1) as f64),
            "seconds": crate::round(seconds),
            "summary_output_tokens": record.usage.output_tokens,
            "facts_kept": Value::Object(found),
            "summary": record.summary,
        }));
    }
    runtime.shutdown().await;
    let total = |i: usize| format!("{}/{}", totals[i].0, totals[i].1);
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "bench": "compaction",
            "summary_model": summary_model,
            "scenarios": rows,
            "facts_kept": { "person": total(0), "files": total(1), "decisions": total(2) },
            "lost_guaranteed_facts": lost_guaranteed,
        }))?
    );
    if strict && !lost_guaranteed.is_empty() {
        bail!("compaction lost facts it keeps by construction: {}", lost_guaranteed.join("; "));
    }
    Ok(())
}
