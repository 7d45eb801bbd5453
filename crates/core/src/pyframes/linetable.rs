//! The line number of an instruction, from a code object's line table, with the answers of
//! CPython's `PyCode_Addr2Line` for 3.9 to 3.13.
//!
//! The table bytes may be garbage read from a live process (a torn read, a stale pointer), so
//! every decoder bounds each read by the slice, consumes at least one byte per step and treats
//! anything a compiler cannot emit as "no answer" rather than guessing. Nothing here allocates:
//! it runs inside the allocation hook.
//!
//! The three formats, as CPython's `Objects/lnotab_notes.txt` and `InternalDocs/locations.md`
//! describe them:
//! - 3.9 `co_lnotab`: pairs (address delta: unsigned byte, line delta: signed byte); an
//!   instruction takes the line accumulated over every pair whose address it has reached.
//! - 3.10 `co_linetable`: pairs (range length in bytes: unsigned, line delta: signed, -128 for
//!   "no line"), each pair one address range; zero-length pairs only carry line deltas.
//! - 3.11+ location table: entries led by a byte with bit 7 set, holding a 4-bit kind and the
//!   range length in code units less one; the kind says how the line delta is encoded, and
//!   column data follows that the line never needs.

/// Which line-table format a code object carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineTableFormat {
    /// 3.9 `co_lnotab`.
    Lnotab39,
    /// 3.10 `co_linetable` (PEP 626).
    Linetable310,
    /// 3.11 to 3.13 `co_linetable`: the location table (PEP 657).
    Locations311,
}

impl LineTableFormat {
    /// The format of CPython `major.minor`, for the versions we read frames of.
    pub fn for_version(major: u8, minor: u8) -> Option<LineTableFormat> {
        match (major, minor) {
            (3, 9) => Some(LineTableFormat::Lnotab39),
            (3, 10) => Some(LineTableFormat::Linetable310),
            (3, 11..=13) => Some(LineTableFormat::Locations311),
            _ => None,
        }
    }
}

/// The line of the instruction at `byte_offset`, as PyCode_Addr2Line; None where the table says
/// the instruction has no line, or the table is malformed/truncated (never panic, never read
/// out of bounds, never loop forever: the input may be garbage read from memory).
///
/// A negative offset (a 3.9 frame that has not started, `f_lasti == -1`) gives `first_line`,
/// as CPython does for every version. A negative result is reported as None: CPython's own
/// `co_lines` shows such a line as no line, and -1 is its "no line" value.
pub fn line_at(
    format: LineTableFormat,
    table: &[u8],
    first_line: i32,
    byte_offset: i32,
) -> Option<i32> {
    let line = if byte_offset < 0 {
        first_line
    } else {
        let offset = i64::from(byte_offset);
        match format {
            LineTableFormat::Lnotab39 => lnotab_line(table, first_line, offset)?,
            LineTableFormat::Linetable310 => linetable310_line(table, first_line, offset)?,
            LineTableFormat::Locations311 => locations_line(table, first_line, offset)?,
        }
    };
    (line >= 0).then_some(line)
}

/// 3.9. Past the last pair the last line holds, so an offset beyond the code still answers, as
/// in CPython. An odd length cannot come from the compiler; CPython would drop the stray byte,
/// but here it means the length we read is wrong.
fn lnotab_line(table: &[u8], first_line: i32, offset: i64) -> Option<i32> {
    if !table.len().is_multiple_of(2) {
        return None;
    }
    let mut line = first_line;
    // Address deltas are at most 255, so this stays within a few hundred of `offset`.
    let mut addr: i64 = 0;
    for pair in table.chunks_exact(2) {
        addr += i64::from(pair[0]);
        if addr > offset {
            break;
        }
        line = line.checked_add(i32::from(pair[1] as i8))?;
    }
    Some(line)
}

