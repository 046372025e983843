//! Counters the runtime keeps about itself, read by `keel-bench`.
//!
//! Plain atomics on the hot path; the per-turn timing samples are kept only
//! when a benchmark asks for them.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use keel_protocol::TurnStatus;

/// One finished turn's timing.
#[derive(Debug, Clone, Copy)]
pub struct TurnTiming {
    /// From the driver's start to its last commit.
    pub wall: Duration,
    /// Time spent inside provider requests (connect, send, stream).
    pub provider: Duration,
}

#[derive(Default)]
pub struct Metrics {
    turns_completed: AtomicU64,
    turns_other: AtomicU64,
    sample: AtomicBool,
    timings: Mutex<Vec<TurnTiming>>,
}

impl Metrics {
    pub(crate) fn turn_finished(&self, status: TurnStatus) {
        if status == TurnStatus::Completed {
            self.turns_completed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.turns_other.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn record_turn(&self, wall: Duration, provider: Duration) {
        if self.sample.load(Ordering::Relaxed)
            && let Ok(mut timings) = self.timings.lock()
        {
            timings.push(TurnTiming { wall, provider });
        }
    }

    /// Starts keeping per-turn timings.
    pub fn sample_timings(&self, on: bool) {
        self.sample.store(on, Ordering::Relaxed);
    }

    /// Takes the timings kept so far.
    pub fn take_timings(&self) -> Vec<TurnTiming> {
        self.timings.lock().map(|mut t| std::mem::take(&mut *t)).unwrap_or_default()
    }

    pub fn turns_completed(&self) -> u64 {
        self.turns_completed.load(Ordering::Relaxed)
    }

    pub fn turns_not_completed(&self) -> u64 {
        self.turns_other.load(Ordering::Relaxed)
    }
}
