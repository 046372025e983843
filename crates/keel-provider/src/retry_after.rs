//! Parsing of the server's retry hints: `retry-after-ms` (milliseconds, sent
//! by OpenAI and Azure) and `Retry-After` (RFC 9110: delay-seconds or an
//! HTTP-date).
//!
//! Pure functions over header values and a "now", so the date arithmetic is
//! tested without a clock. A date in the past means "retry now" (zero).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The delay the server asked for, preferring the more precise
/// `retry-after-ms` over `Retry-After`. Unparseable values are ignored.
pub fn retry_delay(retry_after_ms: Option<&str>, retry_after: Option<&str>, now: SystemTime) -> Option<Duration> {
    retry_after_ms
        .and_then(|ms| parse_non_negative(ms).map(|ms| Duration::from_secs_f64(ms / 1000.0)))
        .or_else(|| retry_after.and_then(|value| parse_retry_after(value, now)))
}

/// Parses one `Retry-After` value: whole (or, leniently, fractional)
/// seconds, or an HTTP-date in any of the three formats RFC 9110 accepts.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    if let Some(seconds) = parse_non_negative(value) {
        return Some(Duration::from_secs_f64(seconds));
    }
    let at = parse_http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

fn parse_non_negative(value: &str) -> Option<f64> {
    let value = value.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    // Cap at a year: a larger hint is nonsense and would overflow `Duration`.
    value.parse::<f64>().ok().filter(|v| v.is_finite()).map(|v| v.min(365.0 * 86_400.0))
}

/// Parses `Sun, 06 Nov 1994 08:49:37 GMT` (IMF-fixdate), `Sunday, 06-Nov-94
/// 08:49:37 GMT` (RFC 850) and `Sun Nov  6 08:49:37 1994` (asctime).
pub fn parse_http_date(value: &str) -> Option<SystemTime> {
    const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
    let mut month = None;
    let mut numbers = Vec::new();
    let mut time = None;
    for token in value.split([' ', ',', '-']).filter(|t| !t.is_empty()) {
        if token.contains(':') {
            let mut parts = token.split(':').map(|p| p.parse::<u64>().ok());
            let (h, m, s) = (parts.next()??, parts.next()??, parts.next()??);
            if parts.next().is_some() || h > 23 || m > 59 || s > 60 {
                return None;
            }
            time = Some(h * 3600 + m * 60 + s);
        } else if token.bytes().all(|b| b.is_ascii_digit()) {
            numbers.push((token.parse::<i64>().ok()?, token.len()));
        } else if let Some(index) = MONTHS.iter().position(|m| token.len() == 3 && token.eq_ignore_ascii_case(m)) {
            month = Some(index as i64 + 1);
        }
        // Weekday names and "GMT" carry no information.
    }
    let (&[(day, _), (year, year_digits)], Some(month), Some(time)) = (numbers.as_slice(), month, time) else {
        return None;
    };
    // RFC 850's two-digit years: RFC 9110 reads far-future years as past.
    let year = match year_digits {
        2 if year < 70 => 2000 + year,
        2 => 1900 + year,
        _ => year,
    };
    if !(1..=31).contains(&day) || year < 1970 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let seconds = u64::try_from(days).ok()? * 86_400 + time;
    Some(UNIX_EPOCH + Duration::from_secs(seconds))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1994-11-06T08:49:37Z, the RFC's example date.
    const EXAMPLE: u64 = 784_111_777;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn all_three_http_date_formats_parse() {
        for text in ["Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"] {
            assert_eq!(parse_http_date(text), Some(at(EXAMPLE)), "{text}");
        }
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(UNIX_EPOCH));
        assert_eq!(parse_http_date("Tue, 29 Feb 2028 12:00:00 GMT"), Some(at(1_835_438_400)));
    }

    #[test]
    fn garbage_dates_are_rejected() {
        for text in ["", "soon", "Sun, 06 Nov 1994 GMT", "Sun, 06 Foo 1994 08:49:37 GMT", "06 Nov 1994 25:00:00"] {
            assert_eq!(parse_http_date(text), None, "{text}");
        }
    }

    #[test]
    fn retry_after_accepts_seconds_and_dates() {
        let now = at(EXAMPLE);
        assert_eq!(parse_retry_after("2", now), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after(" 0.5 ", now), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("-3", now), None);
    }

    #[test]
    fn retry_after_ms_wins_over_retry_after() {
        let now = at(EXAMPLE);
        assert_eq!(retry_delay(Some("250"), Some("3"), now), Some(Duration::from_millis(250)));
        assert_eq!(retry_delay(Some("junk"), Some("3"), now), Some(Duration::from_secs(3)));
        assert_eq!(retry_delay(None, None, now), None);
    }
}
