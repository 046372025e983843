//! Token accounting and compaction, as the runtime runs them.
//!
//! Every request's size is counted before it is sent: the instructions and
//! tool declarations, then the outbound view (the compaction block and the
//! history after its boundary), each history item counted once with the
//! model's tokenizer and cached in the session's slot. When the size passes
//! the session's threshold (default 80% of the cap), or the provider says the
//! request is too long, the driver compacts first (see
//! [`keel_core::compaction`] for what a record holds).
//!
//! How one compaction goes, and what it may leave behind:
//! 1. Nothing is journaled while the summary is written: a crash, an
//!    interrupt or a cancel at this point leaves no trace, and the
//!    summarizer's request is dropped at once (its future is dropped).
//! 2. A failed summary is asked for once more. If that fails too, an
//!    attended session parks a `compaction` question (retry, or trim) and
//!    the turn waits; an unattended one with `auto_trim_on_failure` commits a
//!    trimmed record (no summary; the person's messages and the working
//!    state are still kept); otherwise it parks the question too.
//! 3. The record commits with its `compacted` event in one transaction, and
//!    only if history and the previous record are what the summary was
//!    written against; else it is discarded (`compaction_discarded`).
//!
//! The summarizer is the coworker's own model, without tools, with
//! [`keel_core::compaction::SUMMARY_INSTRUCTIONS`]. Its usage is added to
//! the session's (and the turn's) usage when the record commits; a summary
//! that never commits is not counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use keel_core::compaction::{self as plan, SUMMARY_INSTRUCTIONS};
use keel_protocol::ids::{new_id, now_ms};
use keel_protocol::interaction::{CallRequest, Digests};
use keel_protocol::{CompactionReason, CompactionRecord, CompactionSettings, ContextUsage, EventKind};
use keel_protocol::{InteractionInfo, InteractionKind, InteractionStatus, Item, ToolSpec, TurnStatus, Usage};
use keel_provider::{ModelRequest, TokenCounter};
use keel_store::NewEvent;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::bundle::CoworkerSpec;
use crate::error::{Result, RuntimeError};
use crate::runtime::Runtime;
use crate::slot::SessionSlot;

/// The cap when neither the session nor the model says: the smallest
/// window of current hosted models.
const DEFAULT_CAP: u64 = 128_000;
/// Recent history kept verbatim after a compaction, as a share of the cap.
const KEEP_PERCENT: u64 = 25;
/// The same after the provider said the request was too long.
const FORCED_KEEP_PERCENT: u64 = 10;
/// The person's earlier messages kept verbatim, as a share of the cap.
const USERS_PERCENT: u64 = 10;
/// The qualified name interactions about compaction carry.
pub(crate) const COMPACTION_TOOL: &str = "keel.compaction";

/// Token counters and context windows by `provider:model`, built once (a
/// local model's tokenizer loads the model file).
#[derive(Default)]
pub(crate) struct Counters(Mutex<HashMap<String, ModelTokens>>);

/// A model's token counter and context window (when known).
type ModelTokens = (Arc<dyn TokenCounter>, Option<u64>);

/// How a session's requests are measured.
#[derive(Clone)]
pub(crate) struct Budget {
    pub counter: Arc<dyn TokenCounter>,
    pub cap: u64,
    pub threshold: u64,
}

impl Budget {
    pub fn count(&self, text: &str) -> u64 {
        self.counter.count(text)
    }

    /// Tokens of the parts of a request that are not history.
    pub fn fixed(&self, instructions: &str, tools: &[ToolSpec]) -> u64 {
        let tools: u64 = tools
            .iter()
            .map(|t| 10 + self.count(&t.name) + self.count(&t.description) + self.count(&t.parameters.to_string()))
            .sum();
        4 + self.count(instructions) + tools
    }

    /// Tokens of the outbound view: the block, then items from the boundary.
    pub fn view(&self, record: Option<&CompactionRecord>, items: &[u64]) -> u64 {
        match record {
            None => items.iter().sum(),
            Some(record) => {
                let from = (record.boundary as usize).min(items.len());
                4 + self.count(&plan::block_text(record)) + items[from..].iter().sum::<u64>()
            }
        }
    }
}

