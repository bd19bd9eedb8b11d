//! RFC 3339 timestamps in UTC (`2026-11-22T10:00:00Z`), as a statement's `signedAt` holds them,
//! to and from milliseconds since the Unix epoch. Civil dates from day counts by Howard
//! Hinnant's algorithms (proleptic Gregorian calendar), so no date crate is needed.

/// Days since 1970-01-01 of a civil date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (whole seconds, rounded down).
pub fn format_utc(ms: u64) -> String {
    let secs = (ms / 1000) as i64;
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", s / 3600, s / 60 % 60, s % 60)
}

/// Milliseconds since the epoch of an RFC 3339 UTC time: `YYYY-MM-DDTHH:MM:SS`, an optional
/// fraction of a second (digits after the third ignored) and `Z`, or a date alone
/// (`YYYY-MM-DD`, midnight UTC). Times before 1970 are refused.
///
/// # Errors
/// What is wrong, for a message.
pub fn parse_utc(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a UTC time like 2026-11-22T10:00:00Z or a date like 2026-11-22");
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Result<u32, String> {
        let t = b.get(r).ok_or_else(bad)?;
        if t.is_empty() || !t.iter().all(u8::is_ascii_digit) {
            return Err(bad());
        }
        std::str::from_utf8(t).map_err(|_| bad())?.parse().map_err(|_| bad())
    };
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return Err(bad());
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (mut h, mut mi, mut se, mut ms) = (0, 0, 0, 0u64);
    if b.len() > 10 {
        if b.len() < 20 || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
            return Err(bad());
        }
        (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
        let mut rest = &b[19..];
        if let Some(frac) = rest.strip_prefix(b".") {
            let n = frac.iter().take_while(|c| c.is_ascii_digit()).count();
            if n == 0 {
                return Err(bad());
            }
            for (i, c) in frac[..n].iter().take(3).enumerate() {
                ms += u64::from(c - b'0') * [100, 10, 1][i];
            }
            rest = &frac[n..];
        }
        if !matches!(rest, b"Z" | b"z") {
            return Err(bad());
        }
    }
    let days_in = [
        31,
        if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&mo) || d == 0 || d > days_in[mo as usize - 1] || h > 23 || mi > 59 || se > 60 {
        return Err(bad());
    }
    let days = days_from_civil(i64::from(y), mo, d);
    let secs = days * 86_400 + i64::from(h * 3600 + mi * 60 + se);
    u64::try_from(secs).map(|s| s * 1000 + ms).map_err(|_| format!("{s:?} is before 1970"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_known_values() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(parse_utc("2000-02-29T12:34:56Z"), Ok(951_827_696_000));
        assert_eq!(format_utc(951_827_696_999), "2000-02-29T12:34:56Z");
        assert_eq!(parse_utc("2026-11-22"), parse_utc("2026-11-22T00:00:00Z"));
        assert_eq!(parse_utc("2026-11-22T00:00:00.250Z"), Ok(parse_utc("2026-11-22").unwrap() + 250));
        for ms in [0u64, 86_399_000, 1_700_000_000_000, 4_102_444_800_000] {
            assert_eq!(parse_utc(&format_utc(ms)), Ok(ms));
        }
        for bad in ["", "2026-13-01", "2026-02-30", "2026-11-22T10:00:00", "2026-11-22T10:00:00+01:00", "1969-12-31"] {
            assert!(parse_utc(bad).is_err(), "{bad}");
        }
    }
}
