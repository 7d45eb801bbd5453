//! Offline leak check between marks (docs/analyses.md#check-leaks; the original msMemScope's
//! `check_leaks(input_path, mstx_info, start_index)`): marks A, B and C are the `start_index`-th
//! (from 0), the next and the one after that of the `MSTX Mark` rows whose message (Name) equals
//! `mstx_info`; with `mstx_info` `step` the dump's `SYSTEM STEP` rows count as such marks too (the
//! steps `msmemscope.step()` and `step start` ranges wrote). A block allocated (a `MALLOC` row)
//! after A and before B that has no `FREE` row before C leaks. Every pool counts (`PTA`, `HAL`,
//! `HOST`; the original msMemScope checks HAL only); the input is a CSV or SQLite dump.
//!
//! The dump is streamed: only the blocks allocated between A and B and not yet freed are kept,
//! and reading stops at C.
//!
//! # Report ([`CheckLeaksResult::console`])
//! ```text
//! ====== ERROR: Detected memory leaks between mark A (id 3) and mark B (id 9), not freed by mark C (id 14) ======
//! Direct PTA leak of 0.015 Mb(s) at 0x0000000000001000 on device cpu (row 5).
//!     train.py(12): step
//!     train.py(30): <module>
//! Direct HAL leak of 2.000 Mb(s) at 0x0000000000200000 on device 0 (row 7).
//! ====== SUMMARY: 2.015 Mb(s) leaked in 2 allocation(s) ======
//! ====== By site ======
//!   /w/train.py:12 (step): 15.0 KiB (15360 bytes) in 1 block(s); op aten::addmm
//!   (no Python line recorded): 2.00 MiB (2097152 bytes) in 1 block(s)
//! ```
//! Blocks in allocation order (row ID); `Mb` as in [`super::leaks`]; the Python stack, when the
//! row has one, follows its block, one frame per line indented by 4 spaces. The sites (the
//! MALLOC row's `site` Attr, else its first Python frame), largest first, follow the summary. Without leaks:
//! `====== No memory leaks between mark A (id 3) and mark B (id 9), all freed by mark C (id 14) ======`.
//!
//! # Errors (one line each)
//! - `input_path must be an absolute path: {path}` (the original msMemScope requires one);
//! - `{path}: no such file`, or the reader's other errors (not a dump, unreadable);
//! - `{path}:{line}: malformed row: {reason}` (for a DB, the line is the row's ID);
//! - `found N marks named "X", need start_index+3 = M`.

use std::path::{Path, PathBuf};

use super::leaks::{block_attrs, mb};
use super::live_blocks::{BlockKey, LiveBlocks};
use crate::events::reader::{self, ReadError};
use crate::events::row::format_ptr;
use crate::events::{DeviceId, Event, EventRow, EventType};

/// One block allocated between A and B and not freed before C.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeakedBlock {
    pub ptr: u64,
    pub size: u64,
    pub device: DeviceId,
    pub pool: EventType,
    /// The ID of the block's MALLOC row.
    pub row_id: u64,
    /// The MALLOC row's `Call Stack(Python)` (empty when it has none).
    pub python_stack: String,
    /// Its site: the `site` Attr (`file:line (function)`), else the first Python frame.
    pub site: Option<String>,
    /// The op that allocated it (`op` Attr).
    pub op: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckLeaksResult {
    /// The row IDs of marks A, B and C.
    pub marks: [u64; 3],
    /// In allocation order.
    pub leaks: Vec<LeakedBlock>,
    /// The report (see the module doc).
    pub console: String,
}

