//! Reading a dump back, row by row: the offline analyses stream their input, so memory grows
//! with what an analysis keeps (live blocks), never with the file.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use super::csv::HEADER;
use super::row::{DeviceId, Event, EventRow, EventType};

/// Why a dump cannot be read. Every message names the file, and the line for a bad row.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: no such file")]
    Missing { path: PathBuf },
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("{path}: not a memscope dump: {reason}")]
    NotADump { path: PathBuf, reason: String },
    #[error("{path}:{line}: malformed row: {reason}")]
    BadRow {
        path: PathBuf,
        line: u64,
        reason: String,
    },
}

/// The rows of a dump file (`.csv` or `.db`), in file order.
pub fn open(
    path: &Path,
) -> Result<Box<dyn Iterator<Item = Result<EventRow, ReadError>>>, ReadError> {
    if !path.exists() {
        return Err(ReadError::Missing {
            path: path.to_path_buf(),
        });
    }
    match path.extension().and_then(|e| e.to_str()) {
        Some("db") => Ok(Box::new(DbRows::open(path)?)),
        _ => Ok(Box::new(CsvRows::open(path)?)),
    }
}

/// Streams rows from a CSV dump (RFC 4180; quoted fields may span lines). Byte-oriented: a
/// record is read whole, split at commas with `memchr` when it has no quotes (most rows), and
/// unquoted field by field otherwise; Attr stays raw text until an analysis reads a value.
pub struct CsvRows {
    path: PathBuf,
    input: std::io::BufReader<std::fs::File>,
    line: u64,
    /// The current record's bytes (possibly several lines).
    raw: Vec<u8>,
    /// The current record's text after unquoting, and each field's range in it.
    text: String,
    fields: Vec<std::ops::Range<usize>>,
}

impl CsvRows {
    pub fn open(path: &Path) -> Result<CsvRows, ReadError> {
        let file = std::fs::File::open(path).map_err(|e| ReadError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let mut rows = CsvRows {
            path: path.to_path_buf(),
            input: std::io::BufReader::with_capacity(1 << 20, file),
            line: 0,
            raw: Vec::with_capacity(256),
            text: String::with_capacity(256),
            fields: Vec::with_capacity(12),
        };
        match rows.next_record() {
            Ok(true) if rows.field_strs().collect::<Vec<_>>().join(",") == HEADER => Ok(rows),
            Ok(true) => Err(ReadError::NotADump {
                path: path.to_path_buf(),
                reason: format!("the header is not {HEADER}"),
            }),
            Ok(false) => Err(ReadError::NotADump {
                path: path.to_path_buf(),
                reason: "the file is empty".into(),
            }),
            Err(e) => Err(e),
        }
    }

    fn field_strs(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|r| &self.text[r.clone()])
    }

    /// Reads the next record; false at the end.
    fn next_record(&mut self) -> Result<bool, ReadError> {
        self.raw.clear();
        let mut quotes = 0usize;
        loop {
            let start = self.raw.len();
            let n = self
                .input
                .read_until(b'\n', &mut self.raw)
                .map_err(|e| ReadError::Io {
                    path: self.path.clone(),
                    message: e.to_string(),
                })?;
            if n == 0 {
                if self.raw.is_empty() {
                    return Ok(false);
                }
                if !quotes.is_multiple_of(2) {
                    return Err(self.bad("a quoted field is not closed"));
                }
                break;
            }
            self.line += 1;
            quotes += memchr::memchr_iter(b'"', &self.raw[start..]).count();
            // An odd number of quotes so far: a quoted field goes on on the next line.
            if quotes.is_multiple_of(2) {
                break;
            }
        }
        while matches!(self.raw.last(), Some(b'\n' | b'\r')) {
            self.raw.pop();
        }
        self.text.clear();
        self.fields.clear();
        let raw = std::str::from_utf8(&self.raw).map_err(|_| ReadError::BadRow {
            path: self.path.clone(),
            line: self.line,
            reason: "not UTF-8".into(),
        })?;
        if quotes == 0 {
            self.text.push_str(raw);
            let mut start = 0;
            for comma in memchr::memchr_iter(b',', raw.as_bytes()) {
                self.fields.push(start..comma);
                start = comma + 1;
            }
            self.fields.push(start..raw.len());
            return Ok(true);
        }
        // Quoted fields: copy the runs between quotes, undoubling `""`.
        let b = raw.as_bytes();
        let mut i = 0;
        loop {
            let start = self.text.len();
            if b.get(i) == Some(&b'"') {
                i += 1;
                loop {
                    let Some(q) = memchr::memchr(b'"', &b[i..]).map(|q| i + q) else {
                        return Err(self.bad("a quoted field is not closed"));
                    };
                    self.text.push_str(&raw[i..q]);
                    if b.get(q + 1) == Some(&b'"') {
                        self.text.push('"');
                        i = q + 2;
                    } else {
                        i = q + 1;
                        break;
                    }
                }
                // Anything between the closing quote and the comma is kept, as lenient readers do.
                let end = memchr::memchr(b',', &b[i..]).map_or(b.len(), |c| i + c);
                self.text.push_str(&raw[i..end]);
                i = end;
            } else {
                let end = memchr::memchr(b',', &b[i..]).map_or(b.len(), |c| i + c);
                self.text.push_str(&raw[i..end]);
                i = end;
            }
            self.fields.push(start..self.text.len());
            if i >= b.len() {
                break;
            }
            i += 1; // the comma
        }
        Ok(true)
    }

