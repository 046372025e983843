//! Fault injection for crash tests.
//!
//! `KEEL_CRASH_AFTER=<point>` makes keel abort (as a SIGKILL would: no
//! shutdown code runs) right after that point: a journal event kind, after
//! the commit that holds it (`tool_call_intended`, `tool_call_started`,
//! `tool_call_finished`, ...), or `tool_returned`, after a tool's effect and
//! before its result is journaled. Tests use it to stop keel at every step
//! of a tool call; it is read once and costs a comparison otherwise.

use std::sync::OnceLock;

fn point() -> Option<&'static str> {
    static POINT: OnceLock<Option<String>> = OnceLock::new();
    POINT.get_or_init(|| std::env::var("KEEL_CRASH_AFTER").ok().filter(|p| !p.is_empty())).as_deref()
}

/// Aborts the process if `reached` is the configured crash point.
pub(crate) fn crash_if(reached: &str) {
    if point() == Some(reached) {
        eprintln!("keel: crash point {reached} reached (KEEL_CRASH_AFTER); aborting");
        std::process::abort();
    }
}
