//! Replay: run a recorded session's turns again, with the model's answers
//! and the tools' results taken from its journal, and check that keel makes
//! the same decisions (each call's outcome and who allowed it, each turn's
//! status). A bug report with a journal or an archive becomes a
//! reproducible test.
//!
//! The replay runs in a fresh runtime in a scratch directory, on the
//! session's pinned coworker (not the bundle as it is now). Nothing reaches
//! a provider or runs a tool: a replay provider answers each request with
//! the next recorded attempt (failures included, so retries replay too) and
//! every built-in tool returns its recorded output. People's recorded
//! answers are given again when keel asks. Not replayed, and reported as
//! such: turns a crash or an interrupt cut, turns a person steered mid-way,
//! and calls to MCP tools (their servers are not started: a replay never
//! has effects).

mod recording;

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_protocol::Usage;
use keel_protocol::ids::new_id;
use keel_provider::{BoxFuture, DeltaSink, ModelProvider, ModelRequest, ModelResponse, ProviderError};
use keel_tools::{Tool, ToolContext, ToolDescriptor, ToolOutput};
use serde::Serialize;
use serde_json::Value;

pub use recording::{CallDecision, Decisions, RecordedTurn, Recording, Response};

use crate::config::{ProviderSet, RuntimeConfig};
use crate::error::{Result, RuntimeError};
use crate::events::BusMessage;
use crate::runtime::Runtime;

/// How long one replayed turn may take before the replay gives up on it.
const TURN_LIMIT: Duration = Duration::from_secs(120);

/// What a replay found.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub session_id: String,
    pub turns: Vec<TurnReport>,
    /// True when every replayed turn made the recorded decisions.
    pub matched: bool,
}

/// One turn's comparison.
#[derive(Debug, Clone, Serialize)]
pub struct TurnReport {
    pub turn_id: String,
    pub submission_id: String,
    /// `matched`, `mismatched`, or `skipped` (with `reason`).
    pub result: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub recorded: Decisions,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replayed: Option<Decisions>,
}

/// What the fakes serve, turn by turn.
#[derive(Default)]
struct Script {
    responses: VecDeque<Response>,
    summaries: VecDeque<String>,
    outputs: HashMap<String, VecDeque<(String, bool)>>,
}

type Shared = Arc<Mutex<Script>>;

fn script(shared: &Shared) -> std::sync::MutexGuard<'_, Script> {
    shared.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Answers every request with the next recorded attempt.
struct ReplayProvider {
    name: String,
    script: Shared,
}

impl ModelProvider for ReplayProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn stream<'a>(
        &'a self,
        request: &'a ModelRequest,
        on_delta: DeltaSink<'a>,
    ) -> BoxFuture<'a, std::result::Result<ModelResponse, ProviderError>> {
        Box::pin(async move {
            let mut script = script(&self.script);
            if request.instructions == keel_core::compaction::SUMMARY_INSTRUCTIONS {
                let summary = script.summaries.pop_front().ok_or_else(|| {
                    ProviderError::new(keel_provider::FailureKind::BadRequest, "the recording has no more summaries")
                })?;
                return Ok(ModelResponse {
                    items: vec![keel_protocol::Item::assistant_text(summary)],
                    usage: Usage::default(),
                    finish: keel_provider::FinishReason::Stop,
                });
            }
            match script.responses.pop_front() {
                Some(Response::Completed { items, finish, usage }) => {
                    for item in &items {
                        if let Some(text) = item.message_text() {
                            on_delta(&text);
                        }
                    }
                    Ok(ModelResponse { items, usage, finish })
                }
                Some(Response::Failed { kind, message }) => {
                    Err(ProviderError { kind, message, retry_after: Some(Duration::ZERO), http_status: None })
                }
                None => Err(ProviderError::new(
                    keel_provider::FailureKind::BadRequest,
                    "the recording has no more model answers: keel asked the model more often than when the session ran",
                )),
            }
        })
    }
}

/// A built-in tool's descriptor, returning recorded outputs instead of
/// running.
struct RecordedTool {
    descriptor: ToolDescriptor,
    script: Shared,
}

impl Tool for RecordedTool {
    fn descriptor(&self) -> ToolDescriptor {
        self.descriptor.clone()
    }

    fn call<'a>(&'a self, _context: &'a ToolContext, _arguments: Value) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            let next = script(&self.script).outputs.get_mut(&self.descriptor.name).and_then(VecDeque::pop_front);
            match next {
                Some((text, is_error)) => ToolOutput { text, is_error, ..ToolOutput::default() },
                None => ToolOutput::error(format!(
                    "replay: the recording has no result for this call of {}",
                    self.descriptor.name
                )),
            }
        })
    }
}

