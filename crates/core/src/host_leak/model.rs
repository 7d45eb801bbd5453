//! What a closed (or snapshotted) host-leak window produced. Plain data: the runtime fills it,
//! the renderers only read it, and tests build it by hand.

use super::lsi::Assessment;
use super::SizeHistogram;
use crate::config::HostLeakMode;

/// Default and largest number of leak sites in the TOP N section.
pub const DEFAULT_TOP_N: usize = 10;
pub const MAX_TOP_N: usize = 1024;
/// Number of leading frames that identify a stack.
pub const STACK_KEY_FRAMES: usize = 20;

/// Defaults of the ledger's caps (docs/analyses.md#limits).
pub const DEFAULT_BLOCK_CAP: u64 = 20_000_000;
pub const DEFAULT_OVERFLOW_CAP: u64 = 5_000_000;
pub const DEFAULT_STACK_CAP: u64 = 400_000;
/// The stack table's cap in a Python process: `import torch` alone allocates from about 700,000
/// distinct sites with `malloc` and as many again with the interpreter's own allocators (each
/// line of thousands of module bodies runs once), most of them kept, so the default cap would
/// send most of them to the unknown bucket.
pub const PYTHON_STACK_CAP: u64 = 2_000_000;

/// Why the ledger's data is incomplete, one bit each (the original msMemScope's numbering).
pub mod truncation {
    /// The block table reached its cap: later blocks went to the overflow ledger, without stacks.
    pub const BLOCK_TABLE_FULL: u32 = 1 << 0;
    /// The stack table was full and no dead stack could be recycled: new stacks went to the
    /// unknown bucket.
    pub const STACK_TABLE_FULL: u32 = 1 << 1;
    /// The overflow ledger was full too: accounting stopped.
    pub const ACCOUNTING_STOPPED: u32 = 1 << 2;
    /// The runtime's own memory ran out (the program's allocations went on): accounting
    /// stopped (with ACCOUNTING_STOPPED).
    pub const RUNTIME_OUT_OF_MEMORY: u32 = 1 << 3;
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountBytes {
    pub count: u64,
    pub bytes: u64,
}

impl CountBytes {
    pub fn add(&mut self, bytes: u64) {
        self.count += 1;
        self.bytes += bytes;
    }

    pub fn merge(&mut self, other: CountBytes) {
        self.count += other.count;
        self.bytes += other.bytes;
    }
}

/// The window's time span, in nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowSpan {
    pub start_ns: u64,
    pub end_ns: u64,
    /// True for an interim snapshot: the window is still open at `end_ns`.
    pub still_open: bool,
}

/// Everything that limited or shaped the data, stated in Data Health Analysis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataHealth {
    pub mode: HostLeakMode,
    pub allocations: CountBytes,
    pub frees: CountBytes,
    pub distinct_stacks: u64,
    /// Allocations attributed to the unknown bucket (stack table full, or no stack captured).
    pub unknown_bucket_allocations: u64,
    pub recycled_stacks: u64,
    pub truncation_bits: u32,
    /// When accounting stopped, nanoseconds since the epoch.
    pub stopped_at_ns: Option<u64>,
    pub overflow_allocations: CountBytes,
    pub overflow_frees: CountBytes,
    pub prewindow_frees: CountBytes,
    pub sample_rate: u64,
    pub sample_rate_requested: u64,
    /// Sampling by bytes: the mean interval between samples (0: exact). When set, every
    /// count and byte figure of the report is an estimate (`sampling::weight`).
    pub sample_bytes: u64,
    pub untracked_sampled: CountBytes,
    pub frees_untracked: u64,
    pub block_size_threshold: u64,
    pub untracked_below_threshold: CountBytes,
    pub symbolized_frames: u64,
    pub total_frames: u64,
    /// Interned stacks cut at the key's depth.
    pub cut_stacks: u64,
    /// The CPython whose frames were read, and how many per stack (0: off).
    pub python_version: Option<(u8, u8)>,
    pub python_depth: usize,
    pub block_cap: u64,
    pub overflow_cap: u64,
    pub stack_cap: u64,
    /// Ledger shards that could not be read within the aggregation deadline.
    pub unread_shards: u32,
    /// Which allocator the program's `malloc` reached.
    pub allocator: AllocatorPath,
    /// Whether the interpreter's own allocators (Python objects) were accounted.
    pub python_objects: PythonObjects,
}

