//! The turn driver: performs what `keel-core` decides, one journaled step
//! at a time.
//!
//! Order of every step, which recovery relies on:
//! 1. model call: `model_attempt_started` commits before the request is
//!    sent; the response, its history items and the attempt's outcome commit
//!    together afterwards;
//! 2. tool call: the intent (`tool_call_started`, ledger status `started`)
//!    commits before the tool runs; the result and its history item commit
//!    together afterwards;
//! 3. the end: status, error and closing outputs for unanswered calls commit
//!    with `turn_finished`.
//!
//! No effect runs before its intent is committed.

use std::sync::Arc;
use std::time::Instant;

use keel_core::{Next, ToolCall, TurnLimits};
use keel_protocol::ids::now_ms;
use keel_protocol::session::{AttemptInfo, ToolCallInfo, TurnError};
use keel_protocol::{EventKind, Item, ToolCallStatus, TurnStatus};
use keel_provider::ModelProvider;
use keel_store::NewEvent;
use keel_tools::{ToolContext, ToolOutput};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::approvals::Gate;
use crate::bundle::CoworkerSpec;
use crate::error::{Result, RuntimeError};
use crate::runtime::Runtime;
use crate::slot::SessionSlot;
use crate::telemetry::{SegmentContext, Span};
use crate::tools::TurnTools;
use keel_telemetry::{KeyValue, SpanKind};

mod model_call;

/// One model a coworker may use, resolved to its provider.
struct ModelChoice {
    provider: Arc<dyn ModelProvider>,
    /// The provider's model name.
    model: String,
    /// `provider:model`, as journaled.
    model_ref: String,
    price: Option<crate::bundle::Price>,
}

/// What a driver works with for one turn.
struct TurnRun<'a> {
    runtime: &'a Runtime,
    slot: &'a SessionSlot,
    turn_id: &'a str,
    /// The coworker's model first, then its fallbacks.
    models: Vec<ModelChoice>,
    model_index: usize,
    max_output_tokens: Option<u32>,
    /// Set when a provider refused on safety grounds.
    block_session: bool,
    /// A completed attempt waiting to be committed with its decision.
    pending_attempt: Option<AttemptInfo>,
    instructions: String,
    /// The session's pinned coworker (policies, resources).
    spec: Arc<CoworkerSpec>,
    tools: TurnTools,
    limits: TurnLimits,
    context: ToolContext,
    /// The session's history as committed, kept in step with each commit.
    history: Vec<Item>,
    provider_time: std::time::Duration,
    /// Tokens of the instructions and tool declarations (counted once).
    fixed_tokens: Option<u64>,
    /// Where this segment's spans go.
    segment: SegmentContext,
}

/// Drives a turn until it finishes, is cancelled, or the runtime shuts down.
pub(crate) async fn drive(
    runtime: &Runtime,
    slot: &Arc<SessionSlot>,
    turn_id: &str,
    first: Next,
    cancel: &CancellationToken,
) {
    let started = Instant::now();
    let (trace, turn_span) = crate::telemetry::turn_trace(turn_id);
    let mut segment =
        Span::new(trace, Some(turn_span), "segment", SpanKind::Internal, keel_telemetry::now_unix_nanos());
    segment
        .attr(KeyValue::str("keel.turn.id", turn_id))
        .attr(KeyValue::str("gen_ai.conversation.id", slot.id.as_str()));
    let context = SegmentContext { trace, span: segment.id() };
    let outcome = match prepare(runtime, slot, turn_id, context).await {
        Ok(mut run) => {
            let result = run.drive(first, cancel).await;
            runtime.inner.metrics.record_turn(started.elapsed(), run.provider_time);
            result
        }
        Err(error) => Err(error),
    };
    if let Err(error) = outcome {
        let (kind, message) = match &error {
            RuntimeError::Config(m) => ("config", m.clone()),
            RuntimeError::Outdated(m) => ("session_outdated", m.clone()),
            other => ("runtime", other.to_string()),
        };
        tracing::warn!(session = %slot.id, turn = turn_id, %error, "turn failed");
        // If this commit fails too the turn stays `running` on disk and the
        // next open marks it interrupted: nothing is lost either way.
        segment.error(kind, &message);
        let storage = matches!(error, RuntimeError::Store(_));
        let failure = TurnError { kind: kind.into(), message };
        let ending = Ending::new(TurnStatus::Failed, Some(failure), "the turn failed");
        if finish(runtime, slot, turn_id, ending).await.is_err() && storage {
            record_stop_when_storage_returns(runtime, slot, turn_id).await;
        }
    }
    let status = slot.peek(|state| state.turn.as_ref().map(|t| t.status.as_str()).unwrap_or("unknown"));
    segment.attr(KeyValue::str("keel.segment.outcome", status));
    segment.end(&runtime.inner.telemetry);
}

