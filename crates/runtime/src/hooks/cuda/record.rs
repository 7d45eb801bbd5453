//! The rows the CUDA hooks write, and the book of live device blocks that gives a FREE its
//! size and device and the `used`/`total` columns their values.
//!
//! Called after the real function returned, under the reentrancy guard, with panics caught:
//! a problem here loses a row, never the program's call.

use std::collections::{BTreeMap, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use msmemscope_core::events::row::format_ptr;
use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};

use super::{resolve, Layer, CUDA_ERROR_OUT_OF_MEMORY, CUDA_SUCCESS};
use crate::guard::Entered;
use crate::pipeline;

/// Runs `f` inside the runtime: not at all when this thread already is (our own calls), and
/// never letting a panic reach the program.
pub fn inside(f: impl FnOnce()) {
    if let Some(_entered) = Entered::try_enter() {
        let _ = catch_unwind(AssertUnwindSafe(f));
    }
}

struct Block {
    size: u64,
    device: DeviceId,
    id: u64,
}

/// A physical allocation of the virtual memory API (`cuMemCreate`): device memory until it is
/// released *and* no longer mapped anywhere.
struct Physical {
    block: Block,
    released: bool,
    mappings: u32,
}

#[derive(Default)]
struct Book {
    blocks: HashMap<u64, Block>,
    physical: HashMap<u64, Physical>,
    /// Mapped address -> (handle, size).
    mappings: BTreeMap<u64, (u64, u64)>,
    used: HashMap<DeviceId, u64>,
    next_id: u64,
}

impl Book {
    fn add(&mut self, device: DeviceId, size: u64) -> (u64, u64) {
        self.next_id += 1;
        let used = self.used.entry(device).or_default();
        *used += size;
        (self.next_id, *used)
    }

    fn sub(&mut self, device: DeviceId, size: u64) -> u64 {
        let used = self.used.entry(device).or_default();
        *used = used.saturating_sub(size);
        *used
    }
}

static BOOK: Mutex<Option<Book>> = Mutex::new(None);

fn with_book<R>(f: impl FnOnce(&mut Book) -> R) -> Option<R> {
    let mut book = BOOK.lock().ok()?;
    Some(f(book.get_or_insert_with(Book::default)))
}

fn device_of(layer: Layer) -> DeviceId {
    resolve::current_device(layer).map_or(DeviceId::None, DeviceId::Cuda)
}

/// A MALLOC or FREE row of the HAL pool. `used` and `total` are the live HAL bytes on the
/// device after the call (driver memory is reserved and in use at once). The Attr text is
/// rendered here at once (the values need no escaping): a serde map per row costs more than
/// the hooked call.
fn hal_row(event: Event, device: DeviceId, addr: u64, size: u64, id: u64, used: u64) -> EventRow {
    let mut row = EventRow::new(event, EventType::Hal, "N/A");
    row.device = device;
    row.ptr = Some(addr);
    row.attrs_json = Some(format!(
        "{{\"allocation_id\":{id},\"addr\":\"{}\",\"size\":{size},\"used\":{used},\"total\":{used}}}",
        format_ptr(addr)
    ));
    row
}

fn malloc_row(api: &str, device: DeviceId, addr: u64, size: u64, id: u64, used: u64) -> EventRow {
    let mut row = hal_row(Event::Malloc, device, addr, size, id, used);
    if let Some(text) = row.attrs_json.as_mut() {
        text.pop();
        text.push_str(&format!(",\"owner\":\"HAL\",\"api\":\"{api}\"}}"));
    }
    row
}

/// Whether HAL rows of `event` are recorded now: the book is kept either way.
fn wanted(event: Event) -> bool {
    pipeline::admits(event)
}

/// An allocation call returned `rc`; on success the block is `addr` of `size` bytes.
pub fn allocated(layer: Layer, api: &'static str, rc: i32, addr: u64, size: u64) {
    inside(|| {
        if rc == CUDA_SUCCESS && addr != 0 {
            let device = device_of(layer);
            let Some((id, used)) = with_book(|book| {
                if let Some(stale) = book.blocks.remove(&addr) {
                    // Its free never reached us (a path we do not hook).
                    book.sub(stale.device, stale.size);
                }
                let (id, used) = book.add(device, size);
                book.blocks.insert(addr, Block { size, device, id });
                (id, used)
            }) else {
                return;
            };
            if wanted(Event::Malloc) {
                pipeline::emit(malloc_row(api, device, addr, size, id, used), true);
            }
        } else if rc == CUDA_ERROR_OUT_OF_MEMORY {
            pipeline::emit(oom_trigger(layer, api, size, device_of(layer)), true);
        }
    });
}