/// Which allocator a block came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AllocDomain {
    /// The C heap: `malloc` and its family, C++ `new`.
    #[default]
    Malloc,
    /// CPython's own allocators (`PyMem_Malloc`, `PyObject_Malloc`): Python objects and the
    /// interpreter's memory, served from its arenas rather than from `malloc`.
    Pymalloc,
}

impl AllocDomain {
    /// The name in reports and in `block_detail`'s `Domain` column.
    pub fn label(self) -> &'static str {
        match self {
            AllocDomain::Malloc => "malloc",
            AllocDomain::Pymalloc => "pymalloc",
        }
    }
}

/// Whether a window accounted the interpreter's allocators, and if not, why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PythonObjects {
    /// No CPython whose allocators can be wrapped runs in the process.
    #[default]
    NoInterpreter,
    /// Turned off (`--python-objects=off`, or `--call-stack=python:0`: a Python object's site is
    /// its Python frames).
    Off,
    /// CPython runs, but its allocators were not wrapped: the interpreter never called in (it
    /// started without msmemscope's start-up module, e.g. `python -S` or `-I`).
    NotInstalled,
    /// Wrapped: the Python-object allocations the window tracked.
    Tracked { allocations: CountBytes },
}

/// Where the program's `malloc` calls go, as the runtime found the process's symbol lookup.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum AllocatorPath {
    /// Through the hooks to glibc's allocator.
    #[default]
    Glibc,
    /// Through the hooks to another allocator loaded after the runtime: its file, and whether it
    /// brings its own C++ `operator new`, which does not call `malloc` (those blocks are unseen).
    Forwarded {
        file: String,
        own_operator_new: bool,
    },
    /// Not through the hooks: a module ahead of the runtime in symbol lookup defines `malloc`
    /// (the program itself, or a library preloaded before the runtime).
    Bypassed(String),
}

/// One call stack's line in the report. `stack_id == None` is the unknown bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct LeakSite {
    pub stack_id: Option<u32>,
    pub unfreed: CountBytes,
    pub allocated: CountBytes,
    pub freed: CountBytes,
    pub assessment: Assessment,
    /// The ledger blocks behind `unfreed`: with sampling by bytes, the samples its estimate
    /// rests on (equal to `unfreed.count` when exact).
    pub samples: u64,
    /// Rendered frames, innermost first.
    pub frames: Vec<String>,
    /// The Python frames the stack was allocated under (`file(line): function`), innermost
    /// first; empty where no Python code ran.
    pub python_frames: Vec<String>,
    /// The stack went on beyond the key's depth: callers further out share this site.
    pub cut: bool,
    /// The allocator the site's blocks came from.
    pub domain: AllocDomain,
    /// The site's live bytes at each beat, `(beat, bytes)`, for displays (`leak_sites_N.json`);
    /// filled for the sites the report shows, empty when the site has no series.
    pub live_series: Vec<(f64, u64)>,
}

/// How the beat series were taken, for the TOP N section's first line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeriesMeta {
    pub top_k: usize,
    pub max_series: usize,
    /// The configured beat: the unit of the series' positions and of slopes.
    pub beat_ms: u64,
    /// Whether the beat adapted to the window (no `MSMEMSCOPE_HOST_BEAT_MS`).
    pub adaptive: bool,
    /// The beat the window started and ended sampling at (both `beat_ms` when fixed).
    pub first_beat_ms: f64,
    pub last_beat_ms: f64,
    pub beats_taken: u64,
    pub window_beats: f64,
    pub series: usize,
    pub evicted: usize,
}

/// One unfreed block for `block_detail_{stage}.csv`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDetail {
    pub addr: u64,
    pub size: u64,
    pub alloc_ts_ns: u64,
    pub c_stack: Vec<String>,
    pub python_stack: Vec<String>,
    pub domain: AllocDomain,
    /// With sampling by bytes: the bytes this sampled block stands for (`None`: exact).
    pub estimated_bytes: Option<u64>,
}

/// A resident site beyond the TOP N largest is listed when it holds at least 1/this of the
/// window's unfreed bytes (0.5 %): at most 200 such sites.
pub const RESIDENT_LISTED_SHARE: u64 = 200;

