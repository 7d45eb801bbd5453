//! The event pipeline: producers (the Python tracker through the C ABI, MSTX/NVTX marks) emit
//! rows; the pipeline stamps them (time, process, thread, C stack), filters them by the run's
//! configuration (tracing on/off, `--events`, `--device`, `--level`, `--steps`), and queues them
//! in per-thread buffers that the writer thread drains into the dump files.
//!
//! Layer 5 of the runtime (ARCHITECTURE.md; crates/core/tests/properties/layers.rs checks it):
//! calls sanitizer, unwind and the bottom layers; it is given what it needs when tracing starts
//! (a `WriterPlan`) and never reads the session.

mod buffers;
mod files;
pub mod oom;
mod segments;
mod sinks;
mod write_failure;
mod writer;
pub use writer::FINDINGS_SCHEMA;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use msmemscope_core::config::{
    Analysis as Requested, DataFormat, Device, EventKind, Level, RunConfig,
};
use msmemscope_core::events::{DeviceId, Event, EventRow, EventType};
use msmemscope_core::run_dir::RunDir;

use crate::clock::precise_realtime_ns;
pub use buffers::{Attrs, Texts};
use writer::Writer;

/// What decides whether a row is recorded, derived from the configuration.
#[derive(Clone, Debug)]
struct Filter {
    events: Vec<EventKind>,
    devices: Vec<Device>,
    level: Level,
    steps: Vec<u32>,
    c_stack_depth: Option<u32>,
}

impl Filter {
    fn from_config(config: &RunConfig) -> Filter {
        Filter {
            events: config.events.clone(),
            devices: config.devices.clone(),
            level: config.level,
            steps: config.steps.clone(),
            c_stack_depth: config.call_stack.c,
        }
    }

    /// Whether a row of this kind, on this device, at this step, is recorded.
    fn admits(&self, event: Event, device: DeviceId, step: u64) -> bool {
        let kind = match event {
            Event::Malloc => Some(EventKind::Alloc),
            Event::Free => Some(EventKind::Free),
            Event::OpLaunch | Event::KernelLaunch => Some(EventKind::Launch),
            Event::Access => Some(EventKind::Access),
            _ => None,
        };
        if let Some(kind) = kind {
            if !self.events.contains(&kind) {
                return false;
            }
        }
        match (event, self.level) {
            (Event::OpLaunch, Level::Kernel) | (Event::KernelLaunch, Level::Op) => return false,
            _ => {}
        }
        let device_ok = match device {
            DeviceId::None => true,
            DeviceId::Cpu => self.devices.contains(&Device::Cpu),
            DeviceId::Cuda(i) => self
                .devices
                .iter()
                .any(|d| *d == Device::Cuda || *d == Device::CudaIndex(i)),
        };
        if !device_ok {
            return false;
        }
        // `--steps`: only the listed steps (system rows always, so steps stay visible).
        event == Event::System || self.steps.is_empty() || self.steps.contains(&(step as u32))
    }
}

/// The filter as three words that a row's admission reads without a lock (a read lock is two
/// atomic read-modify-writes per row, a tenth of a busy PyTorch row's cost on the program's
/// thread). Derived from [`Filter::admits`] itself; filters it cannot hold (`--steps`, CUDA
/// indices of 63 and more) send every row to the locked path.
struct FastFilter {
    /// Bit `event as u32`: rows of that event pass `--events` and `--level`; [`SLOW`]: take
    /// the locked path.
    events: AtomicU32,
    /// Bit 0: CPU rows pass `--device`; bit 1 + i: rows of CUDA device i (i < 63).
    devices: AtomicU64,
    /// The C stack depth asked for; [`NO_C_STACK`] when none.
    c_stack_depth: AtomicU32,
}

const SLOW: u32 = 1 << 31;
const NO_C_STACK: u32 = u32::MAX;
const FAST_CUDA_INDICES: u32 = 63;