async fn prepare<'a>(
    runtime: &'a Runtime,
    slot: &'a SessionSlot,
    turn_id: &'a str,
    segment: SegmentContext,
) -> Result<TurnRun<'a>> {
    let state = slot.state();
    let spec: CoworkerSpec = serde_json::from_value((*state.info.coworker_spec).clone())
        .map_err(|e| RuntimeError::Config(format!("the session's pinned coworker cannot be read: {e}")))?;
    let tools = runtime.bind_tools(&spec)?;
    report_unavailable(slot, runtime, turn_id, &tools).await?;
    let mut models = Vec::new();
    for model_ref in std::iter::once(&spec.model).chain(&spec.fallback_models) {
        let (provider, model) = runtime.inner.providers.resolve(model_ref)?;
        let price = spec.prices.get(model_ref).cloned();
        models.push(ModelChoice { provider, model, model_ref: model_ref.clone(), price });
    }
    let history = runtime.store().history(slot.id.clone(), 0).await?;
    Ok(TurnRun {
        runtime,
        slot,
        turn_id,
        models,
        model_index: 0,
        max_output_tokens: spec.max_output_tokens,
        block_session: false,
        pending_attempt: None,
        instructions: spec.instructions.clone(),
        spec: Arc::new(spec.clone()),
        tools,
        limits: TurnLimits {
            max_steps: spec.max_steps.unwrap_or(runtime.inner.default_limits.max_steps),
            ..runtime.inner.default_limits
        },
        context: ToolContext {
            session_id: slot.id.clone(),
            workspace: state.info.workspace.into(),
            resources: Arc::new(spec.resources.clone()),
        },
        history,
        provider_time: std::time::Duration::ZERO,
        fixed_tokens: None,
        segment,
    })
}

/// Journals, once per turn, each MCP server whose pinned tools are left
/// out because it is down.
async fn report_unavailable(slot: &SessionSlot, runtime: &Runtime, turn_id: &str, tools: &TurnTools) -> Result<()> {
    let mut servers: std::collections::BTreeMap<&str, &str> = std::collections::BTreeMap::new();
    for (name, reason) in &tools.unavailable {
        servers.entry(keel_tools::split_qualified(name).0).or_insert(reason);
    }
    if servers.is_empty() {
        return Ok(());
    }
    slot.transact(runtime.store(), |_, change| {
        for (server, reason) in &servers {
            change.events.push(NewEvent::new(
                EventKind::ToolServerUnavailable,
                json!({ "turn_id": turn_id, "server": server, "reason": reason }),
            ));
        }
        Ok(())
    })
    .await?;
    Ok(())
}

