//! Dumps written by the original msMemScope (on Ascend, through torch_npu), read as ours.
//!
//! Its CSV has our header but not our rows: Attr is `{key:value,...}` without quotes (empty
//! for none), rows are written when a block's life ends (its MALLOC row beside its FREE,
//! START_TRACE and STOP_TRACE last), and its older "msleaks" files add their own spellings and
//! units (`acl init`, decimal Ptr, microseconds, `host` devices, several processes with IDs
//! restarting in each). Such a file is recognised by its first rows ([`dialect_of_csv`]); every
//! row is rewritten in our dialect and checked by our row parser ([`rewrite`]), and the rows
//! are put in order ([`order`]) into a CSV dump of ours in a private temporary directory, which
//! the ordinary readers then read. So every analysis sees the rows it would see in a dump of
//! ours, through the one implementation it has.
//!
//! A row that cannot be rewritten is left out with one warning line (up to
//! [`WARNED_ROWS`], then a count), as the original's own analyzers skip a row whose ID is not
//! an integer and go on. One note on stderr says which dialect was read and what was changed.
//!
//! Several processes in one file: each process's rows come in time order, one process after
//! the other, numbered anew. The analyses group rows by device; their live blocks are not kept
//! apart by process, so where two processes of one file use the same device index, a block one
//! of them leaves at an address the other uses later is matched with the other's rows.

mod attr;
mod order;
mod rewrite;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::source::{open_regular, ReadError, MAX_ROW_BYTES};
use rewrite::{Notes, Outcome, Traits};

/// The rows whose skipping is told line by line; the rest are counted.
pub const WARNED_ROWS: u64 = 20;

/// The rows looked at to tell the dialect.
const SNIFFED_ROWS: usize = 2000;
/// The bytes of a CSV file looked at to tell its dialect.
const SNIFFED_BYTES: usize = 1 << 20;

/// Our columns, in our order; the original's header has the same names.
const COLUMNS: [&str; 12] = [
    "ID",
    "Event",
    "Event Type",
    "Name",
    "Timestamp(ns)",
    "Process Id",
    "Thread Id",
    "Device Id",
    "Ptr",
    "Attr",
    "Call Stack(Python)",
    "Call Stack(C)",
];
/// Columns a file may lack (empty in every row then).
const OPTIONAL: [&str; 2] = ["Call Stack(Python)", "Call Stack(C)"];

/// A dump of the original tool's, rewritten as one of ours: read [`Normalized::csv`] with
/// the ordinary readers while this is alive (dropping it removes the directory).
pub struct Normalized {
    _dir: tempfile::TempDir,
    pub csv: PathBuf,
}

/// How a file's rows are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Ours,
    Original(Traits),
}

/// Where each of our columns is in the file's header.
struct Columns([Option<usize>; 12]);

impl Columns {
    fn of<'a>(header: impl Iterator<Item = &'a str>) -> Result<Columns, String> {
        let names: Vec<&str> = header.map(str::trim).collect();
        let mut at = [None; 12];
        for (slot, column) in at.iter_mut().zip(COLUMNS) {
            *slot = names.iter().position(|n| n.eq_ignore_ascii_case(column));
            if slot.is_none() && !OPTIONAL.contains(&column) {
                return Err(format!("the header has no column \"{column}\""));
            }
        }
        Ok(Columns(at))
    }

    /// The 12 fields of `record` in our order ("" for a column the file lacks).
    fn pick<'a>(&self, record: &'a [&'a str]) -> Option<[&'a str; 12]> {
        let mut fields = [""; 12];
        for (field, at) in fields.iter_mut().zip(self.0) {
            if let Some(i) = at {
                *field = record.get(i)?;
            }
        }
        Some(fields)
    }
}