impl FastFilter {
    fn new(filter: &Filter) -> FastFilter {
        let fast = FastFilter {
            events: AtomicU32::new(SLOW),
            devices: AtomicU64::new(0),
            c_stack_depth: AtomicU32::new(NO_C_STACK),
        };
        fast.set(filter);
        fast
    }

    fn set(&self, filter: &Filter) {
        let stepless = Filter {
            steps: Vec::new(),
            ..filter.clone()
        };
        let mut events = 0;
        for event in Event::ALL {
            if stepless.admits(event, DeviceId::None, 0) {
                events |= 1 << event as u32;
            }
        }
        let mut devices = u64::from(stepless.admits(Event::System, DeviceId::Cpu, 0));
        for i in 0..FAST_CUDA_INDICES {
            if stepless.admits(Event::System, DeviceId::Cuda(i), 0) {
                devices |= 1 << (i + 1);
            }
        }
        self.devices.store(devices, Ordering::Relaxed);
        self.c_stack_depth.store(
            filter.c_stack_depth.unwrap_or(NO_C_STACK),
            Ordering::Relaxed,
        );
        let slow = if filter.steps.is_empty() { 0 } else { SLOW };
        self.events.store(events | slow, Ordering::Release);
    }

    /// Whether a row passes (`None`: ask the locked filter).
    fn admits(&self, event: Event, device: DeviceId) -> Option<bool> {
        let events = self.events.load(Ordering::Acquire);
        if events & SLOW != 0 {
            return None;
        }
        let device_bit = match device {
            DeviceId::None => return Some(events & (1 << event as u32) != 0),
            DeviceId::Cpu => 1,
            DeviceId::Cuda(i) if i < FAST_CUDA_INDICES => 1 << (i + 1),
            DeviceId::Cuda(_) => return None,
        };
        let devices = self.devices.load(Ordering::Relaxed);
        Some(events & (1 << event as u32) != 0 && devices & device_bit != 0)
    }

    fn c_stack_depth(&self) -> Option<u32> {
        match self.c_stack_depth.load(Ordering::Relaxed) {
            NO_C_STACK => None,
            depth => Some(depth),
        }
    }
}

/// Where the writer's files go: the run directory, made on first need by its owner
/// (`session`), which hands this function in with the configuration.
pub type RunDirSource = fn() -> Result<Arc<RunDir>, String>;

struct Pipeline {
    /// What the writer starts with, from the configuration its owner (`session`) last applied.
    plan: RwLock<WriterPlan>,
    run_dir: RwLock<Option<RunDirSource>>,
    filter: RwLock<Filter>,
    /// `filter`, readable without its lock.
    fast_filter: FastFilter,
    tracing: AtomicBool,
    /// The current step: 0 before the first `step()`.
    step: AtomicU64,
    writer: Mutex<Option<Writer>>,
    writer_failed: AtomicBool,
    /// The writer was started (it stays until exit): rows no longer take `writer`'s lock.
    writer_started: AtomicBool,
    /// Whether a row other than the run's own SYSTEM rows was ever queued. In a process the
    /// job follows (its run directory is made on first need) nothing starts the writer until
    /// then, so a process that records nothing (a shell, a compiler) leaves no directory.
    recorded: AtomicBool,
    /// This process's run is one the job follows (`config.job` is set).
    followed: AtomicBool,
    /// Whether running out of the runtime's own memory was said in the log (once).
    said_out_of_memory: AtomicBool,
    /// This process's id, read on the first row (a forked child records nothing, so it never
    /// needs another); 0 until then.
    pid: AtomicU32,
    oom: Mutex<Option<oom::OomWatch>>,
    /// Failed small `malloc` calls of the program, counted from the hook (no allocation there).
    small_malloc_failures: AtomicU64,
}

