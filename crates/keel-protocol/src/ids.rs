//! Identifier generation.
//!
//! Ids are a short type prefix, then 26 Crockford base32 characters: 48 bits
//! of milliseconds since the epoch and 80 random bits (the ULID layout). They
//! sort by creation time, which keeps listings stable and index pages warm.

use std::time::{SystemTime, UNIX_EPOCH};

const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// A new id such as `ses_01jd...`, unique with overwhelming probability.
pub fn new_id(prefix: &str) -> String {
    let mut random = [0u8; 10];
    // getrandom only fails when the OS has no entropy source at all; fall back
    // to the clock and a counter so an id is still unique within the process.
    if getrandom::fill(&mut random).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes();
        random[..8].copy_from_slice(&n);
    }
    let ms = now_ms() as u128 & ((1 << 48) - 1);
    let mut value = ms << 80;
    for (i, byte) in random.iter().enumerate() {
        value |= (*byte as u128) << (8 * (9 - i));
    }
    let mut out = String::with_capacity(prefix.len() + 27);
    out.push_str(prefix);
    out.push('_');
    for i in (0..26).rev() {
        let index = ((value >> (5 * i)) & 31) as usize;
        out.push(ALPHABET[index] as char);
    }
    out
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_unique_and_time_ordered() {
        let a = new_id("ses");
        let b = new_id("ses");
        assert!(a.starts_with("ses_"));
        assert_eq!(a.len(), 4 + 26);
        assert_ne!(a, b);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let c = new_id("ses");
        assert!(c > a);
    }
}
