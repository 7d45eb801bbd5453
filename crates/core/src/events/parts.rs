//! The files of one dump: the head file (`memscope_dump_{ts}.csv`, `.db`, `.parquet`) and, for a
//! run longer than its dump budget, the step parts kept beside it in `memscope_dump_{ts}.steps/`
//! (`step_{S}_{P}.{ext}`: part P of step S) with every step's summary line (`steps.csv`). The
//! flight recorder (`crate::recorder`) decides what is kept; the readers chain the files here
//! into one stream of rows and say which steps are in the summary only.
//!
//! A `--format parquet` dump is written in segments, each a complete Parquet file (a file is
//! readable only once its footer is written): the head's first segment is the head file, its
//! later ones `head_{N}.parquet` in the same directory as the parts, and a long step's rows
//! are cut into parts the same way. The one segment being written has the suffix
//! [`OPEN_SUFFIX`] until it is complete; a run that ended without closing it (killed) leaves
//! it so, and the readers name it as the rows they miss.
//!
//! Names and texts only, no rows; the summary is opened through `source` (a regular file only).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The directory of a head file's step parts: `memscope_dump_{ts}.steps` beside it.
pub fn parts_dir(head: &Path) -> PathBuf {
    let stem = head.file_stem().unwrap_or_default().to_string_lossy();
    head.with_file_name(format!("{stem}.steps"))
}

/// The file of one part of a step, inside [`parts_dir`].
pub fn part_name(step: u64, part: u32, ext: &str) -> String {
    format!("step_{step:010}_{part:03}.{ext}")
}

/// Whether `name` is a part file's (`step_{S}_{P}.{ext}`).
pub fn is_part_name(name: &str) -> bool {
    parse_part_name(name).is_some()
}

/// A later segment of the head, inside [`parts_dir`] (the first is the head file itself).
pub fn head_segment_name(segment: u32, ext: &str) -> String {
    format!("head_{segment:06}.{ext}")
}

/// The suffix of a segment file while it is written: its name once complete, then this.
pub const OPEN_SUFFIX: &str = ".open";

/// The summary file, inside [`parts_dir`].
pub const SUMMARY_FILE: &str = "steps.csv";

/// (step, part) of a part file's name, `None` for any other name.
fn parse_part_name(name: &str) -> Option<(u64, u32, &str)> {
    let rest = name.strip_prefix("step_")?;
    let (stem, ext) = rest.split_once('.')?;
    let (step, part) = stem.split_once('_')?;
    // Parts past 999 (a long step cut into many) take more digits.
    if step.len() != 10 || part.len() < 3 {
        return None;
    }
    Some((step.parse().ok()?, part.parse().ok()?, ext))
}

/// (segment, extension) of a later head segment's name.
fn parse_head_segment_name(name: &str) -> Option<(u32, &str)> {
    let (number, ext) = name.strip_prefix("head_")?.split_once('.')?;
    if number.len() < 6 || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((number.parse().ok()?, ext))
}

/// The files that make one dump, in the order of their rows: the head, its later segments,
/// then the step parts kept beside it, by step and part. A part with the head's extension is
/// taken over another of the same step and part (an older Parquet run's journal being
/// converted).
pub fn dump_files(head: &Path) -> Vec<PathBuf> {
    let mut files = vec![head.to_path_buf()];
    let head_ext = head.extension().and_then(|e| e.to_str()).unwrap_or("");
    let dir = parts_dir(head);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return files;
    };
    let mut parts: Vec<((u64, u32), bool, PathBuf)> = Vec::new();
    let mut segments: Vec<(u32, PathBuf)> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some((segment, ext)) = parse_head_segment_name(&name) {
            if ext == head_ext {
                segments.push((segment, entry.path()));
            }
            continue;
        }
        let Some((step, part, ext)) = parse_part_name(&name).map(|(s, p, e)| (s, p, e.to_string()))
        else {
            continue;
        };
        // An empty part: the run was killed between making it and writing its header.
        let empty = entry.metadata().is_ok_and(|m| m.len() == 0);
        if empty || !matches!(ext.as_str(), "csv" | "db" | "parquet") {
            continue;
        }
        parts.push(((step, part), ext == head_ext, entry.path()));
    }
    // The head's own extension first within one (step, part), then one file per (step, part).
    parts.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    parts.dedup_by(|later, first| later.0 == first.0);
    segments.sort();
    files.extend(segments.into_iter().map(|(_, path)| path));
    files.extend(parts.into_iter().map(|(_, _, path)| path));
    files
}