/// How a compaction ended.
#[derive(Debug)]
pub(crate) enum Compacted {
    Applied(CompactionRecord),
    /// The summary failed twice and a person was asked.
    Waiting(InteractionInfo),
    /// Everything after the previous boundary has to stay.
    NothingToCompact,
    /// History changed while the summary was written; nothing committed.
    Discarded(String),
    /// Interrupted or cancelled; nothing committed.
    Cancelled,
}

/// What a compaction is asked for.
pub(crate) struct Request<'a> {
    pub reason: CompactionReason,
    pub spec: &'a CoworkerSpec,
    /// Tokens of the instructions and tool declarations.
    pub fixed: u64,
    /// The turn that waits on the compaction (parked if a person must
    /// decide); `None` for `session/compact`.
    pub turn_id: Option<&'a str>,
    pub cancel: &'a CancellationToken,
}

/// Where to cut and what the record keeps, before any summary.
struct Cut {
    boundary: u64,
    users: Vec<String>,
    dropped_users: u32,
    working_state: keel_protocol::WorkingState,
    tokens_before: u64,
    history_len: u64,
    /// The items the summary covers (from the previous boundary).
    from: usize,
}

impl Runtime {
    /// The token counter and context window of `model_ref`.
    async fn model_tokens(&self, model_ref: &str) -> Result<ModelTokens> {
        if let Some(found) = self.inner.counters.0.lock().ok().and_then(|map| map.get(model_ref).cloned()) {
            return Ok(found);
        }
        let (provider, model) = self.inner.providers.resolve(model_ref)?;
        let found =
            tokio::task::spawn_blocking(move || (provider.token_counter(&model), provider.context_window(&model)))
                .await
                .map_err(|e| RuntimeError::Config(format!("the token counter could not be built: {e}")))?;
        if let Ok(mut map) = self.inner.counters.0.lock() {
            map.insert(model_ref.to_string(), found.clone());
        }
        Ok(found)
    }

    /// The counter and cap for a session of `spec` with `settings`.
    pub(crate) async fn budget(&self, spec: &CoworkerSpec, settings: &CompactionSettings) -> Result<Budget> {
        let (counter, window) = self.model_tokens(&spec.model).await?;
        let cap = settings.cap_tokens.or(window).unwrap_or(DEFAULT_CAP).max(1);
        Ok(Budget { counter, cap, threshold: cap * settings.threshold_percent() / 100 })
    }

    /// How full the session's context is, with `history` its full history.
    pub(crate) async fn context_usage(&self, slot: &SessionSlot, history: &[Item]) -> Result<ContextUsage> {
        let state = slot.state();
        let spec = pinned_spec(&state.info)?;
        let budget = self.budget(&spec, &state.info.compaction).await?;
        let tools = self.bind_tools(&spec).map(|t| t.specs).unwrap_or_default();
        let items = slot.item_tokens(history, budget.counter.as_ref());
        let record = state.compaction.as_deref();
        let used = budget.fixed(&spec.instructions, &tools) + budget.view(record, &items);
        Ok(ContextUsage {
            used_tokens: used,
            cap_tokens: budget.cap,
            available_tokens: budget.cap.saturating_sub(used),
            threshold_tokens: budget.threshold,
            tokenizer: budget.counter.name().to_string(),
            compactions: record.map(|r| r.number).unwrap_or(0),
            boundary: record.map(|r| r.boundary).unwrap_or(0),
        })
    }
}

/// The session's pinned coworker.
pub(crate) fn pinned_spec(info: &keel_protocol::session::SessionInfo) -> Result<CoworkerSpec> {
    serde_json::from_value((*info.coworker_spec).clone())
        .map_err(|e| RuntimeError::Config(format!("the session's pinned coworker cannot be read: {e}")))
}

