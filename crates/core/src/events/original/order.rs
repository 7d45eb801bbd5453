//! Puts rewritten rows in the order our readers need: per process (in the order the processes
//! first appear), by time, then by the original ID, then as they came. The original writes a
//! block's MALLOC row beside its FREE and its START_TRACE/STOP_TRACE rows last, so its rows can
//! be out of place by the whole file: this is a sort, not a window. Memory stays bounded: runs
//! of at most [`RUN_BYTES`] are sorted and spilled to files in the private directory, then
//! merged.
//!
//! IDs: a file of one process whose IDs ascend in this order keeps them, so a row the analyses
//! name is the row of that ID in the user's file. Otherwise (IDs restart in each process of a
//! several-process file, or the time order disagrees with the IDs) rows are numbered 1, 2, ...
//! in this order.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::rewrite::Rewritten;
use crate::events::row::HEADER;
use crate::events::DeviceId;

/// The bytes of row text a run holds before it is sorted and spilled.
const RUN_BYTES: usize = 64 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    process: u32,
    ts: u64,
    id: u64,
    seq: u64,
}

/// How the rows came out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ordered {
    pub rows: u64,
    /// The processes, in the order the file has them.
    pub processes: Vec<u32>,
    /// Rows that were not where the order puts them (0: the file was in order).
    pub moved: u64,
    /// Devices that rows of more than one process are on.
    pub shared_devices: Vec<DeviceId>,
    pub renumbered: bool,
}

/// Collects rows, then writes them in order as a CSV dump of ours.
pub(super) struct Sorter {
    dir: PathBuf,
    run: Vec<(Key, Box<str>)>,
    run_bytes: usize,
    spills: Vec<PathBuf>,
    processes: HashMap<u32, u32>,
    order: Vec<u32>,
    /// The first process seen on each device, and whether another was seen there too.
    devices: BTreeMap<DeviceId, (u32, bool)>,
    seq: u64,
    last: Option<Key>,
    moved: u64,
}

impl Sorter {
    /// Spills go into `dir`, a directory of this reader's own.
    pub fn new(dir: &Path) -> Sorter {
        Sorter {
            dir: dir.to_path_buf(),
            run: Vec::new(),
            run_bytes: 0,
            spills: Vec::new(),
            processes: HashMap::new(),
            order: Vec::new(),
            devices: BTreeMap::new(),
            seq: 0,
            last: None,
            moved: 0,
        }
    }

    pub fn push(&mut self, row: Rewritten) -> io::Result<()> {
        let next = self.order.len() as u32;
        let process = *self.processes.entry(row.pid).or_insert(next);
        if process == next {
            self.order.push(row.pid);
        }
        if row.device != DeviceId::None {
            let seen = self.devices.entry(row.device).or_insert((process, false));
            seen.1 |= seen.0 != process;
        }
        let key = Key {
            process,
            ts: row.ts,
            id: row.id,
            seq: self.seq,
        };
        self.seq += 1;
        if self.last.is_some_and(|last| key < last) {
            self.moved += 1;
        }
        self.last = Some(self.last.map_or(key, |last| last.max(key)));
        self.run_bytes += row.rest.len() + 48;
        self.run.push((key, row.rest.into_boxed_str()));
        if self.run_bytes >= RUN_BYTES {
            self.spill()?;
        }
        Ok(())
    }

    fn spill(&mut self) -> io::Result<()> {
        self.run.sort_unstable_by_key(|(key, _)| *key);
        let path = self.dir.join(format!("run_{}", self.spills.len()));
        let mut out = BufWriter::new(File::create_new(&path)?);
        for (key, text) in self.run.drain(..) {
            write_item(&mut out, key, &text)?;
        }
        out.flush()?;
        self.spills.push(path);
        self.run_bytes = 0;
        Ok(())
    }

    /// Writes every row, in order, to a new file at `out`.
    pub fn finish(mut self, out: &Path) -> io::Result<Ordered> {
        let keep_ids = self.order.len() <= 1;
        if self.spills.is_empty() {
            self.run.sort_unstable_by_key(|(key, _)| *key);
        } else if !self.run.is_empty() {
            self.spill()?;
        }
        let mut renumbered = !keep_ids;
        let mut rows = self.write(out, !renumbered)?;
        if rows.is_none() {
            renumbered = true;
            std::fs::remove_file(out)?;
            rows = self.write(out, false)?;
        }
        Ok(Ordered {
            rows: rows.expect("renumbered rows always ascend"),
            processes: self.order,
            moved: self.moved,
            shared_devices: self
                .devices
                .iter()
                .filter(|(_, (_, shared))| *shared)
                .map(|(device, _)| *device)
                .collect(),
            renumbered,
        })
    }