/// The segments of the dump at `head` that a run left unfinished ([`OPEN_SUFFIX`]): the head
/// itself, or a later segment or part. Each is the dump's newest rows, which no reader gets.
pub fn open_segments(head: &Path) -> Vec<PathBuf> {
    let mut open = Vec::new();
    let mut name = head.as_os_str().to_owned();
    name.push(OPEN_SUFFIX);
    let head_open = PathBuf::from(name);
    if head_open.is_file() {
        open.push(head_open);
    }
    if let Ok(entries) = std::fs::read_dir(parts_dir(head)) {
        let mut names: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().ends_with(OPEN_SUFFIX))
            })
            .collect();
        names.sort();
        open.extend(names);
    }
    open
}

/// One line for a reader of a dump a run left unfinished: the segment that was being written,
/// whose rows are missing.
pub fn open_segment_note(segment: &Path) -> String {
    format!(
        "{}: the run ended while this segment of the dump was being written (it has no Parquet \
         footer): its rows, the dump's newest, are missing; the rows read are those before them",
        segment.display()
    )
}

/// What a bounded run's dump holds: the steps summarized, and which of them kept their rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coverage {
    /// Steps in the summary.
    pub steps: u64,
    /// Steps whose rows are in the dump (the head's and the parts kept), ascending.
    pub kept: Vec<u64>,
    /// Steps in the summary only, ascending.
    pub summarized_only: Vec<u64>,
}

/// What the dump at `head` holds, from its summary and its part files: `None` when it has no
/// summary, or when no step's rows were removed.
pub fn coverage(head: &Path) -> Option<Coverage> {
    coverage_of(head, &dump_files(head))
}

/// [`coverage`] of the dump whose files ([`dump_files`]) are already listed.
fn coverage_of(head: &Path, files: &[PathBuf]) -> Option<Coverage> {
    let summary = summary_steps(&parts_dir(head).join(SUMMARY_FILE))?;
    let parts: BTreeSet<u64> = files
        .iter()
        .skip(1)
        .filter_map(|p| parse_part_name(&p.file_name()?.to_string_lossy()).map(|(s, _, _)| s))
        .collect();
    let mut coverage = Coverage {
        steps: 0,
        kept: Vec::new(),
        summarized_only: Vec::new(),
    };
    let mut kept = parts.clone();
    for (step, in_head) in summary {
        coverage.steps += 1;
        if in_head {
            kept.insert(step);
        } else if !parts.contains(&step) {
            coverage.summarized_only.push(step);
        }
    }
    // A summary of ours names each step once, in order; any other is read as a set.
    coverage.summarized_only.sort_unstable();
    coverage.summarized_only.dedup();
    // Parts of the steps a killed run had no time to summarize count as kept too.
    coverage.kept = kept.into_iter().collect();
    (!coverage.summarized_only.is_empty()).then_some(coverage)
}

/// The longest summary line read: the runtime's are a dozen numbers.
const MAX_SUMMARY_LINE: u64 = 4096;

/// (step, whether its rows are in the head) of each line of the summary at `path` past its
/// header. `None` when it is no regular file (a FIFO would block the reader) or cannot be
/// opened; a line past [`MAX_SUMMARY_LINE`] ends it (no summary of ours has one, and a file
/// of any size is then read no further), a line that names no step is passed over.
fn summary_steps(path: &Path) -> Option<Vec<(u64, bool)>> {
    use std::io::{BufRead, Read};
    let file = super::source::open_regular(path).ok()?;
    let mut reader = std::io::BufReader::new(file);
    let mut steps = Vec::new();
    let mut line = Vec::new();
    let mut header = true;
    loop {
        line.clear();
        let n = (&mut reader)
            .take(MAX_SUMMARY_LINE)
            .read_until(b'\n', &mut line)
            .ok()?;
        if n == 0 || (n as u64 == MAX_SUMMARY_LINE && line.last() != Some(&b'\n')) {
            return Some(steps);
        }
        if std::mem::take(&mut header) {
            continue;
        }
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let mut fields = text.split(|b| *b == b',');
        let (Some(step), Some(detail)) = (fields.next(), fields.nth(3)) else {
            continue;
        };
        let Some(step) = std::str::from_utf8(step).ok().and_then(|s| s.parse().ok()) else {
            continue;
        };
        steps.push((step, detail == b"head"));
    }
}

