//! The SQLite reader: table `memscope_dump`, keyset-paginated by ID.

use std::path::{Path, PathBuf};

use crate::events::fields::parse_fields;
use crate::events::row::EventRow;
use crate::events::row::HEADER;
use crate::events::source::{one_line, open_regular, IdOrder, ReadError, MAX_ROW_BYTES};

/// Streams rows from a SQLite dump, in ID order.
pub struct DbRows {
    path: PathBuf,
    conn: rusqlite::Connection,
    /// Rows fetched and not yet handed out; a page ends at its first bad row.
    page: std::collections::VecDeque<Fetched>,
    /// The ID of the last row fetched, as stored (the next page starts there).
    last_id: Option<rusqlite::types::Value>,
    /// Rows handed out so far.
    rows: u64,
    order: IdOrder,
    done: bool,
}

/// One row of a page: its 12 values as text, or why it is unusable.
enum Fetched {
    Row(Vec<String>),
    /// The row's ID where it is a number, and what is wrong.
    Bad(Option<u64>, String),
    TooLong,
    Failed(ReadError),
}

/// Rows per page, and the bytes after which a page ends early: keyset pagination keeps
/// memory bounded by what a page holds.
const PAGE: i64 = 50_000;
const PAGE_BYTES: usize = 8 << 20;

/// The columns read, in the CSV's order: the header's names.
fn select_columns() -> String {
    HEADER
        .split(',')
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

impl DbRows {
    pub fn open(path: &Path) -> Result<DbRows, ReadError> {
        // SQLite would open a FIFO and block in it.
        drop(open_regular(path)?);
        let conn =
            rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .map_err(|e| sqlite_error(path, e))?;
        // SQLite then refuses (SQLITE_TOOBIG) to load any longer value, instead of allocating
        // it: a damaged or hostile file cannot make a row cost more than the cap.
        // SAFETY: the handle is this open connection's; sqlite3_limit only sets a number.
        unsafe {
            rusqlite::ffi::sqlite3_limit(
                conn.handle(),
                rusqlite::ffi::SQLITE_LIMIT_LENGTH,
                MAX_ROW_BYTES as i32,
            );
        }
        let not_a_dump = |reason: String| ReadError::NotADump {
            path: path.to_path_buf(),
            reason,
        };
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master \
                 WHERE name = 'memscope_dump' AND type IN ('table', 'view')",
                [],
                |r| r.get(0),
            )
            .map_err(|e| sqlite_error(path, e))?;
        if tables != 1 {
            return Err(not_a_dump("no table memscope_dump".into()));
        }
        let columns: Vec<String> = conn
            .prepare("SELECT name FROM pragma_table_info('memscope_dump')")
            .and_then(|mut s| {
                s.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<_, _>>()
            })
            .map_err(|e| sqlite_error(path, e))?;
        // SQLite matches column names without regard to ASCII case, and so does the query.
        if let Some(missing) = HEADER
            .split(',')
            .find(|c| !columns.iter().any(|have| have.eq_ignore_ascii_case(c)))
        {
            return Err(not_a_dump(format!(
                "table memscope_dump lacks column \"{missing}\""
            )));
        }
        Ok(DbRows {
            path: path.to_path_buf(),
            conn,
            page: Default::default(),
            last_id: None,
            rows: 0,
            order: IdOrder::default(),
            done: false,
        })
    }

    /// The next page, keyset-paginated by ID. A page starts at the last ID fetched, inclusive,
    /// and skips that one row: a second row with the same ID is then read, not jumped over,
    /// and refused as a repeat.
    fn fetch(&mut self) {
        let columns = select_columns();
        let (sql, params) = match &self.last_id {
            Some(last) => (
                format!(
                    "SELECT {columns} FROM memscope_dump WHERE \"ID\" >= ?1 ORDER BY \"ID\" LIMIT ?2"
                ),
                vec![last.clone(), rusqlite::types::Value::Integer(PAGE + 1)],
            ),
            None => (
                format!("SELECT {columns} FROM memscope_dump ORDER BY \"ID\" LIMIT ?1"),
                vec![rusqlite::types::Value::Integer(PAGE)],
            ),
        };
        let failed = |e| Fetched::Failed(sqlite_error(&self.path, e));
        let mut statement = match self.conn.prepare_cached(&sql) {
            Ok(s) => s,
            Err(e) => return self.page.push_back(failed(e)),
        };
        let mut rows = match statement.query(rusqlite::params_from_iter(params)) {
            Ok(rows) => rows,
            Err(e) => return self.page.push_back(failed(e)),
        };
        let mut skip = self.last_id.clone();
        let mut bytes = 0;
        let mut page = std::collections::VecDeque::new();
        loop {
            let row = match rows.next() {
                Ok(Some(row)) => row,
                Ok(None) => break,
                Err(e) if is_too_big(&e) => {
                    page.push_back(Fetched::TooLong);
                    break;
                }
                Err(e) => {
                    page.push_back(failed(e));
                    break;
                }
            };
            let id = match row.get_ref(0) {
                Ok(v) => stored_value(v),
                Err(e) => {
                    page.push_back(failed(e));
                    break;
                }
            };
            if skip.take().is_some_and(|last| Some(last) == id) {
                continue;
            }
            let fetched = read_values(row).map_err(|f| match f {
                Fetched::Bad(_, reason) => Fetched::Bad(id.as_ref().and_then(id_number), reason),
                f => f,
            });
            // A row without an ID to resume from is refused when handed out: nothing after
            // it is needed, and the next page could not start past it.
            let stop = fetched.is_err() || id.is_none();
            match fetched {
                Ok((values, len)) => {
                    bytes += len;
                    page.push_back(Fetched::Row(values));
                }
                Err(f) => page.push_back(f),
            }
            if stop {
                break;
            }
            self.last_id = id;
            if bytes >= PAGE_BYTES {
                break;
            }
        }
        self.page = page;
    }
}

