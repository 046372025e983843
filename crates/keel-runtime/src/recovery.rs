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

use keel_core::plan_resume;
use keel_protocol::ids::now_ms;
use keel_protocol::rpc::TurnControlResponse;
use keel_protocol::{AttemptStatus, EventKind, ToolCallStatus, TurnStatus};
use keel_store::NewEvent;
use serde_json::json;

use crate::driver::{interrupt, push_item};
use crate::error::{Result, RuntimeError};
use crate::runtime::Runtime;

impl Runtime {
    /// Marks turns left `running` by a previous process `interrupted`, and
    /// attempts left `running` `abandoned`.
    pub(crate) async fn mark_interrupted(&self) -> Result<()> {
        for slot in self.all_slots() {
            let Some(turn) = slot.state().turn else { continue };
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
                    interrupt(self, &slot, &turn.id, "process_exit").await?;
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
        }
        Ok(())
    }

    /// Makes every `interrupted` turn `recoverable`. Returns how many.
    pub async fn recover(&self) -> Result<usize> {
        let mut count = 0;
        for slot in self.all_slots() {
            let Some(turn) = slot.state().turn.filter(|t| t.status == TurnStatus::Interrupted) else { continue };
            self.recover_turn(&slot, &turn.id).await?;
            count += 1;
        }
        Ok(count)
    }

    async fn recover_turn(&self, slot: &crate::slot::SessionSlot, turn_id: &str) -> Result<()> {
        let Some(turn) = slot.state().turn.filter(|t| t.id == turn_id) else {
            return Err(RuntimeError::NotFound { what: "turn", id: turn_id.into() });
        };
        let items = self.store().history(slot.id.clone(), turn.history_start).await?;
        let ledger = self.store().tool_calls(slot.id.clone(), Some(turn_id.to_string())).await?;
        let statuses: HashMap<String, ToolCallStatus> = ledger.iter().map(|c| (c.call_id.clone(), c.status)).collect();
        let plan = plan_resume(&items, &statuses, turn.steps, self.inner.default_limits);
        slot.transact(self.store(), |state, change| {
            let Some(turn) = state.turn.as_mut().filter(|t| t.id == turn_id && t.status == TurnStatus::Interrupted)
            else {
                return Err(RuntimeError::Conflict(format!("turn {turn_id} is not interrupted")));
            };
            turn.status = TurnStatus::Recoverable;
            for item in plan.append.iter().cloned() {
                if let keel_protocol::Item::FunctionCallOutput { call_id, output, .. } = &item
                    && let Some(mut call) = ledger.iter().find(|c| &c.call_id == call_id).cloned()
                {
                    call.status = ToolCallStatus::Interrupted;
                    call.output = Some(output.clone());
                    call.is_error = true;
                    call.finished_at_ms = Some(now_ms());
                    change.events.push(NewEvent::new(
                        EventKind::ToolCallInterrupted,
                        json!({ "turn_id": turn_id, "call_id": call_id }),
                    ));
                    change.tool_calls.push(call);
                }
                push_item(change, &mut state.info, turn_id, item);
            }
            change.events.push(NewEvent::new(
                EventKind::TurnRecoverable,
                json!({ "turn_id": turn_id, "interrupted_calls": plan.interrupted }),
            ));
            Ok(())
        })
        .await?;
        Ok(())
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
        let ledger = self.store().tool_calls(slot.id.clone(), Some(turn.id.clone())).await?;
        let statuses: HashMap<String, ToolCallStatus> = ledger.iter().map(|c| (c.call_id.clone(), c.status)).collect();
        let plan = plan_resume(&items, &statuses, turn.steps, self.inner.default_limits);
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
