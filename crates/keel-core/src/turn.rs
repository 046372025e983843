//! What happens after the model answers.

use keel_protocol::session::TurnError;
use keel_protocol::{Item, TurnStatus};

/// Limits that bound a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnLimits {
    /// Model round trips allowed in one turn.
    pub max_steps: u32,
    /// Times an answer cut by the output limit is continued before the
    /// turn ends `truncated`.
    pub max_continuations: u32,
}

impl Default for TurnLimits {
    fn default() -> Self {
        TurnLimits { max_steps: 32, max_continuations: 2 }
    }
}

/// The `_runtime_notice` tag of the message that asks the model to continue
/// an answer cut by its output limit.
pub const OUTPUT_CONTINUATION: &str = "output_continuation";

/// Decides what follows a response the provider cut at its output limit.
///
/// Calls in the response are handled as usual (a cut call has invalid
/// arguments and is answered with an error). A plain answer is kept and,
/// while `continuations_done` is under the limit, followed by a runtime
/// notice asking the model to continue; past the limit the turn ends
/// `truncated`. Returns the decision and whether it continues.
pub fn after_output_limit(
    output: Vec<Item>,
    steps_done: u32,
    continuations_done: u32,
    limits: TurnLimits,
) -> (Decision, bool) {
    if output.iter().any(|i| matches!(i, Item::FunctionCall { .. })) {
        return (after_model(output, steps_done, limits), false);
    }
    let mut append = output;
    if append.is_empty() {
        // Nothing was produced before the cut: there is no answer to continue.
        let error = TurnError {
            kind: "output_limit".into(),
            message: "the model reached its output limit before producing any answer; raise max_output_tokens for this coworker".into(),
        };
        return (Decision { append, next: Next::Finish { status: TurnStatus::Truncated, error: Some(error) } }, false);
    }
    if continuations_done >= limits.max_continuations {
        let error = TurnError {
            kind: "output_limit".into(),
            message: format!(
                "the model hit its output limit {} times in this turn; the answer is incomplete. Ask for a shorter answer or raise the model's output limit",
                continuations_done + 1
            ),
        };
        return (Decision { append, next: Next::Finish { status: TurnStatus::Truncated, error: Some(error) } }, false);
    }
    if steps_done >= limits.max_steps {
        return (Decision { append, next: step_limit(limits) }, false);
    }
    append.push(Item::Message {
        role: keel_protocol::Role::Developer,
        content: vec![keel_protocol::ContentPart::InputText {
            text: "[keel runtime] Your previous answer was cut off by the output limit. Continue exactly where it stopped, without repeating what you already wrote.".into(),
        }],
        runtime_notice: Some(OUTPUT_CONTINUATION.into()),
    });
    (Decision { append, next: Next::CallModel }, true)
}

/// A tool call the model asked for, with its arguments already parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub call_id: String,
    pub name: String,
    /// The raw argument text, as journaled.
    pub arguments: String,
    pub parsed: serde_json::Value,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Ask the model again with the history as it now stands.
    CallModel,
    /// Run these calls in order, then ask the model again.
    RunTools(Vec<ToolCall>),
    /// The turn is over.
    Finish { status: TurnStatus, error: Option<TurnError> },
}

/// The outcome of a decision: items to append to history, then what's next.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub append: Vec<Item>,
    pub next: Next,
}

/// Decides what follows a model response.
///
/// `steps_done` counts model round trips including the one that produced
/// `output`. Calls whose arguments are not valid JSON are never run: the model
/// gets an error output for them instead, in the same commit as its response.
pub fn after_model(output: Vec<Item>, steps_done: u32, limits: TurnLimits) -> Decision {
    let mut append = Vec::with_capacity(output.len());
    let mut calls = Vec::new();
    for item in output {
        if let Item::FunctionCall { call_id, name, arguments } = &item {
            match parse_arguments(arguments) {
                Ok(parsed) => calls.push(ToolCall {
                    call_id: call_id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                    parsed,
                }),
                Err(reason) => {
                    let output = tool_error(&format!(
                        "the call was not run: its arguments are not a JSON object ({reason}); send the call again with valid JSON arguments"
                    ));
                    append.push(item.clone());
                    append.push(Item::FunctionCallOutput { call_id: call_id.clone(), output, images: Vec::new() });
                    continue;
                }
            }
        }
        append.push(item);
    }
    let rejected_any = append.iter().any(|i| matches!(i, Item::FunctionCallOutput { .. }));
    let next = if !calls.is_empty() || rejected_any {
        if steps_done >= limits.max_steps {
            step_limit(limits)
        } else if calls.is_empty() {
            Next::CallModel
        } else {
            Next::RunTools(calls)
        }
    } else {
        Next::Finish { status: TurnStatus::Completed, error: None }
    };
    Decision { append, next }
}

