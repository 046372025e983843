//! When to try a model request again, and per-provider circuit breakers.
//!
//! Rate-limited, transient and transport failures are retried, at most
//! [`RetryPolicy::max_attempts`] tries per model in all, with exponential
//! backoff and full jitter; a server's `Retry-After` replaces the computed
//! delay but is capped, so a provider cannot park a turn for an hour. Safety
//! blocks, auth failures, bad requests and context overflows are never
//! retried. The wait is a `select!` against the turn's cancellation token, so
//! `turn/interrupt` ends it at once without another request.
//!
//! A [`Breakers`] entry opens after [`BREAKER_THRESHOLD`] consecutive
//! retryable failures of one provider and stays open for
//! [`BREAKER_COOLDOWN`]; while open, keel sends that provider nothing and
//! moves to a coworker's fallback model instead. After the cooldown one
//! request is let through; a success closes the breaker.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Consecutive retryable failures that open a provider's breaker.
pub const BREAKER_THRESHOLD: u32 = 5;
/// How long an open breaker keeps a provider out.
pub const BREAKER_COOLDOWN: Duration = Duration::from_secs(30);

/// How model requests are retried.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Tries per model for one round trip, the first included.
    pub max_attempts: u32,
    /// The first backoff; each retry doubles it.
    pub base_delay: Duration,
    /// The largest computed backoff.
    pub max_delay: Duration,
    /// The largest `Retry-After` honoured.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `failed_tries` (1 after the first failure).
    pub fn delay(&self, failed_tries: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(after) = retry_after {
            return after.min(self.max_retry_after);
        }
        let exponent = failed_tries.saturating_sub(1).min(16);
        let ceiling = self.base_delay.saturating_mul(1 << exponent).min(self.max_delay);
        // Full jitter keeps many sessions from retrying in lockstep.
        let mut byte = [0u8; 2];
        let fraction = if getrandom::fill(&mut byte).is_ok() { u16::from_le_bytes(byte) as f64 / 65535.0 } else { 1.0 };
        ceiling.mul_f64(0.5 + fraction / 2.0)
    }
}

#[derive(Debug, Default)]
struct Breaker {
    consecutive_failures: u32,
    open_until: Option<Instant>,
}

/// Circuit breakers by provider name.
#[derive(Debug, Default)]
pub struct Breakers {
    by_provider: Mutex<HashMap<String, Breaker>>,
}

impl Breakers {
    /// How much longer the provider is kept out, if its breaker is open.
    pub fn open_for(&self, provider: &str) -> Option<Duration> {
        let map = self.by_provider.lock().ok()?;
        let until = map.get(provider)?.open_until?;
        until.checked_duration_since(Instant::now())
    }

    pub fn success(&self, provider: &str) {
        if let Ok(mut map) = self.by_provider.lock() {
            map.remove(provider);
        }
    }

    /// Counts a retryable failure; returns true if this opened the breaker.
    pub fn failure(&self, provider: &str) -> bool {
        let Ok(mut map) = self.by_provider.lock() else { return false };
        let breaker = map.entry(provider.to_string()).or_default();
        breaker.consecutive_failures += 1;
        if breaker.consecutive_failures >= BREAKER_THRESHOLD {
            breaker.open_until = Some(Instant::now() + BREAKER_COOLDOWN);
            breaker.consecutive_failures = BREAKER_THRESHOLD - 1;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_honours_retry_after() {
        let policy = RetryPolicy::default();
        let first = policy.delay(1, None);
        assert!(first >= Duration::from_millis(250) && first <= Duration::from_millis(500));
        let later = policy.delay(10, None);
        assert!(later <= policy.max_delay && later >= policy.max_delay / 2);
        assert_eq!(policy.delay(1, Some(Duration::from_secs(2))), Duration::from_secs(2));
        assert_eq!(policy.delay(1, Some(Duration::from_secs(3600))), policy.max_retry_after);
    }

    #[test]
    fn a_breaker_opens_after_repeated_failures_and_closes_on_success() {
        let breakers = Breakers::default();
        for _ in 1..BREAKER_THRESHOLD {
            assert!(!breakers.failure("p"));
        }
        assert!(breakers.open_for("p").is_none());
        assert!(breakers.failure("p"));
        assert!(breakers.open_for("p").is_some());
        breakers.success("p");
        assert!(breakers.open_for("p").is_none());
    }
}