impl TurnRun<'_> {
    async fn drive(&mut self, first: Next, cancel: &CancellationToken) -> Result<()> {
        let mut next = first;
        loop {
            if cancel.is_cancelled() {
                return self.stop().await;
            }
            next = match next {
                Next::CallModel => match self.call_model(cancel).await? {
                    model_call::Called::Next(next) => next,
                    model_call::Called::Cancelled => return self.stop().await,
                    model_call::Called::Parked => return Ok(()),
                },
                Next::RunTools(calls) => {
                    for call in calls {
                        match self.run_tool(call, cancel).await? {
                            Step::Done => {}
                            Step::Cancelled => return self.stop().await,
                            Step::Parked => return Ok(()),
                        }
                    }
                    Next::CallModel
                }
                // A person's message arrived while the model was giving
                // its final answer: it is not lost, the model gets it.
                Next::Finish { status: TurnStatus::Completed, .. } if self.has_pending_steers() => Next::CallModel,
                Next::Finish { status, error } => {
                    let ending = Ending {
                        status,
                        error,
                        reason: "the turn ended",
                        history: Some(&self.history),
                        block_session: self.block_session,
                    };
                    finish(self.runtime, self.slot, self.turn_id, ending).await?;
                    return Ok(());
                }
            };
        }
    }

    fn has_pending_steers(&self) -> bool {
        self.slot.peek(|state| state.turn.as_ref().is_some_and(|t| !t.pending_steers.is_empty()))
    }

    /// Records why the driver stopped early: a person's cancel, or shutdown.
    async fn stop(&mut self) -> Result<()> {
        if self.runtime.inner.shutdown.is_cancelled() {
            interrupt(self.runtime, self.slot, self.turn_id, "shutdown").await
        } else {
            let ending = Ending::new(TurnStatus::Cancelled, None, "the person cancelled the turn");
            finish(self.runtime, self.slot, self.turn_id, ending).await
        }
    }

    /// Runs one tool call through the effect ledger: the gate (policy,
    /// grant, a person), then `intended` (decided, not dispatched),
    /// `started` (dispatched: its effect may happen from here on), and the
    /// result with its history item.
    async fn run_tool(&mut self, call: ToolCall, cancel: &CancellationToken) -> Result<Step> {
        let clock = Instant::now();
        let mut span = Span::new(
            self.segment.trace,
            Some(self.segment.span),
            format!("execute_tool {}", call.name),
            SpanKind::Internal,
            keel_telemetry::now_unix_nanos(),
        );
        span.attr(KeyValue::str("gen_ai.operation.name", "execute_tool"))
            .attr(KeyValue::str("gen_ai.tool.name", call.name.as_str()))
            .attr(KeyValue::str("gen_ai.tool.call.id", call.call_id.as_str()))
            .attr(KeyValue::str("gen_ai.tool.type", "function"));
        let mut ledger = ToolCallInfo {
            session_id: self.slot.id.clone(),
            call_id: call.call_id.clone(),
            turn_id: self.turn_id.to_string(),
            name: call.name.clone(),
            arguments: crate::secrets::redact(&call.arguments).into_owned(),
            status: ToolCallStatus::Intended,
            output: None,
            is_error: false,
            started_at_ms: now_ms(),
            finished_at_ms: None,
        };
        // An unknown tool or arguments that break the tool's schema are
        // refused before any intent: the call never runs.
        let bound = self.tools.by_name.get(&call.name).cloned();
        let qualified = bound.as_ref().map(|b| b.qualified.clone()).unwrap_or_default();
        let checked = match bound.map(|b| b.tool) {
            None => Err(format!(
                "the call was not run: there is no tool named {:?}; available tools: {}",
                call.name,
                self.tools.specs.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")
            )),
            Some(tool) => match keel_tools::schema::validate(&tool.descriptor().input_schema, &call.parsed) {
                Ok(()) => Ok(tool),
                Err(reason) => Err(format!("the call was not run: {reason}; fix the arguments and call again")),
            },
        };
        let checked = match checked {
            Ok(tool) => {
                let gate_call = crate::approvals::GateCall {
                    turn_id: self.turn_id,
                    call_id: &call.call_id,
                    name: &call.name,
                    qualified: &qualified,
                    arguments: &call.arguments,
                    parsed: &call.parsed,
                    effect: tool.descriptor().effect,
                };
                match crate::approvals::gate(self.runtime, self.slot, &self.spec, gate_call).await? {
                    Gate::Park => {
                        span.attr(KeyValue::str("keel.tool.outcome", "waiting"));
                        span.end(&self.runtime.inner.telemetry);
                        return Ok(Step::Parked);
                    }
                    Gate::Refuse(message) => Err(message),
                    Gate::Run(decided_by) => Ok((tool, decided_by)),
                }
            }
            Err(message) => Err(message),
        };
        let (output, finished_kind, status) = match checked {
            Err(message) => (ToolOutput::error(message), EventKind::ToolCallRejected, ToolCallStatus::Rejected),
            Ok((tool, decided_by)) => {
                let intent = ledger.clone();
                self.slot
                    .transact(self.runtime.store(), |_, change| {
                        change.events.push(NewEvent::new(
                            EventKind::ToolCallIntended,
                            json!({ "turn_id": intent.turn_id, "call_id": intent.call_id, "name": intent.name, "tool": qualified, "arguments": intent.arguments, "decided_by": decided_by }),
                        ));
                        change.tool_calls.push(intent);
                        Ok(())
                    })
                    .await?;
                ledger.status = ToolCallStatus::Started;
                let started = ledger.clone();
                self.slot
                    .transact(self.runtime.store(), |_, change| {
                        change.events.push(NewEvent::new(
                            EventKind::ToolCallStarted,
                            json!({ "turn_id": started.turn_id, "call_id": started.call_id, "tool": qualified }),
                        ));
                        change.tool_calls.push(started);
                        Ok(())
                    })
                    .await?;
                let output = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return Ok(Step::Cancelled),
                    output = tool.call(&self.context, call.parsed.clone()) => output,
                };
                crate::faults::crash_if("tool_returned");
                if output.not_run {
                    (output, EventKind::ToolCallRejected, ToolCallStatus::Rejected)
                } else {
                    (output, EventKind::ToolCallFinished, ToolCallStatus::Completed)
                }
            }
        };
        let mut output = output;
        output.text = crate::secrets::redact(&output.text).into_owned();
        let telemetry = &self.runtime.inner.telemetry;
        let outcome = if status == ToolCallStatus::Completed { "completed" } else { "rejected" };
        let attributes =
            [KeyValue::str("gen_ai.tool.name", qualified.as_str()), KeyValue::str("keel.tool.outcome", outcome)];
        telemetry.counter_add(crate::telemetry::TOOL_CALLS, 1, &attributes);
        telemetry.histogram_record(crate::telemetry::TOOL_DURATION, clock.elapsed().as_secs_f64(), &attributes[..1]);
        span.attr(KeyValue::str("keel.tool.qualified_name", qualified.as_str()))
            .attr(KeyValue::str("keel.tool.outcome", outcome));
        if output.is_error {
            telemetry.counter_add(crate::telemetry::ERRORS, 1, &[KeyValue::str("error.type", "tool_error")]);
            span.error("tool_error", "the tool returned an error");
        }
        span.end(telemetry);
        ledger.status = status;
        ledger.output = Some(output.text.clone());
        ledger.is_error = output.is_error;
        ledger.finished_at_ms = Some(now_ms());
        // Image bytes go to the ephemeral store; history keeps references.
        let images: Vec<keel_protocol::ImageRef> =
            output.images.into_iter().map(|image| self.runtime.inner.images.put(&self.slot.id, image)).collect();
        let mut finished =
            json!({ "turn_id": self.turn_id, "call_id": call.call_id, "tool": qualified, "is_error": output.is_error });
        if let Some(sandbox) = &output.sandbox {
            finished["sandbox"] = sandbox.clone();
        }
        if !images.is_empty() {
            finished["images"] = json!(images.len());
        }
        let item = Item::FunctionCallOutput { call_id: call.call_id.clone(), output: output.text, images };
        let turn_id = self.turn_id;
        // The output carries the sensitivity of where it came from.
        let label = self.spec.taint.source_label(&qualified);
        self.slot
            .transact(self.runtime.store(), |state, change| {
                change.events.push(NewEvent::new(finished_kind, finished));
                change.tool_calls.push(ledger);
                let index = state.info.history_len;
                push_item(change, &mut state.info, turn_id, item.clone());
                if label > keel_protocol::session::Sensitivity::Public {
                    state.info.labels.insert(index, label);
                }
                Ok(())
            })
            .await?;
        self.history.push(item);
        Ok(Step::Done)
    }
}