/// Why a row tells that the file is the original's, if it does.
fn original_sign(fields: &[&str; 12]) -> bool {
    let attrs = fields[9].trim();
    // Ours writes `{}` for no Attr and quotes every key.
    let unquoted = attrs.is_empty()
        || attrs.strip_prefix('{').is_some_and(|rest| {
            let rest = rest.trim_start();
            !rest.is_empty() && !rest.starts_with('"') && !rest.starts_with('}')
        });
    unquoted
        || matches!(
            fields[2],
            "acl init"
                | "KERNEL_START"
                | "KERNEL_END"
                | "HOST_PINNED"
                | "PTA_WORKSPACE"
                | "ATB"
                | "MINDSPORE"
        )
        || fields[7] == "host"
}

/// Whether a row has the older format's marks.
fn old_sign(fields: &[&str; 12]) -> bool {
    let attrs = fields[9];
    fields[2] == "acl init"
        || (!fields[8].is_empty() && fields[8].bytes().all(|b| b.is_ascii_digit()))
        || attrs.contains("MID:")
        || attrs.contains("owner:,")
        || attrs.contains("owner:}")
}

/// The dialect of rows given as 12 fields each.
fn dialect_of<'a>(rows: impl Iterator<Item = [&'a str; 12]>) -> Dialect {
    let (mut original, mut old, mut max_ts) = (false, false, 0u64);
    for fields in rows {
        original |= original_sign(&fields);
        old |= old_sign(&fields);
        if let Ok(ts) = fields[4].trim().parse::<u64>() {
            max_ts = max_ts.max(ts);
        }
    }
    if !original {
        return Dialect::Ours;
    }
    // Microseconds since 1970 are below 10^17 until the year 5138; nanoseconds passed it in 1973.
    let micro = old && max_ts > 0 && max_ts < 100_000_000_000_000_000;
    Dialect::Original(Traits { old, micro })
}

fn not_a_dump(path: &Path, reason: String) -> ReadError {
    ReadError::NotADump {
        path: path.to_path_buf(),
        reason,
    }
}

/// The dialect of a CSV file, from its first rows.
fn dialect_of_csv(path: &Path) -> Result<Dialect, ReadError> {
    use std::io::Read;
    let file = open_regular(path)?;
    let mut head = Vec::with_capacity(SNIFFED_BYTES);
    file.take(SNIFFED_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(|e| ReadError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(head.as_slice());
    let Ok(header) = reader.headers() else {
        return Ok(Dialect::Ours);
    };
    let columns = match Columns::of(header.iter()) {
        Ok(columns) => columns,
        // A dump's header (ours or the original's) without one of the columns read: named.
        Err(reason)
            if ["ID", "Event"]
                .iter()
                .all(|c| header.iter().any(|h| h.trim() == *c)) =>
        {
            return Err(not_a_dump(
                path,
                format!("{reason} (a dump's header is {})", super::row::HEADER),
            ))
        }
        // No dump's header: our reader says what it should be.
        Err(_) => return Ok(Dialect::Ours),
    };
    let records: Vec<csv::StringRecord> = reader
        .records()
        .take(SNIFFED_ROWS)
        .map_while(Result::ok)
        .collect();
    let fields: Vec<Vec<&str>> = records.iter().map(|r| r.iter().collect()).collect();
    Ok(dialect_of(fields.iter().filter_map(|f| columns.pick(f))))
}

/// Tells rows left out, one line each up to [`WARNED_ROWS`].
struct Skipped<'a> {
    path: &'a Path,
    count: u64,
}

impl Skipped<'_> {
    fn row(&mut self, line: u64, reason: &str) {
        self.count += 1;
        if self.count <= WARNED_ROWS {
            eprintln!(
                "msmemscope: warning: {}:{line}: row left out: {reason}",
                self.path.display()
            );
        }
    }

    fn finish(&self) {
        if self.count > WARNED_ROWS {
            eprintln!(
                "msmemscope: warning: {}: {} more rows left out (not told one by one)",
                self.path.display(),
                self.count - WARNED_ROWS
            );
        }
    }
}

