//! Reading a dump back, row by row: the offline analyses stream their input, so memory grows
//! with what an analysis keeps (live blocks), never with the file.
//!
//! Every offline consumer (the analyses, `--compare`, `report`, `export`) reads through here,
//! so what makes a dump usable is checked here once, not by each consumer: the input is a
//! regular file (a FIFO or a device would block or never end), no row is longer than
//! [`MAX_ROW_BYTES`], every field parses, the Attr values the analyses count with
//! ([`NUMERIC_ATTRS`]) are 64-bit integers, and IDs ascend strictly (a repeated or reordered
//! row would be counted twice or out of time order). The iterators stop after their first
//! error.

use std::path::{Path, PathBuf};

use super::row::EventRow;

pub use super::attrs::{check_attrs, NUMERIC_ATTRS};
pub use super::csv::read::CsvRows;
use super::csv::scan::FastCsv;
pub use super::source::{count_line_ends, Progress, ReadError, RowSource, MAX_ROW_BYTES};
pub use super::sqlite::read::DbRows;

/// The rows of a dump (`.csv`, `.db` or `.parquet`), in file order: the file, then the step
/// parts a bounded run kept beside it (`super::parts`), with one note on stderr naming the
/// steps whose rows are gone.
pub fn open(
    path: &Path,
) -> Result<Box<dyn Iterator<Item = Result<EventRow, ReadError>> + Send>, ReadError> {
    let chain = Chain::of(path, open_file)?;
    if chain.rest.is_empty() {
        return Ok(chain.current);
    }
    Ok(Box::new(chain))
}

/// The step part files (and later segments) kept beside a dump's head (none for a run within
/// its budget), after the notes about a run that ended early, the steps whose rows are gone
/// and the segment a killed run left unfinished.
fn parts_of(path: &Path) -> Vec<PathBuf> {
    super::run_end::say_once(path);
    for open in super::parts::open_segments(path) {
        eprintln!(
            "msmemscope: note: {}",
            super::parts::open_segment_note(&open)
        );
    }
    let files = super::parts::dump_files(path);
    if files.len() > 1 {
        if let Some(note) = super::parts::coverage_note(path, &files) {
            eprintln!("msmemscope: note: {note}");
        }
    }
    files.into_iter().skip(1).collect()
}

/// A dump's files read one after another, as one stream of rows in ascending ID order.
struct Chain<S> {
    current: S,
    /// The file being read.
    path: PathBuf,
    /// The files still to read, the next one last.
    rest: Vec<PathBuf>,
    /// How each file is opened.
    open: fn(&Path) -> Result<S, ReadError>,
    last_id: Option<u64>,
    failed: bool,
}

impl<S> Chain<S> {
    /// The dump at `path` (its head) and the parts kept beside it.
    fn of(path: &Path, open: fn(&Path) -> Result<S, ReadError>) -> Result<Chain<S>, ReadError> {
        let mut rest = parts_of(path);
        rest.reverse();
        Ok(Chain {
            current: open(path)?,
            path: path.to_path_buf(),
            rest,
            open,
            last_id: None,
            failed: false,
        })
    }

    /// Whether `row` (the first of a file) comes after the previous file's rows.
    fn in_order(&mut self, id: u64) -> Result<(), ReadError> {
        if self.last_id.is_some_and(|last| id <= last) {
            self.failed = true;
            return Err(ReadError::BadRow {
                path: self.path.clone(),
                line: 2,
                reason: format!(
                    "ID {id} comes after ID {} of the dump's earlier file: rows must be in \
                     ascending ID order",
                    self.last_id.unwrap_or(0)
                ),
            });
        }
        Ok(())
    }
}

type Rows = Box<dyn Iterator<Item = Result<EventRow, ReadError>> + Send>;

impl Iterator for Chain<Rows> {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.failed {
                return None;
            }
            match self.current.next() {
                Some(Ok(row)) => {
                    if let Err(e) = self.in_order(row.id) {
                        return Some(Err(e));
                    }
                    self.last_id = Some(row.id);
                    return Some(Ok(row));
                }
                Some(Err(e)) => {
                    self.failed = true;
                    return Some(Err(e));
                }
                None => {
                    let next = self.rest.pop()?;
                    match (self.open)(&next) {
                        Ok(rows) => {
                            self.current = rows;
                            self.path = next;
                        }
                        Err(e) => {
                            self.failed = true;
                            return Some(Err(e));
                        }
                    }
                }
            }
        }
    }
}