/// How a tool call step ended.
enum Step {
    Done,
    Cancelled,
    /// The turn waits for a person; the driver ends.
    Parked,
}

/// Appends `item` to history in `change`, with its `item_added` event.
pub(crate) fn push_item(
    change: &mut keel_store::Change,
    info: &mut keel_protocol::session::SessionInfo,
    turn_id: &str,
    item: Item,
) {
    let item = crate::secrets::redact_item(item);
    let index = info.history_len;
    info.history_len += 1;
    change
        .events
        .push(NewEvent::new(EventKind::ItemAdded, json!({ "turn_id": turn_id, "index": index, "item": item })));
    change.history.push((index, item));
}

/// How a turn ends.
pub(crate) struct Ending<'h> {
    pub status: TurnStatus,
    pub error: Option<TurnError>,
    /// Why, in words that complete "not run: ... before this call started".
    pub reason: &'static str,
    /// The session's history if the caller holds it (saves a store read).
    pub history: Option<&'h [Item]>,
    /// Mark the session provider-blocked in the same commit.
    pub block_session: bool,
}

impl Ending<'_> {
    pub fn new(status: TurnStatus, error: Option<TurnError>, reason: &'static str) -> Ending<'static> {
        Ending { status, error, reason, history: None, block_session: false }
    }
}

