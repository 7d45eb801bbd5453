//! A row from its 12 columns as text: what the CSV and SQLite readers (and the reader of the
//! original tool's dumps) share.

use super::attrs::excerpt;
use super::attrs::{check_attrs_numbers, decimal, hexadecimal};
use super::row::{AttrNumbers, DeviceId, Event, EventRow, EventType};

/// Builds a row from the 12 columns in order.
pub(crate) fn parse_fields<'a>(f: impl Iterator<Item = &'a str>) -> Result<EventRow, String> {
    let mut row = EventRow::new(Event::Malloc, EventType::Pta, "");
    parse_fields_into(&mut row, f, &mut Vec::new())?;
    Ok(row)
}

/// Fills `row` from the 12 columns in order, reusing its strings' memory: a reader that hands
/// out one row at a time allocates nothing per row. An Attr string a row no longer needs goes
/// to `spare`, and one is taken from there when a row needs it.
pub(crate) fn parse_fields_into<'a>(
    row: &mut EventRow,
    mut f: impl Iterator<Item = &'a str>,
    spare: &mut Vec<String>,
) -> Result<(), String> {
    let mut next = || f.next().unwrap_or("");
    let id = decimal(next()).ok_or_else(|| "ID is not a number".to_string())?;
    let event_text = next();
    row.event =
        Event::parse(event_text).ok_or_else(|| format!("unknown Event {}", excerpt(event_text)))?;
    let type_text = next();
    row.event_type = EventType::parse(type_text)
        .ok_or_else(|| format!("unknown Event Type {}", excerpt(type_text)))?;
    let name = next();
    row.name.clear();
    row.name.push_str(if name == "N/A" { "" } else { name });
    row.id = id;
    row.ts_ns = decimal(next()).ok_or_else(|| "Timestamp(ns) is not a number".to_string())?;
    row.pid = decimal(next())
        .and_then(|pid| u32::try_from(pid).ok())
        .ok_or_else(|| "Process Id is not a number".to_string())?;
    row.tid = decimal(next()).ok_or_else(|| "Thread Id is not a number".to_string())?;
    let device = next();
    row.device =
        DeviceId::parse(device).ok_or_else(|| format!("bad Device Id {}", excerpt(device)))?;
    let ptr = next();
    row.ptr = match ptr {
        "N/A" | "" => None,
        p => {
            let hex = p.strip_prefix("0x").unwrap_or(p);
            let value = hexadecimal(hex);
            Some(value.ok_or_else(|| format!("bad Ptr {}", excerpt(p)))?)
        }
    };
    let attrs = next();
    // Readers reuse rows; the map is empty but for rows built by hand, and clearing an empty
    // one still costs a call.
    if !row.attrs.is_empty() {
        row.attrs.clear();
    }
    if has_attrs(attrs) {
        // Kept as text: analyses read single values with `attr_u64`/`attr_str`, and
        // `parse_attrs` builds the map for the rest; checked here so that both read what the
        // row says.
        let numbers = check_attrs_numbers(attrs)?;
        keep_attrs(row, numbers, spare, |kept| {
            kept.clear();
            kept.push_str(attrs);
        });
    } else if let Some(unused) = row.attrs_json.take() {
        spare.push(unused);
    }
    row.python_stack.clear();
    row.python_stack.push_str(next());
    row.c_stack.clear();
    row.c_stack.push_str(next());
    Ok(())
}

/// Makes `attrs` (a row's Attr text, which [`parse_fields_into`] was given as empty) the row's,
/// checked as that function checks it: its memory moves into the row, and the row's old string
/// comes back in `attrs`, so a reader that unquoted the text into a string of its own copies
/// nothing.
pub(crate) fn adopt_attrs(
    row: &mut EventRow,
    attrs: &mut String,
    spare: &mut Vec<String>,
) -> Result<(), String> {
    if !has_attrs(attrs) {
        return Ok(());
    }
    let numbers = check_attrs_numbers(attrs)?;
    keep_attrs(row, numbers, spare, |kept| std::mem::swap(kept, attrs));
    Ok(())
}

/// Whether an Attr text holds anything (`{}` is written for none).
fn has_attrs(attrs: &str) -> bool {
    !attrs.is_empty() && attrs != "{}"
}

/// Gives `row` its Attr text through `put` (into the row's string, or one from `spare`), with
/// the numeric values the check found in it.
fn keep_attrs(
    row: &mut EventRow,
    numbers: Option<super::attrs::Plain>,
    spare: &mut Vec<String>,
    put: impl FnOnce(&mut String),
) {
    let kept = row
        .attrs_json
        .get_or_insert_with(|| spare.pop().unwrap_or_default());
    put(kept);
    row.numbers = match numbers {
        Some(plain) => AttrNumbers::of(kept, plain),
        None => AttrNumbers::default(),
    };
}
