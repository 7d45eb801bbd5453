//! Window close: one pass over the ledger turns it into the report model, then files.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use msmemscope_core::config::HostLeakMode;
use msmemscope_core::host_leak::buckets::bucket_index;
use msmemscope_core::host_leak::detail_csv::{render_block_detail, sort_blocks};
use msmemscope_core::host_leak::lsi::{self, SiteFacts, WindowFacts};
use msmemscope_core::host_leak::made_once::demote_imports;
use msmemscope_core::host_leak::overview::render_overview;
use msmemscope_core::host_leak::sampling;
use msmemscope_core::host_leak::sites_json::render_sites_json;
use msmemscope_core::host_leak::{
    resident_listed, AllocDomain, AllocatorPath, BlockDetail, CountBytes, DataHealth,
    HostLeakReport, LeakSite, PythonObjects, SeriesMeta, SizeHistogram, WindowSpan,
};
use msmemscope_core::run_dir::RunDir;
use msmemscope_core::symbolize::Symbolizer;

use super::beats;
use super::block_table::lock_until;
use super::ledger::Ledger;
use super::stack_table::StackCounts;
use super::stack_table::UNKNOWN_STACK;
use crate::clock::realtime_ns;
use crate::unwind::modules;

/// Builds the report; with event mode also the per-block details (largest first).
pub fn build_report(
    ledger: &Ledger,
    deadline: Instant,
    interim: bool,
) -> (HostLeakReport, Option<Vec<BlockDetail>>) {
    let end_ns = realtime_ns();
    let event_mode = ledger.settings.mode == HostLeakMode::Event && !interim;
    // The closing sample ends every series at the moment of the report. An interim snapshot
    // adds no point: the series go on as if it had not been taken.
    if !interim {
        ledger.take_beat(ledger.beats.beat_at(end_ns), true);
    }
    let end_ms = end_ns.saturating_sub(ledger.start_ns) / 1_000_000;

    let mut unfreed_by_stack: HashMap<u32, Unfreed> = HashMap::new();
    let mut unfreed_sizes = SizeHistogram::default();
    let mut raw_blocks: Vec<(usize, u64, u64, u32)> = Vec::new();
    let mean = ledger.settings.sample_bytes;
    let mut unread = ledger.blocks.for_each_shard(deadline, |shard| {
        for (ptr, block) in shard.iter() {
            // With sampling by bytes a block stands for the blocks and bytes it estimates.
            let (count, bytes) = sampling::weight(block.size, mean);
            let entry = unfreed_by_stack.entry(block.stack).or_default();
            entry.blocks.merge(CountBytes { count, bytes });
            entry.samples += 1;
            entry.age_ms_sum += end_ms.saturating_sub(block.alloc_ms as u64) * count;
            let bucket = bucket_index(block.size);
            unfreed_sizes.count[bucket] += count;
            unfreed_sizes.bytes[bucket] += bytes;
            if event_mode {
                raw_blocks.push((ptr, block.size, ledger.alloc_ns(block), block.stack));
            }
        }
    });

    let mut overflow_unfreed = CountBytes::default();
    let (overflow_allocations, overflow_frees) = match ledger.overflow.collect(deadline) {
        Some(state) => {
            for &(_, size) in &state.live {
                overflow_unfreed.add(size);
                unfreed_sizes.add(size);
            }
            (state.allocations, state.frees)
        }
        None => {
            unread += 1;
            (CountBytes::default(), CountBytes::default())
        }
    };

    let (stacks, unknown, unread_stacks) = ledger
        .stacks
        .collect(deadline, |id| unfreed_by_stack.contains_key(&id));
    unread += unread_stacks;

    let mut allocations = overflow_allocations;
    allocations.merge(unknown.allocated);
    allocations.merge(ledger.stacks.allocated_total());

    // After the closing sample, which may have coarsened the series.
    let summary = ledger.beats.summary();
    let window = WindowFacts {
        start_ns: ledger.start_ns,
        end_ns,
        beat_ms: summary.beat_ms,
        sampled_ms: summary.last_beat_ms,
    };
    let assess_site = |id: Option<u32>, counts: &StackCounts, unfreed: &Unfreed| {
        let facts = SiteFacts {
            unfreed: unfreed.blocks,
            allocated: counts.allocated,
            freed_count: counts.freed.count,
            mean_live_age_ms: unfreed.age_ms_sum as f64 / unfreed.blocks.count.max(1) as f64,
            mean_freed_lifetime_ms: counts.freed_lifetime_ms as f64
                / counts.freed.count.max(1) as f64,
            last_alloc_ns: counts.last_alloc_ns,
            first_alloc_ns: counts.first_alloc_ns,
        };
        let flat_tail = if mean > 0 {
            lsi::FLAT_TAIL + sampling::tail_noise(unfreed.samples)
        } else {
            lsi::FLAT_TAIL
        };
        lsi::assess_with_flat_tail(
            &ledger.beats.series_of(id, &window),
            &facts,
            &window,
            flat_tail,
        )
    };
    let mut all_sites: Vec<LeakSite> = Vec::new();
    let mut frames_of: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut python_of: HashMap<u32, u32> = HashMap::new();
    for s in stacks {
        let Some(unfreed) = unfreed_by_stack.get(&s.id) else {
            continue;
        };
        all_sites.push(LeakSite {
            stack_id: Some(s.id),
            unfreed: unfreed.blocks,
            allocated: s.counts.allocated,
            freed: s.counts.freed,
            assessment: assess_site(Some(s.id), &s.counts, unfreed),
            samples: unfreed.samples,
            frames: Vec::new(),
            python_frames: Vec::new(),
            cut: s.cut,
            domain: s.domain,
            live_series: Vec::new(),
        });
        frames_of.insert(s.id, s.frames);
        if let Some(node) = s.python {
            python_of.insert(s.id, node);
        }
    }
    if let Some(unfreed) = unfreed_by_stack.get(&UNKNOWN_STACK) {
        all_sites.push(LeakSite {
            stack_id: None,
            unfreed: unfreed.blocks,
            allocated: unknown.allocated,
            freed: unknown.freed,
            assessment: assess_site(None, &unknown, unfreed),
            samples: unfreed.samples,
            frames: Vec::new(),
            python_frames: Vec::new(),
            cut: false,
            domain: AllocDomain::Malloc,
            live_series: Vec::new(),
        });
    }
    let (mut sites, mut resident) = HostLeakReport::rank_sites(all_sites);
    let top_n = ledger.settings.top_n;
    let made_once = |site: &mut LeakSite| {
        let node = site.stack_id.and_then(|id| python_of.remove(&id))?;
        site.python_frames = ledger.stacks.python_frames(node, deadline);
        Some(lsi::made_by_import(&site.python_frames))
    };
    demote_imports(&mut sites, &mut resident, top_n, made_once);

    let mut unfreed = overflow_unfreed;
    for u in unfreed_by_stack.values() {
        unfreed.merge(u.blocks);
    }

    // Symbolize what the report shows: the TOP N, the resident rows it lists, and in event
    // mode every site (the block details carry stacks).
    let mut symbols = SymbolCache::new();
    let (shown_leaks, shown_resident) = if event_mode {
        (sites.len(), resident.len())
    } else {
        (
            top_n,
            resident_listed(&resident, unfreed.bytes, top_n, interim),
        )
    };
    for site in sites
        .iter_mut()
        .take(shown_leaks)
        .chain(resident.iter_mut().take(shown_resident))
    {
        if let Some(frames) = site.stack_id.and_then(|id| frames_of.get(&id)) {
            site.frames = symbols.render(frames);
        }
        if let Some(node) = site.stack_id.and_then(|id| python_of.remove(&id)) {
            site.python_frames = ledger.stacks.python_frames(node, deadline);
        }
        if let lsi::Series::Points(points) = ledger.beats.series_of(site.stack_id, &window) {
            site.live_series = points
                .iter()
                .map(|p| (p.beat, p.live_bytes as u64))
                .collect();
        }
    }

    let details = event_mode.then(|| {
        let by_id: HashMap<Option<u32>, ShownSite<'_>> = sites
            .iter()
            .chain(resident.iter())
            .map(|s| (s.stack_id, (&s.frames, &s.python_frames, s.domain)))
            .collect();
        let mut details: Vec<BlockDetail> = raw_blocks
            .into_iter()
            .map(|(addr, size, ts, stack)| {
                let key = (stack != UNKNOWN_STACK).then_some(stack);
                BlockDetail {
                    addr: addr as u64,
                    size,
                    alloc_ts_ns: ts,
                    c_stack: by_id.get(&key).map(|f| f.0.clone()).unwrap_or_default(),
                    python_stack: by_id.get(&key).map(|f| f.1.clone()).unwrap_or_default(),
                    domain: by_id.get(&key).map(|f| f.2).unwrap_or_default(),
                    estimated_bytes: (mean > 0).then(|| sampling::weight(size, mean).1),
                }
            })
            .collect();
        sort_blocks(&mut details);
        details
    });

    // Every tracked block is either still in the ledger or was freed.
    let frees = minus(allocations, unfreed);
    let mut prewindow_free_sizes = SizeHistogram::default();
    let mut prewindow_frees = CountBytes::default();
    for (i, stripe) in ledger.prewindow_frees.iter().enumerate() {
        let cb = stripe.sum();
        prewindow_free_sizes.count[i] = cb.count;
        prewindow_free_sizes.bytes[i] = cb.bytes;
        prewindow_frees.merge(cb);
    }

    let s = &ledger.settings;
    let health = DataHealth {
        mode: s.mode,
        allocations,
        frees,
        distinct_stacks: ledger.stacks.interned(),
        unknown_bucket_allocations: ledger.stacks.unattributed_allocs(),
        recycled_stacks: ledger.stacks.recycled(),
        truncation_bits: ledger.truncation_bits(),
        stopped_at_ns: ledger.stopped_at_ns(),
        overflow_allocations,
        overflow_frees,
        prewindow_frees,
        sample_rate: s.sample_rate,
        sample_rate_requested: s.sample_rate_requested,
        sample_bytes: s.sample_bytes,
        untracked_sampled: ledger.untracked_sampled.sum(),
        frees_untracked: ledger.frees_untracked.sum().count,
        block_size_threshold: s.block_size_threshold,
        untracked_below_threshold: ledger.untracked_below_threshold.sum(),
        symbolized_frames: symbols.resolved,
        total_frames: symbols.total,
        cut_stacks: ledger.stacks.cut_stacks(),
        python_version: crate::python::version(),
        python_depth: s.python_depth,
        block_cap: s.block_cap,
        overflow_cap: s.overflow_cap,
        stack_cap: s.stack_cap,
        unread_shards: unread,
        allocator: allocator_path(),
        python_objects: python_objects(ledger),
    };
    let report = HostLeakReport {
        stage: ledger.stage,
        pid: std::process::id(),
        interim,
        window: WindowSpan {
            start_ns: ledger.start_ns,
            end_ns,
            still_open: interim,
        },
        health,
        unfreed,
        overflow_unfreed,
        unfreed_sizes,
        prewindow_free_sizes,
        sites,
        resident,
        series: SeriesMeta {
            top_k: beats::TOP_K,
            max_series: beats::MAX_SERIES,
            beat_ms: summary.beat_ms,
            adaptive: summary.adaptive,
            first_beat_ms: summary.first_beat_ms,
            last_beat_ms: summary.last_beat_ms,
            beats_taken: summary.beats_taken,
            window_beats: window.beats(),
            series: summary.series,
            evicted: summary.evicted,
        },
        top_n,
        snapshot_freeze: CountBytes::default(),
    };
    (report, details)
}

