//! The turn state machine: pure decisions, no I/O.
//!
//! The driver in `keel-runtime` feeds this crate what happened (the model
//! answered, a tool finished, the process restarted) together with the turn's
//! journaled state, and gets back what to record and what to do next. Nothing
//! here touches a clock, a file or a socket, so every decision can be tested
//! and replayed from the journal alone.
//!
//! [`policy`] decides, the same pure way, whether a tool call runs, waits
//! for a person, or is refused.

pub mod call_ids;
pub mod compaction;
pub mod policy;
pub mod recovery;
pub mod redact;
pub mod turn;

pub use policy::{Effect, PolicySpec, RuleSpec, Verdict};
pub use recovery::{CallRecord, ResumePlan, plan_resume};
pub use turn::{Decision, Next, OUTPUT_CONTINUATION, ToolCall, TurnLimits, after_model, after_output_limit};