/// Compacts the session's outbound view; see the module docs.
pub(crate) async fn compact(runtime: &Runtime, slot: &SessionSlot, request: Request<'_>) -> Result<Compacted> {
    let started = Instant::now();
    let state = slot.state();
    let budget = runtime.budget(request.spec, &state.info.compaction).await?;
    let history = runtime.store().history(slot.id.clone(), 0).await?;
    let previous = state.compaction.clone();
    let Some(cut) = cut(slot, &history, previous.as_deref(), &budget, &request) else {
        return Ok(Compacted::NothingToCompact);
    };
    // The summarizer reads as much as its own window allows: the session's
    // cap when it is the coworker's model, else that model's window.
    let summarizer = request.spec.summary_model.clone().unwrap_or_else(|| request.spec.model.clone());
    let (provider, model) = runtime.inner.providers.resolve(&summarizer)?;
    let window = match &request.spec.summary_model {
        Some(other) => runtime.model_tokens(other).await?.1.unwrap_or(DEFAULT_CAP),
        None => budget.cap,
    };
    let max_output = (window / 8).clamp(256, 2_048);
    let chars = (window.saturating_sub(max_output + 1_000) * 3).max(2_000) as usize;
    let transcript = plan::transcript(previous.as_deref(), &history[cut.from..cut.boundary as usize], chars);
    let summarize = ModelRequest {
        model,
        instructions: SUMMARY_INSTRUCTIONS.to_string(),
        items: vec![Item::user_text(format!(
            "The conversation to summarize:\n\n{transcript}\n\nWrite the summary now."
        ))],
        tools: Vec::new(),
        max_output_tokens: Some(max_output as u32),
        images: Default::default(),
    };
    let mut failures = Vec::new();
    let mut summary = None;
    for _ in 0..2 {
        let result = tokio::select! {
            biased;
            _ = request.cancel.cancelled() => return Ok(Compacted::Cancelled),
            result = provider.stream(&summarize, &|_| {}) => result,
        };
        match result {
            Ok(response) => {
                let text: Vec<String> = response.items.iter().filter_map(Item::message_text).collect();
                let text = text.join("\n");
                if text.trim().is_empty() {
                    failures.push("the model returned an empty summary".to_string());
                } else {
                    summary = Some((crate::secrets::redact(&text).into_owned(), response.usage));
                    break;
                }
            }
            Err(error) => failures.push(error.to_string()),
        }
    }
    if request.cancel.is_cancelled() {
        return Ok(Compacted::Cancelled);
    }
    let settings = state.info.compaction;
    match summary {
        Some((text, usage)) => {
            crate::faults::crash_if("summary_returned");
            let mut record = record(slot, &request, &budget, cut, Some((text, usage)), previous.as_deref(), started);
            record.model = Some(summarizer);
            commit(runtime, slot, record, previous.as_deref(), request.turn_id, None).await
        }
        None if !state.info.attended && settings.auto_trim_on_failure => {
            let record = record(slot, &request, &budget, cut, None, previous.as_deref(), started);
            let failed = json!({ "reason": request.reason, "errors": failures, "action": "trimmed" });
            commit(runtime, slot, record, previous.as_deref(), request.turn_id, Some(failed)).await
        }
        None => ask(runtime, slot, &request, &cut, failures).await.map(Compacted::Waiting),
    }
}

/// A trimmed record (no summary) for the session as it is now: what a
/// person's `trim` answer commits. `None` when there is nothing to cut.
pub(crate) async fn trimmed_record(
    runtime: &Runtime,
    slot: &SessionSlot,
    request: &Request<'_>,
) -> Result<Option<CompactionRecord>> {
    let started = Instant::now();
    let state = slot.state();
    let budget = runtime.budget(request.spec, &state.info.compaction).await?;
    let history = runtime.store().history(slot.id.clone(), 0).await?;
    let previous = state.compaction.clone();
    let Some(cut) = cut(slot, &history, previous.as_deref(), &budget, request) else { return Ok(None) };
    Ok(Some(record(slot, request, &budget, cut, None, previous.as_deref(), started)))
}

