//! The clocks the io crate reads: a process-wide monotonic millisecond counter (for sticky pin
//! expiry, comparable across cores) and wall-clock RFC 3339 timestamps (for records).

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds from the process's first use of this clock to `at` (an instant the caller
/// already read, so the clock is not read twice); monotonic and shared by every core.
pub fn monotonic_ms_at(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch()).as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Now as an RFC 3339 UTC timestamp with milliseconds, e.g. `2026-11-22T04:27:50.123Z`.
pub fn now_rfc3339() -> String {
    rfc3339(unix_ms())
}

/// Formats Unix milliseconds as an RFC 3339 UTC timestamp.
pub fn rfc3339(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let ms = unix_ms % 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month 1..=12, day 1..=31) in the proleptic Gregorian
/// calendar, after H. Hinnant's `civil_from_days`; also used by the HTTP `Date` formatter.
pub(crate) fn civil_from_days(days: u64) -> (u64, u32, u32) {
    // Shift the epoch to 0000-03-01 so that leap days fall at the end of a year.
    let z = days.saturating_add(719_468);
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + u64::from(m <= 2), m, d)
}

/// Completes when no byte moved in either direction for `limit`, checked every quarter of it:
/// one timer per tunnel instead of one per read.
pub(crate) async fn idle_watch(
    up: &std::cell::Cell<u64>,
    down: &std::cell::Cell<u64>,
    limit: std::time::Duration,
) {
    let step = limit / 4;
    let mut seen = (up.get(), down.get());
    let mut quiet = std::time::Duration::ZERO;
    loop {
        monoio::time::sleep(step).await;
        let now = (up.get(), down.get());
        if now == seen {
            quiet += step;
            if quiet >= limit {
                return;
            }
        } else {
            seen = now;
            quiet = std::time::Duration::ZERO;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_795_321_670_123), "2026-11-22T04:27:50.123Z");
        let earlier = Instant::now();
        assert!(monotonic_ms_at(earlier) <= monotonic_ms_at(Instant::now()));
    }
}