    fn bad(&self, reason: impl Into<String>) -> ReadError {
        ReadError::BadRow {
            path: self.path.clone(),
            line: self.line,
            reason: reason.into(),
        }
    }

    fn parse(&self) -> Result<EventRow, ReadError> {
        if self.fields.len() != 12 {
            return Err(self.bad(format!("{} fields, expected 12", self.fields.len())));
        }
        parse_fields(self.field_strs()).map_err(|reason| self.bad(reason))
    }
}

impl Iterator for CsvRows {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_record() {
            Ok(true) => Some(self.parse()),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// Builds a row from the 12 columns in order.
fn parse_fields<'a>(mut f: impl Iterator<Item = &'a str>) -> Result<EventRow, String> {
    let mut next = || f.next().unwrap_or("");
    let id = next()
        .parse::<u64>()
        .map_err(|_| "ID is not a number".to_string())?;
    let event_text = next();
    let event = Event::parse(event_text).ok_or_else(|| format!("unknown Event {event_text:?}"))?;
    let type_text = next();
    let event_type =
        EventType::parse(type_text).ok_or_else(|| format!("unknown Event Type {type_text:?}"))?;
    let name = next();
    let mut row = EventRow::new(event, event_type, if name == "N/A" { "" } else { name });
    row.id = id;
    row.ts_ns = next()
        .parse()
        .map_err(|_| "Timestamp(ns) is not a number".to_string())?;
    row.pid = next()
        .parse()
        .map_err(|_| "Process Id is not a number".to_string())?;
    row.tid = next()
        .parse()
        .map_err(|_| "Thread Id is not a number".to_string())?;
    let device = next();
    row.device = DeviceId::parse(device).ok_or_else(|| format!("bad Device Id {device:?}"))?;
    let ptr = next();
    row.ptr = match ptr {
        "N/A" | "" => None,
        p => Some(
            u64::from_str_radix(p.trim_start_matches("0x"), 16)
                .map_err(|_| format!("bad Ptr {p:?}"))?,
        ),
    };
    let attrs = next();
    if !attrs.is_empty() && attrs != "{}" {
        // Kept as text: analyses read single values with `attr_u64`/`attr_str`, and
        // `parse_attrs` builds the map for the rest.
        if !attrs.starts_with('{') || !attrs.ends_with('}') {
            return Err(format!("Attr is not a JSON object: {attrs}"));
        }
        row.attrs_json = Some(attrs.to_string());
    }
    row.python_stack = next().to_string();
    row.c_stack = next().to_string();
    Ok(row)
}

/// Streams rows from a SQLite dump, in ID order.
pub struct DbRows {
    path: PathBuf,
    rows: std::vec::IntoIter<Vec<String>>,
    conn: rusqlite::Connection,
    last_id: i64,
}

const PAGE: i64 = 50_000;

impl DbRows {
    pub fn open(path: &Path) -> Result<DbRows, ReadError> {
        let conn =
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|e| ReadError::Io {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?;
        let ok: Result<i64, _> = conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = 'memscope_dump'",
            [],
            |r| r.get(0),
        );
        if ok.ok() != Some(1) {
            return Err(ReadError::NotADump {
                path: path.to_path_buf(),
                reason: "no table memscope_dump".into(),
            });
        }
        Ok(DbRows {
            path: path.to_path_buf(),
            rows: Vec::new().into_iter(),
            conn,
            last_id: i64::MIN,
        })
    }

    /// The next page of rows (keyset pagination keeps memory bounded).
    fn fetch(&mut self) -> Result<(), ReadError> {
        let err = |e: rusqlite::Error| ReadError::Io {
            path: self.path.clone(),
            message: e.to_string(),
        };
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT * FROM memscope_dump WHERE \"ID\" > ?1 ORDER BY \"ID\" LIMIT ?2",
            )
            .map_err(err)?;
        let page: Vec<Vec<String>> = stmt
            .query_map(rusqlite::params![self.last_id, PAGE], |r| {
                (0..12)
                    .map(|i| {
                        let v: rusqlite::types::Value = r.get(i)?;
                        Ok(match v {
                            rusqlite::types::Value::Integer(n) => n.to_string(),
                            rusqlite::types::Value::Text(t) => t,
                            rusqlite::types::Value::Real(f) => f.to_string(),
                            _ => String::new(),
                        })
                    })
                    .collect()
            })
            .map_err(err)?
            .collect::<Result<_, _>>()
            .map_err(|e| ReadError::Io {
                path: self.path.clone(),
                message: e.to_string(),
            })?;
        if let Some(last) = page.last() {
            self.last_id = last[0].parse().unwrap_or(self.last_id);
        }
        self.rows = page.into_iter();
        Ok(())
    }
}

impl Iterator for DbRows {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut record = self.rows.next();
        if record.is_none() {
            if let Err(e) = self.fetch() {
                return Some(Err(e));
            }
            record = self.rows.next();
        }
        let record = record?;
        let id = record[0].clone();
        Some(
            parse_fields(record.iter().map(String::as_str)).map_err(|reason| ReadError::BadRow {
                path: self.path.clone(),
                line: id.parse().unwrap_or(0),
                reason,
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::csv::write_row;

    fn temp(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("msmemscope-reader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
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
}
