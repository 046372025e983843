//! One model round trip: attempts, retries, fallbacks and what the answer
//! means for the turn.
//!
//! Every attempt is journaled before its request is sent
//! (`model_attempt_started`) and after it ends (`model_attempt_finished`,
//! with its status and any text it streamed). A failed attempt's text stays
//! in the attempts ledger: it never enters history and never reaches the
//! next attempt, whose request is built from committed history alone.

use std::sync::Mutex;
use std::time::Instant;

use keel_core::{Next, after_model, after_output_limit};
use keel_protocol::ids::{new_id, now_ms};
use keel_protocol::session::{AttemptInfo, TurnError};
use keel_protocol::{AttemptStatus, CompactionReason, EventKind, Item, TurnStatus, Usage};
use keel_provider::{FailureKind, FinishReason, ModelRequest, ModelResponse, ProviderError};
use keel_store::NewEvent;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{TurnRun, push_item};
use crate::compaction::{Compacted, Request, compact};
use crate::error::Result;
use crate::events::BusMessage;
use crate::telemetry::Span;
use keel_telemetry::{KeyValue, SpanKind};

/// How a model round trip ended.
pub(super) enum Called {
    Next(Next),
    Cancelled,
    /// A compaction needs a person's answer; the turn waits.
    Parked,
}

/// Whether the next request may go out.
enum Fit {
    /// Yes; `true` when a compaction was committed first.
    Ready(bool),
    Cancelled,
    Parked,
}

/// How one attempt ended.
enum Outcome {
    Completed(ModelResponse),
    Failed(ProviderError),
    Cancelled,
}