fn oom_trigger(layer: Layer, api: &str, size: u64, device: DeviceId) -> EventRow {
    let mut row = EventRow::new(Event::OomDetail, EventType::OomTrigger, "");
    row.device = device;
    row.attrs.insert("func".into(), api.into());
    row.attrs.insert("req_size".into(), size.into());
    let error = match layer {
        Layer::Driver => "CUDA_ERROR_OUT_OF_MEMORY",
        Layer::Runtime => "cudaErrorMemoryAllocation",
    };
    row.attrs.insert("error".into(), error.into());
    row
}

/// A free call of `addr` succeeded.
pub fn freed(layer: Layer, addr: u64) {
    if addr == 0 {
        // `cudaFree(0)`: the idiom that creates the context, no block.
        return;
    }
    inside(|| {
        let known = with_book(|book| {
            book.blocks.remove(&addr).map(|b| {
                let used = book.sub(b.device, b.size);
                (b, used)
            })
        })
        .flatten();
        if !wanted(Event::Free) {
            return;
        }
        let row = match known {
            Some((b, used)) => hal_row(Event::Free, b.device, addr, b.size, b.id, used),
            // Allocated before tracing began: size unknown.
            None => {
                let device = device_of(layer);
                let used = with_book(|book| *book.used.entry(device).or_default()).unwrap_or(0);
                hal_row(Event::Free, device, addr, 0, 0, used)
            }
        };
        pipeline::emit(row, true);
    });
}

/// `cuMemCreate` succeeded: `handle` holds `size` bytes on `device`.
pub fn created(handle: u64, size: u64, device: DeviceId) {
    inside(|| {
        let Some((id, used)) = with_book(|book| {
            let (id, used) = book.add(device, size);
            let block = Block { size, device, id };
            book.physical.insert(
                handle,
                Physical {
                    block,
                    released: false,
                    mappings: 0,
                },
            );
            (id, used)
        }) else {
            return;
        };
        pipeline::emit(
            malloc_row("cuMemCreate", device, handle, size, id, used),
            true,
        );
    });
}

/// `cuMemMap` succeeded.
pub fn mapped(addr: u64, size: u64, handle: u64) {
    inside(|| {
        with_book(|book| {
            if let Some(p) = book.physical.get_mut(&handle) {
                p.mappings += 1;
                book.mappings.insert(addr, (handle, size));
            }
        });
    });
}

/// `cuMemUnmap` of `[addr, addr + size)` succeeded.
pub fn unmapped(addr: u64, size: u64) {
    inside(|| {
        let ended = with_book(|book| {
            let end = addr.saturating_add(size.max(1));
            let inside: Vec<u64> = book.mappings.range(addr..end).map(|(a, _)| *a).collect();
            let mut ended = Vec::new();
            for a in inside {
                if let Some((handle, _)) = book.mappings.remove(&a) {
                    if let Some(p) = book.physical.get_mut(&handle) {
                        p.mappings = p.mappings.saturating_sub(1);
                        if p.released && p.mappings == 0 {
                            ended.push(handle);
                        }
                    }
                }
            }
            ended
                .into_iter()
                .filter_map(|h| end_physical(book, h))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
        for row in ended {
            pipeline::emit(row, true);
        }
    });
}

/// `cuMemRelease` succeeded: the memory goes once the last mapping does.
pub fn released(handle: u64) {
    inside(|| {
        let row = with_book(|book| {
            let p = book.physical.get_mut(&handle)?;
            p.released = true;
            if p.mappings == 0 {
                end_physical(book, handle)
            } else {
                None
            }
        })
        .flatten();
        if let Some(row) = row {
            pipeline::emit(row, true);
        }
    });
}

fn end_physical(book: &mut Book, handle: u64) -> Option<EventRow> {
    let p = book.physical.remove(&handle)?;
    let used = book.sub(p.block.device, p.block.size);
    Some(hal_row(
        Event::Free,
        p.block.device,
        handle,
        p.block.size,
        p.block.id,
        used,
    ))
}

/// A kernel launch that succeeded.
pub fn launched(layer: Layer, name: impl FnOnce() -> String, stream: u64) {
    if !pipeline::admits(Event::KernelLaunch) {
        return;
    }
    inside(|| {
        let mut row = EventRow::new(Event::KernelLaunch, EventType::KernelLaunch, name());
        row.device = device_of(layer);
        row.attrs_json = Some(format!("{{\"streamId\":{stream}}}"));
        pipeline::emit(row, true);
    });
}

/// Whether a successful call's result code lets the hook record it.
pub fn ok(rc: i32) -> bool {
    rc == CUDA_SUCCESS
}