impl CheckLeaksResult {
    pub fn total_bytes(&self) -> u64 {
        self.leaks.iter().map(|l| l.size).sum()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckLeaksError {
    #[error("input_path must be an absolute path: {}", .0.display())]
    RelativePath(PathBuf),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("found {found} marks named {name:?}, need start_index+3 = {need}")]
    TooFewMarks {
        found: usize,
        name: String,
        need: usize,
    },
}

/// Runs the check on the dump at `path` (see the module doc).
pub fn check_leaks(
    path: &Path,
    mstx_info: &str,
    start_index: usize,
) -> Result<CheckLeaksResult, CheckLeaksError> {
    if !path.is_absolute() {
        return Err(CheckLeaksError::RelativePath(path.to_path_buf()));
    }
    let need = start_index.saturating_add(3);
    let mut found = 0usize;
    let mut marks = [0u64; 3];
    // Live blocks allocated between A and B.
    let mut live: LiveBlocks<LiveBlock> = LiveBlocks::new();
    let mut rows = reader::open_rows(path)?;
    while let Some(row) = rows.next_row()? {
        match (row.event, row.event_type) {
            (Event::Mstx, EventType::Mark) | (Event::System, EventType::Step)
                if is_mark(row, mstx_info) =>
            {
                if found >= start_index {
                    marks[found - start_index] = row.id;
                }
                found += 1;
                if found == need {
                    let mut leaks: Vec<LeakedBlock> =
                        live.drain().map(|(key, block)| block.leaked(key)).collect();
                    leaks.sort_by_key(|l| l.row_id);
                    let console = render(&marks, &leaks);
                    return Ok(CheckLeaksResult {
                        marks,
                        leaks,
                        console,
                    });
                }
            }
            // Blocks allocated between A and B, and freed before B's match.
            (Event::Malloc, _) if found == start_index + 1 => {
                live.apply(row, || LiveBlock::of(row));
            }
            (Event::Free, _) if found > start_index && !live.is_empty() => {
                live.apply(row, || LiveBlock::of(row));
            }
            _ => {}
        }
    }
    Err(CheckLeaksError::TooFewMarks {
        found,
        name: mstx_info.to_string(),
        need,
    })
}

/// Whether `row` is one of the marks named `mstx_info`.
fn is_mark(row: &EventRow, mstx_info: &str) -> bool {
    match row.event_type {
        EventType::Step => mstx_info == STEP_MARKS,
        _ => row.name == mstx_info,
    }
}

/// The `mstx_info` under which the dump's STEP rows count as marks.
pub const STEP_MARKS: &str = "step";

/// What a live block keeps besides its key: 32 bytes, since a window can hold hundreds of
/// thousands and every lookup in a map that size misses the cache.
struct LiveBlock {
    row_id: u64,
    size: u64,
    /// The MALLOC row's Python stack, site and op, when it has them (kept together: most
    /// blocks have none, or all).
    origin: Option<Box<Origin>>,
}

struct Origin {
    python_stack: String,
    site: Option<String>,
    op: Option<String>,
}

impl LiveBlock {
    fn of(row: &EventRow) -> LiveBlock {
        let site = super::leaks::sites::row_site(row).map(|s| s.into_owned());
        let op = row.attr_str("op").map(str::to_string);
        let origin = (!row.python_stack.is_empty() || site.is_some() || op.is_some()).then(|| {
            Box::new(Origin {
                python_stack: row.python_stack.clone(),
                site,
                op,
            })
        });
        LiveBlock {
            row_id: row.id,
            size: block_attrs(row).size.unwrap_or(0),
            origin,
        }
    }

