//! The runtime's side of the OOM analysis (`--analysis=oom[:K]`; the watch itself is
//! `msmemscope_core::analysis::oom_watch`, fed by the pipeline): the trigger row of a `malloc`
//! of the program that returned NULL, the count of small ones, and the host's memory for the
//! SNAPSHOT row.

use std::sync::atomic::Ordering;

use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};

pub use msmemscope_core::analysis::oom_watch::OomWatch;

/// Failed `malloc` requests at least this large are reported at once; smaller ones mean the
/// process is truly out of memory, where building rows could fail too: they are only counted.
pub const REPORTED_MALLOC_FAILURE: usize = 1 << 20;

/// The watch for `--analysis=oom:K`, its SNAPSHOT rows with the host's memory.
pub fn watch(k: u32) -> OomWatch {
    OomWatch::new(k).with_host_memory(host_memory)
}

/// MemTotal and MemAvailable in bytes, from /proc/meminfo.
fn host_memory() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// The trigger row of a failed `malloc` the program made.
pub fn malloc_failure_row(function: &str, size: usize) -> EventRow {
    let mut row = EventRow::new(Event::OomDetail, EventType::OomTrigger, "");
    row.device = DeviceId::Cpu;
    row.attrs.insert("func".into(), function.into());
    row.attrs.insert("req_size".into(), (size as u64).into());
    row.attrs
        .insert("error".into(), "malloc returned NULL (ENOMEM)".into());
    row
}

/// Whether the OOM analysis watches this run (read on the hook path).
pub fn watching() -> bool {
    super::OOM_ACTIVE.load(Ordering::Relaxed)
}
