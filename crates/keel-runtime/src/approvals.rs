//! People in the loop: tool policies, approvals, grants and expiry.
//!
//! Before a tool call's intent is journaled the driver asks the coworker's
//! policy ([`keel_core::policy`]). `allow` runs it, `deny` refuses it (the
//! model reads why), `ask` parks the turn: keel journals an interaction
//! holding the call and the digests of the session's bundle, the tool's
//! descriptor, the tool's policy and the resource policy, marks the turn
//! `waiting`, and the driver ends, holding nothing. `interaction/respond`
//! applies a decision only while those digests still match the session's
//! pinned view (else it asks again), and only once (the first answer
//! stands). `allow_for_session` is a grant: later calls of the same tool
//! under the same digests run without asking, across restarts, since grants
//! are answered interactions in the journal. An interaction may expire;
//! then it counts as denied, by keel, and says so.

use std::sync::Arc;

use keel_core::policy::{self, Verdict};
use keel_protocol::ids::{new_id, now_ms};
use keel_protocol::interaction::{CallRequest, Decision, Digests};
use keel_protocol::session::{SessionInfo, ToolCallInfo};
use keel_protocol::{DecisionKind, Effect, EventKind, InteractionInfo, InteractionKind, InteractionStatus, TurnStatus};
use keel_protocol::{Item, ToolCallStatus};
use keel_store::NewEvent;
use serde::Serialize;
use serde_json::{Value, json};

use crate::bundle::{CoworkerSpec, digest_json};
use crate::error::{Result, RuntimeError};
use crate::runtime::Runtime;
use crate::slot::SessionSlot;

/// Whether an interaction loaded at open stays in memory: pending ones,
/// grants, and the current turn's.
pub(crate) fn keep(interaction: &InteractionInfo, current_turn: &str) -> bool {
    interaction.status == InteractionStatus::Pending || interaction.turn_id == current_turn || is_grant(interaction)
}

fn is_grant(interaction: &InteractionInfo) -> bool {
    interaction.status == InteractionStatus::Answered
        && interaction.decision.as_ref().is_some_and(|d| d.decision == DecisionKind::AllowForSession)
}

/// The digests a decision about `tool` is bound to, from the session's
/// pinned view.
pub(crate) fn digests(info: &SessionInfo, spec: &CoworkerSpec, tool: &str) -> Digests {
    Digests {
        bundle: info.bundle_digest.clone(),
        tool: spec.tool_digests.get(tool).cloned().unwrap_or_default(),
        tool_policy: digest_json(&serde_json::to_value(policy::find(&spec.policies, tool)).unwrap_or_default()),
        resource_policy: digest_json(&serde_json::to_value(&spec.resources).unwrap_or_default()),
    }
}

/// What the driver does with a call.
pub(crate) enum Gate {
    /// Run it; the value says who decided (journaled with the intent).
    Run(Value),
    /// Do not run it; the model reads this.
    Refuse(String),
    /// The turn waits for a person.
    Park,
}

/// The call as the gate sees it.
pub(crate) struct GateCall<'a> {
    pub turn_id: &'a str,
    pub call_id: &'a str,
    pub name: &'a str,
    pub qualified: &'a str,
    pub arguments: &'a str,
    pub parsed: &'a Value,
    pub effect: Effect,
}