/// Replays `recording` in a runtime under `scratch` (an empty folder).
pub async fn replay(recording: &Recording, scratch: &Path) -> Result<ReplayReport> {
    let shared: Shared = Arc::default();
    script(&shared).summaries = recording.summaries.iter().cloned().collect();
    let spec = crate::compaction::pinned_spec(&recording.session)?;
    let mut providers = ProviderSet::new();
    let models = std::iter::once(&spec.model).chain(&spec.fallback_models).chain(spec.summary_model.as_ref());
    for model in models {
        let name = model.split_once(':').map(|(p, _)| p).unwrap_or(model);
        providers = providers.with(Arc::new(ReplayProvider { name: name.to_string(), script: shared.clone() }));
    }
    let mut config = RuntimeConfig::new(scratch.join("state"));
    config.providers = providers;
    config.retry.base_delay = Duration::ZERO;
    config.retry.max_delay = Duration::ZERO;
    config.retry.max_retry_after = Duration::ZERO;
    config.extra_tools = keel_tools::builtin_descriptors()
        .into_iter()
        .map(|descriptor| Arc::new(RecordedTool { descriptor, script: shared.clone() }) as Arc<dyn Tool>)
        .collect();
    let workspace = scratch.join("workspace");
    std::fs::create_dir_all(&workspace)
        .map_err(|e| RuntimeError::Config(format!("cannot create the replay's workspace: {e}")))?;
    let runtime = Runtime::open(config).await?;
    let original = &recording.session;
    let session = runtime
        .insert_session(keel_protocol::session::SessionInfo {
            id: new_id("ses"),
            name: format!("replay of {}", original.name),
            workspace: workspace.display().to_string(),
            provider_blocked: false,
            current_turn_id: None,
            history_len: 0,
            usage: Usage::default(),
            labels: Default::default(),
            owner: None,
            ..original.clone()
        })
        .await?;
    let mut reports = Vec::new();
    for turn in &recording.turns {
        if let Some(reason) = &turn.not_replayable {
            reports.push(TurnReport {
                turn_id: turn.turn_id.clone(),
                submission_id: turn.submission_id.clone(),
                result: "skipped",
                reason: Some(reason.clone()),
                recorded: turn.decisions.clone(),
                replayed: None,
            });
            continue;
        }
        {
            let mut script = script(&shared);
            script.responses = turn.responses.iter().cloned().collect();
            script.outputs.clear();
            for (tool, text, is_error) in &turn.tool_outputs {
                script.outputs.entry(tool.clone()).or_default().push_back((text.clone(), *is_error));
            }
        }
        let outcome = tokio::time::timeout(TURN_LIMIT, run_turn(&runtime, &session.id, turn)).await;
        let reason = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(_) => Some(format!("the replayed turn did not end within {}s", TURN_LIMIT.as_secs())),
        };
        reports.push(TurnReport {
            turn_id: turn.turn_id.clone(),
            submission_id: turn.submission_id.clone(),
            result: "mismatched",
            reason,
            recorded: turn.decisions.clone(),
            replayed: None,
        });
    }
    // Read the replay's own journal the way the original was read.
    let events = crate::archive::all_events(runtime.store(), &session.id).await?;
    let replayed = Recording::read(session.clone(), &events, &[]);
    let mut replayed_turns = replayed.turns.into_iter();
    for report in reports.iter_mut().filter(|r| r.result != "skipped") {
        let Some(turn) = replayed_turns.next() else { break };
        if report.reason.is_none() && turn.decisions == report.recorded {
            report.result = "matched";
        }
        report.replayed = Some(turn.decisions);
    }
    runtime.shutdown().await;
    let matched = reports.iter().all(|r| r.result != "mismatched");
    Ok(ReplayReport { session_id: original.id.clone(), turns: reports, matched })
}

/// Starts one turn and answers its questions as the recording did.
async fn run_turn(runtime: &Runtime, session: &str, turn: &RecordedTurn) -> Result<()> {
    let mut events = runtime.subscribe(session, runtime.snapshot_last_seq(session).await?).await?;
    runtime.start_turn(session, &turn.submission_id, &turn.text).await?;
    let mut asked: HashMap<String, String> = HashMap::new();
    loop {
        let Some(message) = events.next().await? else {
            return Err(RuntimeError::Conflict("the replay's event stream closed".into()));
        };
        let BusMessage::Event(event) = message else { continue };
        match event.kind.as_str() {
            "interaction_requested" => {
                let interaction = &event.data["interaction"];
                let id = interaction["id"].as_str().unwrap_or_default().to_string();
                let call = interaction["request"]["call_id"].as_str().unwrap_or_default().to_string();
                asked.insert(id, call);
            }
            "turn_waiting" => {
                let id = event.data["interaction_id"].as_str().unwrap_or_default().to_string();
                let call = asked.get(&id).cloned().unwrap_or_default();
                let Some((decision, message)) = turn.answers.get(&call).cloned() else {
                    return Err(RuntimeError::Conflict(format!(
                        "keel asked a person about call {call}, which the recording never asked about"
                    )));
                };
                runtime.respond_interaction(session, &id, decision, message).await?;
            }
            "turn_finished" => return Ok(()),
            _ => {}
        }
    }
}
