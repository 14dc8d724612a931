//! The `Date` response field (RFC 9110 §6.6.1), formatted at most once per second per core.
//!
//! On the per-request path: one read of the coarse clock and a copy of the whole field line,
//! whose length is fixed, per response.

use std::cell::Cell;

use crate::clock::civil_from_days;

/// Length of an IMF-fixdate such as `Sun, 06 Nov 1994 08:49:37 GMT`.
pub(crate) const IMF_FIXDATE_LEN: usize = 29;

/// Length of the field line `Date: <IMF-fixdate>` and its CRLF.
const DATE_LINE_LEN: usize = "Date: ".len() + IMF_FIXDATE_LEN + 2;

thread_local! {
    /// The second last formatted and its field line. Each core is one thread, so the cache
    /// needs no synchronisation.
    static CACHE: Cell<(u64, [u8; DATE_LINE_LEN])> =
        const { Cell::new((u64::MAX, [0; DATE_LINE_LEN])) };
}

/// The `Date` field line for now (`Date: Sun, 06 Nov 1994 08:49:37 GMT` and CRLF), from the
/// coarse wall clock (a field of whole seconds).
pub(crate) fn field_line() -> [u8; DATE_LINE_LEN] {
    let secs = crate::timer::wall_secs();
    CACHE.with(|cache| {
        let (cached_secs, line) = cache.get();
        if cached_secs == secs {
            return line;
        }
        let line = date_line(secs);
        cache.set((secs, line));
        line
    })
}

/// The field line of the date `secs` seconds after the Unix epoch.
fn date_line(secs: u64) -> [u8; DATE_LINE_LEN] {
    let mut line = [0u8; DATE_LINE_LEN];
    let mut w = Writer {
        out: &mut line,
        at: 0,
    };
    w.bytes(b"Date: ");
    w.bytes(&format_imf_fixdate(secs));
    w.bytes(b"\r\n");
    line
}

/// Formats seconds since the Unix epoch as `Sun, 06 Nov 1994 08:49:37 GMT` (RFC 9110 §5.6.7).
pub(crate) fn format_imf_fixdate(secs: u64) -> [u8; IMF_FIXDATE_LEN] {
    const DAYS: [&[u8; 3]; 7] = [b"Thu", b"Fri", b"Sat", b"Sun", b"Mon", b"Tue", b"Wed"];
    const MONTHS: [&[u8; 3]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let mut out = [0u8; IMF_FIXDATE_LEN];
    let weekday = DAYS.get((days % 7) as usize).copied().unwrap_or(b"Thu");
    let month_name = MONTHS
        .get((month as usize).saturating_sub(1))
        .copied()
        .unwrap_or(b"Jan");
    let mut w = Writer {
        out: &mut out,
        at: 0,
    };
    w.bytes(weekday);
    w.bytes(b", ");
    w.two(u64::from(day));
    w.bytes(b" ");
    w.bytes(month_name);
    w.bytes(b" ");
    // Years past 9999 are not representable in the format; they do not occur before then.
    w.two(year / 100 % 100);
    w.two(year % 100);
    w.bytes(b" ");
    w.two(rem / 3600);
    w.bytes(b":");
    w.two(rem / 60 % 60);
    w.bytes(b":");
    w.two(rem % 60);
    w.bytes(b" GMT");
    out
}

struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, s: &[u8]) {
        for &b in s {
            if let Some(slot) = self.out.get_mut(self.at) {
                *slot = b;
            }
            self.at = self.at.saturating_add(1);
        }
    }

    fn two(&mut self, n: u64) {
        self.bytes(&[b'0' + (n / 10 % 10) as u8, b'0' + (n % 10) as u8]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_dates() {
        let table: &[(u64, &str)] = &[
            (0, "Thu, 01 Jan 1970 00:00:00 GMT"),
            (784_111_777, "Sun, 06 Nov 1994 08:49:37 GMT"),
            (951_782_400, "Tue, 29 Feb 2000 00:00:00 GMT"),
            (1_709_164_799, "Wed, 28 Feb 2024 23:59:59 GMT"),
            (1_709_251_199, "Thu, 29 Feb 2024 23:59:59 GMT"),
            (4_102_444_800, "Fri, 01 Jan 2100 00:00:00 GMT"),
            (253_402_300_799, "Fri, 31 Dec 9999 23:59:59 GMT"),
        ];
        for (secs, want) in table {
            assert_eq!(
                std::str::from_utf8(&format_imf_fixdate(*secs)).unwrap(),
                *want,
                "{secs}"
            );
        }
    }

    #[test]
    fn the_field_line_is_well_formed() {
        let line = field_line();
        let text = std::str::from_utf8(&line).unwrap();
        let date = text
            .strip_prefix("Date: ")
            .unwrap()
            .strip_suffix("\r\n")
            .unwrap();
        assert!(date.ends_with(" GMT"), "{text:?}");
        assert!(
            date.bytes().all(|b| b.is_ascii_graphic() || b == b' '),
            "{text:?}"
        );
        assert_eq!(
            date_line(784_111_777),
            *b"Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
        );
    }
}