static PIPELINE: OnceLock<Pipeline> = OnceLock::new();
/// Set while the configuration asks for the OOM analysis (read by the malloc hooks).
static OOM_ACTIVE: AtomicBool = AtomicBool::new(false);

fn pipeline() -> &'static Pipeline {
    PIPELINE.get_or_init(|| {
        let config = RunConfig::default();
        let filter = Filter::from_config(&config);
        Pipeline {
            fast_filter: FastFilter::new(&filter),
            filter: RwLock::new(filter),
            plan: RwLock::new(WriterPlan::of(&config)),
            run_dir: RwLock::new(None),
            tracing: AtomicBool::new(false),
            step: AtomicU64::new(0),
            writer: Mutex::new(None),
            writer_failed: AtomicBool::new(false),
            writer_started: AtomicBool::new(false),
            recorded: AtomicBool::new(false),
            followed: AtomicBool::new(false),
            said_out_of_memory: AtomicBool::new(false),
            pid: AtomicU32::new(0),
            oom: Mutex::new(None),
            small_malloc_failures: AtomicU64::new(0),
        }
    })
}

/// Takes the configuration its owner put in force: the filter, the OOM watch, and what the
/// writer starts with; `run_dir` gives the directory when the writer first needs it.
pub fn apply_config(config: &RunConfig, run_dir: RunDirSource) {
    let p = pipeline();
    let k = config.analysis.iter().find_map(|a| match a {
        msmemscope_core::config::Analysis::Oom(k) => Some(*k),
        _ => None,
    });
    if let Ok(mut watch) = p.oom.lock() {
        *watch = k.map(oom::watch);
    }
    OOM_ACTIVE.store(k.is_some(), Ordering::Relaxed);
    p.followed.store(config.job.is_some(), Ordering::Relaxed);
    if let Ok(mut f) = p.filter.write() {
        *f = Filter::from_config(config);
        p.fast_filter.set(&f);
    }
    if let Ok(mut plan) = p.plan.write() {
        *plan = WriterPlan::of(config);
    }
    if let Ok(mut source) = p.run_dir.write() {
        *source = Some(run_dir);
    }
}

/// The part of the configuration the writer needs when it starts: the configuration itself
/// has one owner, the session.
#[derive(Clone)]
struct WriterPlan {
    format: DataFormat,
    analyses: Vec<Requested>,
    dump_budget: Option<u64>,
}

impl WriterPlan {
    fn of(config: &RunConfig) -> WriterPlan {
        WriterPlan {
            format: config.format,
            analyses: config.analysis.clone(),
            dump_budget: config.dump_budget,
        }
    }
}

impl Pipeline {
    fn writer_plan(&self) -> WriterPlan {
        self.plan
            .read()
            .map(|plan| plan.clone())
            .unwrap_or_else(|_| WriterPlan::of(&RunConfig::default()))
    }

    fn run_dir(&self) -> Result<Arc<RunDir>, String> {
        let source = self
            .run_dir
            .read()
            .ok()
            .and_then(|s| *s)
            .ok_or_else(|| "no run directory was configured".to_string())?;
        source()
    }
}

pub fn is_tracing() -> bool {
    PIPELINE
        .get()
        .is_some_and(|p| p.tracing.load(Ordering::Relaxed))
}

// --- CUDA hooks (issue 11): a cheap pre-check before building a row ---
/// Whether a row of this kind would be recorded now (tracing, `--events`, `--level`,
/// `--steps`; the device is not known yet), so hooks skip building rows nobody keeps.
pub fn admits(event: Event) -> bool {
    if !is_tracing() {
        return false;
    }
    let p = pipeline();
    if let Some(admitted) = p.fast_filter.admits(event, DeviceId::None) {
        return admitted;
    }
    let step = p.step.load(Ordering::Acquire);
    p.filter
        .read()
        .is_ok_and(|f| f.admits(event, DeviceId::None, step))
}
// --- end CUDA hooks ---

