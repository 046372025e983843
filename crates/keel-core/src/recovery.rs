//! Continuing a turn from its journal after the process stopped.
//!
//! The rule that protects people: a tool call whose intent was journaled but
//! whose result was not may have had its effect. It is never re-run silently;
//! the model receives an output saying the call was interrupted and that it
//! must check before trying again. Calls the model asked for that never
//! started are safe to run.

use std::collections::{HashMap, HashSet};

use keel_protocol::session::ToolCallInfo;
use keel_protocol::{Item, ToolCallStatus};

use crate::turn::{Next, TurnLimits, after_model, step_limit, tool_error};

/// What resuming a turn does.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumePlan {
    /// Outputs to append for calls that were interrupted mid-effect.
    pub append: Vec<Item>,
    /// Call ids that get an interrupted output.
    pub interrupted: Vec<String>,
    /// Then what the driver does.
    pub next: Next,
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
/// `ledger` the effect-ledger status of each call id of this turn, and
/// `steps_done` the model round trips already completed.
pub fn plan_resume(
    turn_items: &[Item],
    ledger: &HashMap<String, ToolCallStatus>,
    steps_done: u32,
    limits: TurnLimits,
) -> ResumePlan {
    let answered = answered_calls(turn_items);
    let mut append = Vec::new();
    let mut interrupted = Vec::new();
    let mut unstarted = Vec::new();
    for item in turn_items {
        if let Item::FunctionCall { call_id, .. } = item {
            if answered.contains(call_id.as_str()) {
                continue;
            }
            match ledger.get(call_id) {
                // Never dispatched (no intent, or only the intent): safe.
                None | Some(ToolCallStatus::Intended) => unstarted.push(item.clone()),
                Some(_) => {
                    interrupted.push(call_id.clone());
                    append.push(Item::FunctionCallOutput {
                        call_id: call_id.clone(),
                        output: tool_error(
                            "this call was interrupted when keel stopped: it started, but its result was never recorded, so its effect may or may not have happened. It was not run again. Check the current state before calling it again",
                        ),
                        images: Vec::new(),
                    });
                }
            }
        }
    }
    let next = if !unstarted.is_empty() {
        // Run the calls that never started, exactly as the model asked.
        let decision = after_model(unstarted, steps_done, TurnLimits { max_steps: u32::MAX, ..limits });
        match decision.next {
            Next::RunTools(calls) => Next::RunTools(calls),
            _ => Next::CallModel,
        }
    } else {
        match turn_items.last() {
            // The model's last word was a plain answer: the turn is done.
            Some(Item::Message { role: keel_protocol::Role::Assistant, .. }) if append.is_empty() => {
                Next::Finish { status: keel_protocol::TurnStatus::Completed, error: None }
            }
            _ if steps_done >= limits.max_steps => step_limit(limits),
            _ => Next::CallModel,
        }
    };
    ResumePlan { append, interrupted, next }
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

    #[test]
    fn a_started_call_without_result_is_surfaced_not_rerun() {
        let items = vec![Item::user_text("go"), call("a")];
        let ledger = HashMap::from([("a".to_string(), ToolCallStatus::Started)]);
        let plan = plan_resume(&items, &ledger, 1, TurnLimits::default());
        assert_eq!(plan.interrupted, vec!["a".to_string()]);
        assert!(matches!(&plan.append[0], Item::FunctionCallOutput { output, .. } if output.contains("interrupted")));
        assert_eq!(plan.next, Next::CallModel);
    }

    #[test]
    fn an_unstarted_call_runs() {
        let items = vec![Item::user_text("go"), call("a")];
        let plan = plan_resume(&items, &HashMap::new(), 1, TurnLimits::default());
        assert!(plan.append.is_empty());
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
        let ledger = HashMap::from([("a".to_string(), ToolCallStatus::Completed)]);
        let plan = plan_resume(&items, &ledger, 1, TurnLimits::default());
        assert!(plan.interrupted.is_empty());
        assert_eq!(plan.next, Next::CallModel);
    }
}
