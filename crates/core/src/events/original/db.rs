//! The original tool's SQLite dump: table `memscope_dump` (its older versions: `leaks_dump`),
//! the CSV's columns, the same dialect.

use std::path::Path;

use rusqlite::types::ValueRef;

use super::order::Sorter;
use super::rewrite::{self, Notes, Outcome};
use super::{
    dialect_of, not_a_dump, private_dir, Columns, Dialect, Normalized, Skipped, COLUMNS,
    SNIFFED_ROWS,
};
use crate::events::source::{one_line, open_regular, ReadError, MAX_ROW_BYTES};

/// A dump's table.
struct Table {
    conn: rusqlite::Connection,
    name: &'static str,
    columns: Vec<String>,
    /// The name is the original's alone (`leaks_dump`).
    surely_original: bool,
}

/// What is done with each row read: its position and its 12 values (or why it has none).
type EachRow<'a> = dyn FnMut(u64, Result<[&str; 12], String>) -> Result<(), ReadError> + 'a;

/// The dump's table in `path`; `None` when the file has neither table or SQLite cannot read it.
fn find_table(path: &Path) -> Option<Table> {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .ok()?;
    // SAFETY: the handle is this open connection's; sqlite3_limit only sets a number.
    unsafe {
        rusqlite::ffi::sqlite3_limit(
            conn.handle(),
            rusqlite::ffi::SQLITE_LIMIT_LENGTH,
            MAX_ROW_BYTES as i32,
        );
    }
    let has = |table: &str| -> Option<bool> {
        conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = ?1 AND type IN ('table', 'view')",
            [table],
            |r| r.get::<_, i64>(0),
        )
        .ok()
        .map(|n| n == 1)
    };
    let (table, surely_original) = if has("memscope_dump")? {
        ("memscope_dump", false)
    } else if has("leaks_dump")? {
        ("leaks_dump", true)
    } else {
        return None;
    };
    let names: Vec<String> = conn
        .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
        .and_then(|mut s| {
            s.query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()
        })
        .ok()?;
    Some(Table {
        conn,
        name: table,
        columns: names,
        surely_original,
    })
}

fn sqlite_error(path: &Path, e: rusqlite::Error) -> ReadError {
    ReadError::Io {
        path: path.to_path_buf(),
        message: format!("SQLite: {}", one_line(&e.to_string())),
    }
}

/// A column's value as the CSV would have it; `None` for a blob.
fn text(value: ValueRef) -> Option<String> {
    Some(match value {
        ValueRef::Null => String::new(),
        ValueRef::Integer(i) => i.to_string(),
        ValueRef::Real(f) => f.to_string(),
        ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
        ValueRef::Blob(_) => return None,
    })
}

pub(super) fn normalize_if_original(
    path: &Path,
    shown: &Path,
) -> Result<Option<Normalized>, ReadError> {
    drop(open_regular(path)?);
    // Anything wrong before the file shows the original's table is our reader's to tell.
    let Some(Table {
        conn,
        name: table,
        columns: names,
        surely_original,
    }) = find_table(path)
    else {
        return Ok(None);
    };
    let columns = match Columns::of(names.iter().map(String::as_str)) {
        Ok(columns) => columns,
        Err(reason) if surely_original => {
            return Err(not_a_dump(path, format!("table {table}: {reason}")))
        }
        // Ours, or not a dump: the ordinary reader names what is wrong.
        Err(_) => return Ok(None),
    };
    let select = format!(
        "SELECT {} FROM {table}",
        columns
            .0
            .iter()
            .map(|at| at.map_or("''".to_string(), |i| format!("\"{}\"", names[i])))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let Ok(mut statement) = conn.prepare(&select) else {
        return Ok(None);
    };
    // The row's 12 values as text, each row in turn, or why it is unusable.
    let mut each_row = |limit: Option<usize>, f: &mut EachRow| -> Result<(), ReadError> {
        let mut rows = statement.query([]).map_err(|e| sqlite_error(path, e))?;
        let mut n = 0u64;
        while let Some(row) = rows.next().map_err(|e| sqlite_error(path, e))? {
            n += 1;
            if limit.is_some_and(|l| n as usize > l) {
                break;
            }
            let mut values: Vec<String> = Vec::with_capacity(12);
            let mut blob = None;
            for (i, column) in COLUMNS.iter().enumerate() {
                match row.get_ref(i).ok().and_then(text) {
                    Some(v) => values.push(v),
                    None => {
                        blob.get_or_insert(*column);
                        values.push(String::new());
                    }
                }
            }
            let fields: Vec<&str> = values.iter().map(String::as_str).collect();
            let fields: [&str; 12] = fields.try_into().expect("12 columns");
            match blob {
                Some(column) => f(n, Err(format!("{column} is a blob"))),
                None => f(n, Ok(fields)),
            }?;
        }
        Ok(())
    };
    let mut sniffed: Vec<[String; 12]> = Vec::new();
    let looked = each_row(Some(SNIFFED_ROWS), &mut |_, fields| {
        if let Ok(fields) = fields {
            sniffed.push(fields.map(str::to_string));
        }
        Ok(())
    });
    if looked.is_err() && !surely_original {
        return Ok(None);
    }
    let dialect = dialect_of(sniffed.iter().map(|f| f.each_ref().map(String::as_str)));
    let traits = match dialect {
        Dialect::Original(traits) => traits,
        Dialect::Ours if surely_original => rewrite::Traits {
            old: true,
            micro: false,
        },
        Dialect::Ours => return Ok(None),
    };
    let dir = private_dir(path)?;
    let mut sorter = Sorter::new(dir.path());
    let mut notes = Notes::default();
    let mut skipped = Skipped {
        path: shown,
        count: 0,
    };
    each_row(None, &mut |n, fields| {
        let outcome = fields.and_then(|fields| rewrite::rewrite(&fields, traits, &mut notes));
        match outcome {
            Ok(Outcome::Row(row)) => sorter.push(row).map_err(|e| ReadError::Io {
                path: path.to_path_buf(),
                message: e.to_string(),
            }),
            Ok(Outcome::Dropped) => Ok(()),
            Err(reason) => {
                skipped.row(n, &reason);
                Ok(())
            }
        }
    })?;
    skipped.finish();
    drop(statement);
    super::finish(path, shown, dir, sorter, traits, &notes).map(Some)
}
