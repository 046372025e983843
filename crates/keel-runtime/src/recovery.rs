//! Restart recovery and `turn/resume`.
//!
//! Opening a state directory marks every `running` turn `interrupted` (its
//! process died) and every `waiting` turn `recoverable` (its question is still
//! pending). [`Runtime::recover`] then reads each interrupted turn's journal:
//! a tool call whose intent was committed without a result gets an output
//! saying it was interrupted and not re-run (ledger status `interrupted`),
//! and the turn becomes `recoverable`. [`Runtime::resume_turn`] continues a
//! recoverable turn from its journal without redoing completed steps.

use std::collections::HashMap;

use keel_core::{CallRecord, plan_resume};
use keel_protocol::ids::new_id;
use keel_protocol::ids::now_ms;
use keel_protocol::interaction::CallRequest;
use keel_protocol::rpc::TurnControlResponse;
use keel_protocol::{AttemptStatus, EventKind, TurnStatus};
use keel_protocol::{DecisionKind, Effect, InteractionInfo, InteractionKind, InteractionStatus};
use keel_store::NewEvent;
use serde_json::json;

use crate::driver::interrupt;
use crate::error::{Result, RuntimeError};
use crate::runtime::Runtime;

impl Runtime {
    /// Marks turns left `running` by a previous process `interrupted`, and
    /// attempts left `running` `abandoned`.
    pub(crate) async fn mark_interrupted(&self) -> Result<()> {
        // Sessions are settled concurrently, so their commits share group
        // commits (one fsync for many) instead of one fsync each in turn.
        let stopped: Vec<_> = self
            .all_slots()
            .into_iter()
            .filter(|slot| {
                slot.peek(|s| {
                    s.turn.as_ref().is_some_and(|t| matches!(t.status, TurnStatus::Running | TurnStatus::Waiting))
                })
            })
            .collect();
        self.for_each_concurrently(stopped, |runtime, slot| async move { runtime.mark_stopped(&slot).await }).await
    }

