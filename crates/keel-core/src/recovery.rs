//! Continuing a turn from its journal after the process stopped.
//!
//! The rule that protects people: a tool call that was dispatched but whose
//! result was not journaled may have had its effect. It runs again only if
//! its tool is read-only or idempotent, or a person says so; otherwise a
//! person decides (run again, skip, or enter the result). Calls that were
//! never dispatched are safe to run.

use std::collections::{HashMap, HashSet};

use keel_protocol::session::ToolCallInfo;
use keel_protocol::{Item, ToolCallStatus};

use crate::turn::{Next, TurnLimits, after_model, step_limit, tool_error};

/// What resuming a turn does.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumePlan {
    /// Calls that started, have no result, and may not simply run again
    /// (side-effecting, and no person said to): a person must decide before
    /// the turn goes on.
    pub ask: Vec<String>,
    /// Then what the driver does (once `ask` is empty).
    pub next: Next,
}

/// What the journal knows about one call of the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallRecord {
    pub status: ToolCallStatus,
    /// Safe to run again: the tool is read-only or idempotent, or a person
    /// said to run it again.
    pub may_rerun: bool,
}

/// The call ids that already have an output.
fn answered_calls(items: &[Item]) -> HashSet<&str> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::FunctionCallOutput { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect()
}

/// Plans how to continue a turn.
///
/// `turn_items` is the turn's part of history (from its user message on),
/// `ledger` the effect-ledger record of each call id of this turn, and
/// `steps_done` the model round trips already completed. A call with no
/// output runs (again) if it was never dispatched (no ledger record, or only
/// its intent) or may be re-run; one that was dispatched and may not is
/// put to a person.
pub fn plan_resume(
    turn_items: &[Item],
    ledger: &HashMap<String, CallRecord>,
    steps_done: u32,
    limits: TurnLimits,
) -> ResumePlan {
    let answered = answered_calls(turn_items);
    let mut ask = Vec::new();
    let mut to_run = Vec::new();
    for item in turn_items {
        if let Item::FunctionCall { call_id, .. } = item {
            if answered.contains(call_id.as_str()) {
                continue;
            }
            match ledger.get(call_id) {
                None => to_run.push(item.clone()),
                Some(record) if record.status == ToolCallStatus::Intended || record.may_rerun => {
                    to_run.push(item.clone())
                }
                Some(_) => ask.push(call_id.clone()),
            }
        }
    }
    let next = if !to_run.is_empty() {
        // Run the calls exactly as the model asked.
        let decision = after_model(to_run, steps_done, TurnLimits { max_steps: u32::MAX, ..limits });
        match decision.next {
            Next::RunTools(calls) => Next::RunTools(calls),
            _ => Next::CallModel,
        }
    } else {
        match turn_items.last() {
            // The model's last word was a plain answer: the turn is done.
            Some(Item::Message { role: keel_protocol::Role::Assistant, .. }) => {
                Next::Finish { status: keel_protocol::TurnStatus::Completed, error: None }
            }
            _ if steps_done >= limits.max_steps => step_limit(limits),
            _ => Next::CallModel,
        }
    };
    ResumePlan { ask, next }
}

/// Outputs that close every call in `turn_items` that has none, so history
/// stays well formed when a turn ends early. A call the ledger shows as
/// started gets an "interrupted, may have taken effect" output and is
/// returned with its ledger record; a call that never started gets a "not
/// run" output naming `reason`.
pub fn close_unanswered(
    turn_items: &[Item],
    ledger: &[ToolCallInfo],
    reason: &str,
) -> Vec<(Item, Option<ToolCallInfo>)> {
    let answered = answered_calls(turn_items);
    let mut out = Vec::new();
    for item in turn_items {
        let Item::FunctionCall { call_id, .. } = item else { continue };
        if answered.contains(call_id.as_str()) {
            continue;
        }
        let started = ledger.iter().find(|c| &c.call_id == call_id && c.status == ToolCallStatus::Started);
        let output = match started {
            Some(_) => tool_error(&format!(
                "{reason} while this call was running: its effect may or may not have happened, and it was not run again. Check the current state before calling it again"
            )),
            None => tool_error(&format!("not run: {reason} before this call started")),
        };
        out.push((Item::FunctionCallOutput { call_id: call_id.clone(), output, images: Vec::new() }, started.cloned()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::TurnStatus;

    fn call(id: &str) -> Item {
        Item::FunctionCall { call_id: id.into(), name: "write_file".into(), arguments: "{}".into() }
    }

    fn record(status: ToolCallStatus, may_rerun: bool) -> CallRecord {
        CallRecord { status, may_rerun }
    }

    #[test]
    fn a_dispatched_side_effecting_call_is_put_to_a_person() {
        let items = vec![Item::user_text("go"), call("a")];
        let ledger = HashMap::from([("a".to_string(), record(ToolCallStatus::Started, false))]);
        let plan = plan_resume(&items, &ledger, 1, TurnLimits::default());
        assert_eq!(plan.ask, vec!["a".to_string()]);
    }

    #[test]
    fn a_rerunnable_or_undispatched_call_runs_again() {
        let items = vec![Item::user_text("go"), call("a"), call("b")];
        let ledger = HashMap::from([
            ("a".to_string(), record(ToolCallStatus::Started, true)),
            ("b".to_string(), record(ToolCallStatus::Intended, false)),
        ]);
        let plan = plan_resume(&items, &ledger, 1, TurnLimits::default());
        assert!(plan.ask.is_empty());
        assert!(matches!(plan.next, Next::RunTools(ref c) if c.len() == 2));
    }

    #[test]
    fn an_unstarted_call_runs() {
        let items = vec![Item::user_text("go"), call("a")];
        let plan = plan_resume(&items, &HashMap::new(), 1, TurnLimits::default());
        assert!(plan.ask.is_empty());
        assert!(matches!(plan.next, Next::RunTools(ref c) if c[0].call_id == "a"));
    }

    #[test]
    fn a_user_message_alone_asks_the_model() {
        let plan = plan_resume(&[Item::user_text("go")], &HashMap::new(), 0, TurnLimits::default());
        assert_eq!(plan.next, Next::CallModel);
    }

    #[test]
    fn a_final_answer_completes() {
        let items = vec![Item::user_text("go"), Item::assistant_text("done")];
        let plan = plan_resume(&items, &HashMap::new(), 1, TurnLimits::default());
        assert_eq!(plan.next, Next::Finish { status: TurnStatus::Completed, error: None });
    }

    #[test]
    fn answered_calls_are_left_alone() {
        let items = vec![
            Item::user_text("go"),
            call("a"),
            Item::FunctionCallOutput { call_id: "a".into(), output: "ok".into(), images: Vec::new() },
        ];
        let ledger = HashMap::from([("a".to_string(), record(ToolCallStatus::Completed, false))]);
        let plan = plan_resume(&items, &ledger, 1, TurnLimits::default());
        assert!(plan.ask.is_empty());
        assert_eq!(plan.next, Next::CallModel);
    }
}