impl RowSource for Chain<Box<dyn RowSource>> {
    fn next_row(&mut self) -> Result<Option<&EventRow>, ReadError> {
        loop {
            if self.failed {
                return Ok(None);
            }
            let id = match self.current.next_row() {
                Ok(Some(row)) => Some(row.id),
                Ok(None) => None,
                Err(e) => {
                    self.failed = true;
                    return Err(e);
                }
            };
            match id {
                Some(id) => {
                    self.in_order(id)?;
                    self.last_id = Some(id);
                    return Ok(self.current.current());
                }
                None => {
                    let Some(next) = self.rest.pop() else {
                        return Ok(None);
                    };
                    self.current = (self.open)(&next).inspect_err(|_| self.failed = true)?;
                    self.path = next;
                }
            }
        }
    }

    fn current(&self) -> Option<&EventRow> {
        if self.failed {
            return None;
        }
        self.current.current()
    }

    fn progress(&self) -> Option<Progress> {
        self.current.progress()
    }
}

/// The rows of one dump file, in file order.
fn open_file(
    path: &Path,
) -> Result<Box<dyn Iterator<Item = Result<EventRow, ReadError>> + Send>, ReadError> {
    if let Some(rewritten) = super::original::normalize_if_original(path)? {
        return Ok(Box::new(Rewritten {
            inner: CsvRows::open(&rewritten.csv)?,
            _file: rewritten,
        }));
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some("db") => Ok(Box::new(DbRows::open(path)?)),
        Some("parquet") => Ok(Box::new(super::parquet::ParquetRows::open(path)?)),
        _ => Ok(Box::new(CutTail {
            inner: CsvRows::open(path)?,
            path: path.to_path_buf(),
            ended: false,
        })),
    }
}

/// Whether `e` is about a CSV dump's last row, cut off where the writing stopped (a full disk,
/// the process killed): the file does not end with a line end, and the bad row starts on its
/// last line. Looked at only when a row is refused.
fn is_cut_last_row(path: &Path, e: &ReadError) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let ReadError::BadRow { line, .. } = e else {
        return false;
    };
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let mut last = [0u8; 1];
    if file.seek(SeekFrom::End(-1)).is_err() || file.read_exact(&mut last).is_err() {
        return false;
    }
    if last[0] == b'\n' || file.seek(SeekFrom::Start(0)).is_err() {
        return false;
    }
    count_line_ends(file).is_ok_and(|lines| *line == lines + 1)
}

fn warn_cut_last_row(e: &ReadError) {
    if let ReadError::BadRow { path, line, .. } = e {
        eprintln!(
            "msmemscope: warning: {}:{line}: the last row is cut off (the writing stopped inside \
             it: {}); it is left out, the rows before it are read",
            path.display(),
            super::run_end::cut_row_cause(path)
        );
    }
}

/// A CSV reader that ends, with one warning, at a cut-off last row instead of refusing the
/// file.
struct CutTail<R> {
    inner: R,
    path: PathBuf,
    ended: bool,
}

impl Iterator for CutTail<CsvRows> {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        match self.inner.next()? {
            Err(e) if is_cut_last_row(&self.path, &e) => {
                warn_cut_last_row(&e);
                self.ended = true;
                None
            }
            other => Some(other),
        }
    }
}

impl<R: RowSource> RowSource for CutTail<R> {
    fn next_row(&mut self) -> Result<Option<&EventRow>, ReadError> {
        if self.ended {
            return Ok(None);
        }
        if let Err(e) = self.inner.next_row() {
            if is_cut_last_row(&self.path, &e) {
                warn_cut_last_row(&e);
                self.ended = true;
                return Ok(None);
            }
            return Err(e);
        }
        Ok(self.inner.current())
    }

    fn current(&self) -> Option<&EventRow> {
        if self.ended {
            return None;
        }
        self.inner.current()
    }

    fn progress(&self) -> Option<Progress> {
        self.inner.progress()
    }
}