/// 3.10. Walks ranges from the start until one ends past `offset`. A zero-length pair only
/// moves the running line: ends never shrink, so it cannot be the first to pass `offset`, and
/// the range after it gets its delta. Running out of pairs (the offset lies past the code, or
/// the table is cut short) is no line.
fn linetable310_line(table: &[u8], first_line: i32, offset: i64) -> Option<i32> {
    const NO_LINE: i8 = -128;
    let mut running_line = first_line;
    let mut end: i64 = 0;
    let mut pairs = table.chunks(2);
    loop {
        let pair = pairs.next()?;
        let &[length, delta] = pair else {
            return None;
        };
        end += i64::from(length);
        let delta = delta as i8;
        let line = if delta == NO_LINE {
            None
        } else {
            running_line = running_line.checked_add(i32::from(delta))?;
            Some(running_line)
        };
        if end > offset {
            return line;
        }
    }
}

/// 3.11+ entry kinds (the bits 3..=6 of an entry's first byte) that bear on the line.
const KIND_ONE_LINE0: u8 = 10;
const KIND_ONE_LINE2: u8 = 12;
const KIND_NO_COLUMNS: u8 = 13;
const KIND_LONG: u8 = 14;
const KIND_NONE: u8 = 15;

/// Only an entry's first byte has bit 7 set; varint and column bytes never do.
const ENTRY_START: u8 = 0x80;

/// 3.11 to 3.13. As in CPython, an entry's column bytes are skipped by scanning for the next
/// entry's first byte, so they need no decoding; the line delta, where it is a varint, must lie
/// wholly inside this entry.
fn locations_line(table: &[u8], first_line: i32, offset: i64) -> Option<i32> {
    // CPython never checks the first byte, trusting the compiler; garbage fails here.
    if table.first().is_some_and(|b| b & ENTRY_START == 0) {
        return None;
    }
    let mut running_line = first_line;
    let mut end: i64 = 0;
    let mut pos = 0usize;
    while let Some(&head) = table.get(pos) {
        let kind = (head >> 3) & 0x0f;
        let delta = match kind {
            KIND_NO_COLUMNS | KIND_LONG => read_signed_varint(table.get(pos + 1..)?)?,
            KIND_ONE_LINE0..=KIND_ONE_LINE2 => i32::from(kind - KIND_ONE_LINE0),
            // Short forms stay on the line; a "none" entry leaves the running line alone.
            _ => 0,
        };
        running_line = running_line.checked_add(delta)?;
        // Lengths count 2-byte code units, 1 to 8 of them.
        end += (i64::from(head & 0x07) + 1) * 2;
        pos += 1;
        while table.get(pos).is_some_and(|b| b & ENTRY_START == 0) {
            pos += 1;
        }
        if end > offset {
            return (kind != KIND_NONE).then_some(running_line);
        }
    }
    None
}

/// A 3.11+ unsigned varint: 6 bits a byte, least significant first, bit 6 saying another byte
/// follows. A byte with bit 7 set belongs to the next entry, so meeting one is a cut-short
/// varint; so is one longer than a 32-bit value could need.
fn read_varint(bytes: &[u8]) -> Option<u32> {
    let mut value = 0u32;
    let mut shift = 0u32;
    for &b in bytes {
        if b & ENTRY_START != 0 {
            return None;
        }
        // At shift 30 the top bits fall off, as in CPython's unsigned arithmetic.
        value |= u32::from(b & 0x3f) << shift;
        if b & 0x40 == 0 {
            return Some(value);
        }
        shift += 6;
        if shift > 30 {
            return None;
        }
    }
    None
}