fn private_dir(path: &Path) -> Result<tempfile::TempDir, ReadError> {
    tempfile::Builder::new()
        .prefix("msmemscope-original-")
        .tempdir()
        .map_err(|e| ReadError::Io {
            path: path.to_path_buf(),
            message: format!(
                "cannot make a temporary directory to put the original dump's rows in order: {e}"
            ),
        })
}

/// The original tool's CSV or SQLite dump at `path`, rewritten as ours; `None` for a dump of
/// ours (or anything else: the ordinary readers then say what it is).
pub fn normalize_if_original(path: &Path) -> Result<Option<Normalized>, ReadError> {
    normalize_if_original_as(path, path)
}

/// [`normalize_if_original`], for a file read at `path` that the user knows as `shown` (a
/// path through a held directory descriptor): messages name `shown`.
pub fn normalize_if_original_as(
    path: &Path,
    shown: &Path,
) -> Result<Option<Normalized>, ReadError> {
    let named = |e: ReadError| rename(e, path, shown);
    match path.extension().and_then(|e| e.to_str()) {
        Some("db") => db::normalize_if_original(path, shown).map_err(named),
        Some("parquet") => Ok(None),
        _ => match dialect_of_csv(path).map_err(named)? {
            Dialect::Ours => Ok(None),
            Dialect::Original(traits) => {
                normalize_csv(path, shown, traits).map(Some).map_err(named)
            }
        },
    }
}

/// `e` with `shown` for `path`.
fn rename(e: ReadError, path: &Path, shown: &Path) -> ReadError {
    let fix = |p: PathBuf| if p == path { shown.to_path_buf() } else { p };
    match e {
        ReadError::Missing { path } => ReadError::Missing { path: fix(path) },
        ReadError::Io { path, message } => ReadError::Io {
            path: fix(path),
            message,
        },
        ReadError::NotADump { path, reason } => ReadError::NotADump {
            path: fix(path),
            reason,
        },
        ReadError::BadRow { path, line, reason } => ReadError::BadRow {
            path: fix(path),
            line,
            reason,
        },
        ReadError::RowTooLong { path, line, row } => ReadError::RowTooLong {
            path: fix(path),
            line,
            row,
        },
    }
}

fn normalize_csv(path: &Path, shown: &Path, traits: Traits) -> Result<Normalized, ReadError> {
    let io = |e: std::io::Error| ReadError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mut reader =
        csv::ReaderBuilder::new()
            .flexible(true)
            .from_reader(std::io::BufReader::with_capacity(
                1 << 20,
                open_regular(path)?,
            ));
    let header = reader
        .headers()
        .map_err(|e| not_a_dump(path, e.to_string()))?;
    let columns = Columns::of(header.iter()).map_err(|reason| not_a_dump(path, reason))?;
    let dir = private_dir(path)?;
    let mut sorter = order::Sorter::new(dir.path());
    let mut notes = Notes::default();
    let mut skipped = Skipped {
        path: shown,
        count: 0,
    };
    let mut record = csv::StringRecord::new();
    let mut data_rows = 0u64;
    loop {
        let line = reader.position().line();
        match reader.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => match e.kind() {
                csv::ErrorKind::Io(_) => return Err(io(e.into())),
                csv::ErrorKind::Utf8 { .. } => {
                    data_rows += 1;
                    skipped.row(line, "not UTF-8 text");
                    continue;
                }
                _ => {
                    data_rows += 1;
                    skipped.row(line, &e.to_string());
                    continue;
                }
            },
        }
        data_rows += 1;
        if record.as_slice().len() > MAX_ROW_BYTES {
            return Err(ReadError::RowTooLong {
                path: path.to_path_buf(),
                line: Some(line),
                row: data_rows,
            });
        }
        let fields: Vec<&str> = record.iter().collect();
        let Some(fields) = columns.pick(&fields) else {
            skipped.row(
                line,
                &format!("{} fields, the header has more", fields.len()),
            );
            continue;
        };
        match rewrite::rewrite(&fields, traits, &mut notes) {
            Ok(Outcome::Row(row)) => sorter.push(row).map_err(io)?,
            Ok(Outcome::Dropped) => {}
            Err(reason) => skipped.row(line, &reason),
        }
    }
    skipped.finish();
    finish(path, shown, dir, sorter, traits, &notes)
}