pub fn start_tracing() {
    let p = pipeline();
    if !p.tracing.swap(true, Ordering::AcqRel) {
        emit(
            EventRow::new(Event::System, EventType::StartTrace, ""),
            false,
        );
    }
}

/// Ends tracing and writes everything recorded so far.
pub fn stop_tracing() {
    let p = pipeline();
    if p.tracing.load(Ordering::Acquire) {
        emit(
            EventRow::new(Event::System, EventType::StopTrace, ""),
            false,
        );
        p.tracing.store(false, Ordering::Release);
    }
    flush(Duration::from_secs(10));
}

/// Who marks the steps. Apart from [`Pipeline`]: an optimizer's step is offered through the C
/// ABI whether or not a run has made the pipeline yet, and making it for an offer that writes
/// nothing would leave a pipeline without a run directory, whose next flush gives up on the
/// writer for good.
struct StepMarks {
    /// Whether the program marked a step itself (`msmemscope.step()`, a `step start` range).
    by_program: AtomicBool,
    /// Inferred step boundaries offered so far.
    inferred_offers: AtomicU64,
}

static STEP_MARKS: StepMarks = StepMarks {
    by_program: AtomicBool::new(false),
    inferred_offers: AtomicU64::new(0),
};

/// Starts the next step and records its STEP row (Name = the step number).
pub fn step() {
    STEP_MARKS.by_program.store(true, Ordering::Release);
    write_step(None);
}

/// A step boundary the tracker inferred (an optimizer's `step()`): recorded only while the
/// program has marked no step itself, with the Attr `{"source": source}`. The first offer is
/// never written: a program that marks its steps at their end calls `msmemscope.step()` only
/// after its first optimizer step, and a boundary written before it would count one step
/// twice. True when written.
pub fn inferred_step(source: &str) -> bool {
    let offers = STEP_MARKS.inferred_offers.fetch_add(1, Ordering::AcqRel) + 1;
    if offers < 2 || STEP_MARKS.by_program.load(Ordering::Acquire) {
        return false;
    }
    write_step(Some(source));
    true
}

fn write_step(source: Option<&str>) {
    let p = pipeline();
    let step = p.step.fetch_add(1, Ordering::AcqRel) + 1;
    let mut row = EventRow::new(Event::System, EventType::Step, step.to_string());
    if let Some(source) = source {
        row.attrs.insert("source".into(), source.into());
    }
    emit(row, false);
}

/// Ranges named `step start` mark steps, as the original msMemScope's users annotate them.
pub fn on_range_start(message: &str) {
    if message == "step start" {
        step();
    }
}

/// Whether a row of `event` on `device` is recorded now: the C stack depth asked for, and the
/// pipeline that records it, if so.
fn admission(event: Event, device: DeviceId) -> Option<(&'static Pipeline, Option<u32>)> {
    let p = PIPELINE
        .get()
        .filter(|p| p.tracing.load(Ordering::Relaxed))?;
    if crate::private_alloc::out_of_memory_since().is_some() {
        // The runtime lives on its reserve: rows would use it up. Said once in the log.
        if !p.said_out_of_memory.swap(true, Ordering::Relaxed) {
            crate::log::error(
                "event dump incomplete: the runtime's own memory ran out (the program went on); \
                 later events are not recorded",
            );
        }
        return None;
    }
    match p.fast_filter.admits(event, device) {
        Some(true) => return Some((p, p.fast_filter.c_stack_depth())),
        Some(false) => return None,
        None => {}
    }
    let step = p.step.load(Ordering::Acquire);
    match p.filter.read() {
        Ok(f) if f.admits(event, device, step) => Some((p, f.c_stack_depth)),
        _ => None,
    }
}