/// The length of the prefix of `resident` (sorted by unfreed bytes, largest first) a report
/// lists; see [`HostLeakReport::resident_shown`].
pub fn resident_listed(
    resident: &[LeakSite],
    unfreed_bytes: u64,
    top_n: usize,
    interim: bool,
) -> usize {
    if interim {
        return resident.len().min(top_n);
    }
    let beyond = resident
        .iter()
        .skip(top_n)
        .take_while(|s| s.unfreed.bytes.saturating_mul(RESIDENT_LISTED_SHARE) >= unfreed_bytes)
        .count();
    resident.len().min(top_n) + beyond
}

#[derive(Clone, Debug, PartialEq)]
pub struct HostLeakReport {
    pub stage: u32,
    pub pid: u32,
    pub interim: bool,
    pub window: WindowSpan,
    pub health: DataHealth,
    /// Unfreed blocks of the ledger, the unknown bucket and the overflow channel together.
    pub unfreed: CountBytes,
    /// Unfreed blocks in the overflow channel (part of `unfreed`, never in the detail CSV).
    pub overflow_unfreed: CountBytes,
    pub unfreed_sizes: SizeHistogram,
    pub prewindow_free_sizes: SizeHistogram,
    /// Sites with unfreed blocks that are not resident, ordered by LSI (then unfreed bytes).
    pub sites: Vec<LeakSite>,
    /// Resident sites (caches, pools, rings), ordered by unfreed bytes; not in the TOP N.
    pub resident: Vec<LeakSite>,
    pub series: SeriesMeta,
    pub top_n: usize,
    /// Interim snapshots only: tracked allocations that arrived while the snapshot walked the
    /// ledger (counted in the window, possibly missing from the snapshot).
    pub snapshot_freeze: CountBytes,
}

impl HostLeakReport {
    /// Reasons the window cannot support a leak conclusion; empty when it can.
    pub fn unusable_reasons(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        match &self.health.allocator {
            AllocatorPath::Bypassed(who) => reasons.push(format!(
                "malloc is defined by {who}, which the loader finds before the runtime, so the \
                 program's allocations never reach the hooks (only calls bound to the runtime's \
                 functions are counted)"
            )),
            AllocatorPath::Forwarded {
                file,
                own_operator_new: true,
            } => reasons.push(format!(
                "blocks from C++ operator new are not seen ({file} brings its own, which does not \
                 call malloc); malloc's are"
            )),
            _ => {}
        }
        if self.health.truncation_bits & truncation::RUNTIME_OUT_OF_MEMORY != 0 {
            reasons.push(
                "accounting stopped when the runtime's own memory ran out (the program went on): \
                 the data is the prefix up to that point"
                    .to_string(),
            );
        } else if self.health.truncation_bits & truncation::ACCOUNTING_STOPPED != 0 {
            reasons.push(
                "accounting stopped when the overflow ledger filled: the data is the prefix up to that point"
                    .to_string(),
            );
        }
        if self.health.unread_shards > 0 {
            reasons.push(format!(
                "{} ledger shard(s) could not be read before the aggregation deadline",
                self.health.unread_shards
            ));
        }
        reasons
    }

    /// How many of the resident sites (largest first) the overview and the sites file list.
    /// A closed window lists the TOP N largest and every further one holding at least
    /// 1/[`RESIDENT_LISTED_SHARE`] of the window's unfreed bytes: a Python process leaves
    /// hundreds of thousands of small one-off sites (every imported module's objects), and
    /// listing them all made a report of hundreds of megabytes. An interim snapshot lists at
    /// most TOP N.
    pub fn resident_shown(&self) -> usize {
        resident_listed(&self.resident, self.unfreed.bytes, self.top_n, self.interim)
    }

    /// Splits assessed sites into (leak sites by LSI, resident sites by unfreed bytes).
    pub fn rank_sites(sites: Vec<LeakSite>) -> (Vec<LeakSite>, Vec<LeakSite>) {
        let (mut resident, mut leaks): (Vec<LeakSite>, Vec<LeakSite>) =
            sites.into_iter().partition(|s| s.assessment.is_resident());
        let by_bytes = |a: &LeakSite, b: &LeakSite| {
            b.unfreed
                .bytes
                .cmp(&a.unfreed.bytes)
                .then(b.unfreed.count.cmp(&a.unfreed.count))
                .then(a.stack_id.cmp(&b.stack_id))
        };
        leaks.sort_by(|a, b| {
            b.assessment
                .lsi
                .total_cmp(&a.assessment.lsi)
                .then_with(|| by_bytes(a, b))
        });
        resident.sort_by(by_bytes);
        (leaks, resident)
    }
}