/// Decides whether a call may run now, journaling a question if a person
/// must answer first.
pub(crate) async fn gate(
    runtime: &Runtime,
    slot: &SessionSlot,
    spec: &CoworkerSpec,
    call: GateCall<'_>,
) -> Result<Gate> {
    let rule = policy::find(&spec.policies, call.qualified);
    let mut decision = policy::evaluate(rule, call.qualified, call.effect, call.parsed);
    // Taint: an outbound call while the context holds data above its
    // clearance is decided by `on_violation`, whatever the policy says.
    let taint = taint_check(&slot.state().info, spec, call.qualified);
    if let Some(check) = &taint
        && check.violation
    {
        let verdict = spec.taint.on_violation.unwrap_or(Verdict::Ask);
        let rule = format!(
            "taint: the context holds {} data and {} may only carry {} data out",
            label_name(check.context),
            call.qualified,
            label_name(check.clearance)
        );
        if verdict != Verdict::Allow {
            decision = policy::Decision { verdict, rule };
        }
    }
    let taint_record = taint.as_ref().map(|c| {
        json!({ "context": c.context, "clearance": c.clearance, "violation": c.violation, "verdict": decision.verdict })
    });
    match decision.verdict {
        Verdict::Allow => {
            return Ok(Gate::Run(json!({ "by": "policy", "rule": decision.rule, "taint": taint_record })));
        }
        Verdict::Deny => {
            return Ok(Gate::Refuse(format!("the call was not run: {}", deny_reason(&decision.rule))));
        }
        Verdict::Ask => {}
    }
    let state = slot.state();
    let digests = digests(&state.info, spec, call.qualified);
    // A person already answered for this very call.
    let answered = state.interactions.iter().rev().find(|i| {
        i.turn_id == call.turn_id
            && i.request.call_id == call.call_id
            && i.kind == InteractionKind::Approval
            && matches!(i.status, InteractionStatus::Answered | InteractionStatus::Expired)
    });
    if let Some(interaction) = answered
        && let Some(answer) = &interaction.decision
    {
        if answer.decision.allows() {
            return Ok(Gate::Run(
                json!({ "by": answer.by, "decision": answer.decision, "interaction_id": interaction.id }),
            ));
        }
        let why = match (&interaction.status, &answer.message) {
            (InteractionStatus::Expired, _) => {
                "nobody answered the approval request in time, so it counts as denied".to_string()
            }
            (_, Some(message)) => format!("a person denied it: {message}"),
            (_, None) => "a person denied it".to_string(),
        };
        return Ok(Gate::Refuse(format!("the call was not run: {why}")));
    }
    if let Some(grant) = state
        .interactions
        .iter()
        .find(|i| is_grant(i) && i.request.tool == call.qualified && i.request.digests == digests)
    {
        return Ok(Gate::Run(json!({ "by": "grant", "interaction_id": grant.id })));
    }
    if state.interactions.iter().any(|i| {
        i.status == InteractionStatus::Pending && i.turn_id == call.turn_id && i.request.call_id == call.call_id
    }) {
        return Ok(Gate::Park);
    }
    let now = now_ms();
    let timeout = policy::expires_secs(rule).or(spec.approval_timeout_secs);
    let interaction = InteractionInfo {
        id: new_id("int"),
        session_id: slot.id.clone(),
        turn_id: call.turn_id.to_string(),
        kind: InteractionKind::Approval,
        status: InteractionStatus::Pending,
        request: CallRequest {
            call_id: call.call_id.to_string(),
            tool: call.qualified.to_string(),
            name: call.name.to_string(),
            arguments: call.arguments.to_string(),
            reason: decision.rule,
            digests,
        },
        attended: state.info.attended,
        created_at_ms: now,
        expires_at_ms: timeout.map(|secs| now + i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX)),
        decision: None,
        superseded_by: None,
    };
    park(runtime, slot, call.turn_id, interaction).await?;
    Ok(Gate::Park)
}

/// The taint facts of an outbound call.
pub(crate) struct TaintCheck {
    pub context: keel_protocol::session::Sensitivity,
    pub clearance: keel_protocol::session::Sensitivity,
    pub violation: bool,
}

/// `None` unless `tool` sends data out.
fn taint_check(info: &SessionInfo, spec: &CoworkerSpec, tool: &str) -> Option<TaintCheck> {
    let clearance = spec.taint.clearance(tool)?;
    let context = info.labels.values().copied().max().unwrap_or_default();
    Some(TaintCheck { context, clearance, violation: context > clearance })
}

fn label_name(label: keel_protocol::session::Sensitivity) -> &'static str {
    match label {
        keel_protocol::session::Sensitivity::Public => "public",
        keel_protocol::session::Sensitivity::Internal => "internal",
        keel_protocol::session::Sensitivity::Private => "private",
    }
}

fn deny_reason(rule: &str) -> String {
    if rule.starts_with("taint:") {
        format!("denied by taint tracking ({rule})")
    } else {
        format!("the policy denies it ({rule})")
    }
}