/// Chooses the boundary: keep the recent part that fits a share of the cap.
fn cut(
    slot: &SessionSlot,
    history: &[Item],
    previous: Option<&CompactionRecord>,
    budget: &Budget,
    request: &Request<'_>,
) -> Option<Cut> {
    let items = slot.item_tokens(history, budget.counter.as_ref());
    let previous_boundary = previous.map(|p| p.boundary).unwrap_or(0);
    let percent = if request.reason == CompactionReason::ContextTooLong { FORCED_KEEP_PERCENT } else { KEEP_PERCENT };
    let keep = budget.cap * percent / 100;
    // The person's latest message stays after the boundary, where it reads
    // as theirs, unless the provider refused the request as too long.
    let person_cut = history
        .iter()
        .rposition(plan::is_person_message)
        .map(|at| at as u64)
        .filter(|&at| at > previous_boundary && plan::is_clean_cut(history, at as usize));
    let keep_cut = plan::choose_boundary(history, &items, previous_boundary, keep);
    let boundary = match (request.reason, keep_cut, person_cut) {
        (CompactionReason::ContextTooLong, keep_cut, person_cut) => keep_cut.or(person_cut),
        (_, Some(keep_cut), Some(person_cut)) => Some(keep_cut.min(person_cut)),
        (_, keep_cut, person_cut) => keep_cut.or(person_cut),
    }?;
    let before = &history[..boundary as usize];
    let count = |text: &str| budget.count(text);
    let (users, dropped_users) = plan::person_messages(before, budget.cap * USERS_PERCENT / 100, &count);
    Some(Cut {
        boundary,
        users,
        dropped_users,
        working_state: plan::working_state(before),
        tokens_before: request.fixed + budget.view(previous, &items),
        history_len: history.len() as u64,
        from: (previous_boundary as usize).min(boundary as usize),
    })
}

fn record(
    slot: &SessionSlot,
    request: &Request<'_>,
    budget: &Budget,
    cut: Cut,
    summary: Option<(String, Usage)>,
    previous: Option<&CompactionRecord>,
    started: Instant,
) -> CompactionRecord {
    let trimmed = summary.is_none();
    let (summary, usage) = summary.unwrap_or_default();
    let mut record = CompactionRecord {
        id: new_id("cmp"),
        session_id: slot.id.clone(),
        number: previous.map(|p| p.number).unwrap_or(0) + 1,
        boundary: cut.boundary,
        summary,
        users: cut.users,
        dropped_users: cut.dropped_users,
        working_state: cut.working_state,
        trimmed,
        reason: request.reason,
        tokens_before: cut.tokens_before,
        tokens_after: 0,
        model: None,
        usage,
        history_len: cut.history_len,
        created_at_ms: now_ms(),
        duration_ms: 0,
    };
    // `cut` filled the slot's cache for every item, so this counts nothing.
    let kept = slot.cached_tokens_from(record.boundary as usize);
    record.tokens_after = request.fixed + 4 + budget.count(&plan::block_text(&record)) + kept;
    record.duration_ms = started.elapsed().as_millis() as u64;
    record
}

/// Commits `record` unless history or the record changed since the cut.
async fn commit(
    runtime: &Runtime,
    slot: &SessionSlot,
    record: CompactionRecord,
    previous: Option<&CompactionRecord>,
    turn_id: Option<&str>,
    failed: Option<serde_json::Value>,
) -> Result<Compacted> {
    let previous_id = previous.map(|p| p.id.clone());
    let event = compacted_event(&record);
    let committed = record.clone();
    let outcome = slot
        .transact(runtime.store(), |state, change| {
            let current = state.compaction.as_ref().map(|c| c.id.clone());
            if state.info.history_len != record.history_len || current != previous_id {
                return Err(RuntimeError::Conflict(format!(
                    "history changed while the summary was written (it had {} items, now {}); the summary was discarded",
                    record.history_len, state.info.history_len
                )));
            }
            if let Some(failed) = failed {
                change.events.push(NewEvent::new(EventKind::CompactionFailed, failed));
            }
            change.events.push(NewEvent::new(EventKind::Compacted, event));
            state.info.usage.add(&record.usage);
            if let Some(turn) = state.turn.as_mut().filter(|t| Some(t.id.as_str()) == turn_id) {
                turn.usage.add(&record.usage);
            }
            change.compaction = Some(record);
            state.compaction = Some(Arc::new(committed));
            Ok(())
        })
        .await;
    match outcome {
        Ok(_) => Ok(Compacted::Applied(
            slot.state()
                .compaction
                .as_deref()
                .cloned()
                .ok_or_else(|| RuntimeError::Conflict("the compaction record vanished after its commit".into()))?,
        )),
        Err(RuntimeError::Conflict(why)) => {
            let _ = slot
                .transact(runtime.store(), |_, change| {
                    change.events.push(NewEvent::new(EventKind::CompactionDiscarded, json!({ "reason": why })));
                    Ok(())
                })
                .await;
            Ok(Compacted::Discarded(why))
        }
        Err(other) => Err(other),
    }
}