/// One line for a reader of a bounded run's dump: which steps are in the summary only.
/// `files`: the dump's files, as [`dump_files`] lists them.
pub fn coverage_note(head: &Path, files: &[PathBuf]) -> Option<String> {
    let c = coverage_of(head, files)?;
    Some(format!(
        "{}: the run was longer than its dump budget: {} of {} steps are in the step summary \
         only ({}); the rows read are those of steps {}",
        head.display(),
        c.summarized_only.len(),
        c.steps,
        ranges(&c.summarized_only),
        ranges(&c.kept),
    ))
}

/// `1-40, 45, 50-60` of ascending numbers.
pub fn ranges(steps: &[u64]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < steps.len() {
        let start = steps[i];
        let mut end = start;
        while i + 1 < steps.len() && end.checked_add(1) == Some(steps[i + 1]) {
            i += 1;
            end = steps[i];
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        if start == end {
            let _ = write!(out, "{start}");
        } else {
            let _ = write!(out, "{start}-{end}");
        }
        i += 1;
    }
    out
}

/// The summary's header.
pub const SUMMARY_HEADER: &str = "Step,Rows,First ID,Last ID,Detail,PTA Used(byte),PTA Max Used(byte),HAL Used(byte),HAL Max Used(byte),OOM,Leak Sites Grown,Leak Growth(byte)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_round_trip_and_ranges_read_well() {
        assert_eq!(part_name(42, 1, "csv"), "step_0000000042_001.csv");
        assert_eq!(
            parse_part_name("step_0000000042_001.csv"),
            Some((42, 1, "csv"))
        );
        assert_eq!(parse_part_name("step_42_1.csv"), None);
        assert_eq!(parse_part_name("steps.csv"), None);
        assert_eq!(ranges(&[1, 2, 3, 5, 7, 8]), "1-3, 5, 7-8");
        assert_eq!(
            parts_dir(Path::new("/r/device_cpu/dump/memscope_dump_1_2.csv")),
            Path::new("/r/device_cpu/dump/memscope_dump_1_2.steps")
        );
    }

    /// A bounded run's files: the head first, then the parts by step and part; the steps in
    /// the summary only are those with neither head rows nor a part, and a part whose step
    /// has no summary line yet (a killed run) counts as kept.
    #[test]
    fn the_files_of_a_dump_and_what_they_cover() {
        let dir = std::env::temp_dir().join(format!("msmemscope_recorder_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let head = dir.join("memscope_dump_1.csv");
        let parts = parts_dir(&head);
        std::fs::create_dir_all(&parts).unwrap();
        std::fs::write(&head, "").unwrap();
        let mut summary = format!("{SUMMARY_HEADER}\n");
        for step in 0..8u64 {
            let detail = if step < 2 { "head" } else { "part" };
            summary.push_str(&format!("{step},1,1,1,{detail},,,,,0,0,0\n"));
        }
        std::fs::write(parts.join(SUMMARY_FILE), summary).unwrap();
        for (step, part) in [(9, 0), (4, 1), (4, 0), (7, 0)] {
            std::fs::write(parts.join(part_name(step, part, "csv")), "ID\n").unwrap();
        }
        // Made, and the run killed before its header: not a part.
        std::fs::write(parts.join(part_name(10, 0, "csv")), "").unwrap();
        std::fs::write(parts.join("notes.txt"), "").unwrap();
        let names: Vec<String> = dump_files(&head)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "memscope_dump_1.csv",
                "step_0000000004_000.csv",
                "step_0000000004_001.csv",
                "step_0000000007_000.csv",
                "step_0000000009_000.csv"
            ]
        );
        let c = coverage(&head).unwrap();
        assert_eq!(c.steps, 8);
        assert_eq!(c.kept, vec![0, 1, 4, 7, 9]);
        assert_eq!(c.summarized_only, vec![2, 3, 5, 6]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