/// Ends a turn, answering every call the model made that has no output yet
/// so the next request to the model is well formed.
pub(crate) async fn finish(runtime: &Runtime, slot: &SessionSlot, turn_id: &str, ending: Ending<'_>) -> Result<()> {
    let Ending { status, error, reason, history, block_session } = ending;
    let state = slot.state();
    let Some(turn) = state.turn.filter(|t| t.id == turn_id) else {
        return Err(RuntimeError::Conflict(format!("turn {turn_id} is not the session's current turn")));
    };
    let coworker = state.info.coworker;
    let items = match history {
        Some(history) => history.get(turn.history_start as usize..).unwrap_or_default().to_vec(),
        None => runtime.store().history(slot.id.clone(), turn.history_start).await?,
    };
    let mut closing = keel_core::recovery::close_unanswered(&items, &[], reason);
    if !closing.is_empty() {
        // Only a turn that ends with unanswered calls needs the ledger.
        let ledger = runtime.store().tool_calls(slot.id.clone(), Some(turn_id.to_string())).await?;
        closing = keel_core::recovery::close_unanswered(&items, &ledger, reason);
    }
    let release = || slot.release_job(turn_id);
    slot.transact_then(
        runtime.store(),
        |state, change| {
            let Some(turn) = state.turn.as_mut().filter(|t| t.id == turn_id && !t.status.is_terminal()) else {
                return Err(RuntimeError::Conflict(format!("turn {turn_id} has already ended")));
            };
            turn.status = status;
            turn.error = error.clone();
            let withdrawn = Runtime::withdraw_pending(state, change, turn_id);
            if block_session {
                state.info.provider_blocked = true;
            }
            for (item, interrupted) in closing {
                if let (Some(mut call), Item::FunctionCallOutput { output, .. }) = (interrupted, &item) {
                    change.events.push(NewEvent::new(
                        EventKind::ToolCallInterrupted,
                        json!({ "turn_id": turn_id, "call_id": call.call_id }),
                    ));
                    call.status = ToolCallStatus::Interrupted;
                    call.output = Some(output.clone());
                    call.is_error = true;
                    call.finished_at_ms = Some(now_ms());
                    change.tool_calls.push(call);
                }
                push_item(change, &mut state.info, turn_id, item);
            }
            let mut data =
                json!({ "turn_id": turn_id, "status": status, "error": error, "provider_blocked": block_session });
            if !withdrawn.is_empty() {
                data["withdrawn"] = json!(withdrawn);
            }
            change.events.push(NewEvent::new(EventKind::TurnFinished, data));
            Ok(())
        },
        release,
    )
    .await?;
    runtime.inner.metrics.turn_finished(status);
    turn_span(runtime, &slot.state(), &coworker, &turn, status, error.as_ref());
    Ok(())
}