/// What a block's row shows of its site: C frames, Python frames, allocator.
type ShownSite<'a> = (&'a Vec<String>, &'a Vec<String>, AllocDomain);

/// A stack's unfreed blocks and their summed ages, from the block walk.
#[derive(Default)]
struct Unfreed {
    blocks: CountBytes,
    /// Ledger blocks behind `blocks` (fewer with sampling by bytes).
    samples: u64,
    age_ms_sum: u64,
}

/// Whether the window accounted Python objects, and why not.
fn python_objects(ledger: &Ledger) -> PythonObjects {
    if crate::python::version().is_none() {
        PythonObjects::NoInterpreter
    } else if !ledger.settings.python_objects_on() {
        PythonObjects::Off
    } else if !crate::python::object_allocators_wrapped() {
        PythonObjects::NotInstalled
    } else {
        PythonObjects::Tracked {
            allocations: ledger.python_allocations.sum(),
        }
    }
}

fn minus(a: CountBytes, b: CountBytes) -> CountBytes {
    CountBytes {
        count: a.count.saturating_sub(b.count),
        bytes: a.bytes.saturating_sub(b.bytes),
    }
}

/// The symbolizer of every window of the process: a module's symbols and DWARF (and its
/// installed debug file's, libc's being tens of megabytes) are read once, not once a window.
static SYMBOLIZER: Mutex<Option<SharedSymbolizer>> = Mutex::new(None);