/// The C frames of this call, `depth` deep, handed to `f` (empty when not asked for).
fn with_c_frames<R>(want: bool, depth: Option<u32>, f: impl FnOnce(&[u64]) -> R) -> R {
    match (want, depth) {
        (true, Some(depth)) if depth as usize <= crate::unwind::MAX_FRAMES => {
            // Memoized: allocation-heavy producers ask for stacks at every row.
            crate::unwind::with_stack(None, |stack, _| {
                let frames = stack.as_slice();
                f(&frames[..frames.len().min(depth as usize)])
            })
        }
        (true, Some(depth)) => f(&crate::unwind::capture_deep(depth as usize)),
        _ => f(&[]),
    }
}

/// Stamps, filters and queues a row.
pub fn emit(mut row: EventRow, want_c_stack: bool) {
    if row.event == Event::Free {
        // Reused memory must not inherit the freed block's stream accesses.
        crate::sanitizer::on_free_row(&row);
    }
    let Some((p, depth)) = admission(row.event, row.device) else {
        return;
    };
    if row.ts_ns == 0 {
        row.ts_ns = precise_realtime_ns();
    }
    row.pid = p.process_id();
    row.tid = buffers::thread_id();
    let frames = with_c_frames(want_c_stack, depth, <[u64]>::to_vec);
    // The writer (and the dump file) start with the first real event: a process that only
    // starts and stops tracing, or execs another program first (a shell script, a version
    // shim), leaves no file behind.
    let system = row.event == Event::System;
    let (pid, tid) = (row.pid, row.tid);
    let follow_up = if OOM_ACTIVE.load(Ordering::Relaxed) {
        p.oom
            .lock()
            .ok()
            .and_then(|mut w| w.as_mut().map(|w| w.observe(&row, &frames)))
    } else {
        None
    };
    buffers::push(row, frames);
    for (mut extra, extra_frames) in follow_up.into_iter().flatten() {
        (extra.pid, extra.tid) = (pid, tid);
        buffers::push(extra, extra_frames);
    }
    if !system {
        p.note_recorded();
    }
}

/// A row from a producer that hands its texts over borrowed (the C ABI): stamped, filtered and
/// queued as [`emit`] does, without an [`EventRow`] made on this thread. Rows that the
/// sanitizer or the OOM watch must see take [`emit`].
pub fn emit_borrowed(
    event: Event,
    event_type: EventType,
    device: DeviceId,
    ptr: Option<u64>,
    texts: &Texts,
    want_c_stack: bool,
) {
    if (event == Event::Free && crate::sanitizer::is_active()) || OOM_ACTIVE.load(Ordering::Relaxed)
    {
        return emit(texts.row(event, event_type, device, ptr), want_c_stack);
    }
    let Some((p, depth)) = admission(event, device) else {
        return;
    };
    let numbers = buffers::Numbers {
        event,
        event_type,
        ts_ns: precise_realtime_ns(),
        pid: p.process_id(),
        // Stamped by `push_packed`, from the thread's local it reads anyway.
        tid: 0,
        device,
        ptr,
    };
    with_c_frames(want_c_stack, depth, |frames| {
        buffers::push_packed(numbers, texts, frames)
    });
    if event != Event::System {
        p.note_recorded();
    }
}

/// Queues an operator's ATEN_START/ATEN_END row whose name is interned (see
/// [`buffers::OpRow`]); the same row as [`emit_borrowed`] would make of it.
pub fn emit_op(event_type: EventType, name: &'static [u8]) {
    let op = buffers::OpRow {
        event_type,
        name,
        ts_ns: 0,
        pid: 0,
        tid: 0,
    };
    if OOM_ACTIVE.load(Ordering::Relaxed) {
        // The OOM analysis sees whole rows: this one goes as any other, stamped there.
        let n = op.numbers();
        return emit_borrowed(n.event, n.event_type, n.device, n.ptr, &op.texts(), false);
    }
    let Some((p, _)) = admission(Event::OpLaunch, DeviceId::None) else {
        return;
    };
    buffers::push_op(buffers::OpRow {
        ts_ns: precise_realtime_ns(),
        pid: p.process_id(),
        ..op
    });
    p.note_recorded();
}

