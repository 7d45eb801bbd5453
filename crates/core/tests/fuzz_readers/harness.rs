//! One check per reader, shared by the stable fuzz test (`tests/fuzz_readers`) and the
//! libFuzzer targets (`fuzz/`, which include this file): the input bytes become the reader's
//! file (or frame), the reader runs to its end, and what must hold for any input is asserted,
//! so that a violation is a panic either driver reports with its input.
//!
//! What holds for every input: no panic; every error is one line that starts with the file it
//! is about (a row error also names the line or row); no row is handed out after an error or
//! longer than [`MAX_ROW_BYTES`]; the two readers of a dump (the iterator and the row source)
//! agree where both read it to the end.

use std::path::{Path, PathBuf};

use msmemscope_core::control_frame;
use msmemscope_core::events::parts;
use msmemscope_core::events::reader::{self, ReadError, MAX_ROW_BYTES};
use msmemscope_core::events::EventRow;

/// The readers, by the name their corpus directory and fuzz target carry.
pub const TARGETS: [&str; 7] = [
    "csv",
    "original_csv",
    "sqlite",
    "parquet",
    "step_summary",
    "step_part",
    "control_frame",
];

/// Runs the check of `target` on `bytes` in `dir` (a directory of the caller's own, emptied
/// here first); what the two dump readers read, for a dump's targets.
pub fn check(target: &str, bytes: &[u8], dir: &Path) -> Option<(Outcome, Outcome)> {
    reset(dir);
    Some(match target {
        // The original tool's CSV is our CSV reader's input too: the dialect is told from the
        // header, so the two differ only in the inputs they start from.
        "csv" | "original_csv" => dump(bytes, &dir.join("memscope_dump_1.csv")),
        "sqlite" => dump(bytes, &dir.join("memscope_dump_1.db")),
        "parquet" => dump(bytes, &dir.join("memscope_dump_1.parquet")),
        "step_summary" => step_summary(bytes, dir),
        "step_part" => step_part(bytes, dir),
        "control_frame" => {
            frame(bytes);
            return None;
        }
        _ => panic!(
            "no fuzz target {target:?}; the targets: {}",
            TARGETS.join(", ")
        ),
    })
}

fn reset(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
}

/// A dump file of `bytes` read both ways.
fn dump(bytes: &[u8], path: &Path) -> (Outcome, Outcome) {
    std::fs::write(path, bytes).unwrap();
    read_dump(path)
}

/// A bounded run's head, a valid part of step 4, and `bytes` as its step summary.
fn step_summary(bytes: &[u8], dir: &Path) -> (Outcome, Outcome) {
    let head = bounded_run(dir);
    std::fs::write(parts::parts_dir(&head).join(parts::SUMMARY_FILE), bytes).unwrap();
    read_dump(&head)
}

/// A bounded run's head and summary, and `bytes` as the part of step 4.
fn step_part(bytes: &[u8], dir: &Path) -> (Outcome, Outcome) {
    let head = bounded_run(dir);
    std::fs::write(
        parts::parts_dir(&head).join(parts::SUMMARY_FILE),
        STEP_SUMMARY,
    )
    .unwrap();
    std::fs::write(
        parts::parts_dir(&head).join(parts::part_name(4, 0, "csv")),
        bytes,
    )
    .unwrap();
    read_dump(&head)
}

/// The header every dump of ours starts with.
pub const HEADER: &str = "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,Call Stack(Python),Call Stack(C)";

/// The head of a bounded run: steps 0 and 1.
pub const HEAD_ROWS: &str = "1,SYSTEM,START_TRACE,N/A,1000,42,42,N/A,N/A,{},,\n\
2,MSTX,Mark,step start,1100,42,42,N/A,N/A,{},,\n\
3,MALLOC,PTA,N/A,1200,42,42,cpu,0x1000,\"{\"\"size\"\":64,\"\"allocation_id\"\":1,\"\"used\"\":64,\"\"total\"\":64}\",,\n";

/// The part kept of step 4.
pub const PART_ROWS: &str = "9,MSTX,Mark,step start,1900,42,42,N/A,N/A,{},,\n\
10,FREE,PTA,N/A,2000,42,42,cpu,0x1000,\"{\"\"size\"\":64,\"\"allocation_id\"\":1,\"\"used\"\":0,\"\"total\"\":64}\",,\n";

/// The summary of steps 0 to 4: 0 and 1 in the head, 2 and 3 summarized only, 4 in a part.
pub const STEP_SUMMARY: &str = "Step,Rows,First ID,Last ID,Detail,PTA Used(byte),PTA Max Used(byte),HAL Used(byte),HAL Max Used(byte),OOM,Leak Sites Grown,Leak Growth(byte)\n\
0,1,1,1,head,,,,,0,0,0\n\
1,2,2,3,head,64,64,,,0,0,0\n\
2,2,4,5,summary,64,128,,,0,0,0\n\
3,3,6,8,summary,64,128,,,0,0,0\n\
4,2,9,10,part,0,64,,,0,0,0\n";

