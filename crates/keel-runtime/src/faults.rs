//! Fault injection for crash tests.
//!
//! `KEEL_CRASH_AFTER=<point>` makes keel abort (as a SIGKILL would: no
//! shutdown code runs) right after that point: a journal event kind, after
//! the commit that holds it (`tool_call_intended`, `tool_call_started`,
//! `tool_call_finished`, ...), or `tool_returned`, after a tool's effect and
//! before its result is journaled. `<point>@<n>` aborts the n-th time the
//! point is reached in this process (so a test can let an earlier turn pass
//! and crash a later one). Tests use it to stop keel at every step of a tool
//! call; it is read once and costs a comparison otherwise.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The configured point and on which of its occurrences to abort.
fn point() -> Option<&'static (String, u64)> {
    static POINT: OnceLock<Option<(String, u64)>> = OnceLock::new();
    POINT
        .get_or_init(|| {
            let value = std::env::var("KEEL_CRASH_AFTER").ok().filter(|p| !p.is_empty())?;
            Some(match value.split_once('@') {
                Some((name, n)) => (name.to_string(), n.parse().unwrap_or(1)),
                None => (value, 1),
            })
        })
        .as_ref()
}

/// Aborts the process if `reached` is the configured crash point (on its
/// configured occurrence).
pub(crate) fn crash_if(reached: &str) {
    static SEEN: AtomicU64 = AtomicU64::new(0);
    let Some((name, nth)) = point() else { return };
    if name == reached && SEEN.fetch_add(1, Ordering::SeqCst) + 1 == *nth {
        eprintln!("keel: crash point {reached} reached (KEEL_CRASH_AFTER); aborting");
        std::process::abort();
    }
}

/// `KEEL_HOLD_AT=<event kind>:<ms>` pauses the task whose commit holds that
/// event for that long, after the commit and the in-memory state are
/// updated and before what follows the commit (a turn's driver releasing
/// the session, the events being published), so a test can act inside a
/// window that is otherwise too short to hit: `turn_finished` holds a turn
/// that has ended durably but whose driver still holds the session.
pub(crate) async fn hold_if(reached: &str) {
    static HOLD: OnceLock<Option<(String, u64)>> = OnceLock::new();
    let hold = HOLD.get_or_init(|| {
        let value = std::env::var("KEEL_HOLD_AT").ok()?;
        let (name, ms) = value.split_once(':')?;
        Some((name.to_string(), ms.parse().ok()?))
    });
    if let Some((name, ms)) = hold
        && name == reached
    {
        eprintln!("keel: holding at {reached} for {ms} ms (KEEL_HOLD_AT)");
        tokio::time::sleep(std::time::Duration::from_millis(*ms)).await;
    }
}