/// A `malloc`-family call of the program returned NULL for `size` bytes (called from the hooks,
/// only while the OOM analysis watches).
pub fn on_malloc_failure(function: &str, size: usize) {
    if size >= oom::REPORTED_MALLOC_FAILURE {
        emit(oom::malloc_failure_row(function, size), true);
    } else if let Some(p) = PIPELINE.get() {
        // Never `pipeline()` here, inside the allocator: the watch that calls this was turned on
        // by a configuration the pipeline took, so it exists.
        p.small_malloc_failures.fetch_add(1, Ordering::Relaxed);
    }
}

impl Pipeline {
    fn note_recorded(&self) {
        if !self.recorded.load(Ordering::Relaxed) {
            self.recorded.store(true, Ordering::Relaxed);
        }
        // Once started, the writer runs to the end: rows no longer take its lock.
        if !self.writer_started.load(Ordering::Acquire) {
            self.ensure_writer();
        }
    }

    /// This process's id, read once.
    fn process_id(&self) -> u32 {
        match self.pid.load(Ordering::Relaxed) {
            0 => {
                let pid = std::process::id();
                self.pid.store(pid, Ordering::Relaxed);
                pid
            }
            pid => pid,
        }
    }

    /// Starts the writer on first use. False when it cannot run (then rows are dropped and the
    /// failure is logged once).
    fn ensure_writer(&self) -> bool {
        if self.followed.load(Ordering::Relaxed) && !self.recorded.load(Ordering::Relaxed) {
            return false;
        }
        if self.writer_failed.load(Ordering::Relaxed) {
            return false;
        }
        let Ok(mut writer) = self.writer.lock() else {
            return false;
        };
        if writer.is_some() {
            return true;
        }
        let started = self.run_dir().and_then(|dir| {
            let plan = self.writer_plan();
            let analyses = msmemscope_core::analysis::online_for(&plan.analyses);
            let sinks = sinks::Sinks::new(&dir, plan.format, plan.dump_budget);
            Writer::start(sinks, analyses, dir.clone())
                .ok_or_else(|| "cannot start the writer thread".to_string())
        });
        match started {
            Ok(w) => {
                *writer = Some(w);
                self.writer_started.store(true, Ordering::Release);
                true
            }
            Err(e) => {
                self.writer_failed.store(true, Ordering::Relaxed);
                crate::log::error(&format!("event dump disabled: {e}"));
                false
            }
        }
    }
}

/// Writes everything queued so far (waits at most `timeout`).
pub fn flush(timeout: Duration) {
    if let Some(p) = PIPELINE.get() {
        p.ensure_writer();
        if let Ok(writer) = p.writer.lock() {
            if let Some(w) = writer.as_ref() {
                w.flush(timeout);
            }
        }
    }
}

/// Writes everything queued so far and returns the live blocks of the sites the leaks analysis
/// judges leaking (empty without the analysis, or when the writer did not answer in `timeout`).
pub fn leak_suspects(timeout: Duration) -> Vec<writer::Suspect> {
    let Some(p) = PIPELINE.get() else {
        return Vec::new();
    };
    p.ensure_writer();
    let Ok(writer) = p.writer.lock() else {
        return Vec::new();
    };
    writer
        .as_ref()
        .and_then(|w| w.leak_suspects(timeout))
        .unwrap_or_default()
}

/// Asks a bounded dump to keep these steps' rows in full; false when no writer runs yet
/// (nothing was traced).
pub fn keep_steps(steps: &[u64]) -> bool {
    let Some(p) = PIPELINE.get() else {
        return false;
    };
    if !p.writer_started.load(Ordering::Acquire) {
        return false;
    }
    let Ok(writer) = p.writer.lock() else {
        return false;
    };
    writer.as_ref().is_some_and(|w| w.keep_steps(steps))
}