struct SharedSymbolizer(Symbolizer);

// SAFETY: the symbolizer's loaders may hold reference-counted parts that are not Send, but
// every one of them stays inside the symbolizer, which is only ever used by one thread at a
// time, under SYMBOLIZER's lock.
unsafe impl Send for SharedSymbolizer {}

/// How long a report waits for the shared symbolizer (held by another report, or by a thread
/// that does not exist in this forked child) before it uses one of its own.
const SYMBOLIZER_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Symbolizes each distinct return address once and counts coverage over reported frames.
struct SymbolCache {
    symbolizer: Option<std::sync::MutexGuard<'static, Option<SharedSymbolizer>>>,
    own: Option<Symbolizer>,
    rendered: HashMap<u64, (Vec<String>, bool)>,
    resolved: u64,
    total: u64,
}

impl SymbolCache {
    fn new() -> SymbolCache {
        // Modules loaded since the last scan (still mapped now) are added before resolving.
        modules::refresh(false);
        let fresh =
            || Symbolizer::new(modules::seen_modules()).with_fallback(Box::new(dladdr_name));
        let mut own = None;
        let symbolizer = match lock_until(&SYMBOLIZER, Instant::now() + SYMBOLIZER_WAIT) {
            Some(mut shared) => {
                match shared.as_mut() {
                    Some(s) => s.0.set_modules(modules::seen_modules()),
                    None => *shared = Some(SharedSymbolizer(fresh())),
                }
                Some(shared)
            }
            None => {
                own = Some(fresh());
                None
            }
        };
        SymbolCache {
            own,
            symbolizer,
            rendered: HashMap::new(),
            resolved: 0,
            total: 0,
        }
    }