impl TurnRun<'_> {
    /// One model round trip, compacting the context first when the request
    /// would pass the session's threshold.
    pub(super) async fn call_model(&mut self, cancel: &CancellationToken) -> Result<Called> {
        self.deliver_steers().await?;
        match self.fit_context(cancel, None).await? {
            Fit::Ready(_) => {}
            Fit::Cancelled => return Ok(Called::Cancelled),
            Fit::Parked => return Ok(Called::Parked),
        }
        let step = self.slot.turn_steps() + 1;
        let mut tries_on_model = 0u32;
        let mut forced_compactions = 0;
        loop {
            let provider_name = self.models[self.model_index].provider.name().to_string();
            if let Some(wait) = self.runtime.inner.breakers.open_for(&provider_name) {
                let reason = format!("circuit_open ({}s left)", wait.as_secs());
                if self.switch_model(&reason).await? {
                    tries_on_model = 0;
                    continue;
                }
                let error = ProviderError::new(
                    FailureKind::Transport,
                    format!(
                        "provider {provider_name} failed repeatedly; keel sends it nothing for another {}s. Retry later or give the coworker a fallback model",
                        wait.as_secs() + 1
                    ),
                );
                return Ok(Called::Next(self.failure_next(error)));
            }
            tries_on_model += 1;
            match self.attempt(step, cancel).await? {
                Outcome::Cancelled => return Ok(Called::Cancelled),
                Outcome::Completed(response) => {
                    self.runtime.inner.breakers.success(&provider_name);
                    return Ok(Called::Next(self.decide(response, step).await?));
                }
                // The provider measured the request as too long: compact
                // (keeping less) and send it again, at most twice a step.
                Outcome::Failed(error) if error.kind == FailureKind::ContextTooLong && forced_compactions < 2 => {
                    forced_compactions += 1;
                    match self.fit_context(cancel, Some(CompactionReason::ContextTooLong)).await? {
                        Fit::Ready(true) => continue,
                        Fit::Ready(false) => return Ok(Called::Next(self.failure_next(error))),
                        Fit::Cancelled => return Ok(Called::Cancelled),
                        Fit::Parked => return Ok(Called::Parked),
                    }
                }
                Outcome::Failed(error) => {
                    if error.kind.is_retryable() {
                        self.runtime.inner.breakers.failure(&provider_name);
                    }
                    let policy = self.runtime.inner.retry;
                    if error.kind.is_retryable() && tries_on_model < policy.max_attempts {
                        let delay = policy.delay(tries_on_model, error.retry_after);
                        let retrying = json!({
                            "turn_id": self.turn_id, "step": step, "next_attempt": tries_on_model + 1,
                            "delay_ms": delay.as_millis() as u64, "reason": error.kind.as_str(), "error": error.message,
                        });
                        self.slot
                            .transact(self.runtime.store(), |_, change| {
                                change.events.push(NewEvent::new(EventKind::ModelRetrying, retrying));
                                Ok(())
                            })
                            .await?;
                        tokio::select! {
                            biased;
                            _ = cancel.cancelled() => return Ok(Called::Cancelled),
                            _ = tokio::time::sleep(delay) => {}
                        }
                        continue;
                    }
                    let switchable = matches!(error.kind, FailureKind::Auth) || error.kind.is_retryable();
                    if switchable && self.switch_model(error.kind.as_str()).await? {
                        tries_on_model = 0;
                        continue;
                    }
                    return Ok(Called::Next(self.failure_next(error)));
                }
            }
        }
    }

    /// Compacts when the next request would pass the session's threshold,
    /// or (with `forced`) because the provider said it was too long.
    async fn fit_context(&mut self, cancel: &CancellationToken, forced: Option<CompactionReason>) -> Result<Fit> {
        let state = self.slot.state();
        let budget = self.runtime.budget(&self.spec, &state.info.compaction).await?;
        let fixed = *self.fixed_tokens.get_or_insert_with(|| budget.fixed(&self.instructions, &self.tools.specs));
        let reason = match forced {
            Some(reason) => reason,
            None => {
                let items = self.slot.item_tokens(&self.history, budget.counter.as_ref());
                if fixed + budget.view(state.compaction.as_deref(), &items) <= budget.threshold {
                    return Ok(Fit::Ready(false));
                }
                CompactionReason::Threshold
            }
        };
        let guard = self.slot.begin_compaction(cancel);
        let request = Request { reason, spec: &self.spec, fixed, turn_id: Some(self.turn_id), cancel: &guard.token };
        let mut span = Span::new(
            self.segment.trace,
            Some(self.segment.span),
            "compact",
            SpanKind::Internal,
            keel_telemetry::now_unix_nanos(),
        );
        span.attr(KeyValue::str("keel.compaction.reason", reason.as_str()));
        let outcome = compact(self.runtime, self.slot, request).await?;
        drop(guard);
        let result = match &outcome {
            Compacted::Applied(record) => {
                span.attr(KeyValue::i64("keel.compaction.tokens_before", record.tokens_before as i64))
                    .attr(KeyValue::i64("keel.compaction.tokens_after", record.tokens_after as i64));
                "applied"
            }
            Compacted::Waiting(_) => "waiting",
            Compacted::NothingToCompact => "nothing_to_compact",
            Compacted::Discarded(_) => "discarded",
            Compacted::Cancelled => "cancelled",
        };
        span.attr(KeyValue::str("keel.compaction.outcome", result));
        span.end(&self.runtime.inner.telemetry);
        Ok(match outcome {
            Compacted::Applied(_) => Fit::Ready(true),
            Compacted::Waiting(_) => Fit::Parked,
            Compacted::Cancelled if cancel.is_cancelled() => Fit::Cancelled,
            // Nothing to cut, or a stale summary: send the request as it is;
            // the provider has the last word on its size.
            Compacted::NothingToCompact | Compacted::Discarded(_) | Compacted::Cancelled => Fit::Ready(false),
        })
    }

    /// Moves to the coworker's next fallback model, journaling the switch.
    /// Returns false when there is none left.
    async fn switch_model(&mut self, reason: &str) -> Result<bool> {
        if self.model_index + 1 >= self.models.len() {
            return Ok(false);
        }
        let from = self.models[self.model_index].model_ref.clone();
        self.model_index += 1;
        let to = self.models[self.model_index].model_ref.clone();
        let switched = json!({ "turn_id": self.turn_id, "from": from, "to": to, "reason": reason });
        self.slot
            .transact(self.runtime.store(), |_, change| {
                change.events.push(NewEvent::new(EventKind::ModelSwitched, switched));
                Ok(())
            })
            .await?;
        Ok(true)
    }

    /// The end of a turn whose model round trip failed for good.
    fn failure_next(&mut self, error: ProviderError) -> Next {
        let message = match error.kind {
            FailureKind::SafetyBlocked => {
                self.block_session = true;
                format!(
                    "{error}; the provider refused on safety grounds, so this session accepts no new turns. Start a new session"
                )
            }
            FailureKind::ContextTooLong => {
                format!("{error}; the conversation no longer fits the model's context window. Start a new session")
            }
            _ => error.to_string(),
        };
        Next::Finish {
            status: TurnStatus::Failed,
            error: Some(TurnError { kind: format!("provider_{}", error.kind.as_str()), message }),
        }
    }

    /// Sends one request, journaling the attempt before and after.
    async fn attempt(&mut self, step: u32, cancel: &CancellationToken) -> Result<Outcome> {
        let model = &self.models[self.model_index];
        let provider = model.provider.clone();
        let mut attempt = AttemptInfo {
            id: new_id("att"),
            session_id: self.slot.id.clone(),
            turn_id: self.turn_id.to_string(),
            step,
            attempt: 0,
            model: model.model_ref.clone(),
            status: AttemptStatus::Running,
            text: String::new(),
            usage: Usage::default(),
            finish_reason: None,
            error: None,
            started_at_ms: now_ms(),
            finished_at_ms: None,
        };
        let request = ModelRequest {
            model: model.model.clone(),
            instructions: self.live_instructions(),
            items: keel_core::compaction::outbound(&self.history, self.slot.state().compaction.as_deref()),
            tools: self.tools.specs.clone(),
            max_output_tokens: self.max_output_tokens,
            images: self.visible_images(),
        };
        self.slot
            .transact(self.runtime.store(), |state, change| {
                let turn_attempts = state.turn.as_mut().map(|t| {
                    t.attempts += 1;
                    t.attempts
                });
                attempt.attempt = turn_attempts.unwrap_or(1);
                change.events.push(NewEvent::new(
                    EventKind::ModelAttemptStarted,
                    json!({ "turn_id": attempt.turn_id, "attempt_id": attempt.id, "step": step, "attempt": attempt.attempt, "model": attempt.model }),
                ));
                change.attempt = Some(attempt.clone());
                Ok(())
            })
            .await?;
        let streamed = Mutex::new(String::new());
        let slot = self.slot;
        let turn_id = self.turn_id;
        let on_delta = |text: &str| {
            if let Ok(mut all) = streamed.lock() {
                all.push_str(text);
            }
            slot.publish(BusMessage::Delta { turn_id: turn_id.to_string(), text: text.to_string() });
        };
        let model_ref = self.models[self.model_index].model_ref.clone();
        let provider_label = crate::telemetry::provider_name(provider.name()).to_string();
        let mut span = Span::new(
            self.segment.trace,
            Some(self.segment.span),
            format!("chat {}", request.model),
            SpanKind::Client,
            keel_telemetry::now_unix_nanos(),
        );
        span.attr(KeyValue::str("gen_ai.operation.name", "chat"))
            .attr(KeyValue::str("gen_ai.provider.name", provider_label.as_str()))
            .attr(KeyValue::str("gen_ai.system", provider_label.as_str()))
            .attr(KeyValue::str("gen_ai.request.model", request.model.as_str()))
            .attr(KeyValue::str("gen_ai.conversation.id", self.slot.id.as_str()))
            .attr(KeyValue::str("keel.model", model_ref.as_str()))
            .attr(KeyValue::i64("keel.step", i64::from(step)))
            .attr(KeyValue::i64("keel.attempt", i64::from(attempt.attempt)));
        if let Some(limit) = request.max_output_tokens {
            span.attr(KeyValue::i64("gen_ai.request.max_tokens", i64::from(limit)));
        }
        let clock = Instant::now();
        let result = tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            result = provider.stream(&request, &on_delta) => Some(result),
        };
        let elapsed = clock.elapsed();
        self.provider_time += elapsed;
        attempt.text = streamed.lock().map(|s| crate::secrets::redact(&s).into_owned()).unwrap_or_default();
        attempt.finished_at_ms = Some(now_ms());
        let outcome = match result {
            None => {
                attempt.status = AttemptStatus::Abandoned;
                Outcome::Cancelled
            }
            Some(Ok(mut response)) => {
                attempt.status = AttemptStatus::Completed;
                response.usage.cost_micro_usd = self.cost(&response.usage);
                attempt.usage = response.usage;
                attempt.finish_reason = Some(response.finish.as_str().to_string());
                Outcome::Completed(response)
            }
            Some(Err(error)) => {
                attempt.status = AttemptStatus::Failed;
                attempt.error = Some(format!("{}: {}", error.kind.as_str(), error.message));
                Outcome::Failed(error)
            }
        };
        self.observe_attempt(span, &attempt, &outcome, elapsed, &provider_label, &request.model);
        if !matches!(outcome, Outcome::Completed(_)) {
            self.commit_attempt(attempt, Vec::new(), None, Vec::new()).await?;
        } else {
            self.pending_attempt = Some(attempt);
        }
        Ok(outcome)
    }

    /// Ends an attempt's `chat` span and records its metrics.
    fn observe_attempt(
        &self,
        mut span: Span,
        attempt: &AttemptInfo,
        outcome: &Outcome,
        elapsed: std::time::Duration,
        provider: &str,
        model: &str,
    ) {
        let telemetry = &self.runtime.inner.telemetry;
        let status = match attempt.status {
            AttemptStatus::Completed => "completed",
            AttemptStatus::Failed => "failed",
            _ => "abandoned",
        };
        let base = [KeyValue::str("gen_ai.provider.name", provider), KeyValue::str("gen_ai.request.model", model)];
        let mut attrs = base.to_vec();
        attrs.push(KeyValue::str("gen_ai.operation.name", "chat"));
        if let Outcome::Failed(error) = outcome {
            attrs.push(KeyValue::str("error.type", error.kind.as_str()));
            telemetry.counter_add(crate::telemetry::ERRORS, 1, &[KeyValue::str("error.type", error.kind.as_str())]);
            span.error(error.kind.as_str(), error.message.as_str());
        }
        telemetry.histogram_record(crate::telemetry::OPERATION_DURATION, elapsed.as_secs_f64(), &attrs);
        let mut counted = base.to_vec();
        counted.push(KeyValue::str("keel.attempt.outcome", status));
        telemetry.counter_add(crate::telemetry::ATTEMPTS, 1, &counted);
        span.attr(KeyValue::str("keel.attempt.outcome", status));
        if let Outcome::Completed(response) = outcome {
            for (kind, tokens) in [("input", response.usage.input_tokens), ("output", response.usage.output_tokens)] {
                let mut attrs = base.to_vec();
                attrs.push(KeyValue::str("gen_ai.token.type", kind));
                telemetry.histogram_record(crate::telemetry::TOKEN_USAGE, tokens as f64, &attrs);
            }
            span.attr(KeyValue::i64("gen_ai.usage.input_tokens", response.usage.input_tokens as i64))
                .attr(KeyValue::i64("gen_ai.usage.output_tokens", response.usage.output_tokens as i64))
                .attr(KeyValue::strings("gen_ai.response.finish_reasons", [response.finish.as_str()]));
            if response.usage.cached_input_tokens > 0 {
                span.attr(KeyValue::i64(
                    "gen_ai.usage.cache_read.input_tokens",
                    response.usage.cached_input_tokens as i64,
                ));
            }
            if telemetry.capture_content() {
                let output = serde_json::to_string(&response.items).unwrap_or_default();
                span.attr(KeyValue::str("gen_ai.output.messages", crate::secrets::redact(&output).into_owned()));
            }
        }
        span.end(telemetry);
    }

    /// The instructions with the tools' live context, asked for afresh on
    /// every attempt and never written to history.
    fn live_instructions(&self) -> String {
        let live = self.tools.live_context(&self.slot.id);
        if live.is_empty() {
            return self.instructions.clone();
        }
        format!(
            "{}\n\nLive tool status (current as of this request; it supersedes older access errors in the conversation): {}",
            self.instructions,
            serde_json::Value::Object(live)
        )
    }

    /// Moves a person's pending messages for this turn into history, in
    /// one commit, before the next model request.
    async fn deliver_steers(&mut self) -> Result<()> {
        let pending = self.slot.state().turn.map(|t| t.pending_steers).unwrap_or_default();
        if pending.is_empty() {
            return Ok(());
        }
        let turn_id = self.turn_id;
        let mut delivered = Vec::new();
        self.slot
            .transact(self.runtime.store(), |state, change| {
                let Some(turn) = state.turn.as_mut() else { return Ok(()) };
                let steers = std::mem::take(&mut turn.pending_steers);
                for steer in steers {
                    let item = crate::secrets::redact_item(Item::user_text(steer.text));
                    push_item(change, &mut state.info, turn_id, item.clone());
                    delivered.push(item);
                }
                Ok(())
            })
            .await?;
        self.history.extend(delivered);
        Ok(())
    }

    /// The images the model may see in this request: those still in the
    /// ephemeral store whose tool allows showing them now (asked afresh on
    /// every attempt). The rest go out as placeholders.
    fn visible_images(&self) -> std::collections::BTreeMap<String, keel_provider::ImageData> {
        let mut visible = std::collections::BTreeMap::new();
        let mut tool_of_call = std::collections::HashMap::new();
        for item in &self.history {
            match item {
                Item::FunctionCall { call_id, name, .. } => {
                    tool_of_call.insert(call_id.as_str(), name.as_str());
                }
                Item::FunctionCallOutput { call_id, images, .. } if !images.is_empty() => {
                    let allowed = tool_of_call
                        .get(call_id.as_str())
                        .and_then(|name| self.tools.by_name.get(*name))
                        .is_some_and(|bound| bound.tool.images_allowed(&self.slot.id));
                    if !allowed {
                        continue;
                    }
                    for image in images {
                        if let Some(data) = self.runtime.inner.images.get(&self.slot.id, &image.id) {
                            visible.insert(image.id.clone(), data);
                        }
                    }
                }
                _ => {}
            }
        }
        visible
    }

    /// The cost of `usage` under the coworker's price for the current model.
    fn cost(&self, usage: &Usage) -> u64 {
        let Some(price) = &self.models[self.model_index].price else { return 0 };
        price.micro_usd(usage)
    }

    /// Records a completed response with the history it adds and decides
    /// what follows.
    async fn decide(&mut self, mut response: ModelResponse, step: u32) -> Result<Next> {
        let Some(attempt) = self.pending_attempt.take() else {
            return Ok(Next::CallModel);
        };
        // Provider call ids are untrusted: the ledger keys on keel's own.
        let renamed = keel_core::call_ids::assign_call_ids(
            &mut response.items,
            keel_core::call_ids::call_ids_in(&self.history),
            self.turn_id,
            step,
        );
        let continuations = self.slot.state().turn.map(|t| t.continuations).unwrap_or(0);
        let (decision, continued) = if response.finish == FinishReason::Length {
            after_output_limit(response.items, step, continuations, self.limits)
        } else {
            (after_model(response.items, step, self.limits), false)
        };
        self.commit_attempt(attempt, decision.append, Some((step, continued)), renamed).await?;
        Ok(decision.next)
    }

    /// Commits an attempt's outcome; a completed one with the items it adds
    /// to history, its step, and whether it continued a cut answer; `renamed`
    /// lists provider call ids keel replaced (journaled with the attempt).
    async fn commit_attempt(
        &mut self,
        attempt: AttemptInfo,
        items: Vec<Item>,
        completed: Option<(u32, bool)>,
        renamed: Vec<keel_core::call_ids::RenamedCall>,
    ) -> Result<()> {
        let usage = attempt.usage;
        let items: Vec<Item> = items.into_iter().map(crate::secrets::redact_item).collect();
        let mut finished = json!({
            "turn_id": attempt.turn_id, "attempt_id": attempt.id, "attempt": attempt.attempt, "status": attempt.status,
            "usage": attempt.usage, "finish_reason": attempt.finish_reason, "error": attempt.error,
        });
        if !renamed.is_empty() {
            finished["renamed_calls"] =
                renamed.iter().map(|r| json!({"provider_call_id": r.provider_call_id, "call_id": r.call_id})).collect();
        }
        let added = items.clone();
        let turn_id = self.turn_id;
        self.slot
            .transact(self.runtime.store(), |state, change| {
                change.events.push(NewEvent::new(EventKind::ModelAttemptFinished, finished));
                change.attempt = Some(attempt);
                state.info.usage.add(&usage);
                if let Some(turn) = state.turn.as_mut() {
                    turn.usage.add(&usage);
                    if let Some((step, continued)) = completed {
                        turn.steps = step;
                        if continued {
                            turn.continuations += 1;
                        }
                    }
                }
                // What the model writes is as sensitive as what it read.
                let context = state.info.labels.values().copied().max().unwrap_or_default();
                for item in added {
                    let index = state.info.history_len;
                    push_item(change, &mut state.info, turn_id, item);
                    if context > keel_protocol::session::Sensitivity::Public {
                        state.info.labels.insert(index, context);
                    }
                }
                Ok(())
            })
            .await?;
        self.history.extend(items);
        Ok(())
    }
}