/// Writes everything queued so far and returns what the online analyses found so far as JSON
/// (see `writer::findings_json`); `None` when no writer runs (nothing was traced: none is
/// started for this) or it did not answer in `timeout`.
pub fn findings(timeout: Duration) -> Option<String> {
    let p = PIPELINE.get()?;
    if !p.writer_started.load(Ordering::Acquire) {
        return None;
    }
    let writer = p.writer.lock().ok()?;
    writer.as_ref().and_then(|w| w.findings(timeout))
}

/// At exit: the last rows reach the files (a `--format parquet` dump's last segments closed).
pub fn shutdown() {
    if let Some(p) = PIPELINE.get() {
        if p.tracing.load(Ordering::Acquire) {
            emit(
                EventRow::new(Event::System, EventType::StopTrace, ""),
                false,
            );
            p.tracing.store(false, Ordering::Release);
        }
        p.ensure_writer();
        if let Ok(writer) = p.writer.lock() {
            if let Some(w) = writer.as_ref() {
                w.stop(Duration::from_secs(30));
            }
        }
        let small = p.small_malloc_failures.load(Ordering::Relaxed);
        if small > 0 {
            crate::log::info(&format!(
                "oom: {small} malloc-family requests under {} bytes returned NULL (counted only: \
                 a process that short of memory may not be able to build their rows)",
                oom::REPORTED_MALLOC_FAILURE
            ));
        }
    }
}

/// In a forked child: record nothing from now on, without touching the parent's writer (its
/// thread did not survive the fork) or any lock another thread may have held at the fork.
pub fn forget_after_fork() {
    if let Some(p) = PIPELINE.get() {
        p.tracing.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lock-free form of the filter answers as the filter does, or sends the row to it.
    #[test]
    fn the_fast_filter_agrees_with_the_filter() {
        use EventKind::*;
        let kinds = [
            vec![Alloc, Free, Launch],
            vec![Alloc, Free],
            vec![Launch, Access],
            vec![],
        ];
        let device_sets = [
            vec![Device::Cpu, Device::Cuda],
            vec![Device::Cpu],
            vec![Device::CudaIndex(0), Device::CudaIndex(5)],
            vec![Device::CudaIndex(70)],
            vec![Device::Cuda],
        ];
        let rows = [
            DeviceId::None,
            DeviceId::Cpu,
            DeviceId::Cuda(0),
            DeviceId::Cuda(5),
            DeviceId::Cuda(62),
            DeviceId::Cuda(63),
            DeviceId::Cuda(70),
        ];
        let mut fast_answers = 0;
        for events in &kinds {
            for devices in &device_sets {
                for level in [Level::Op, Level::Kernel] {
                    for steps in [vec![], vec![2]] {
                        let filter = Filter {
                            events: events.clone(),
                            devices: devices.clone(),
                            level,
                            steps: steps.clone(),
                            c_stack_depth: Some(8),
                        };
                        let fast = FastFilter::new(&filter);
                        for event in Event::ALL {
                            for device in rows {
                                let Some(answer) = fast.admits(event, device) else {
                                    continue;
                                };
                                fast_answers += 1;
                                assert_eq!(
                                    answer,
                                    filter.admits(event, device, 1),
                                    "{event:?} on {device:?} with {filter:?}"
                                );
                            }
                        }
                        assert_eq!(fast.c_stack_depth(), Some(8));
                        // Only steps and CUDA indices past 62 take the locked filter.
                        let locked = !steps.is_empty();
                        assert_eq!(fast.admits(Event::Malloc, DeviceId::Cpu).is_none(), locked);
                        assert_eq!(fast.admits(Event::Malloc, DeviceId::Cuda(63)), None);
                    }
                }
            }
        }
        // Without steps, every row but those of CUDA devices 63 and 70.
        assert_eq!(fast_answers, 4 * 5 * 2 * Event::ALL.len() * 5);
    }
}
