//! One row of the original tool's dump, rewritten as a row of ours: its spellings, units and
//! Attr syntax mapped onto our dialect, then checked by our own row parser, so that what comes
//! out is exactly what our readers accept.

use std::collections::BTreeMap;

use super::attr::{self, AttrNotes};
use crate::events::csv::write_row;
use crate::events::fields::parse_fields;
use crate::events::EventRow;

/// What the file's first rows said about it ([`super::sniff`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Traits {
    /// Its older ("msleaks") format: decimal Ptr, `acl init`, `MID`/`owner` keys.
    pub old: bool,
    /// Its Timestamp(ns) column holds microseconds (the older format's clock).
    pub micro: bool,
}

/// What was changed, counted over the file, for the one note on stderr.
#[derive(Debug, Default)]
pub(super) struct Notes {
    pub rows: u64,
    pub attr: AttrNotes,
    /// Rows left out on purpose, by what they were.
    pub dropped: BTreeMap<&'static str, u64>,
    /// Event Types read as one of ours: (theirs, ours) → rows.
    pub renamed_types: BTreeMap<(String, &'static str), u64>,
    pub op_names: u64,
    pub decimal_ptrs: u64,
    pub host_devices: u64,
}

/// A row of ours, and what orders it: its process, time and ID.
pub(super) struct Rewritten {
    pub pid: u32,
    pub device: crate::events::DeviceId,
    pub ts: u64,
    pub id: u64,
    /// The row as our CSV writes it, without its ID and the comma after it (the ID is written
    /// when the rows are in order), ending with its line end.
    pub rest: String,
}

/// What became of a row.
pub(super) enum Outcome {
    Row(Rewritten),
    /// Left out on purpose (counted in the notes).
    Dropped,
}

/// Rewrites one row given as its 12 columns in our order.
pub(super) fn rewrite(
    fields: &[&str; 12],
    traits: Traits,
    notes: &mut Notes,
) -> Result<Outcome, String> {
    let [id, event, event_type, name, ts, pid, tid, device, ptr, attrs, py, c] = *fields;
    let id = id.trim();
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("ID {} is not an integer", quoted(id)));
    }
    let theirs = event_type;
    let mut renamed = false;
    let event_type = match map_type(event, event_type) {
        TypeMap::Same => event_type.to_string(),
        TypeMap::Drop(what) => {
            *notes.dropped.entry(what).or_default() += 1;
            return Ok(Outcome::Dropped);
        }
        TypeMap::As(ours) => {
            *notes
                .renamed_types
                .entry((event_type.to_string(), ours))
                .or_default() += 1;
            renamed = true;
            ours.to_string()
        }
    };
    let name = match op_name(event, name) {
        Some(ours) => {
            notes.op_names += 1;
            ours
        }
        None => name.to_string(),
    };
    let ts = match ts.trim().parse::<u64>() {
        Ok(t) if traits.micro => t
            .checked_mul(1000)
            .ok_or_else(|| format!("Timestamp {} is out of range", quoted(ts)))?
            .to_string(),
        Ok(t) => t.to_string(),
        Err(_) => return Err(format!("Timestamp {} is not a number", quoted(ts))),
    };
    let device = match device.trim() {
        "host" => {
            notes.host_devices += 1;
            "cpu"
        }
        d => d,
    };
    let ptr = match ptr.trim() {
        p if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            notes.decimal_ptrs += 1;
            let value = p
                .parse::<u64>()
                .map_err(|_| format!("Ptr {} is out of range", quoted(p)))?;
            format!("0x{value:016x}")
        }
        p => p.to_string(),
    };
    let mut attrs = attr::to_json(attrs, event == "FREE", &mut notes.attr)?;
    if renamed && (event == "MALLOC" || event == "FREE") {
        // Which of its pools the block came from stays visible.
        attrs = with_original_pool(&attrs, theirs)?;
    }
    let columns = [
        id,
        event,
        &event_type,
        &name,
        &ts,
        pid,
        tid,
        device,
        &ptr,
        &attrs,
        py,
        c,
    ];
    let row = parse_fields(columns.into_iter())?;
    notes.rows += 1;
    Ok(Outcome::Row(Rewritten {
        pid: row.pid,
        device: row.device,
        ts: row.ts_ns,
        id: row.id,
        rest: rest_of(&row),
    }))
}

/// `row` as our CSV writes it, from after its ID's comma.
fn rest_of(row: &EventRow) -> String {
    let mut line = String::new();
    write_row(&mut line, row);
    let comma = line.find(',').map_or(0, |i| i + 1);
    line.split_off(comma)
}

fn with_original_pool(attrs: &str, theirs: &str) -> Result<String, String> {
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(attrs).map_err(|e| format!("Attr is not a JSON object ({e})"))?;
    object.insert("original_type".into(), theirs.into());
    Ok(serde_json::Value::Object(object).to_string())
}