/// The rows of a dump (`.csv`, `.db` or `.parquet`, and the step parts a bounded run kept
/// beside it), in file order, through the fastest reader for its format: CSV dumps are parsed
/// on worker threads ([`super::scan`]).
pub fn open_rows(path: &Path) -> Result<Box<dyn RowSource>, ReadError> {
    let chain = Chain::of(path, open_rows_file)?;
    if chain.rest.is_empty() {
        return Ok(chain.current);
    }
    Ok(Box::new(chain))
}

/// [`open_rows`] of one file.
fn open_rows_file(path: &Path) -> Result<Box<dyn RowSource>, ReadError> {
    if let Some(rewritten) = super::original::normalize_if_original(path)? {
        return Ok(Box::new(Rewritten {
            inner: FastCsv::open(&rewritten.csv)?,
            _file: rewritten,
        }));
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some("db") | Some("parquet") => Ok(Box::new(Owned {
            rows: open_file(path)?,
            row: None,
        })),
        _ => Ok(Box::new(CutTail {
            inner: FastCsv::open(path)?,
            path: path.to_path_buf(),
            ended: false,
        })),
    }
}

/// A reader of the original tool's dump rewritten as ours ([`super::original`]): the
/// rewritten file lives as long as its reader.
struct Rewritten<R> {
    inner: R,
    _file: super::original::Normalized,
}

impl<R: Iterator<Item = Result<EventRow, ReadError>>> Iterator for Rewritten<R> {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next()
    }
}

impl<R: RowSource> RowSource for Rewritten<R> {
    fn next_row(&mut self) -> Result<Option<&EventRow>, ReadError> {
        self.inner.next_row()
    }

    fn current(&self) -> Option<&EventRow> {
        self.inner.current()
    }

    fn progress(&self) -> Option<Progress> {
        self.inner.progress()
    }
}

/// A [`RowSource`] over an iterator of owned rows.
struct Owned {
    rows: Box<dyn Iterator<Item = Result<EventRow, ReadError>> + Send>,
    row: Option<EventRow>,
}