    /// Runs `work` on every slot, up to 256 at a time.
    async fn for_each_concurrently<F, Fut>(
        &self,
        slots: Vec<std::sync::Arc<crate::slot::SessionSlot>>,
        work: F,
    ) -> Result<()>
    where
        F: Fn(Runtime, std::sync::Arc<crate::slot::SessionSlot>) -> Fut,
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let mut running = tokio::task::JoinSet::new();
        for slot in slots {
            if running.len() >= 256
                && let Some(done) = running.join_next().await
            {
                done.map_err(|e| RuntimeError::Config(format!("a recovery task failed: {e}")))??;
            }
            running.spawn(work(self.clone(), slot));
        }
        while let Some(done) = running.join_next().await {
            done.map_err(|e| RuntimeError::Config(format!("a recovery task failed: {e}")))??;
        }
        Ok(())
    }

    /// [`Self::mark_interrupted`] for one session.
    async fn mark_stopped(&self, slot: &crate::slot::SessionSlot) -> Result<()> {
        let Some(turn) = slot.state().turn else { return Ok(()) };
        match turn.status {
            TurnStatus::Running => {
                let attempts = self.store().attempts(slot.id.clone()).await?;
                for mut attempt in attempts.into_iter().filter(|a| a.status == AttemptStatus::Running) {
                    attempt.status = AttemptStatus::Abandoned;
                    attempt.finished_at_ms = Some(now_ms());
                    attempt.error = Some("keel stopped while this attempt was streaming".into());
                    slot.transact(self.store(), |_, change| {
                        change.events.push(NewEvent::new(
                            EventKind::ModelAttemptFinished,
                            json!({ "turn_id": attempt.turn_id, "attempt_id": attempt.id, "status": attempt.status, "error": attempt.error }),
                        ));
                        change.attempt = Some(attempt);
                        Ok(())
                    })
                    .await?;
                }
                interrupt(self, slot, &turn.id, "process_exit").await?;
            }
            TurnStatus::Waiting => {
                slot.transact(self.store(), |state, change| {
                    if let Some(turn) = state.turn.as_mut() {
                        turn.status = TurnStatus::Recoverable;
                    }
                    change.events.push(NewEvent::new(
                        EventKind::TurnRecoverable,
                        json!({ "turn_id": turn.id, "interrupted_calls": [] }),
                    ));
                    Ok(())
                })
                .await?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Settles an imported session like one found at open: a running turn
    /// becomes interrupted then recoverable, a waiting one recoverable.
    pub(crate) async fn settle_imported(&self, slot: &crate::slot::SessionSlot) -> Result<()> {
        self.mark_stopped(slot).await?;
        if let Some(turn) = slot.state().turn.filter(|t| t.status == TurnStatus::Interrupted) {
            self.recover_turn(slot, &turn.id).await?;
        }
        Ok(())
    }

    /// Makes every `interrupted` turn `recoverable`. Returns how many.
    pub async fn recover(&self) -> Result<usize> {
        let interrupted: Vec<_> = self
            .all_slots()
            .into_iter()
            .filter(|slot| slot.peek(|s| s.turn.as_ref().is_some_and(|t| t.status == TurnStatus::Interrupted)))
            .collect();
        let count = interrupted.len();
        self.for_each_concurrently(interrupted, |runtime, slot| async move {
            let Some(turn) = slot.state().turn.filter(|t| t.status == TurnStatus::Interrupted) else { return Ok(()) };
            runtime.recover_turn(&slot, &turn.id).await
        })
        .await?;
        Ok(count)
    }

    async fn recover_turn(&self, slot: &crate::slot::SessionSlot, turn_id: &str) -> Result<()> {
        let Some(turn) = slot.state().turn.filter(|t| t.id == turn_id) else {
            return Err(RuntimeError::NotFound { what: "turn", id: turn_id.into() });
        };
        let items = self.store().history(slot.id.clone(), turn.history_start).await?;
        let (records, ledger) = self.ledger_records(slot, turn_id).await?;
        let plan = plan_resume(&items, &records, turn.steps, self.inner.default_limits);
        let questions = self.interrupted_call_questions(slot, turn_id, &plan.ask, &ledger);
        slot.transact(self.store(), |state, change| {
            let Some(turn) = state.turn.as_mut().filter(|t| t.id == turn_id && t.status == TurnStatus::Interrupted)
            else {
                return Err(RuntimeError::Conflict(format!("turn {turn_id} is not interrupted")));
            };
            turn.status = TurnStatus::Recoverable;
            for question in &questions {
                change.events.push(NewEvent::new(
                    EventKind::ToolCallInterrupted,
                    json!({ "turn_id": turn_id, "call_id": question.request.call_id, "interaction_id": question.id }),
                ));
                change.events.push(NewEvent::new(EventKind::InteractionRequested, json!({ "interaction": question })));
                change.interactions.push(question.clone());
                state.interactions.push(question.clone());
            }
            change.events.push(NewEvent::new(
                EventKind::TurnRecoverable,
                json!({ "turn_id": turn_id, "interrupted_calls": plan.ask }),
            ));
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// The effect-ledger records of a turn's calls, with whether each may
    /// run again: its tool is read-only or idempotent, or a person said so.
    pub(crate) async fn ledger_records(
        &self,
        slot: &crate::slot::SessionSlot,
        turn_id: &str,
    ) -> Result<(HashMap<String, CallRecord>, Vec<keel_protocol::session::ToolCallInfo>)> {
        let ledger = self.store().tool_calls(slot.id.clone(), Some(turn_id.to_string())).await?;
        let state = slot.state();
        let spec: crate::bundle::CoworkerSpec =
            serde_json::from_value((*state.info.coworker_spec).clone()).unwrap_or_else(|_| empty_spec());
        // A session whose tools changed cannot be bound; then nothing is
        // assumed safe to repeat.
        let tools = self.bind_tools(&spec).unwrap_or_default();
        let run_again: std::collections::HashSet<&str> = state
            .interactions
            .iter()
            .filter(|i| {
                i.turn_id == turn_id
                    && i.kind == InteractionKind::InterruptedCall
                    && i.decision.as_ref().is_some_and(|d| d.decision == DecisionKind::RunAgain)
            })
            .map(|i| i.request.call_id.as_str())
            .collect();
        let records = ledger
            .iter()
            .map(|call| {
                let effect = tools.by_name.get(&call.name).map(|b| b.tool.descriptor().effect).unwrap_or_default();
                let may_rerun = matches!(effect, Effect::ReadOnly | Effect::Idempotent)
                    || run_again.contains(call.call_id.as_str());
                (call.call_id.clone(), CallRecord { status: call.status, may_rerun })
            })
            .collect();
        Ok((records, ledger))
    }

    /// Questions for dispatched side-effecting calls without a result that
    /// have none yet.
    fn interrupted_call_questions(
        &self,
        slot: &crate::slot::SessionSlot,
        turn_id: &str,
        ask: &[String],
        ledger: &[keel_protocol::session::ToolCallInfo],
    ) -> Vec<InteractionInfo> {
        let state = slot.state();
        let spec: crate::bundle::CoworkerSpec =
            serde_json::from_value((*state.info.coworker_spec).clone()).unwrap_or_else(|_| empty_spec());
        let tools = self.bind_tools(&spec).unwrap_or_default();
        ask.iter()
            .filter(|call_id| {
                !state.interactions.iter().any(|i| {
                    i.turn_id == turn_id && &i.request.call_id == *call_id && i.kind == InteractionKind::InterruptedCall
                })
            })
            .filter_map(|call_id| ledger.iter().find(|c| &c.call_id == call_id))
            .map(|call| {
                let qualified = tools.by_name.get(&call.name).map(|b| b.qualified.clone()).unwrap_or_else(|| call.name.clone());
                InteractionInfo {
                    id: new_id("int"),
                    session_id: slot.id.clone(),
                    turn_id: turn_id.to_string(),
                    kind: InteractionKind::InterruptedCall,
                    status: InteractionStatus::Pending,
                    request: CallRequest {
                        call_id: call.call_id.clone(),
                        digests: crate::approvals::digests(&state.info, &spec, &qualified),
                        tool: qualified,
                        name: call.name.clone(),
                        arguments: call.arguments.clone(),
                        reason: "this side-effecting call started before keel stopped and has no recorded result, so its effect may or may not have happened: run it again, skip it, or enter its result".into(),
                    },
                    attended: state.info.attended,
                    created_at_ms: now_ms(),
                    expires_at_ms: None,
                    decision: None,
                    superseded_by: None,
                }
            })
            .collect()
    }

    /// Continues the session's `recoverable` (or `interrupted`) turn.
    pub async fn resume_turn(&self, session_id: &str) -> Result<TurnControlResponse> {
        let slot = self.slot(session_id)?;
        let _control = slot.control.lock().await;
        if slot.has_job() {
            return Err(RuntimeError::Busy("the session's turn is already running".into()));
        }
        let Some(turn) = slot.state().turn else {
            return Err(RuntimeError::Conflict("the session has no turn to resume".into()));
        };
        match turn.status {
            TurnStatus::Interrupted => self.recover_turn(&slot, &turn.id).await?,
            TurnStatus::Recoverable => {}
            other => {
                return Err(RuntimeError::Conflict(format!(
                    "turn {} is {}; only an interrupted or recoverable turn can be resumed",
                    turn.id,
                    other.as_str()
                )));
            }
        }
        let Some(turn) = slot.state().turn else {
            return Err(RuntimeError::Conflict("the session has no turn to resume".into()));
        };
        if let Some(pending) = slot
            .state()
            .interactions
            .iter()
            .find(|i| i.turn_id == turn.id && i.status == keel_protocol::InteractionStatus::Pending)
        {
            return Err(RuntimeError::Conflict(format!(
                "turn {} waits for a person: answer interaction {} with interaction/respond and it continues",
                turn.id, pending.id
            )));
        }
        let turn_id = turn.id.clone();
        self.continue_turn(&slot, &turn_id).await?;
        Ok(TurnControlResponse { turn_id, status: TurnStatus::Running })
    }

    /// Starts a driver on the session's parked or recoverable turn, from its
    /// journal.
    pub(crate) async fn continue_turn(
        &self,
        slot: &std::sync::Arc<crate::slot::SessionSlot>,
        turn_id: &str,
    ) -> Result<()> {
        let Some(turn) = slot.state().turn.filter(|t| t.id == turn_id) else {
            return Err(RuntimeError::NotFound { what: "turn", id: turn_id.into() });
        };
        let items = self.store().history(slot.id.clone(), turn.history_start).await?;
        let (records, _) = self.ledger_records(slot, turn_id).await?;
        let plan = plan_resume(&items, &records, turn.steps, self.inner.default_limits);
        if let Some(call_id) = plan.ask.first() {
            return Err(RuntimeError::Conflict(format!(
                "the call {call_id} may have had its effect; a person must decide whether to run it again before the turn goes on"
            )));
        }
        let turn_id = turn.id.clone();
        slot.transact(self.store(), |state, change| {
            if let Some(turn) = state.turn.as_mut() {
                turn.status = TurnStatus::Running;
            }
            change.events.push(NewEvent::new(EventKind::TurnResumed, json!({ "turn_id": turn_id })));
            Ok(())
        })
        .await?;
        self.spawn_driver(slot.clone(), turn_id, plan.next);
        Ok(())
    }
}

/// A stand-in when a session's pinned coworker cannot be read: no tools, so
/// nothing is assumed safe to repeat.
fn empty_spec() -> crate::bundle::CoworkerSpec {
    crate::bundle::CoworkerSpec {
        description: String::new(),
        model: String::new(),
        instructions: String::new(),
        tools: Vec::new(),
        resources: Default::default(),
        policies: Default::default(),
        approval_timeout_secs: None,
        taint: Default::default(),
        compaction: None,
        summary_model: None,
        fallback_models: Vec::new(),
        max_steps: None,
        max_output_tokens: None,
        prices: Default::default(),
        tool_digests: Default::default(),
    }
}
