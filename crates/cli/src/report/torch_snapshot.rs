//! `msmemscope export --format torch-snapshot DIR`: the run as the pickle PyTorch's memory
//! viewer reads (`torch.cuda.memory._snapshot()`'s format, used by `torch.cuda._memory_viz`
//! and pytorch.org/memory_viz), written to `torch_snapshot.pickle` in the run directory.
//!
//! Mapping:
//! - `device_traces[i]`: CUDA device i's rows; `cpu` comes after the highest CUDA index (as
//!   PyTorch's own CPU-profile conversion places it).
//! - Each `MALLOC` of a tensor pool (`PTA`, `HOST`) is an `alloc` entry; each `FREE` is a
//!   `free_requested` followed by a `free_completed` (PyTorch's two steps of one free). `HAL`
//!   rows are the driver allocations under the caching allocator: `segment_alloc` /
//!   `segment_free`. `OOM_TRIGGER` rows are `oom` entries.
//! - Frames: the row's C stack (innermost first) then its Python stack, each line parsed into
//!   `{filename, line, name}`; `time_us` from the timestamp; `category` is the `owner` Attr.
//! - `segments`: what is live at the end of the dump, one segment per block (a HAL block is a
//!   segment of one inactive block; a tensor block is a segment of one active block).
//! - Rows without a device are written to every device file; they are taken from the first
//!   file only.

use std::collections::{BTreeMap, HashMap};
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};

use super::dump_files;
use super::pickle::Pickler;
use crate::failure::Failure;

/// The snapshot's file name inside the run directory.
pub const SNAPSHOT_FILE: &str = "torch_snapshot.pickle";

/// One stack frame as the viewer wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

/// `file(line): func` (Python) → frame.
fn python_frame(text: &str) -> Frame {
    if let Some((location, name)) = text.split_once("): ") {
        if let Some((file, line)) = location.rsplit_once('(') {
            if let Ok(line) = line.parse() {
                return Frame {
                    filename: file.to_owned(),
                    line,
                    name: name.to_owned(),
                };
            }
        }
    }
    Frame {
        filename: "??".to_owned(),
        line: 0,
        name: text.to_owned(),
    }
}

/// `function file:line` or `function (module+0xoff)` (C) → frame.
fn c_frame(text: &str) -> Frame {
    if let Some(rest) = text.strip_suffix(')') {
        if let Some((name, module)) = rest.rsplit_once(" (") {
            return Frame {
                filename: module.to_owned(),
                line: 0,
                name: name.to_owned(),
            };
        }
    }
    if let Some((name, location)) = text.rsplit_once(' ') {
        if let Some((file, line)) = location.rsplit_once(':') {
            if let Ok(line) = line.parse() {
                return Frame {
                    filename: file.to_owned(),
                    line,
                    name: name.to_owned(),
                };
            }
        }
    }
    Frame {
        filename: "??".to_owned(),
        line: 0,
        name: text.to_owned(),
    }
}

