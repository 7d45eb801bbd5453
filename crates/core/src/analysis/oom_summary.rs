//! The OOM summary (`--analysis=oom`): for each allocation that failed, one block of text on the
//! console (and in `analysis_report.txt`): the bytes asked for, the op, the user's line, and the
//! largest sites live at that moment.
//!
//! # Rules
//! - Live blocks: `MALLOC`/`FREE` rows of every pool (live_blocks' rules), each with its site
//!   (the `site` Attr, else the first Python frame), owner and module (the `module` Attr: the
//!   same line in two layers is two sites here, since the question is what filled memory).
//! - A failure is an `OOM_DETAIL OOM_TRIGGER` row (`req_size`, `func`, `error`, `site`). One
//!   failed tensor allocation often gives two triggers: the `malloc` hook's (`func` a libc
//!   function) and the tensor allocator's (`func` the op): triggers of the same device and size
//!   less than a second apart are one failure, named by the op when either names one.
//! - The largest live sites at the failure, by bytes ([`SHOWN_SITES`] of them); at most
//!   [`KEPT_FAILURES`] failures are described, the rest counted.

use std::collections::HashMap;

use super::fast_map::FastMap;
use super::leaks::findings::{human, source_of};
use super::leaks::sites::{owner_category, row_site};
use super::live_blocks::LiveBlocks;
use super::{Analysis, AnalysisOutput};
use crate::events::{DeviceId, Event, EventRow, EventType};

pub const SHOWN_SITES: usize = 5;
pub const KEPT_FAILURES: usize = 16;
const SAME_FAILURE_NS: u64 = 1_000_000_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveSite {
    pub site: Option<String>,
    pub owner: Option<String>,
    /// The module its blocks were allocated in (the `module` Attr), if the dump says.
    pub module: Option<String>,
    pub bytes: u64,
    pub blocks: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub device: DeviceId,
    pub requested: u64,
    pub op: Option<String>,
    pub site: Option<String>,
    pub error: Option<String>,
    pub ts_ns: u64,
    pub live_bytes: u64,
    pub live_blocks: u64,
    pub largest: Vec<LiveSite>,
}

type Origin = (Option<String>, Option<String>, Option<String>);

#[derive(Default)]
pub struct OomSummary {
    /// (size, index into `origins`) of each live block.
    live: LiveBlocks<(u64, u32)>,
    /// (site, owner, module) of the live blocks: what the largest sites are told apart by.
    origins: Vec<Origin>,
    origin_ids: HashMap<Origin, u32>,
    failures: Vec<Failure>,
    more_failures: u64,
    source: Option<super::leaks::findings::SourceLine>,
}

/// The op of a trigger's `func`: an ATen name, not the libc function the hook saw fail.
fn op_name(func: Option<&str>) -> Option<String> {
    func.filter(|f| f.contains("::")).map(str::to_string)
}

impl OomSummary {
    pub fn new() -> OomSummary {
        OomSummary::default()
    }

    /// With the user's source lines read by `source`.
    pub fn with_source(mut self, source: super::leaks::findings::SourceLine) -> OomSummary {
        self.source = Some(source);
        self
    }

    pub fn failures(&self) -> &[Failure] {
        &self.failures
    }

    fn origin_of(&mut self, row: &EventRow) -> u32 {
        let key = (
            row_site(row).map(|s| s.into_owned()),
            owner_category(row).map(str::to_string),
            row.attr_str("module").map(str::to_string),
        );
        if let Some(id) = self.origin_ids.get(&key) {
            return *id;
        }
        let id = self.origins.len() as u32;
        self.origins.push(key.clone());
        self.origin_ids.insert(key, id);
        id
    }

    fn trigger(&mut self, row: &EventRow) {
        let requested = row.attr_u64("req_size").unwrap_or(0);
        let op = op_name(row.attr_str("func")).or_else(|| op_name(Some(&row.name)));
        let site = row_site(row).map(|s| s.into_owned());
        let error = row.attr_string("error").map(|e| e.into_owned());
        if let Some(last) = self.failures.last_mut() {
            if last.device == row.device
                && last.requested == requested
                && row.ts_ns.saturating_sub(last.ts_ns) < SAME_FAILURE_NS
            {
                if last.op.is_none() {
                    last.op = op;
                    if error.is_some() {
                        last.error = error;
                    }
                }
                if last.site.is_none() {
                    last.site = site;
                }
                return;
            }
        }
        if self.failures.len() >= KEPT_FAILURES {
            self.more_failures += 1;
            return;
        }
        let mut by_origin: FastMap<u32, (u64, u64)> = FastMap::default();
        let (mut live_bytes, mut live_blocks) = (0u64, 0u64);
        for (key, &(size, origin)) in self.live.iter() {
            if row.device != DeviceId::None && key.device != row.device {
                continue;
            }
            live_bytes += size;
            live_blocks += 1;
            let e = by_origin.entry(origin).or_default();
            e.0 += size;
            e.1 += 1;
        }
        let mut largest: Vec<LiveSite> = by_origin
            .into_iter()
            .map(|(origin, (bytes, blocks))| {
                let (site, owner, module) = self.origins[origin as usize].clone();
                LiveSite {
                    site,
                    owner,
                    module,
                    bytes,
                    blocks,
                }
            })
            .collect();
        largest.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
        largest.truncate(SHOWN_SITES);
        self.failures.push(Failure {
            device: row.device,
            requested,
            op,
            site,
            error,
            ts_ns: row.ts_ns,
            live_bytes,
            live_blocks,
            largest,
        });
    }

