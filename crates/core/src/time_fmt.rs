//! Wall-clock formatting without a time-zone database: reports state times in UTC.

/// `YYYY-mm-dd HH:MM:SS.mmm UTC` for nanoseconds since the Unix epoch.
pub fn utc_timestamp(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let millis = (ns / 1_000_000) % 1000;
    let (y, m, d, hh, mm, ss) = civil(secs);
    format!("{y:04}-{m:02}-{d:02} {hh:02}:{mm:02}:{ss:02}.{millis:03} UTC")
}

/// `YYYYmmddHHMMSS` (UTC), the timestamp used in output names.
pub fn compact_timestamp(secs: u64) -> String {
    let (y, m, d, hh, mm, ss) = civil(secs);
    format!("{y:04}{m:02}{d:02}{hh:02}{mm:02}{ss:02}")
}

fn civil(secs: u64) -> (i64, u32, u32, u64, u64, u64) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's days-from-civil inverse.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d, rem / 3600, (rem / 60) % 60, rem % 60)
}

/// Bytes with a binary unit, for humans; exact byte counts are printed beside it.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(utc_timestamp(0), "1970-01-01 00:00:00.000 UTC");
        // 2026-11-29 09:44:28.250 UTC
        assert_eq!(
            utc_timestamp(1_795_945_468_250_000_000),
            "2026-11-29 09:44:28.250 UTC"
        );
        assert_eq!(compact_timestamp(951_782_400), "20000229000000");
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