/// A row's frames: C (innermost first), then Python (innermost first).
pub fn frames_of(c_stack: &str, python_stack: &str) -> Vec<Frame> {
    let lines = |s: &str| {
        s.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let mut frames: Vec<Frame> = lines(c_stack).iter().map(|l| c_frame(l)).collect();
    frames.extend(lines(python_stack).iter().map(|l| python_frame(l)));
    frames
}

/// A live block at the end of the dump.
struct Live {
    size: u64,
    hal: bool,
    c_stack: String,
    python_stack: String,
}

type Out = Pickler<BufWriter<std::fs::File>>;

fn write_frames(p: &mut Out, frames: &[Frame]) -> std::io::Result<()> {
    p.list()?;
    for f in frames {
        p.dict()?;
        p.item_str("filename", &f.filename)?;
        p.item_int("line", f.line as i128)?;
        p.item_str("name", &f.name)?;
        p.append()?;
    }
    Ok(())
}

/// One trace entry (the caller appends it to the device's list).
fn write_entry(
    p: &mut Out,
    action: &str,
    addr: u64,
    size: u64,
    row: &EventRow,
    category: Option<&str>,
) -> std::io::Result<()> {
    p.dict()?;
    p.item_str("action", action)?;
    p.item_int("addr", addr as i128)?;
    p.item_int("size", size as i128)?;
    p.item_int("stream", 0)?;
    p.item_int("time_us", (row.ts_ns / 1000) as i128)?;
    p.str("frames")?;
    write_frames(p, &frames_of(&row.c_stack, &row.python_stack))?;
    p.set_item()?;
    if let Some(category) = category {
        p.item_str("category", category)?;
    }
    p.append()
}

/// The viewer's device index of each device directory: CUDA indices as they are, `cpu` after
/// the highest one.
fn device_indices(devices: &[DeviceId]) -> BTreeMap<DeviceId, usize> {
    let next = devices
        .iter()
        .filter_map(|d| match d {
            DeviceId::Cuda(i) => Some(*i as usize + 1),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    devices
        .iter()
        .map(|&d| {
            let index = match d {
                DeviceId::Cuda(i) => i as usize,
                _ => next,
            };
            (d, index)
        })
        .collect()
}

/// Writes the run's snapshot; returns its path.
pub fn export(run: &Path) -> Result<PathBuf, Failure> {
    let dumps =
        dump_files(run).map_err(|e| Failure::io(format!("cannot list {}: {e}", run.display())))?;
    if dumps.is_empty() {
        return Err(Failure::input(format!(
            "{}: the run has no event dump (device_*/dump/memscope_dump_*); a torch snapshot needs MALLOC/FREE rows",
            run.display()
        )));
    }
    let device_of = |dir: &str| {
        DeviceId::parse(dir.strip_prefix("device_").unwrap_or(dir)).unwrap_or(DeviceId::Cpu)
    };
    let mut devices: Vec<DeviceId> = dumps.iter().map(|(d, _)| device_of(d)).collect();
    devices.dedup();
    let indices = device_indices(&devices);
    let slots = indices.values().max().map_or(0, |m| m + 1);

    let path = run.join(SNAPSHOT_FILE);
    // Written beside it and renamed when complete: a dump refused halfway through leaves no
    // partial snapshot behind, and an earlier one whole.
    let partial = run.join(format!("{SNAPSHOT_FILE}.partial"));
    let file = open_new(&partial)?;
    let written = (|| -> Result<(), Failure> {
        let io_error =
            |e: std::io::Error| Failure::io(format!("cannot write {}: {e}", path.display()));
        let mut p = Pickler::new(BufWriter::with_capacity(1 << 20, file)).map_err(io_error)?;
        p.dict().map_err(io_error)?;
        p.str("device_traces").map_err(io_error)?;
        p.list().map_err(io_error)?;

        let mut live: Vec<BTreeMap<(u64, bool), Live>> =
            (0..slots).map(|_| BTreeMap::new()).collect();
        let mut first_file = true;
        for (slot, blocks) in live.iter_mut().enumerate() {
            p.list().map_err(io_error)?;
            for (dir, dump) in &dumps {
                let device = device_of(dir);
                if indices[&device] != slot {
                    continue;
                }
                let take_deviceless = first_file;
                first_file = false;
                // The sizes of live tensor blocks, for FREE rows that lack one.
                let mut sizes: HashMap<(EventType, u64), u64> = HashMap::new();
                for row in super::read_ahead(dump.clone()) {
                    let row = row?;
                    let mine =
                        row.device == device || (row.device == DeviceId::None && take_deviceless);
                    if !mine {
                        continue;
                    }
                    write_row(&mut p, &row, &mut sizes, blocks).map_err(io_error)?;
                }
            }
            p.append().map_err(io_error)?;
        }
        p.set_item().map_err(io_error)?;

        p.str("segments").map_err(io_error)?;
        p.list().map_err(io_error)?;
        for (slot, blocks) in live.iter().enumerate() {
            for (&(addr, _), block) in blocks {
                write_segment(&mut p, slot, addr, block).map_err(io_error)?;
            }
        }
        p.set_item().map_err(io_error)?;
        p.finish().map_err(io_error)?;
        Ok(())
    })();
    let renamed = written.and_then(|()| {
        std::fs::rename(&partial, &path)
            .map_err(|e| Failure::io(format!("cannot write {}: {e}", path.display())))
    });
    if let Err(failure) = renamed {
        let _ = std::fs::remove_file(&partial);
        return Err(failure);
    }
    Ok(path)
}

fn write_row(
    p: &mut Out,
    row: &EventRow,
    sizes: &mut HashMap<(EventType, u64), u64>,
    live: &mut BTreeMap<(u64, bool), Live>,
) -> std::io::Result<()> {
    let hal = row.event_type == EventType::Hal;
    match (row.event, row.event_type) {
        (Event::Malloc, EventType::Pta | EventType::Hal | EventType::Host) => {
            let Some(addr) = row.ptr else { return Ok(()) };
            let size = row.attr_u64("size").unwrap_or(0);
            sizes.insert((row.event_type, addr), size);
            live.insert(
                (addr, hal),
                Live {
                    size,
                    hal,
                    c_stack: row.c_stack.clone(),
                    python_stack: row.python_stack.clone(),
                },
            );
            let action = if hal { "segment_alloc" } else { "alloc" };
            write_entry(p, action, addr, size, row, row.attr_str("owner"))
        }
        (Event::Free, EventType::Pta | EventType::Hal | EventType::Host) => {
            let Some(addr) = row.ptr else { return Ok(()) };
            let known = sizes.remove(&(row.event_type, addr));
            live.remove(&(addr, hal));
            let size = row.attr_u64("size").or(known).unwrap_or(0);
            if hal {
                return write_entry(p, "segment_free", addr, size, row, None);
            }
            write_entry(p, "free_requested", addr, size, row, None)?;
            write_entry(p, "free_completed", addr, size, row, None)
        }
        (Event::OomDetail, EventType::OomTrigger) => {
            let mut row = row.clone();
            row.parse_attrs();
            p.dict()?;
            p.item_str("action", "oom")?;
            let size = row.attr_u64("req_size").unwrap_or(0);
            p.item_int("size", size as i128)?;
            p.item_int("device_free", row.attr_u64("free").unwrap_or(0) as i128)?;
            p.item_int("addr", 0)?;
            p.item_int("stream", 0)?;
            p.item_int("time_us", (row.ts_ns / 1000) as i128)?;
            p.str("frames")?;
            write_frames(p, &frames_of(&row.c_stack, &row.python_stack))?;
            p.set_item()?;
            p.append()
        }
        _ => Ok(()),
    }
}

fn write_segment(p: &mut Out, device: usize, addr: u64, block: &Live) -> std::io::Result<()> {
    let size = block.size as i128;
    let active = if block.hal { 0 } else { size };
    p.dict()?;
    p.item_int("device", device as i128)?;
    p.item_int("address", addr as i128)?;
    p.item_int("total_size", size)?;
    p.item_int("stream", 0)?;
    let kind = if block.size > 1 << 20 {
        "large"
    } else {
        "small"
    };
    p.item_str("segment_type", kind)?;
    p.str("segment_pool_id")?;
    p.int(0)?;
    p.int(0)?;
    p.tuple2()?;
    p.set_item()?;
    p.item_int("allocated_size", active)?;
    p.item_int("active_size", active)?;
    p.item_int("requested_size", active)?;
    p.str("blocks")?;
    p.list()?;
    p.dict()?;
    p.item_int("address", addr as i128)?;
    p.item_int("size", size)?;
    p.item_int("requested_size", active)?;
    let state = if block.hal {
        "inactive"
    } else {
        "active_allocated"
    };
    p.item_str("state", state)?;
    p.str("frames")?;
    write_frames(p, &frames_of(&block.c_stack, &block.python_stack))?;
    p.set_item()?;
    p.append()?;
    p.set_item()?;
    p.append()
}

fn open_new(path: &Path) -> Result<std::fs::File, Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| Failure::io(format!("cannot create {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_parse_both_stack_styles() {
        let frames = frames_of(
            "alloc_block /src/a.c:12\nmain (prog+0x1a2)\n",
            "train.py(40): step\n/x/y(z).py(7): <module>",
        );
        let f = |filename: &str, line, name: &str| Frame {
            filename: filename.into(),
            line,
            name: name.into(),
        };
        assert_eq!(
            frames,
            vec![
                f("/src/a.c", 12, "alloc_block"),
                f("prog+0x1a2", 0, "main"),
                f("train.py", 40, "step"),
                f("/x/y(z).py", 7, "<module>"),
            ]
        );
    }

    #[test]
    fn cpu_comes_after_the_cuda_devices() {
        let map = device_indices(&[DeviceId::Cuda(0), DeviceId::Cuda(2), DeviceId::Cpu]);
        assert_eq!(map[&DeviceId::Cpu], 3);
        assert_eq!(map[&DeviceId::Cuda(2)], 2);
        assert_eq!(device_indices(&[DeviceId::Cpu])[&DeviceId::Cpu], 0);
    }
}