/// Writes the ordered dump and tells what was read, once per file in this process.
fn finish(
    path: &Path,
    shown: &Path,
    dir: tempfile::TempDir,
    sorter: order::Sorter,
    traits: Traits,
    notes: &Notes,
) -> Result<Normalized, ReadError> {
    let csv = dir.path().join("memscope_dump_rewritten.csv");
    let ordered = sorter.finish(&csv).map_err(|e| ReadError::Io {
        path: path.to_path_buf(),
        message: format!("cannot put the original dump's rows in order: {e}"),
    })?;
    static TOLD: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let mut told = TOLD.lock().unwrap_or_else(|e| e.into_inner());
    if told
        .get_or_insert_with(HashSet::new)
        .insert(shown.to_path_buf())
    {
        eprintln!(
            "msmemscope: note: {}: {}",
            shown.display(),
            summary(traits, notes, &ordered)
        );
    }
    Ok(Normalized { _dir: dir, csv })
}

/// The note: which dialect, and what was changed.
fn summary(traits: Traits, notes: &Notes, ordered: &order::Ordered) -> String {
    let mut said = vec![format!(
        "read as a dump of the original msMemScope ({} format): {} rows",
        if traits.old {
            "older, msleaks"
        } else {
            "current"
        },
        ordered.rows
    )];
    if notes.attr != Default::default() || notes.rows > 0 {
        said.push("Attr {key:value} read as JSON".into());
    }
    if notes.attr.empty_values > 0 {
        said.push(format!(
            "{} empty Attr values left out",
            notes.attr.empty_values
        ));
    }
    if notes.attr.negative_sizes > 0 {
        said.push(format!(
            "{} negative FREE sizes read as their magnitude",
            notes.attr.negative_sizes
        ));
    }
    for (what, n) in &notes.dropped {
        said.push(format!("{n} {what} left out"));
    }
    for ((theirs, ours), n) in &notes.renamed_types {
        said.push(format!("{n} {theirs} rows read as {ours}"));
    }
    if notes.op_names > 0 {
        said.push(format!(
            "{} op names torch._ops.NS.OP.OVERLOAD read as NS::OP",
            notes.op_names
        ));
    }
    if traits.micro {
        said.push("Timestamp(ns) read as microseconds".into());
    }
    if notes.decimal_ptrs > 0 {
        said.push(format!("{} decimal Ptr values", notes.decimal_ptrs));
    }
    if notes.host_devices > 0 {
        said.push(format!(
            "{} rows of device host read as cpu",
            notes.host_devices
        ));
    }
    if ordered.moved > 0 {
        said.push(format!(
            "{} rows out of time order put in place",
            ordered.moved
        ));
    }
    if ordered.processes.len() > 1 {
        let pids: Vec<String> = ordered.processes.iter().map(u32::to_string).collect();
        said.push(format!(
            "{} processes ({}), one after the other",
            pids.len(),
            pids.join(", ")
        ));
    }
    if !ordered.shared_devices.is_empty() {
        let devices: Vec<String> = ordered
            .shared_devices
            .iter()
            .map(|d| d.to_string())
            .collect();
        let (noun, verb) = match devices.len() {
            1 => ("device", "has"),
            _ => ("devices", "have"),
        };
        said.push(format!(
            "{noun} {} {verb} rows of more than one process: analysed per device, their \
             blocks are matched across those processes",
            devices.join(", ")
        ));
    }
    if ordered.renumbered {
        said.push("rows numbered anew in that order".into());
    }
    said.join("; ")
}

mod db;