    fn leaked(self, key: BlockKey) -> LeakedBlock {
        let (python_stack, site, op) = match self.origin {
            Some(o) => (o.python_stack, o.site, o.op),
            None => (String::new(), None, None),
        };
        LeakedBlock {
            ptr: key.ptr,
            size: self.size,
            device: key.device,
            pool: key.pool,
            row_id: self.row_id,
            python_stack,
            site,
            op,
        }
    }
}

/// The report for marks A, B, C (row IDs) and the leaked blocks in order.
pub fn render(marks: &[u64; 3], leaks: &[LeakedBlock]) -> String {
    let [a, b, c] = marks;
    if leaks.is_empty() {
        return format!(
            "====== No memory leaks between mark A (id {a}) and mark B (id {b}), all freed by mark C (id {c}) ======\n"
        );
    }
    let mut out = format!(
        "====== ERROR: Detected memory leaks between mark A (id {a}) and mark B (id {b}), not freed by mark C (id {c}) ======\n"
    );
    let mut total = 0u64;
    for leak in leaks {
        total += leak.size;
        out.push_str(&format!(
            "Direct {} leak of {} Mb(s) at {} on device {} (row {}).\n",
            leak.pool.as_str(),
            mb(leak.size),
            format_ptr(leak.ptr),
            leak.device,
            leak.row_id
        ));
        for frame in leak.python_stack.lines().filter(|l| !l.trim().is_empty()) {
            out.push_str("    ");
            out.push_str(frame);
            out.push('\n');
        }
    }
    out.push_str(&format!(
        "====== SUMMARY: {} Mb(s) leaked in {} allocation(s) ======\n",
        mb(total),
        leaks.len()
    ));
    render_sites(&mut out, leaks);
    out
}

/// The leaked blocks by site, largest first (nothing when no block has a site).
fn render_sites(out: &mut String, leaks: &[LeakedBlock]) {
    use super::leaks::findings::human;
    if leaks.iter().all(|l| l.site.is_none()) {
        return;
    }
    // site -> (bytes, blocks, ops)
    let mut sites: Vec<(Option<&str>, u64, u64, Vec<&str>)> = Vec::new();
    for leak in leaks {
        let at = match sites.iter().position(|s| s.0 == leak.site.as_deref()) {
            Some(at) => at,
            None => {
                sites.push((leak.site.as_deref(), 0, 0, Vec::new()));
                sites.len() - 1
            }
        };
        let entry = &mut sites[at];
        entry.1 += leak.size;
        entry.2 += 1;
        if let Some(op) = leak.op.as_deref() {
            if !entry.3.contains(&op) {
                entry.3.push(op);
            }
        }
    }
    sites.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out.push_str("====== By site ======\n");
    for (site, bytes, blocks, ops) in sites {
        out.push_str(&format!(
            "  {}: {} ({bytes} bytes) in {blocks} block(s)",
            site.unwrap_or("(no Python line recorded)"),
            human(bytes)
        ));
        if !ops.is_empty() {
            out.push_str(&format!("; op {}", ops.join(", ")));
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::csv::{write_row, HEADER};

    struct Dump(PathBuf);

    impl Dump {
        fn new(name: &str, rows: &[EventRow]) -> Dump {
            let dir = std::env::temp_dir().join(format!(
                "msmemscope-check-leaks-{}-{name}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("dump.csv");
            let mut text = format!("{HEADER}\n");
            for (i, row) in rows.iter().enumerate() {
                let mut row = row.clone();
                row.id = i as u64 + 1;
                write_row(&mut text, &row);
            }
            std::fs::write(&path, text).unwrap();
            Dump(path)
        }
    }

    impl Drop for Dump {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
        }
    }

    fn mark(text: &str) -> EventRow {
        EventRow::new(Event::Mstx, EventType::Mark, text)
    }

    fn blk(event: Event, pool: EventType, ptr: u64, size: u64) -> EventRow {
        let mut r = EventRow::new(event, pool, "");
        r.device = DeviceId::Cpu;
        r.ptr = Some(ptr);
        r.attrs.insert("size".into(), size.into());
        r
    }

    fn rows() -> Vec<EventRow> {
        use Event::{Free, Malloc};
        use EventType::{Hal, Pta};
        let mut with_stack = blk(Malloc, Pta, 0x30, 15_728);
        with_stack.python_stack = "train.py(12): step\ntrain.py(30): <module>".into();
        vec![
            blk(Malloc, Pta, 0x10, 100),     // 1: before A
            mark("test"),                    // 2: A (start_index 0)
            mark("other"),                   // 3
            blk(Malloc, Pta, 0x20, 200),     // 4: freed before C
            with_stack,                      // 5: leaks
            blk(Malloc, Hal, 0x40, 2 << 20), // 6: leaks
            blk(Free, Pta, 0x10, 100),       // 7: allocated before A: ignored
            mark("test"),                    // 8: B
            blk(Malloc, Pta, 0x50, 500),     // 9: after B: ignored
            blk(Free, Pta, 0x20, 200),       // 10
            mark("test"),                    // 11: C
            blk(Free, Hal, 0x40, 2 << 20),   // 12: after C: too late
            mark("test"),                    // 13
        ]
    }

    #[test]
    fn step_rows_are_marks_named_step_and_sites_come_from_attrs() {
        use Event::{Free, Malloc};
        use EventType::Pta;
        let step = |n: u64| EventRow::new(Event::System, EventType::Step, n.to_string());
        let mut kept = blk(Malloc, Pta, 0x30, 4096);
        kept.attrs.insert("site".into(), "/w/t.py:9 (main)".into());
        kept.attrs.insert("op".into(), "aten::empty".into());
        let rows = vec![
            step(1),                   // 1: A
            kept,                      // 2: leaks
            blk(Malloc, Pta, 0x40, 8), // 3: freed
            step(2),                   // 4: B
            blk(Free, Pta, 0x40, 8),   // 5
            step(3),                   // 6: C
        ];
        let dump = Dump::new("steps", &rows);
        let result = check_leaks(&dump.0, STEP_MARKS, 0).unwrap();
        assert_eq!(result.marks, [1, 4, 6]);
        assert_eq!(result.leaks.len(), 1);
        assert_eq!(result.leaks[0].site.as_deref(), Some("/w/t.py:9 (main)"));
        assert!(result.console.ends_with(
            "====== By site ======\n  /w/t.py:9 (main): 4.00 KiB (4096 bytes) in 1 block(s); op aten::empty\n"
        ), "{}", result.console);
    }

    #[test]
    fn blocks_between_a_and_b_not_freed_by_c() {
        let dump = Dump::new("abc", &rows());
        let result = check_leaks(&dump.0, "test", 0).unwrap();
        assert_eq!(result.marks, [2, 8, 11]);
        assert_eq!(
            result.console,
            "====== ERROR: Detected memory leaks between mark A (id 2) and mark B (id 8), not freed by mark C (id 11) ======\n\
             Direct PTA leak of 0.015 Mb(s) at 0x0000000000000030 on device cpu (row 5).\n    \
             train.py(12): step\n    \
             train.py(30): <module>\n\
             Direct HAL leak of 2.000 Mb(s) at 0x0000000000000040 on device cpu (row 6).\n\
             ====== SUMMARY: 2.015 Mb(s) leaked in 2 allocation(s) ======\n\
             ====== By site ======\n  \
             (no Python line recorded): 2.00 MiB (2097152 bytes) in 1 block(s)\n  \
             train.py:12 (step): 15.4 KiB (15728 bytes) in 1 block(s)\n"
        );
        assert_eq!(
            result.leaks[0].python_stack,
            "train.py(12): step\ntrain.py(30): <module>"
        );
        assert_eq!(result.total_bytes(), 15_728 + (2 << 20));
    }

    #[test]
    fn start_index_shifts_the_marks() {
        let dump = Dump::new("shift", &rows());
        // A = row 8, B = row 11, C = row 13: 0x50 (row 9) is allocated between and never freed.
        let result = check_leaks(&dump.0, "test", 1).unwrap();
        assert_eq!(result.marks, [8, 11, 13]);
        assert_eq!(result.leaks.len(), 1);
        assert_eq!(result.leaks[0].ptr, 0x50);
        assert_eq!(result.leaks[0].row_id, 9);
    }

    #[test]
    fn no_leaks() {
        let rows = vec![
            mark("m"),
            blk(Event::Malloc, EventType::Host, 0x1, 1),
            mark("m"),
            blk(Event::Free, EventType::Host, 0x1, 1),
            mark("m"),
        ];
        let dump = Dump::new("none", &rows);
        let result = check_leaks(&dump.0, "m", 0).unwrap();
        assert!(result.leaks.is_empty());
        assert_eq!(
            result.console,
            "====== No memory leaks between mark A (id 1) and mark B (id 3), all freed by mark C (id 5) ======\n"
        );
    }

    #[test]
    fn errors() {
        let dump = Dump::new("errors", &rows());
        let err = check_leaks(&dump.0, "test", 2).unwrap_err().to_string();
        assert_eq!(err, "found 4 marks named \"test\", need start_index+3 = 5");
        let err = check_leaks(&dump.0, "nope", 0).unwrap_err().to_string();
        assert_eq!(err, "found 0 marks named \"nope\", need start_index+3 = 3");
        let err = check_leaks(Path::new("dump.csv"), "test", 0)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "input_path must be an absolute path: dump.csv");
        let err = check_leaks(Path::new("/nonexistent/dump.csv"), "test", 0)
            .unwrap_err()
            .to_string();
        assert_eq!(err, "/nonexistent/dump.csv: no such file");
        // A malformed row before C: the reader's error, with the line.
        let mut text = std::fs::read_to_string(&dump.0).unwrap();
        text = text.replacen("\n4,MALLOC,", "\n4,MALLOK,", 1);
        std::fs::write(&dump.0, text).unwrap();
        let err = check_leaks(&dump.0, "test", 0).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{}:5: malformed row: unknown Event \"MALLOK\"",
                dump.0.display()
            )
        );
    }
}