/// Journals `interaction` and parks its turn as `waiting`; the driver is
/// released before the events reach subscribers.
async fn park(runtime: &Runtime, slot: &SessionSlot, turn_id: &str, interaction: InteractionInfo) -> Result<()> {
    let record = serde_json::to_value(&interaction).unwrap_or_default();
    slot.transact_then(
        runtime.store(),
        |state, change| {
            if let Some(turn) = state.turn.as_mut().filter(|t| t.id == turn_id) {
                turn.status = TurnStatus::Waiting;
            }
            change.events.push(NewEvent::new(EventKind::InteractionRequested, json!({ "interaction": record })));
            change.events.push(NewEvent::new(
                EventKind::TurnWaiting,
                json!({ "turn_id": turn_id, "interaction_id": interaction.id }),
            ));
            change.interactions.push(interaction.clone());
            state.interactions.push(interaction);
            Ok(())
        },
        || slot.release_job(turn_id),
    )
    .await?;
    Ok(())
}

/// The result of `interaction/respond`.
#[derive(Debug, Clone, Serialize)]
pub struct RespondOutcome {
    /// `applied`, or `reasked` when the policy or bundle changed since the
    /// question: `interaction` is then the new question.
    pub status: &'static str,
    pub interaction: InteractionInfo,
    /// The turn's status after the answer.
    pub turn_status: Option<TurnStatus>,
}