/// The sign sits in the lowest bit, the magnitude above it.
fn read_signed_varint(bytes: &[u8]) -> Option<i32> {
    let raw = read_varint(bytes)?;
    // `raw >> 1` is below 2^31, so the conversion cannot fail.
    let magnitude = i32::try_from(raw >> 1).ok()?;
    Some(if raw & 1 != 0 { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    const PROBE: &str = include_str!("linetable_probe.py");

    fn hex_decode(s: &str) -> Vec<u8> {
        if s == "-" {
            return Vec::new();
        }
        assert!(s.len().is_multiple_of(2), "odd hex {s}");
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// One CPython of each minor version 3.9..=3.13 found here: pyenv's, the system's
    /// (`/usr/local/bin`, `/usr/bin`), then uv's (`~/.local/share/uv/python`), the first found
    /// of each version.
    fn cpython_interpreters() -> Vec<(u8, PathBuf)> {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let pyenv = std::env::var_os("PYENV_ROOT")
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".pyenv")))
            .unwrap_or_else(|| PathBuf::from("/root/.pyenv"));
        let mut found: Vec<(u8, PathBuf)> = Vec::new();
        let mut add = |minor: u8, exe: PathBuf| {
            if (9..=13).contains(&minor) && exe.is_file() && !found.iter().any(|f| f.0 == minor) {
                found.push((minor, exe));
            }
        };
        // pyenv's `versions/3.M.P`, and uv's `cpython-3.M.P-linux-x86_64-gnu`.
        let versioned = |dir: &Path, prefix: &str| -> Vec<(u8, PathBuf)> {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return Vec::new();
            };
            let mut out = Vec::new();
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(version) = name.strip_prefix(prefix) else {
                    continue;
                };
                let version = version.split('-').next().unwrap_or("");
                let mut parts = version.split('.');
                let (Some("3"), Some(minor), Some(_patch), None) =
                    (parts.next(), parts.next(), parts.next(), parts.next())
                else {
                    continue;
                };
                let Ok(minor) = minor.parse::<u8>() else {
                    continue;
                };
                out.push((
                    minor,
                    entry.path().join("bin").join(format!("python3.{minor}")),
                ));
            }
            out.sort();
            out
        };
        for (minor, exe) in versioned(&pyenv.join("versions"), "") {
            add(minor, exe);
        }
        for dir in ["/usr/local/bin", "/usr/bin"] {
            for minor in 9..=13u8 {
                add(minor, Path::new(dir).join(format!("python3.{minor}")));
            }
        }
        if let Some(home) = &home {
            let uv = home.join(".local/share/uv/python");
            for (minor, exe) in versioned(&uv, "cpython-") {
                add(minor, exe);
            }
        }
        found.sort();
        found
    }

    struct Checked {
        codes: usize,
        offsets: usize,
        no_line: usize,
    }

    fn check_interpreter(minor: u8, exe: &Path) -> Checked {
        let out = Command::new(exe)
            .args(["-I", "-c", PROBE])
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
        assert!(
            out.status.success(),
            "{} failed: {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("utf-8 probe output");
        let mut lines = text.lines();
        let version = lines.next().expect("version record");
        assert_eq!(version, format!("V 3 {minor}"), "{}", exe.display());
        let format = LineTableFormat::for_version(3, minor).expect("supported version");

        let mut checked = Checked {
            codes: 0,
            offsets: 0,
            no_line: 0,
        };
        while let Some(code) = lines.next() {
            let fields: Vec<&str> = code.split(' ').collect();
            assert!(fields.len() == 4 && fields[0] == "C", "bad record {code:?}");
            let name = fields[1];
            let first_line: i32 = fields[2].parse().expect("co_firstlineno");
            let table = hex_decode(fields[3]);
            let expected = lines.next().expect("L record");
            let expected = expected.strip_prefix('L').expect("L record").trim();
            for (i, want) in expected.split_whitespace().enumerate() {
                let want = (want != "-").then(|| want.parse::<i32>().expect("line"));
                let offset = i32::try_from(i * 2).expect("offset");
                let got = line_at(format, &table, first_line, offset);
                assert_eq!(
                    got, want,
                    "3.{minor} {name} (first line {first_line}) at byte offset {offset}"
                );
                checked.offsets += 1;
                checked.no_line += usize::from(want.is_none());
            }
            assert_eq!(line_at(format, &table, first_line, -1), Some(first_line));
            checked.codes += 1;
        }
        checked
    }

    #[test]
    fn linetable_matches_cpython_on_every_interpreter_found() {
        let interpreters = cpython_interpreters();
        if interpreters.is_empty() {
            eprintln!(
                "skipped: no CPython 3.9..=3.13 is installed (looked in pyenv's versions/, \
                 /usr/local/bin, /usr/bin and ~/.local/share/uv/python)"
            );
            return;
        }
        for (minor, exe) in &interpreters {
            let c = check_interpreter(*minor, exe);
            eprintln!(
                "3.{minor}: {} code objects, {} offsets ({} without a line) agree",
                c.codes, c.offsets, c.no_line
            );
            // The corpus is large; a near-empty run means the probe broke, not that all is well.
            assert!(
                c.codes >= 20 && c.offsets >= 3000,
                "3.{minor}: too little checked"
            );
            if *minor >= 11 {
                assert!(
                    c.no_line > 0,
                    "3.{minor}: no instruction without a line seen"
                );
            }
        }
    }

    #[test]
    fn linetable_versions() {
        assert_eq!(
            LineTableFormat::for_version(3, 9),
            Some(LineTableFormat::Lnotab39)
        );
        assert_eq!(
            LineTableFormat::for_version(3, 10),
            Some(LineTableFormat::Linetable310)
        );
        for minor in 11..=13 {
            assert_eq!(
                LineTableFormat::for_version(3, minor),
                Some(LineTableFormat::Locations311)
            );
        }
        for (major, minor) in [(3, 8), (3, 14), (2, 7), (4, 0)] {
            assert_eq!(LineTableFormat::for_version(major, minor), None);
        }
    }

    const ALL: [LineTableFormat; 3] = [
        LineTableFormat::Lnotab39,
        LineTableFormat::Linetable310,
        LineTableFormat::Locations311,
    ];

    #[test]
    fn linetable_negative_offset_is_first_line() {
        for format in ALL {
            assert_eq!(line_at(format, &[], 7, -1), Some(7));
            assert_eq!(line_at(format, &[0xff, 0xff, 0xff], 7, -5), Some(7));
        }
    }

    #[test]
    fn linetable_empty_table() {
        // 3.9 leaves a code object that never leaves its first line with no pairs at all.
        assert_eq!(line_at(LineTableFormat::Lnotab39, &[], 12, 0), Some(12));
        assert_eq!(line_at(LineTableFormat::Lnotab39, &[], 12, 40), Some(12));
        // From 3.10 every instruction has a range; with none there is no line.
        assert_eq!(line_at(LineTableFormat::Linetable310, &[], 12, 0), None);
        assert_eq!(line_at(LineTableFormat::Locations311, &[], 12, 0), None);
    }

    #[test]
    fn linetable_lnotab39_hand_table() {
        // +0 bytes/+1 line, +6 bytes/-3 lines, +255/+0, +1/+127.
        let t = [0, 1, 6, 0xfd, 255, 0, 1, 127];
        let f = LineTableFormat::Lnotab39;
        assert_eq!(line_at(f, &t, 10, 0), Some(11));
        assert_eq!(line_at(f, &t, 10, 5), Some(11));
        assert_eq!(line_at(f, &t, 10, 6), Some(8));
        assert_eq!(line_at(f, &t, 10, 261), Some(8));
        assert_eq!(line_at(f, &t, 10, 262), Some(135));
        assert_eq!(line_at(f, &t, 10, 100_000), Some(135));
        // Odd length: the length is wrong.
        assert_eq!(line_at(f, &t[..7], 10, 0), None);
        // Line arithmetic that overflows is garbage, not a wrapped line.
        assert_eq!(line_at(f, &[0, 1], i32::MAX, 0), None);
        // Lines below zero are no line.
        assert_eq!(line_at(f, &[0, 0xf0], 3, 0), None);
    }

    #[test]
    fn linetable_310_hand_table() {
        let f = LineTableFormat::Linetable310;
        // [0,4): +2; zero-length +127 folded in; [4,10): +1; [10,12): no line; [12,14): -5.
        let t = [4, 2, 0, 127, 6, 1, 2, 0x80, 2, 0xfb];
        assert_eq!(line_at(f, &t, 1, 0), Some(3));
        assert_eq!(line_at(f, &t, 1, 3), Some(3));
        assert_eq!(line_at(f, &t, 1, 4), Some(131));
        assert_eq!(line_at(f, &t, 1, 9), Some(131));
        assert_eq!(line_at(f, &t, 1, 10), None);
        // The no-line range did not move the running line.
        assert_eq!(line_at(f, &t, 1, 12), Some(126));
        // Past the last range.
        assert_eq!(line_at(f, &t, 1, 14), None);
        // Cut mid-pair, and cut after zero-length pairs that never close a range.
        assert_eq!(line_at(f, &t[..5], 1, 4), None);
        assert_eq!(line_at(f, &[0, 1, 0, 1], 1, 0), None);
    }

    /// An entry's first byte.
    fn head(kind: u8, units: u8) -> u8 {
        0x80 | (kind << 3) | (units - 1)
    }

    #[test]
    fn linetable_locations_hand_table() {
        let f = LineTableFormat::Locations311;
        let t = [
            // 2 units, long form: line +200 (svarint 400 = 0x10 | 0x40, 0x06), end line, cols.
            head(KIND_LONG, 2),
            0x50,
            0x06,
            0,
            1,
            1,
            // 1 unit, short form 3: same line, one column byte.
            head(3, 1),
            0x12,
            // 3 units, one-line form +2, two column bytes.
            head(KIND_ONE_LINE2, 3),
            4,
            5,
            // 1 unit, no location.
            head(KIND_NONE, 1),
            // 8 units, no columns: line -150 (svarint 301 = 0x2d | 0x40, 0x04).
            head(KIND_NO_COLUMNS, 8),
            0x6d,
            0x04,
        ];
        let first = 10;
        assert_eq!(line_at(f, &t, first, 0), Some(210));
        assert_eq!(line_at(f, &t, first, 2), Some(210));
        assert_eq!(line_at(f, &t, first, 4), Some(210));
        assert_eq!(line_at(f, &t, first, 6), Some(212));
        assert_eq!(line_at(f, &t, first, 11), Some(212));
        assert_eq!(line_at(f, &t, first, 12), None);
        assert_eq!(line_at(f, &t, first, 14), Some(62));
        assert_eq!(line_at(f, &t, first, 29), Some(62));
        assert_eq!(line_at(f, &t, first, 30), None);
    }

    #[test]
    fn linetable_locations_malformed() {
        let f = LineTableFormat::Locations311;
        // Varint cut short by the end of the table, and by the next entry's first byte.
        assert_eq!(line_at(f, &[head(KIND_LONG, 1), 0x41], 1, 0), None);
        assert_eq!(line_at(f, &[head(KIND_NO_COLUMNS, 1)], 1, 0), None);
        assert_eq!(
            line_at(f, &[head(KIND_NO_COLUMNS, 1), 0x41, head(3, 1), 0], 1, 0),
            None
        );
        // A varint longer than any 32-bit value.
        let long = [head(KIND_LONG, 1), 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x01];
        assert_eq!(line_at(f, &long, 1, 0), None);
        // A first byte that does not start an entry.
        assert_eq!(line_at(f, &[0x12, head(3, 1), 0], 1, 0), None);
        // Overflowing line arithmetic.
        assert_eq!(
            line_at(f, &[head(KIND_ONE_LINE2, 1), 0, 0], i32::MAX - 1, 0),
            None
        );
    }

    #[test]
    fn linetable_garbage_never_panics() {
        // xorshift: deterministic garbage without a dependency.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut buf = [0u8; 64];
        for _ in 0..20_000 {
            let len = (next() % 65) as usize;
            for b in &mut buf[..len] {
                *b = next() as u8;
            }
            let offset = (next() % 600) as i32 - 8;
            let first = (next() % 1000) as i32 - 10;
            for format in ALL {
                if let Some(line) = line_at(format, &buf[..len], first, offset) {
                    assert!(line >= 0);
                }
            }
        }
        for format in ALL {
            let _ = line_at(format, &[0xff; 4096], i32::MAX, i32::MAX);
            let _ = line_at(format, &[0x00; 4096], i32::MIN, i32::MAX);
        }
    }
}