impl RowSource for Owned {
    fn next_row(&mut self) -> Result<Option<&EventRow>, ReadError> {
        self.row = None;
        match self.rows.next() {
            Some(Ok(row)) => Ok(Some(&*self.row.insert(row))),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    fn current(&self) -> Option<&EventRow> {
        self.row.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::attrs::{decimal, hexadecimal, numeric_attr_index};
    use crate::events::csv::{write_row, HEADER};
    use crate::events::fields::parse_fields_into;
    use crate::events::{DeviceId, Event, EventType};

    fn temp(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("msmemscope-reader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn numbers_known_from_the_check_answer_only_for_their_text() {
        let fields = |attrs: &'static str| {
            [
                "7", "MALLOC", "PTA", "N/A", "5", "1", "1", "cpu", "0x10", attrs, "", "",
            ]
            .into_iter()
        };
        let mut row = EventRow::new(Event::Free, EventType::Pta, "");
        parse_fields_into(&mut row, fields(r#"{"size":5,"used":70}"#), &mut Vec::new()).unwrap();
        assert_eq!(row.attr_u64("size"), Some(5));
        assert_eq!(row.attr_u64("used"), Some(70));
        assert_eq!(row.attr_u64("total"), None);
        // The row's memory is reused for the next: same length, other values.
        parse_fields_into(&mut row, fields(r#"{"size":6,"used":71}"#), &mut Vec::new()).unwrap();
        assert_eq!(
            (row.attr_u64("size"), row.attr_u64("used")),
            (Some(6), Some(71))
        );
        // Escapes are the full check's: nothing known, the text is read.
        let escaped = r#"{"size":8,"owner":"a\"b"}"#;
        parse_fields_into(&mut row, fields(escaped), &mut Vec::new()).unwrap();
        assert_eq!(row.attr_u64("size"), Some(8));
        // A text put in place of the one read is read, not answered from what was known.
        row.attrs_json = Some(r#"{"size":9,"used":72}"#.into());
        assert_eq!(row.attr_u64("size"), Some(9));
    }

    #[test]
    fn numeric_attr_indices_follow_the_list() {
        for (i, key) in NUMERIC_ATTRS.iter().enumerate() {
            assert_eq!(numeric_attr_index(key), Some(i));
        }
        assert_eq!(numeric_attr_index("owner"), None);
    }

    #[test]
    fn numbers_read_as_the_standard_parsers_read_them() {
        for text in [
            "",
            "0",
            "+7",
            "-1",
            "++1",
            "12a",
            "18446744073709551615",
            "18446744073709551616",
            "00042",
            " 1",
            "+",
            "1700000000000000137",
            "9999999999999999999",
            "99999999999999999999",
            "+9999999999999999999",
            "000000000000000000000000001",
            "999999999999999999a",
        ] {
            assert_eq!(decimal(text), text.parse::<u64>().ok(), "{text:?}");
        }
        for text in [
            "",
            "0",
            "ff",
            "FF",
            "+1",
            "-1",
            "g",
            "ffffffffffffffff",
            "10000000000000000",
            "000000000000000001",
        ] {
            let standard = (!text.starts_with(['+', '-']))
                .then(|| u64::from_str_radix(text, 16).ok())
                .flatten();
            assert_eq!(hexadecimal(text), standard, "{text:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_numbers_read_as_the_standard_parsers_read_them(
            text in "[+0-9a-fA-F:/ ]{0,24}",
            n in proptest::prelude::any::<u64>(),
            width in 0usize..24,
        ) {
            proptest::prop_assert_eq!(decimal(&text), text.parse::<u64>().ok(), "{:?}", text);
            let written = format!("{n:0width$}");
            proptest::prop_assert_eq!(decimal(&written), Some(n));
            let hex_standard = (!text.starts_with(['+', '-']))
                .then(|| u64::from_str_radix(&text, 16).ok())
                .flatten();
            proptest::prop_assert_eq!(hexadecimal(&text), hex_standard, "{:?}", text);
            proptest::prop_assert_eq!(hexadecimal(&format!("{n:0width$x}")), Some(n));
            proptest::prop_assert_eq!(hexadecimal(&format!("{n:016X}")), Some(n));
        }

        /// Sixteen digits, a Ptr's width, are read a word at a time: mostly hex digits, some
        /// bytes next to the digit and letter ranges, and non-ASCII.
        #[test]
        fn sixteen_hex_digits_read_as_the_standard_parser_reads_them(
            text in "([0-9a-fA-F]{1,4}|[/:@G`g\x7f é+]){1,16}",
        ) {
            let sixteen: String = text.chars().take(16).collect();
            let standard = (!sixteen.starts_with(['+', '-']))
                .then(|| u64::from_str_radix(&sixteen, 16).ok())
                .flatten();
            proptest::prop_assert_eq!(hexadecimal(&sixteen), standard, "{:?}", sixteen);
        }
    }

    #[test]
    fn round_trips_written_rows() {
        let mut a = EventRow::new(Event::Malloc, EventType::Pta, "");
        a.id = 1;
        a.ts_ns = 5;
        a.device = DeviceId::Cpu;
        a.ptr = Some(0x1000);
        a.attrs.insert("size".into(), 64.into());
        a.python_stack = "a.py(1): f\nb.py(2): \"g\"".into();
        let mut b = EventRow::new(Event::OpLaunch, EventType::AtenStart, "aten::add.Tensor");
        b.id = 2;
        let mut text = format!("{HEADER}\n");
        write_row(&mut text, &a);
        write_row(&mut text, &b);
        let mut rows: Vec<EventRow> = open(&temp("ok.csv", &text))
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        rows[0].parse_attrs();
        assert_eq!(rows, vec![a, b]);
    }

    #[test]
    fn errors_name_file_and_line() {
        let missing = open(Path::new("/nonexistent/x.csv"))
            .err()
            .unwrap()
            .to_string();
        assert_eq!(missing, "/nonexistent/x.csv: no such file");
        let path = temp("bad.csv", &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,0x10,{{}},,\n2,BOGUS,PTA,N/A,5,1,1,cpu,0x10,{{}},,\n"));
        let results: Vec<_> = open(&path).unwrap().collect();
        assert!(results[0].is_ok());
        let err = results[1].as_ref().unwrap_err().to_string();
        assert!(
            err.ends_with("bad.csv:3: malformed row: unknown Event \"BOGUS\""),
            "{err}"
        );
        let path = temp("nohdr.csv", "a,b\n");
        assert!(open(&path)
            .err()
            .unwrap()
            .to_string()
            .contains("not a memscope dump"));
    }

    /// Removes the test's large files, which would otherwise pile up in the temporary directory.
    fn remove(paths: &[&Path]) {
        for path in paths {
            let _ = std::fs::remove_file(path);
        }
    }

    /// The first error of a dump, as its message.
    fn first_error(path: &Path) -> String {
        match open(path) {
            Err(e) => e.to_string(),
            Ok(rows) => rows
                .filter_map(Result::err)
                .next()
                .map(|e| e.to_string())
                .unwrap_or_default(),
        }
    }

    const MALLOC: &str = "2,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{\"\"size\"\":64}\",,";

    #[test]
    fn a_line_without_end_is_refused_at_the_cap() {
        let path = temp(
            "sparse.csv",
            &format!("{HEADER}\n1,MSTX,Mark,a,5,1,1,N/A,N/A,{{}},,\n"),
        );
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(3 << 30).unwrap();
        drop(file);
        let err = first_error(&path);
        assert_eq!(
            err,
            format!(
                "{}:3: row 2 is longer than 16777216 bytes: not a memscope dump",
                path.display()
            )
        );
        remove(&[&path]);
        // A header that long is no header.
        let path = temp("sparse_header.csv", "");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        assert_eq!(
            first_error(&path),
            format!(
                "{}: not a memscope dump: its first line is longer than 16777216 bytes",
                path.display()
            )
        );
        remove(&[&path]);
        // A quoted field that never closes is capped the same way, across lines.
        let mut text = format!("{HEADER}\n1,MSTX,Mark,\"a");
        text.push_str(&"\n".repeat(MAX_ROW_BYTES));
        let path = temp("open_quote.csv", &text);
        assert!(
            first_error(&path)
                .ends_with(":2: row 1 is longer than 16777216 bytes: not a memscope dump"),
            "{}",
            first_error(&path)
        );
        remove(&[&path]);
        // A row of exactly the cap, its line end included, is read; one byte more is not.
        let stack = MAX_ROW_BYTES - MALLOC.len() - 1;
        let long = format!("{MALLOC}{}\n", "x".repeat(stack));
        let path = temp("at_cap.csv", &format!("{HEADER}\n{long}"));
        let row = open(&path).unwrap().next().unwrap().unwrap();
        assert_eq!(row.c_stack.len(), stack);
        remove(&[&path]);
        let long = format!("{MALLOC}{}\n", "x".repeat(stack + 1));
        let path = temp("over_cap.csv", &format!("{HEADER}\n{long}"));
        assert!(first_error(&path)
            .ends_with(":2: row 1 is longer than 16777216 bytes: not a memscope dump"));
        remove(&[&path]);
    }

    #[test]
    fn non_regular_files_are_refused() {
        let dir = temp("x", "").parent().unwrap().to_path_buf();
        let fifo = dir.join("fifo.csv");
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for name in ["fifo.csv", "fifo.db"] {
            let path = dir.join(name);
            if name.ends_with(".db") {
                let _ = std::fs::remove_file(&path);
                std::os::unix::fs::symlink(&fifo, &path).unwrap();
            }
            assert_eq!(
                first_error(&path),
                format!(
                    "{}: not a memscope dump: a FIFO, not a regular file",
                    path.display()
                )
            );
        }
        let zero = dir.join("zero.csv");
        let _ = std::fs::remove_file(&zero);
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert_eq!(
            first_error(&zero),
            format!(
                "{}: not a memscope dump: a character device, not a regular file",
                zero.display()
            )
        );
        assert_eq!(
            first_error(&dir),
            format!(
                "{}: not a memscope dump: a directory, not a regular file",
                dir.display()
            )
        );
    }

    #[test]
    fn values_that_do_not_fit_are_refused() {
        let cases = [
            (
                r#"{""size"":18446744073709551616}"#,
                r#"Attr "size" is not an integer from 0 to 18446744073709551615: "18446744073709551616""#,
            ),
            (
                r#"{""size"":-1}"#,
                r#"Attr "size" is not an integer from 0 to 18446744073709551615: "-1""#,
            ),
            (
                r#"{""used"":1.5}"#,
                r#"Attr "used" is not an integer from 0 to 18446744073709551615: "1.5""#,
            ),
            (
                r#"{""total"":""7""}"#,
                r#"Attr "total" is not an integer from 0 to 18446744073709551615: "\"7\"""#,
            ),
            (
                r#"{""size"":1,""size"":2}"#,
                r#"Attr "size" is given twice"#,
            ),
            (
                r#"{""si\u007ae"":1}"#,
                r#"Attr "size" is written with escapes"#,
            ),
            (
                r#"{""size"":1"#,
                r#"Attr is not a JSON object (EOF while parsing an object at line 1 column 9): "{\"size\":1""#,
            ),
            (
                r#"{""size"":1}x"#,
                r#"Attr is not a JSON object (trailing characters at line 1 column 11): "{\"size\":1}x""#,
            ),
        ];
        for (attr, reason) in cases {
            let path = temp(
                "overflow.csv",
                &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{attr}\",,\n"),
            );
            assert_eq!(
                first_error(&path),
                format!("{}:2: malformed row: {reason}", path.display())
            );
        }
        // The largest value, and keys that are not counted, are fine.
        let path = temp("max.csv", &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,0x10,\"{{\"\"size\"\":18446744073709551615,\"\"owner\"\":-1.5}}\",,\n"));
        let row = open(&path).unwrap().next().unwrap().unwrap();
        assert_eq!(row.attr_u64("size"), Some(u64::MAX));
        for (ptr, reason) in [
            ("0x", "bad Ptr \"0x\""),
            ("0x+1", "bad Ptr \"0x+1\""),
            ("0x10000000000000000", "bad Ptr \"0x10000000000000000\""),
        ] {
            let path = temp(
                "ptr.csv",
                &format!("{HEADER}\n1,MALLOC,PTA,N/A,5,1,1,cpu,{ptr},{{}},,\n"),
            );
            assert_eq!(
                first_error(&path),
                format!("{}:2: malformed row: {reason}", path.display())
            );
        }
    }

    #[test]
    fn ids_must_ascend() {
        let row = |id: u64| format!("{id},MSTX,Mark,a,5,1,1,N/A,N/A,{{}},,\n");
        let path = temp(
            "dup.csv",
            &format!("{HEADER}\n{}{}{}", row(1), row(2), row(2)),
        );
        assert_eq!(
            first_error(&path),
            format!(
                "{}:4: malformed row: ID 2 repeats the previous row's ID",
                path.display()
            )
        );
        let path = temp(
            "order.csv",
            &format!("{HEADER}\n{}{}{}", row(1), row(3), row(2)),
        );
        assert_eq!(
            first_error(&path),
            format!(
                "{}:4: malformed row: ID 2 comes after ID 3: rows must be in ascending ID order",
                path.display()
            )
        );
        // The iterator stops at its first error.
        let path = temp(
            "stop.csv",
            &format!("{HEADER}\n{}{}{}", row(2), row(1), row(3)),
        );
        assert_eq!(open(&path).unwrap().count(), 2);
    }

    fn db(name: &str, schema: &str, rows: &[&[rusqlite::types::Value]]) -> PathBuf {
        let path = temp(name, "");
        std::fs::remove_file(&path).unwrap();
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(schema).unwrap();
        for row in rows {
            let marks = vec!["?"; row.len()].join(",");
            conn.execute(
                &format!("INSERT INTO memscope_dump VALUES ({marks})"),
                rusqlite::params_from_iter(row.iter()),
            )
            .unwrap();
        }
        path
    }

    fn db_row(id: i64, attr: &str, stack: rusqlite::types::Value) -> Vec<rusqlite::types::Value> {
        use rusqlite::types::Value;
        let t = |s: &str| Value::Text(s.into());
        vec![
            Value::Integer(id),
            t("MALLOC"),
            t("PTA"),
            t("N/A"),
            Value::Integer(5),
            Value::Integer(1),
            Value::Integer(1),
            t("cpu"),
            t("0x10"),
            t(attr),
            stack,
            t(""),
        ]
    }

    const LOOSE: &str = "CREATE TABLE memscope_dump (\"ID\", \"Event\", \"Event Type\", \"Name\", \"Timestamp(ns)\", \"Process Id\", \"Thread Id\", \"Device Id\", \"Ptr\", \"Attr\", \"Call Stack(Python)\", \"Call Stack(C)\")";

    #[test]
    fn sqlite_dumps_are_checked_like_csv() {
        use rusqlite::types::Value;
        let path = db(
            "schema.db",
            "CREATE TABLE memscope_dump (\"ID\" INTEGER, \"Event\" TEXT)",
            &[],
        );
        assert_eq!(
            first_error(&path),
            format!(
                "{}: not a memscope dump: table memscope_dump lacks column \"Event Type\"",
                path.display()
            )
        );
        let path = db("none.db", "CREATE TABLE other (a)", &[]);
        assert_eq!(
            first_error(&path),
            format!(
                "{}: not a memscope dump: no table memscope_dump",
                path.display()
            )
        );
        let path = temp("text.db", &format!("{HEADER}\n"));
        assert_eq!(
            first_error(&path),
            format!(
                "{}: not a memscope dump: not an SQLite database",
                path.display()
            )
        );

        let big = "{\"size\":18446744073709551616}";
        let path = db(
            "overflow.db",
            crate::events::sqlite::write::CREATE_TABLE,
            &[&db_row(1, big, Value::Null)],
        );
        assert_eq!(
            first_error(&path),
            format!("{}:1: malformed row: Attr \"size\" is not an integer from 0 to 18446744073709551615: \"18446744073709551616\"", path.display())
        );
        let path = db(
            "utf8.db",
            LOOSE,
            &[
                &db_row(1, "{}", Value::Null),
                &db_row(2, "{}", Value::Text(String::new())),
            ],
        );
        {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.execute(
                "UPDATE memscope_dump SET \"Name\" = CAST(x'ff00' AS TEXT) WHERE \"ID\" = 2",
                [],
            )
            .unwrap();
        }
        assert_eq!(
            first_error(&path),
            format!("{}:2: malformed row: Name is not UTF-8", path.display())
        );
        let path = db(
            "blob.db",
            LOOSE,
            &[&db_row(7, "{}", Value::Blob(vec![1, 2]))],
        );
        assert_eq!(
            first_error(&path),
            format!(
                "{}:7: malformed row: Call Stack(Python) is a BLOB, not text",
                path.display()
            )
        );

        // A value over the cap is refused by SQLite before it is loaded.
        let huge = Value::Text("x".repeat(MAX_ROW_BYTES + 1));
        let path = db(
            "long.db",
            crate::events::sqlite::write::CREATE_TABLE,
            &[&db_row(1, "{}", Value::Null), &db_row(2, "{}", huge)],
        );
        assert_eq!(
            first_error(&path),
            format!(
                "{}: row 2 is longer than 16777216 bytes: not a memscope dump",
                path.display()
            )
        );
        remove(&[&path]);
        // So is a row whose values add up past it.
        let half = || Value::Text("x".repeat(MAX_ROW_BYTES / 2 + 1));
        let mut row = db_row(1, "{}", half());
        row[11] = half();
        let path = db(
            "sum.db",
            crate::events::sqlite::write::CREATE_TABLE,
            &[&row],
        );
        assert_eq!(
            first_error(&path),
            format!(
                "{}: row 1 is longer than 16777216 bytes: not a memscope dump",
                path.display()
            )
        );
        remove(&[&path]);
    }

    #[test]
    fn sqlite_repeats_are_found_across_pages() {
        use rusqlite::types::Value;
        // Two 5 MiB rows end a page (PAGE_BYTES); the repeat of the second starts the next.
        let stack = || Value::Text("x".repeat(5 << 20));
        let rows = [
            db_row(1, "{}", stack()),
            db_row(2, "{}", stack()),
            db_row(2, "{}", Value::Null),
            db_row(3, "{}", Value::Null),
        ];
        let refs: Vec<&[Value]> = rows.iter().map(Vec::as_slice).collect();
        let path = db("repeat.db", LOOSE, &refs);
        assert_eq!(
            first_error(&path),
            format!(
                "{}:2: malformed row: ID 2 repeats the previous row's ID",
                path.display()
            )
        );
        remove(&[&path]);
        // Without the repeat every row is read once, in ID order.
        let rows = [
            db_row(3, "{}", stack()),
            db_row(1, "{}", stack()),
            db_row(2, "{}", stack()),
            db_row(4, "{}", Value::Null),
        ];
        let refs: Vec<&[Value]> = rows.iter().map(Vec::as_slice).collect();
        let path = db("pages.db", LOOSE, &refs);
        let ids: Vec<u64> = open(&path).unwrap().map(|r| r.unwrap().id).collect();
        assert_eq!(ids, [1, 2, 3, 4]);
        remove(&[&path]);
    }
}