/// The end of a turn that ran out of model round trips.
pub fn step_limit(limits: TurnLimits) -> Next {
    Next::Finish {
        status: TurnStatus::Failed,
        error: Some(TurnError {
            kind: "step_limit".into(),
            message: format!(
                "the turn used its {} model round trips and the model still wanted to call tools; raise max_steps in the bundle or split the task",
                limits.max_steps
            ),
        }),
    }
}

fn parse_arguments(arguments: &str) -> Result<serde_json::Value, String> {
    let text = if arguments.trim().is_empty() { "{}" } else { arguments };
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value @ serde_json::Value::Object(_)) => Ok(value),
        Ok(_) => Err("expected an object".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The output text of a tool call that failed, in one consistent shape.
pub fn tool_error(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str, args: &str) -> Item {
        Item::FunctionCall { call_id: id.into(), name: "write_file".into(), arguments: args.into() }
    }

    #[test]
    fn a_plain_answer_completes_the_turn() {
        let d = after_model(vec![Item::assistant_text("done")], 1, TurnLimits::default());
        assert_eq!(d.append.len(), 1);
        assert_eq!(d.next, Next::Finish { status: TurnStatus::Completed, error: None });
    }

    #[test]
    fn valid_calls_run_and_invalid_ones_get_an_error_output() {
        let d = after_model(vec![call("a", r#"{"path":"x"}"#), call("b", "{not json")], 1, TurnLimits::default());
        assert_eq!(d.append.len(), 3);
        assert!(matches!(&d.append[2], Item::FunctionCallOutput { call_id, output, .. }
            if call_id == "b" && output.contains("not run")));
        match d.next {
            Next::RunTools(calls) => {
                assert_eq!(calls.len(), 1);
                assert_eq!(calls[0].call_id, "a");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn only_invalid_calls_go_straight_back_to_the_model() {
        let d = after_model(vec![call("b", "[1]")], 1, TurnLimits::default());
        assert_eq!(d.next, Next::CallModel);
    }

    #[test]
    fn output_limit_continues_twice_then_truncates() {
        let limits = TurnLimits::default();
        let (first, continued) = after_output_limit(vec![Item::assistant_text("part 1")], 1, 0, limits);
        assert!(continued);
        assert_eq!(first.next, Next::CallModel);
        assert!(
            matches!(&first.append[1], Item::Message { runtime_notice: Some(n), role: keel_protocol::Role::Developer, .. } if n == OUTPUT_CONTINUATION)
        );
        let (second, continued) = after_output_limit(vec![Item::assistant_text("part 2")], 2, 1, limits);
        assert!(continued && second.next == Next::CallModel);
        let (third, continued) = after_output_limit(vec![Item::assistant_text("part 3")], 3, 2, limits);
        assert!(!continued);
        assert_eq!(third.append.len(), 1, "no notice once the turn ends");
        assert!(matches!(third.next, Next::Finish { status: TurnStatus::Truncated, .. }));
    }

    #[test]
    fn an_empty_cut_answer_is_truncated_at_once() {
        let (d, continued) = after_output_limit(Vec::new(), 1, 0, TurnLimits::default());
        assert!(!continued);
        assert!(matches!(d.next, Next::Finish { status: TurnStatus::Truncated, .. }));
    }

    #[test]
    fn a_cut_tool_call_is_answered_not_continued() {
        let (d, continued) = after_output_limit(vec![call("a", r#"{"path":"x","cont"#)], 1, 0, TurnLimits::default());
        assert!(!continued);
        assert_eq!(d.next, Next::CallModel);
        assert!(matches!(&d.append[1], Item::FunctionCallOutput { .. }));
    }

    #[test]
    fn the_step_limit_fails_the_turn() {
        let d = after_model(vec![call("a", "{}")], 3, TurnLimits { max_steps: 3, ..TurnLimits::default() });
        assert!(
            matches!(d.next, Next::Finish { status: TurnStatus::Failed, error: Some(ref e) } if e.kind == "step_limit")
        );
    }
}
