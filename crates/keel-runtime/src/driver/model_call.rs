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
        let outcome = compact(self.runtime, self.slot, request).await?;
        drop(guard);
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
        let clock = Instant::now();
        let result = tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            result = provider.stream(&request, &on_delta) => Some(result),
        };
        self.provider_time += clock.elapsed();
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
        if !matches!(outcome, Outcome::Completed(_)) {
            self.commit_attempt(attempt, Vec::new(), None).await?;
        } else {
            self.pending_attempt = Some(attempt);
        }
        Ok(outcome)
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
    async fn decide(&mut self, response: ModelResponse, step: u32) -> Result<Next> {
        let Some(attempt) = self.pending_attempt.take() else {
            return Ok(Next::CallModel);
        };
        let continuations = self.slot.state().turn.map(|t| t.continuations).unwrap_or(0);
        let (decision, continued) = if response.finish == FinishReason::Length {
            after_output_limit(response.items, step, continuations, self.limits)
        } else {
            (after_model(response.items, step, self.limits), false)
        };
        self.commit_attempt(attempt, decision.append, Some((step, continued))).await?;
        Ok(decision.next)
    }

    /// Commits an attempt's outcome; a completed one with the items it adds
    /// to history, its step, and whether it continued a cut answer.
    async fn commit_attempt(
        &mut self,
        attempt: AttemptInfo,
        items: Vec<Item>,
        completed: Option<(u32, bool)>,
    ) -> Result<()> {
        let usage = attempt.usage;
        let items: Vec<Item> = items.into_iter().map(crate::secrets::redact_item).collect();
        let finished = json!({
            "turn_id": attempt.turn_id, "attempt_id": attempt.id, "attempt": attempt.attempt, "status": attempt.status,
            "usage": attempt.usage, "finish_reason": attempt.finish_reason, "error": attempt.error,
        });
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