enum TypeMap {
    Same,
    As(&'static str),
    Drop(&'static str),
}

/// The original's Event Types that ours spell otherwise or lack.
fn map_type(event: &str, event_type: &str) -> TypeMap {
    match (event, event_type) {
        // The runtime's start in each process: no memory, nothing an analysis reads.
        ("SYSTEM", "acl init") => TypeMap::Drop("`acl init` rows"),
        ("KERNEL_LAUNCH", "KERNEL_START") => TypeMap::As("KERNEL_LAUNCH"),
        // A kernel is counted once, at its start.
        ("KERNEL_LAUNCH", "KERNEL_END") => TypeMap::Drop("KERNEL_END rows"),
        ("MALLOC" | "FREE", "HOST_PINNED") => TypeMap::As("HOST"),
        // Framework-level pools of its other allocators: ours is PTA's place.
        ("MALLOC" | "FREE", "PTA_WORKSPACE" | "ATB" | "MINDSPORE") => TypeMap::As("PTA"),
        _ => TypeMap::Same,
    }
}

/// `torch._ops.aten.addmm.default` (the dispatcher's Python name, which the original records)
/// as ours names it: `aten::addmm`.
fn op_name(event: &str, name: &str) -> Option<String> {
    if event != "OP_LAUNCH" {
        return None;
    }
    let rest = name.strip_prefix("torch._ops.")?;
    let mut parts = rest.split('.');
    let (namespace, op) = (parts.next()?, parts.next()?);
    (!namespace.is_empty() && !op.is_empty()).then(|| format!("{namespace}::{op}"))
}

fn quoted(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CURRENT: Traits = Traits {
        old: false,
        micro: false,
    };
    const OLD: Traits = Traits {
        old: true,
        micro: true,
    };

    fn one(line: &str, traits: Traits) -> (Result<Outcome, String>, Notes) {
        let mut record = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(line.as_bytes());
        let record = record.records().next().unwrap().unwrap();
        let fields: Vec<&str> = record.iter().collect();
        let fields: [&str; 12] = fields.try_into().unwrap();
        let mut notes = Notes::default();
        (rewrite(&fields, traits, &mut notes), notes)
    }

    fn row(line: &str, traits: Traits) -> Rewritten {
        match one(line, traits).0 {
            Ok(Outcome::Row(r)) => r,
            Ok(Outcome::Dropped) => panic!("dropped"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_current_malloc_row_is_ours() {
        let r = row(
            r#"10,MALLOC,PTA,N/A,1764753084425691000,3101864,3101864,0,0x000012c041400000,"{allocation_id:4,addr:0x000012c041400000,size:16778240,total:20971520,used:16780288}",,"#,
            CURRENT,
        );
        assert_eq!((r.pid, r.ts, r.id), (3101864, 1764753084425691000, 10));
        assert_eq!(
            r.rest,
            "MALLOC,PTA,N/A,1764753084425691000,3101864,3101864,0,0x000012c041400000,\"{\"\"allocation_id\"\":4,\"\"addr\"\":\"\"0x000012c041400000\"\",\"\"size\"\":16778240,\"\"total\"\":20971520,\"\"used\"\":16780288}\",,\n"
        );
    }

    #[test]
    fn op_names_take_our_spelling() {
        let r = row(
            "4,OP_LAUNCH,ATEN_START,torch._ops.aten.addmm.default,17,1,1,0,N/A,,,",
            CURRENT,
        );
        assert_eq!(
            r.rest,
            "OP_LAUNCH,ATEN_START,aten::addmm,17,1,1,0,N/A,{},,\n"
        );
    }

    #[test]
    fn old_rows_get_ns_hex_pointers_and_cpu_for_host() {
        let r = row(
            r#"340,FREE,PTA,N/A,1746006024581187,2523738,2523738,host,20616939216384,"{addr:20616939216384,size:-14336,owner:,total:2097152,used:3645440}",,"#,
            OLD,
        );
        assert_eq!(r.ts, 1746006024581187000);
        assert_eq!(
            r.rest,
            "FREE,PTA,N/A,1746006024581187000,2523738,2523738,cpu,0x000012c041569e00,\"{\"\"addr\"\":20616939216384,\"\"size\"\":14336,\"\"total\"\":2097152,\"\"used\"\":3645440}\",,\n"
        );
    }

    #[test]
    fn other_spellings_are_mapped_or_left_out() {
        let (dropped, notes) = one("1,SYSTEM,acl init,N/A,1746006014162153,2,2,N/A,N/A,,,", OLD);
        assert!(matches!(dropped, Ok(Outcome::Dropped)));
        assert_eq!(notes.dropped.get("`acl init` rows"), Some(&1));
        let r = row("5,MALLOC,ATB,N/A,1,2,2,0,0x10,{size:8},,", CURRENT);
        assert_eq!(
            r.rest,
            "MALLOC,PTA,N/A,1,2,2,0,0x0000000000000010,\"{\"\"size\"\":8,\"\"original_type\"\":\"\"ATB\"\"}\",,\n"
        );
        let r = row("6,KERNEL_LAUNCH,KERNEL_START,k,1,2,2,0,N/A,,,", CURRENT);
        assert!(r.rest.starts_with("KERNEL_LAUNCH,KERNEL_LAUNCH,k,"));
        let (bad, _) = one("x7,MALLOC,PTA,N/A,1,2,2,0,0x10,{size:8},,", CURRENT);
        assert_eq!(bad.err().unwrap(), "ID \"x7\" is not an integer");
        let (bad, _) = one("7,MALLOC,NOPE,N/A,1,2,2,0,0x10,{size:8},,", CURRENT);
        assert_eq!(bad.err().unwrap(), "unknown Event Type \"NOPE\"");
    }
}
