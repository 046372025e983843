//! `session/compact`, and a person's answer to a `compaction` question.

use std::sync::Arc;

use keel_protocol::ids::now_ms;
use keel_protocol::interaction::Decision;
use keel_protocol::rpc::CompactResponse;
use keel_protocol::{CompactionReason, DecisionKind, EventKind, InteractionInfo, InteractionStatus, TurnStatus};
use keel_store::NewEvent;
use serde_json::json;

use super::{Compacted, Request, compact, compacted_event, pinned_spec, trimmed_record};
use crate::approvals::RespondOutcome;
use crate::error::{Result, RuntimeError};
use crate::runtime::Runtime;
use crate::slot::SessionSlot;

impl Runtime {
    /// Compacts a session's context now (`session/compact`). Refused while
    /// a turn's driver runs: it compacts its own context when it needs to,
    /// and a summary written meanwhile would be stale. `turn/interrupt`
    /// cancels it; nothing is committed then.
    pub async fn compact_session(&self, session_id: &str) -> Result<CompactResponse> {
        let slot = self.slot(session_id)?;
        if slot.has_job() {
            return Err(RuntimeError::Busy(
                "a turn is running; it compacts its own context when it needs to. Try again when the turn ends".into(),
            ));
        }
        if slot.is_compacting() {
            return Err(RuntimeError::Busy("a compaction of this session is already running".into()));
        }
        let guard = slot.begin_compaction(&self.inner.shutdown);
        let outcome = self.compact_now(&slot, CompactionReason::Manual, &guard.token).await?;
        drop(guard);
        let history = self.store().history(slot.id.clone(), 0).await?;
        let context = self.context_usage(&slot, &history).await.ok();
        let respond = |status: &str| CompactResponse {
            status: status.into(),
            compaction: None,
            interaction: None,
            context: context.clone(),
        };
        match outcome {
            Compacted::Applied(record) => Ok(CompactResponse { compaction: Some(record), ..respond("applied") }),
            Compacted::Waiting(interaction) => {
                Ok(CompactResponse { interaction: Some(interaction), ..respond("waiting") })
            }
            Compacted::NothingToCompact => Ok(respond("nothing_to_compact")),
            Compacted::Discarded(why) => Err(RuntimeError::Conflict(format!("{why}; run session/compact again"))),
            Compacted::Cancelled => Err(RuntimeError::Conflict(
                "the compaction was cancelled (turn/interrupt or shutdown) and nothing was committed".into(),
            )),
        }
    }

    /// Runs a compaction that no turn waits on.
    async fn compact_now(
        &self,
        slot: &SessionSlot,
        reason: CompactionReason,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<Compacted> {
        let state = slot.state();
        let spec = pinned_spec(&state.info)?;
        let budget = self.budget(&spec, &state.info.compaction).await?;
        let tools = self.bind_tools(&spec).map(|t| t.specs).unwrap_or_default();
        let fixed = budget.fixed(&spec.instructions, &tools);
        compact(self, slot, Request { reason, spec: &spec, fixed, turn_id: None, cancel }).await
    }

    /// A person's answer to a `compaction` question. `trim` commits a
    /// trimmed record with the answer, in one commit; `retry` records the
    /// answer and asks for the summary again: through the waiting turn's
    /// driver, or in the background when no turn waits.
    pub(crate) async fn answer_compaction(
        &self,
        slot: &Arc<SessionSlot>,
        mut interaction: InteractionInfo,
        decision: DecisionKind,
        message: Option<String>,
    ) -> Result<RespondOutcome> {
        let state = slot.state();
        let waiting_turn = state
            .turn
            .as_ref()
            .filter(|t| {
                t.id == interaction.turn_id && matches!(t.status, TurnStatus::Waiting | TurnStatus::Recoverable)
            })
            .map(|t| t.id.clone());
        let reason = serde_json::from_str::<serde_json::Value>(&interaction.request.arguments)
            .ok()
            .and_then(|a| serde_json::from_value::<CompactionReason>(a["reason"].clone()).ok())
            .unwrap_or(CompactionReason::Manual);
        let trimmed = match decision {
            DecisionKind::Trim => {
                let spec = pinned_spec(&state.info)?;
                let budget = self.budget(&spec, &state.info.compaction).await?;
                let tools = self.bind_tools(&spec).map(|t| t.specs).unwrap_or_default();
                let fixed = budget.fixed(&spec.instructions, &tools);
                let cancel = tokio_util::sync::CancellationToken::new();
                let request = Request { reason, spec: &spec, fixed, turn_id: waiting_turn.as_deref(), cancel: &cancel };
                trimmed_record(self, slot, &request).await?
            }
            _ => None,
        };
        interaction.status = InteractionStatus::Answered;
        interaction.decision = Some(Decision { decision, message, by: "person".into(), at_ms: now_ms() });
        let record = interaction.clone();
        slot.transact(self.store(), |state, change| {
            change.events.push(NewEvent::new(
                EventKind::InteractionAnswered,
                json!({ "interaction_id": record.id, "turn_id": record.turn_id, "status": record.status, "decision": record.decision }),
            ));
            change.interactions.push(record.clone());
            crate::approvals::replace(&mut state.interactions, record.clone());
            if let Some(trimmed) = trimmed {
                if state.info.history_len != trimmed.history_len {
                    return Err(RuntimeError::Conflict(
                        "history changed while the trim was prepared; answer again".into(),
                    ));
                }
                change.events.push(NewEvent::new(EventKind::Compacted, compacted_event(&trimmed)));
                change.compaction = Some(trimmed.clone());
                state.compaction = Some(Arc::new(trimmed));
            }
            Ok(())
        })
        .await?;
        if waiting_turn.is_some() {
            self.continue_if_answered(slot).await?;
        } else if decision == DecisionKind::Retry {
            let runtime = self.clone();
            let slot = slot.clone();
            self.inner.tasks.spawn(async move {
                let guard = slot.begin_compaction(&runtime.inner.shutdown);
                if let Err(error) = runtime.compact_now(&slot, reason, &guard.token).await {
                    tracing::warn!(session = %slot.id, %error, "compaction retry failed");
                }
            });
        }
        Ok(RespondOutcome { status: "applied", interaction, turn_status: slot.state().turn.map(|t| t.status) })
    }
}