    fn render(&mut self, frames: &[u64]) -> Vec<String> {
        let mut out = Vec::with_capacity(frames.len());
        for &address in frames {
            let symbolizer = match self.symbolizer.as_mut() {
                Some(shared) => shared.as_mut().map(|s| &mut s.0),
                None => self.own.as_mut(),
            };
            let (lines, ok) = self.rendered.entry(address).or_insert_with(|| {
                let frames = match symbolizer {
                    Some(symbolizer) => symbolizer.symbolize_return_address(address),
                    None => Vec::new(),
                };
                let ok = frames.iter().any(|f| f.is_resolved());
                (frames.iter().map(|f| f.render()).collect(), ok)
            });
            self.total += 1;
            if *ok {
                self.resolved += 1;
            }
            out.extend(lines.iter().cloned());
        }
        out
    }
}

/// The dynamic symbol `dladdr` finds for a return address, for libraries without `.symtab`.
fn dladdr_name(address: u64) -> Option<String> {
    // SAFETY: `Dl_info` is a C struct of raw pointers, for which all-zero bytes (null pointers)
    // are a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables; info is a valid out-pointer.
    let found = unsafe { libc::dladdr((address - 1) as *const libc::c_void, &mut info) } != 0;
    if !found || info.dli_sname.is_null() {
        return None;
    }
    // SAFETY: dli_sname is a NUL-terminated string owned by the loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_sname) }.to_string_lossy();
    Some(addr2line::demangle_auto(name, None).into_owned())
}

/// Writes `leak_overview_{stage}.txt` (and `block_detail_{stage}.csv` when given) into
/// `run_dir/host_leak/` (mode 0750), through the run directory's held descriptor, never
/// following a symlink. Returns the overview's path.
pub fn write_report(
    run_dir: &RunDir,
    report: &HostLeakReport,
    details: Option<&[BlockDetail]>,
) -> std::io::Result<PathBuf> {
    let dir = Path::new("host_leak");
    let write = |name: String, bytes: &[u8]| -> std::io::Result<()> {
        run_dir.create_file_io(&dir.join(name))?.write_all(bytes)
    };
    let overview = format!("leak_overview_{}.txt", report.stage);
    write(overview.clone(), render_overview(report).as_bytes())?;
    // The machine-readable twin of the overview (TOP N with their beat series), for the report page.
    write(
        format!("leak_sites_{}.json", report.stage),
        render_sites_json(report).as_bytes(),
    )?;
    if let Some(details) = details {
        // Written even without a row (header only): the overview says it was written, and a
        // reader can tell "no unfreed block" from "no file".
        write(
            format!("block_detail_{}.csv", report.stage),
            render_block_detail(details, report.health.sample_bytes > 0).as_bytes(),
        )?;
    }
    Ok(run_dir.path().join(dir).join(overview))
}

/// Where the program's `malloc` went, for Data Health.
fn allocator_path() -> AllocatorPath {
    if let Some(who) = crate::forward::malloc_ahead_of_runtime() {
        return AllocatorPath::Bypassed(who);
    }
    match crate::forward::foreign_allocator() {
        Some((file, own_operator_new)) => AllocatorPath::Forwarded {
            file,
            own_operator_new,
        },
        None => AllocatorPath::Glibc,
    }
}