/// Writes a bounded run's head and the part of step 4 in `dir`; the head's path.
fn bounded_run(dir: &Path) -> PathBuf {
    let head = dir.join("memscope_dump_1.csv");
    std::fs::write(&head, format!("{HEADER}\n{HEAD_ROWS}")).unwrap();
    let parts_dir = parts::parts_dir(&head);
    std::fs::create_dir_all(&parts_dir).unwrap();
    std::fs::write(
        parts_dir.join(parts::part_name(4, 0, "csv")),
        format!("{HEADER}\n{PART_ROWS}"),
    )
    .unwrap();
    head
}

/// What reading a dump gave: the rows' IDs, and the error that ended them.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    pub ids: Vec<u64>,
    pub error: Option<String>,
}

/// Reads the dump at `head` with both readers, checking each, and the summary's note.
pub fn read_dump(head: &Path) -> (Outcome, Outcome) {
    let files = parts::dump_files(head);
    if let Some(note) = parts::coverage_note(head, &files) {
        assert_one_line(&note);
    }
    let _ = parts::coverage(head);
    let iterated = iterate(head);
    let sourced = source(head);
    if iterated.error.is_none() && sourced.error.is_none() {
        assert_eq!(
            iterated.ids, sourced.ids,
            "the iterator and the row source read different rows"
        );
    }
    (iterated, sourced)
}

/// [`reader::open`] to its end.
fn iterate(head: &Path) -> Outcome {
    let mut out = Outcome {
        ids: Vec::new(),
        error: None,
    };
    let rows = match reader::open(head) {
        Ok(rows) => rows,
        Err(e) => {
            out.error = Some(checked_error(head, &e));
            return out;
        }
    };
    for row in rows {
        assert!(out.error.is_none(), "a row after the error {:?}", out.error);
        match row {
            Ok(row) => {
                check_row(&row);
                out.ids.push(row.id);
            }
            Err(e) => out.error = Some(checked_error(head, &e)),
        }
    }
    out
}

/// [`reader::open_rows`] to its end (a bound on the calls: a source that never ends is a bug).
fn source(head: &Path) -> Outcome {
    let mut out = Outcome {
        ids: Vec::new(),
        error: None,
    };
    let mut rows = match reader::open_rows(head) {
        Ok(rows) => rows,
        Err(e) => {
            out.error = Some(checked_error(head, &e));
            return out;
        }
    };
    loop {
        match rows.next_row() {
            Ok(Some(row)) => {
                check_row(row);
                out.ids.push(row.id);
                assert!(out.ids.len() < 10_000_000, "a source that never ends");
            }
            Ok(None) => break,
            Err(e) => {
                out.error = Some(checked_error(head, &e));
                break;
            }
        }
    }
    // Once ended, a source stays ended.
    assert!(
        matches!(rows.next_row(), Ok(None) | Err(_)),
        "a row after the end"
    );
    out
}

fn check_row(row: &EventRow) {
    let len = row.name.len()
        + row.python_stack.len()
        + row.c_stack.len()
        + row.attrs_json.as_ref().map_or(0, String::len);
    assert!(len <= MAX_ROW_BYTES, "a row of {len} bytes");
}

/// The error's text, checked: one line, about the head or a file beside it, with the line or
/// row where it is about one.
fn checked_error(head: &Path, e: &ReadError) -> String {
    let text = e.to_string();
    assert_one_line(&text);
    let dir = head.parent().unwrap().display().to_string();
    assert!(
        text.starts_with(&dir),
        "an error that names no file of the dump: {text:?}"
    );
    if let ReadError::BadRow { line, .. } = e {
        assert!(
            text.contains(&format!(":{line}: ")),
            "a row error without its position: {text:?}"
        );
    }
    text
}

fn assert_one_line(text: &str) {
    assert!(
        !text.is_empty() && !text.contains('\n') && !text.contains('\r'),
        "not one line: {text:?}"
    );
}

/// The control channel's frames, both sides: the client's reading of a reply, and the
/// server's of a request (its header, then the payload it would read).
fn frame(bytes: &[u8]) {
    match control_frame::read(&mut &bytes[..]) {
        Ok((h, payload)) => {
            assert!(h.payload_len <= control_frame::MAX_PAYLOAD);
            assert_eq!(payload.len(), h.payload_len as usize);
        }
        Err(line) => assert_one_line(&line),
    }
    let Some(header) = bytes.get(..control_frame::HEADER_LEN) else {
        return;
    };
    let h = control_frame::Header::parse(header.try_into().unwrap());
    match control_frame::check_request_header(&h) {
        control_frame::HeaderCheck::Request => {
            let rest = &bytes[control_frame::HEADER_LEN..];
            let payload = &rest[..rest.len().min(h.payload_len as usize)];
            match control_frame::parse_request(payload) {
                Ok(command) => assert!(!command.contains('\n'), "{command:?}"),
                Err(line) => assert_one_line(&line),
            }
        }
        control_frame::HeaderCheck::WrongType(line) | control_frame::HeaderCheck::Fatal(line) => {
            assert_one_line(&line)
        }
    }
}