    /// The console text (empty when nothing failed).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.failures {
            out.push_str(&format!(
                "====== OOM: an allocation of {} ({} bytes) failed on device {} ======\n",
                human(f.requested),
                f.requested,
                f.device
            ));
            let at = f.site.as_deref().unwrap_or("(no Python line recorded)");
            match &f.op {
                Some(op) => out.push_str(&format!("  op {op} at {at}\n")),
                None => out.push_str(&format!("  at {at}\n")),
            }
            let source = source_of(f.site.as_deref(), self.source);
            if let Some(source) = source {
                out.push_str(&format!("      {source}\n"));
            }
            if let Some(error) = &f.error {
                out.push_str(&format!("  error: {error}\n"));
            }
            out.push_str(&format!(
                "  live then: {} ({} bytes) in {} block(s)",
                human(f.live_bytes),
                f.live_bytes,
                f.live_blocks
            ));
            if f.largest.is_empty() {
                out.push('\n');
                continue;
            }
            out.push_str("; the largest sites:\n");
            for s in &f.largest {
                out.push_str(&format!(
                    "    {}: {} ({} bytes) in {} block(s)",
                    s.site.as_deref().unwrap_or("(no Python line recorded)"),
                    human(s.bytes),
                    s.bytes,
                    s.blocks
                ));
                if let Some(owner) = &s.owner {
                    out.push_str(&format!("; owner {owner}"));
                }
                if let Some(module) = &s.module {
                    out.push_str(&format!("; in {module}"));
                }
                out.push('\n');
            }
        }
        if self.more_failures > 0 {
            out.push_str(&format!(
                "  ... and {} more failed allocation(s) (OOM_TRIGGER rows in the dump)\n",
                self.more_failures
            ));
        }
        out
    }
}

impl Analysis for OomSummary {
    fn name(&self) -> &'static str {
        "oom"
    }

    fn feed(&mut self, row: &EventRow) {
        match (row.event, row.event_type) {
            (Event::Malloc, _) if row.ptr.is_some() => {
                let size = row.attr_u64("size").unwrap_or(0);
                let origin = self.origin_of(row);
                self.live.apply(row, || (size, origin));
            }
            (Event::Free, _) => {
                self.live.apply(row, || (0, 0));
            }
            (Event::OomDetail, EventType::OomTrigger) => self.trigger(row),
            _ => {}
        }
    }

    fn finish(&mut self) -> AnalysisOutput {
        self.live.clear();
        AnalysisOutput {
            console: self.render(),
            files: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn malloc(ptr: u64, size: u64, site: &str, owner: &str) -> EventRow {
        let mut r = EventRow::new(Event::Malloc, EventType::Pta, "N/A");
        r.device = DeviceId::Cpu;
        r.ptr = Some(ptr);
        r.attrs_json = Some(format!(
            "{{\"size\":{size},\"owner\":\"{owner}\",\"site\":\"{site}\"}}"
        ));
        r
    }

    fn trigger(func: &str, size: u64, ts_ns: u64) -> EventRow {
        let mut r = EventRow::new(Event::OomDetail, EventType::OomTrigger, func);
        r.device = DeviceId::Cpu;
        r.ts_ns = ts_ns;
        r.attrs_json = Some(format!(
            "{{\"func\":\"{func}\",\"req_size\":{size},\"error\":\"no memory\",\"site\":\"/w/t.py:9 (main)\"}}"
        ));
        r
    }

    #[test]
    fn one_summary_per_failure_with_the_largest_live_sites() {
        let mut oom = OomSummary::new();
        let mut free = EventRow::new(Event::Free, EventType::Pta, "N/A");
        free.device = DeviceId::Cpu;
        free.ptr = Some(0x30);
        for row in [
            malloc(0x10, 3000, "/w/t.py:4 (main)", "PTA@weight"),
            malloc(0x20, 3000, "/w/t.py:4 (main)", "PTA@weight"),
            malloc(0x30, 10_000, "/w/t.py:5 (main)", "PTA"),
            malloc(0x40, 100, "/w/t.py:6 (main)", "PTA@activation"),
            free,
            // The malloc hook's trigger, then the tensor allocator's: one failure.
            trigger("posix_memalign", 1 << 40, 1_000),
            trigger("aten::empty.memory_format", 1 << 40, 2_000),
        ] {
            oom.feed(&row);
        }
        let out = oom.finish();
        assert_eq!(
            out.console,
            "====== OOM: an allocation of 1.00 TiB (1099511627776 bytes) failed on device cpu ======\n\
             \x20 op aten::empty.memory_format at /w/t.py:9 (main)\n\
             \x20 error: no memory\n\
             \x20 live then: 5.96 KiB (6100 bytes) in 3 block(s); the largest sites:\n\
             \x20   /w/t.py:4 (main): 5.86 KiB (6000 bytes) in 2 block(s); owner weight\n\
             \x20   /w/t.py:6 (main): 100 B (100 bytes) in 1 block(s); owner activation\n"
        );
        assert_eq!(oom.failures().len(), 1);
    }
}