/// The `compacted` event: the record without its texts (those are in the
/// record itself, which `session/get` shows).
pub(crate) fn compacted_event(record: &CompactionRecord) -> serde_json::Value {
    json!({
        "compaction_id": record.id, "number": record.number, "boundary": record.boundary,
        "reason": record.reason, "trimmed": record.trimmed, "tokens_before": record.tokens_before,
        "tokens_after": record.tokens_after, "users_kept": record.users.len(), "dropped_users": record.dropped_users,
        "model": record.model, "usage": record.usage, "duration_ms": record.duration_ms,
    })
}

/// Parks a `compaction` question: retry the summary, or trim.
async fn ask(
    runtime: &Runtime,
    slot: &SessionSlot,
    request: &Request<'_>,
    cut: &Cut,
    failures: Vec<String>,
) -> Result<InteractionInfo> {
    let state = slot.state();
    let current_turn = state.turn.as_ref().map(|t| t.id.clone()).unwrap_or_default();
    let turn_id = request.turn_id.map(str::to_string).unwrap_or(current_turn);
    let id = new_id("cmp");
    let interaction = InteractionInfo {
        id: new_id("int"),
        session_id: slot.id.clone(),
        turn_id: turn_id.clone(),
        kind: InteractionKind::Compaction,
        status: InteractionStatus::Pending,
        request: CallRequest {
            call_id: id,
            tool: COMPACTION_TOOL.into(),
            name: "compaction".into(),
            arguments: json!({ "reason": request.reason, "boundary": cut.boundary, "errors": failures }).to_string(),
            reason: format!(
                "the context is over its cap and the summary failed twice ({}); answer retry to ask the model again, or trim to drop the oldest part without a summary (your messages and the working state are kept)",
                failures.last().map(String::as_str).unwrap_or("no reason given")
            ),
            digests: Digests {
                bundle: state.info.bundle_digest.clone(),
                tool: String::new(),
                tool_policy: String::new(),
                resource_policy: String::new(),
            },
        },
        attended: state.info.attended,
        created_at_ms: now_ms(),
        expires_at_ms: None,
        decision: None,
        superseded_by: None,
    };
    let record = serde_json::to_value(&interaction).unwrap_or_default();
    let failed =
        json!({ "reason": request.reason, "errors": failures, "action": "asked", "interaction_id": interaction.id });
    let parks_turn = request.turn_id.is_some();
    let asked = interaction.clone();
    slot.transact_then(
        runtime.store(),
        |state, change| {
            change.events.push(NewEvent::new(EventKind::CompactionFailed, failed));
            change.events.push(NewEvent::new(EventKind::InteractionRequested, json!({ "interaction": record })));
            if parks_turn && let Some(turn) = state.turn.as_mut().filter(|t| t.id == turn_id) {
                turn.status = TurnStatus::Waiting;
                change.events.push(NewEvent::new(
                    EventKind::TurnWaiting,
                    json!({ "turn_id": turn_id, "interaction_id": asked.id }),
                ));
            }
            change.interactions.push(asked.clone());
            state.interactions.push(asked);
            Ok(())
        },
        || {
            if let Some(turn_id) = request.turn_id {
                slot.release_job(turn_id);
            }
        },
    )
    .await?;
    Ok(interaction)
}

mod manual;