impl Runtime {
    /// Pending interactions across sessions (or of one), oldest first.
    pub fn inbox(&self, session_id: Option<&str>) -> Vec<InteractionInfo> {
        let mut pending: Vec<InteractionInfo> = self
            .all_slots()
            .into_iter()
            .filter(|slot| session_id.is_none_or(|id| slot.id == id))
            .flat_map(|slot| {
                slot.peek(|state| {
                    state
                        .interactions
                        .iter()
                        .filter(|i| i.status == InteractionStatus::Pending)
                        .cloned()
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        pending.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        pending
    }

    /// A person's answer to an interaction.
    pub async fn respond_interaction(
        &self,
        session_id: &str,
        interaction_id: &str,
        decision: DecisionKind,
        message: Option<String>,
    ) -> Result<RespondOutcome> {
        let slot = self.slot(session_id)?;
        let _control = slot.control.lock().await;
        wait_for_driver(&slot).await;
        let state = slot.state();
        let Some(interaction) = state.interactions.iter().find(|i| i.id == interaction_id).cloned() else {
            return Err(RuntimeError::NotFound { what: "pending interaction", id: interaction_id.into() });
        };
        match interaction.status {
            InteractionStatus::Pending => {}
            InteractionStatus::Answered => {
                let first =
                    interaction.decision.as_ref().map(|d| format!("{:?} by {}", d.decision, d.by)).unwrap_or_default();
                return Err(RuntimeError::Conflict(format!(
                    "interaction {interaction_id} was already answered ({first}); the first answer stands"
                )));
            }
            InteractionStatus::Expired => {
                return Err(RuntimeError::Conflict(format!(
                    "interaction {interaction_id} expired before this answer and counted as denied"
                )));
            }
            InteractionStatus::Superseded => {
                return Err(RuntimeError::Conflict(format!(
                    "interaction {interaction_id} was asked again as {} because the policy or bundle changed; answer that one",
                    interaction.superseded_by.as_deref().unwrap_or("a newer interaction")
                )));
            }
            InteractionStatus::Withdrawn => {
                return Err(RuntimeError::Conflict(format!(
                    "interaction {interaction_id} was withdrawn: its turn ended before an answer"
                )));
            }
        }
        if !decision.fits(interaction.kind) {
            return Err(RuntimeError::InvalidParams(format!(
                "{decision:?} does not answer a {:?} interaction; use {}",
                interaction.kind,
                match interaction.kind {
                    InteractionKind::Approval => "allow_once, allow_for_session or deny",
                    InteractionKind::InterruptedCall => "run_again, skip or enter_result (with message)",
                    InteractionKind::Compaction => "retry or trim",
                }
            )));
        }
        if interaction.expires_at_ms.is_some_and(|at| at <= now_ms()) {
            self.expire(&slot, interaction).await?;
            return Err(RuntimeError::Conflict(format!(
                "interaction {interaction_id} expired before this answer and counted as denied"
            )));
        }
        if interaction.kind == InteractionKind::Compaction {
            return self.answer_compaction(&slot, interaction, decision, message).await;
        }
        let spec: CoworkerSpec = serde_json::from_value((*state.info.coworker_spec).clone())
            .map_err(|e| RuntimeError::Config(format!("the session's pinned coworker cannot be read: {e}")))?;
        let current = digests(&state.info, &spec, &interaction.request.tool);
        if current != interaction.request.digests {
            let asked = self.reask(&slot, interaction, current).await?;
            return Ok(RespondOutcome {
                status: "reasked",
                interaction: asked,
                turn_status: slot.state().turn.map(|t| t.status),
            });
        }
        let closing = match (interaction.kind, decision) {
            (InteractionKind::InterruptedCall, DecisionKind::Skip | DecisionKind::EnterResult) => {
                Some(self.closing_output(&slot, &interaction, decision, message.as_deref()).await?)
            }
            _ => None,
        };
        let answer = Decision { decision, message, by: "person".into(), at_ms: now_ms() };
        let answered = self.answer(&slot, interaction, InteractionStatus::Answered, answer, closing).await?;
        self.continue_if_answered(&slot).await?;
        Ok(RespondOutcome {
            status: "applied",
            interaction: answered,
            turn_status: slot.state().turn.map(|t| t.status),
        })
    }

    /// Records an answer (or an expiry).
    async fn answer(
        &self,
        slot: &SessionSlot,
        mut interaction: InteractionInfo,
        status: InteractionStatus,
        decision: Decision,
        closing: Option<(Item, ToolCallInfo)>,
    ) -> Result<InteractionInfo> {
        interaction.status = status;
        interaction.decision = Some(decision);
        let record = interaction.clone();
        slot.transact(self.store(), |state, change| {
            change.events.push(NewEvent::new(
                EventKind::InteractionAnswered,
                json!({ "interaction_id": record.id, "turn_id": record.turn_id, "status": record.status, "decision": record.decision }),
            ));
            change.interactions.push(record.clone());
            replace(&mut state.interactions, record.clone());
            if let Some((item, call)) = closing {
                change.events.push(NewEvent::new(
                    EventKind::ToolCallFinished,
                    json!({ "turn_id": record.turn_id, "call_id": call.call_id, "is_error": call.is_error, "decided_by": {"by": "person", "interaction_id": record.id} }),
                ));
                change.tool_calls.push(call);
                crate::driver::push_item(change, &mut state.info, &record.turn_id, item);
            }
            Ok(())
        })
        .await?;
        Ok(interaction)
    }

    /// The output a skipped or person-completed interrupted call gets, and
    /// its ledger record.
    async fn closing_output(
        &self,
        slot: &SessionSlot,
        interaction: &InteractionInfo,
        decision: DecisionKind,
        message: Option<&str>,
    ) -> Result<(Item, ToolCallInfo)> {
        let ledger = self.store().tool_calls(slot.id.clone(), Some(interaction.turn_id.clone())).await?;
        let Some(mut call) = ledger.into_iter().find(|c| c.call_id == interaction.request.call_id) else {
            return Err(RuntimeError::NotFound { what: "tool call", id: interaction.request.call_id.clone() });
        };
        let (output, status, is_error) = match decision {
            DecisionKind::EnterResult => (
                format!(
                    "(this result was entered by a person after keel stopped mid-call) {}",
                    message.unwrap_or_default()
                ),
                ToolCallStatus::Completed,
                false,
            ),
            _ => (
                keel_core::turn::tool_error(&format!(
                    "this call was interrupted when keel stopped; its effect may or may not have happened, and a person chose not to run it again{}. Check the current state before calling it again",
                    message.map(|m| format!(": {m}")).unwrap_or_default()
                )),
                ToolCallStatus::Interrupted,
                true,
            ),
        };
        call.status = status;
        call.output = Some(output.clone());
        call.is_error = is_error;
        call.finished_at_ms = Some(now_ms());
        Ok((Item::tool_output(call.call_id.clone(), output), call))
    }

    /// Asks again under the current digests.
    async fn reask(&self, slot: &SessionSlot, mut old: InteractionInfo, current: Digests) -> Result<InteractionInfo> {
        let now = now_ms();
        let mut new = old.clone();
        new.id = new_id("int");
        new.request.digests = current;
        new.created_at_ms = now;
        new.expires_at_ms = old.expires_at_ms.map(|at| now + (at - old.created_at_ms));
        old.status = InteractionStatus::Superseded;
        old.superseded_by = Some(new.id.clone());
        let (old_record, new_record) = (old.clone(), new.clone());
        let new_json = serde_json::to_value(&new).unwrap_or_default();
        slot.transact(self.store(), |state, change| {
            change.events.push(NewEvent::new(
                EventKind::InteractionSuperseded,
                json!({ "interaction_id": old_record.id, "superseded_by": new_record.id, "reason": "the policy, tool or bundle changed since the question; asking again" }),
            ));
            change.events.push(NewEvent::new(EventKind::InteractionRequested, json!({ "interaction": new_json })));
            change.interactions.push(old_record.clone());
            change.interactions.push(new_record.clone());
            replace(&mut state.interactions, old_record.clone());
            state.interactions.push(new_record.clone());
            Ok(())
        })
        .await?;
        Ok(new)
    }

    /// Counts an unanswered interaction as denied, by keel.
    async fn expire(&self, slot: &Arc<SessionSlot>, interaction: InteractionInfo) -> Result<()> {
        let message = "nobody answered the approval request before it expired, so it counts as denied".to_string();
        let answer =
            Decision { decision: DecisionKind::Deny, message: Some(message), by: "keel".into(), at_ms: now_ms() };
        self.answer(slot, interaction, InteractionStatus::Expired, answer, None).await?;
        self.continue_if_answered(slot).await
    }

    /// Expires every pending interaction whose time has come, and lets its
    /// turn go on.
    pub(crate) async fn expire_due(&self) -> Result<()> {
        let now = now_ms();
        for slot in self.all_slots() {
            // Most sessions have nothing pending: look without copying.
            let due: Vec<InteractionInfo> = slot.peek(|state| {
                state
                    .interactions
                    .iter()
                    .filter(|i| i.status == InteractionStatus::Pending && i.expires_at_ms.is_some_and(|at| at <= now))
                    .cloned()
                    .collect()
            });
            if due.is_empty() {
                continue;
            }
            let _control = slot.control.lock().await;
            wait_for_driver(&slot).await;
            for interaction in due {
                let still_pending = slot
                    .state()
                    .interactions
                    .iter()
                    .any(|i| i.id == interaction.id && i.status == InteractionStatus::Pending);
                if still_pending {
                    self.expire(&slot, interaction).await?;
                }
            }
        }
        Ok(())
    }

    /// Resumes the session's parked turn once none of its questions is
    /// pending.
    pub(crate) async fn continue_if_answered(&self, slot: &Arc<SessionSlot>) -> Result<()> {
        let state = slot.state();
        let Some(turn) = state.turn else { return Ok(()) };
        if !matches!(turn.status, TurnStatus::Waiting | TurnStatus::Recoverable) || slot.has_job() {
            return Ok(());
        }
        if state.interactions.iter().any(|i| i.status == InteractionStatus::Pending && i.turn_id == turn.id) {
            return Ok(());
        }
        self.continue_turn(slot, &turn.id).await
    }

    /// Marks the pending interactions of an ending turn withdrawn, in the
    /// turn's final commit, and returns their ids (the `turn_finished`
    /// event lists them, so the journal says what was withdrawn).
    pub(crate) fn withdraw_pending(
        state: &mut crate::slot::SessionState,
        change: &mut keel_store::Change,
        turn_id: &str,
    ) -> Vec<String> {
        let mut withdrawn = Vec::new();
        for interaction in state.interactions.iter_mut() {
            if interaction.turn_id == turn_id && interaction.status == InteractionStatus::Pending {
                interaction.status = InteractionStatus::Withdrawn;
                change.interactions.push(interaction.clone());
                withdrawn.push(interaction.id.clone());
            }
        }
        withdrawn
    }
}

/// Waits until a driver that is only checkpointing has let go.
async fn wait_for_driver(slot: &SessionSlot) {
    if let Some((_, _, mut done)) = slot.job_turn() {
        let parked = slot.state().turn.is_some_and(|t| t.status != TurnStatus::Running);
        if parked {
            let _ = done.wait_for(|finished| *finished).await;
        }
    }
}

pub(crate) fn replace(interactions: &mut Vec<InteractionInfo>, record: InteractionInfo) {
    match interactions.iter_mut().find(|i| i.id == record.id) {
        Some(existing) => *existing = record,
        None => interactions.push(record),
    }
}