/// The store refused the turn's last commits (a full disk, an I/O error):
/// the turn cannot even be recorded as failed. Keep trying, every second
/// until keel shuts down, to record it `interrupted`, so it becomes
/// recoverable as soon as the store accepts writes again; meanwhile the
/// driver stays registered and new submissions are refused as busy. If keel
/// stops first, the next start finds the turn `running` and marks it
/// interrupted, which comes to the same.
async fn record_stop_when_storage_returns(runtime: &Runtime, slot: &SessionSlot, turn_id: &str) {
    loop {
        tokio::select! {
            _ = runtime.inner.shutdown.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
        match interrupt(runtime, slot, turn_id, "storage_failed").await {
            Ok(()) => {
                slot.release_job(turn_id);
                return;
            }
            Err(RuntimeError::Store(_)) => continue,
            Err(_) => return,
        }
    }
}

/// Emits the `invoke_agent` span of an ended turn, and its metrics.
fn turn_span(
    runtime: &Runtime,
    state: &crate::slot::SessionState,
    coworker: &str,
    turn: &keel_protocol::session::TurnInfo,
    status: TurnStatus,
    error: Option<&TurnError>,
) {
    let telemetry = &runtime.inner.telemetry;
    let status_attr = [KeyValue::str("keel.turn.status", status.as_str())];
    telemetry.counter_add(crate::telemetry::TURNS, 1, &status_attr);
    let seconds = (now_ms() - turn.created_at_ms).max(0) as f64 / 1000.0;
    telemetry.histogram_record(crate::telemetry::TURN_DURATION, seconds, &status_attr);
    if !telemetry.is_enabled() {
        return;
    }
    let usage = state.turn.as_ref().map(|t| t.usage).unwrap_or(turn.usage);
    let (trace, id) = crate::telemetry::turn_trace(&turn.id);
    let start = crate::telemetry::nanos(turn.created_at_ms);
    let mut span = Span::new(trace, None, format!("invoke_agent {coworker}"), SpanKind::Internal, start).with_id(id);
    span.attr(KeyValue::str("gen_ai.operation.name", "invoke_agent"))
        .attr(KeyValue::str("gen_ai.agent.name", coworker))
        .attr(KeyValue::str("gen_ai.conversation.id", state.info.id.as_str()))
        .attr(KeyValue::str("keel.turn.id", turn.id.as_str()))
        .attr(KeyValue::str("keel.turn.status", status.as_str()))
        .attr(KeyValue::i64("keel.turn.steps", i64::from(state.turn.as_ref().map_or(turn.steps, |t| t.steps))))
        .attr(KeyValue::i64("gen_ai.usage.input_tokens", usage.input_tokens as i64))
        .attr(KeyValue::i64("gen_ai.usage.output_tokens", usage.output_tokens as i64));
    if let Some(error) = error {
        telemetry.counter_add(crate::telemetry::ERRORS, 1, &[KeyValue::str("error.type", error.kind.as_str())]);
        span.error(&error.kind, &error.message);
    }
    span.end(telemetry);
}

/// Marks a turn `interrupted`: its process is stopping (or stopped) while it
/// ran. Nothing is appended; recovery decides what the journal means.
pub(crate) async fn interrupt(runtime: &Runtime, slot: &SessionSlot, turn_id: &str, reason: &str) -> Result<()> {
    slot.transact(runtime.store(), |state, change| {
        let Some(turn) = state.turn.as_mut().filter(|t| t.id == turn_id) else {
            return Err(RuntimeError::Conflict(format!("turn {turn_id} is not the session's current turn")));
        };
        turn.status = TurnStatus::Interrupted;
        change.events.push(NewEvent::new(EventKind::TurnInterrupted, json!({ "turn_id": turn_id, "reason": reason })));
        Ok(())
    })
    .await
    .map(|_| ())
}