/// A row's values as the CSV's text, and their total length.
fn read_values(row: &rusqlite::Row) -> Result<(Vec<String>, usize), Fetched> {
    use rusqlite::types::ValueRef;
    let mut values = Vec::with_capacity(12);
    let mut len = 0;
    for (i, column) in HEADER.split(',').enumerate() {
        let value = match row.get_ref(i) {
            Ok(v) => v,
            Err(e) if is_too_big(&e) => return Err(Fetched::TooLong),
            Err(e) => {
                return Err(Fetched::Bad(
                    None,
                    format!("{column}: {}", one_line(&e.to_string())),
                ))
            }
        };
        let text = match value {
            ValueRef::Null => String::new(),
            ValueRef::Integer(n) => n.to_string(),
            ValueRef::Real(f) => f.to_string(),
            ValueRef::Text(t) => match std::str::from_utf8(t) {
                Ok(t) => t.to_owned(),
                Err(_) => return Err(Fetched::Bad(None, format!("{column} is not UTF-8"))),
            },
            ValueRef::Blob(_) => {
                return Err(Fetched::Bad(None, format!("{column} is a BLOB, not text")))
            }
        };
        len += text.len();
        if len > MAX_ROW_BYTES {
            return Err(Fetched::TooLong);
        }
        values.push(text);
    }
    Ok((values, len))
}

/// An ID as stored, to start the next page at; `None` for one no page could start at (it is
/// refused as not a number anyway).
fn stored_value(v: rusqlite::types::ValueRef) -> Option<rusqlite::types::Value> {
    use rusqlite::types::{Value, ValueRef};
    match v {
        ValueRef::Integer(n) => Some(Value::Integer(n)),
        ValueRef::Real(f) => Some(Value::Real(f)),
        ValueRef::Text(t) => std::str::from_utf8(t).ok().map(|t| Value::Text(t.into())),
        ValueRef::Null | ValueRef::Blob(_) => None,
    }
}

fn id_number(v: &rusqlite::types::Value) -> Option<u64> {
    match v {
        rusqlite::types::Value::Integer(n) => u64::try_from(*n).ok(),
        rusqlite::types::Value::Text(t) => t.parse().ok(),
        _ => None,
    }
}

fn is_too_big(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::TooBig)
}

/// A damaged file or one that is not SQLite is bad input; anything else (permissions, locks,
/// the disk) is an I/O failure.
fn sqlite_error(path: &Path, e: rusqlite::Error) -> ReadError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => ReadError::NotADump {
            path: path.to_path_buf(),
            reason: "not an SQLite database".into(),
        },
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => ReadError::NotADump {
            path: path.to_path_buf(),
            reason: format!("a damaged SQLite database ({})", one_line(&e.to_string())),
        },
        _ => ReadError::Io {
            path: path.to_path_buf(),
            message: one_line(&e.to_string()),
        },
    }
}

impl Iterator for DbRows {
    type Item = Result<EventRow, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.page.is_empty() {
            self.fetch();
        }
        let Some(fetched) = self.page.pop_front() else {
            self.done = true;
            return None;
        };
        self.rows += 1;
        let position = self.rows;
        let bad = |line: u64, reason: String| ReadError::BadRow {
            path: self.path.clone(),
            line,
            reason,
        };
        let item = match fetched {
            Fetched::Row(values) => {
                let line = values[0].parse().unwrap_or(position);
                parse_fields(values.iter().map(String::as_str))
                    .and_then(|row| self.order.check(row.id).map(|_| row))
                    .map_err(|reason| bad(line, reason))
            }
            Fetched::Bad(id, reason) => Err(bad(id.unwrap_or(position), reason)),
            Fetched::TooLong => Err(ReadError::RowTooLong {
                path: self.path.clone(),
                line: None,
                row: position,
            }),
            Fetched::Failed(e) => Err(e),
        };
        self.done = item.is_err();
        Some(item)
    }
}