    /// The rows written, or `None` when `keep_ids` met an ID that does not ascend.
    fn write(&self, out: &Path, keep_ids: bool) -> io::Result<Option<u64>> {
        let mut file = BufWriter::with_capacity(1 << 20, File::create_new(out)?);
        writeln!(file, "{HEADER}")?;
        let mut written = 0u64;
        let mut last_id = None;
        let mut put = |key: Key, text: &str| -> io::Result<bool> {
            let id = if keep_ids {
                if last_id.is_some_and(|last| key.id <= last) {
                    return Ok(false);
                }
                key.id
            } else {
                written + 1
            };
            last_id = Some(id);
            written += 1;
            let mut n = itoa::Buffer::new();
            file.write_all(n.format(id).as_bytes())?;
            file.write_all(b",")?;
            file.write_all(text.as_bytes())?;
            Ok(true)
        };
        if self.spills.is_empty() {
            for (key, text) in &self.run {
                if !put(*key, text)? {
                    return Ok(None);
                }
            }
        } else {
            let mut runs = self
                .spills
                .iter()
                .map(|p| File::open(p).map(|f| BufReader::with_capacity(1 << 16, f)))
                .collect::<io::Result<Vec<_>>>()?;
            let mut heads = BinaryHeap::new();
            for (i, run) in runs.iter_mut().enumerate() {
                if let Some((key, text)) = read_item(run)? {
                    heads.push(Reverse((key, i, text)));
                }
            }
            while let Some(Reverse((key, i, text))) = heads.pop() {
                if !put(key, &text)? {
                    return Ok(None);
                }
                if let Some((key, text)) = read_item(&mut runs[i])? {
                    heads.push(Reverse((key, i, text)));
                }
            }
        }
        file.flush()?;
        Ok(Some(written))
    }
}

fn write_item(out: &mut impl Write, key: Key, text: &str) -> io::Result<()> {
    out.write_all(&key.process.to_le_bytes())?;
    out.write_all(&key.ts.to_le_bytes())?;
    out.write_all(&key.id.to_le_bytes())?;
    out.write_all(&key.seq.to_le_bytes())?;
    out.write_all(&(text.len() as u64).to_le_bytes())?;
    out.write_all(text.as_bytes())
}

fn read_item(input: &mut impl Read) -> io::Result<Option<(Key, String)>> {
    let mut process = [0u8; 4];
    match input.read_exact(&mut process) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut word = [0u8; 8];
    let mut next = || -> io::Result<u64> {
        input.read_exact(&mut word)?;
        Ok(u64::from_le_bytes(word))
    };
    let key = Key {
        process: u32::from_le_bytes(process),
        ts: next()?,
        id: next()?,
        seq: next()?,
    };
    let len = next()? as usize;
    let mut text = vec![0u8; len];
    input.read_exact(&mut text)?;
    let text = String::from_utf8(text)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a spilled row is not UTF-8"))?;
    Ok(Some((key, text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u32, ts: u64, id: u64) -> Rewritten {
        Rewritten {
            pid,
            device: DeviceId::Cuda(pid),
            ts,
            id,
            rest: format!("p{pid} t{ts}\n"),
        }
    }

    fn sorted(rows: Vec<Rewritten>, spill_every: Option<usize>) -> (String, Ordered) {
        let dir = tempfile::tempdir().unwrap();
        let mut sorter = Sorter::new(dir.path());
        for (i, r) in rows.into_iter().enumerate() {
            sorter.push(r).unwrap();
            if spill_every.is_some_and(|n| (i + 1) % n == 0) {
                sorter.spill().unwrap();
            }
        }
        let out = dir.path().join("out.csv");
        let ordered = sorter.finish(&out).unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        (text.lines().skip(1).collect::<Vec<_>>().join("|"), ordered)
    }

    #[test]
    fn one_process_in_time_order_keeps_its_ids() {
        for spill in [None, Some(1), Some(2)] {
            let (text, ordered) = sorted(vec![row(7, 30, 3), row(7, 10, 1), row(7, 20, 2)], spill);
            assert_eq!(text, "1,p7 t10|2,p7 t20|3,p7 t30");
            assert_eq!(ordered.processes, vec![7]);
            assert_eq!(
                (ordered.rows, ordered.moved, ordered.renumbered),
                (3, 2, false)
            );
        }
    }

    #[test]
    fn processes_follow_each_other_and_are_renumbered() {
        for spill in [None, Some(2)] {
            let (text, ordered) = sorted(
                vec![row(9, 50, 1), row(5, 10, 1), row(9, 60, 2), row(5, 5, 2)],
                spill,
            );
            assert_eq!(text, "1,p9 t50|2,p9 t60|3,p5 t5|4,p5 t10");
            assert_eq!(ordered.processes, vec![9, 5]);
            assert!(ordered.renumbered);
        }
    }

    #[test]
    fn ids_that_disagree_with_time_are_renumbered() {
        for spill in [None, Some(1)] {
            let (text, ordered) = sorted(vec![row(1, 10, 2), row(1, 20, 1)], spill);
            assert_eq!(text, "1,p1 t10|2,p1 t20");
            assert!(ordered.renumbered);
        }
    }
}
