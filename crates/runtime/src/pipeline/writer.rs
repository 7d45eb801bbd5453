//! The writer thread: every 100 ms (10 ms while rows stream in) it takes what the threads
//! queued, writes the rows older than a short watermark (a row timestamped just before a drain
//! may still be on its way into a buffer) in the order of time, then flushes, so a crash or
//! SIGTERM of the target loses at most the rows of the last fraction of a second. It runs with
//! every signal blocked: the program's signal handlers never run on it.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use msmemscope_core::analysis::Analysis;
use msmemscope_core::events::{Event, EventType};
use msmemscope_core::symbolize::Symbolizer;
use std::path::Path;

use msmemscope_core::run_dir::RunDir;

use super::buffers::{Backlog, Queued};
use super::sinks::Sinks;
use crate::clock::precise_realtime_ns;

const TICK: Duration = Duration::from_millis(100);
/// The tick while rows stream in: a producer then fills a batch that stays in its core's cache
/// (a 100 ms batch of a busy PyTorch run is several MiB, and each row written into it cost the
/// program a cache miss).
const BUSY_TICK: Duration = Duration::from_millis(10);
/// Rows written in one tick above which the next tick is a busy one.
const BUSY_ROWS: usize = 2_048;
/// Rows younger than this wait for the next tick.
const WATERMARK_NS: u64 = 50_000_000;

#[derive(Default)]
struct Control {
    stop: bool,
    /// Incremented by `flush` requests; the writer acknowledges by copying it to `flushed`.
    flush_requested: u64,
    flushed: u64,
    stopped: bool,
    /// Set with a flush request: the writer then collects the leak suspects into `suspects`.
    suspects_wanted: bool,
    suspects: Option<Vec<Suspect>>,
    /// Set with a flush request: the writer then writes the findings so far into `findings`.
    findings_wanted: bool,
    findings: Option<String>,
    /// Steps the program asked a bounded dump to keep in full (`msmemscope.keep_steps`), taken
    /// by the writer at its next turn.
    keep_steps: Vec<u64>,
}

/// A live block of a site the leaks analysis judges leaking: (device, Ptr, size, site).
pub type Suspect = (msmemscope_core::events::DeviceId, u64, u64, String);

pub struct Writer {
    control: Arc<(Mutex<Control>, Condvar)>,
}

struct State {
    sinks: Sinks,
    /// Online analyses: they see every row written, and report when the writer stops.
    analyses: Vec<Box<dyn Analysis>>,
    /// STEP rows written, and the leaks analysis's notes at the last one (sites that rose,
    /// their bytes' growth).
    steps: u64,
    growth: (u64, u64),
    run_dir: Arc<RunDir>,
    /// Rows queued and not written yet, where the threads queued them.
    backlog: Backlog,
    next_id: u64,
    symbolizer: Option<Symbolizer>,
    symbols: HashMap<u64, String>,
    written: u64,
    /// A write of the dump failed (said once in the log, which the launcher reads).
    dump_incomplete: bool,
}

impl Writer {
    /// Starts the writer thread. `None` if no thread can be made (nothing is written then; the
    /// caller logs it).
    pub fn start(
        sinks: Sinks,
        analyses: Vec<Box<dyn Analysis>>,
        run_dir: Arc<RunDir>,
    ) -> Option<Writer> {
        let control: Arc<(Mutex<Control>, Condvar)> = Arc::default();
        let theirs = control.clone();
        let mut state = State {
            sinks,
            analyses,
            steps: 0,
            growth: (0, 0),
            run_dir,
            backlog: Backlog::default(),
            next_id: 1,
            symbolizer: None,
            symbols: HashMap::new(),
            written: 0,
            dump_incomplete: false,
        };
        let spawned = crate::raw_thread::spawn(
            "msmemscope-wr",
            Box::new(move || {
                // However the thread ends (a panic included), waiters learn it at once: a dead
                // writer must not hold the program's exit for the flush timeout.
                let _gone = Gone(theirs.clone());
                run(&theirs, &mut state)
            }),
        );
        spawned.ok().map(|_| Writer { control })
    }

    /// Writes everything queued so far and waits (at most `timeout`) until it is on disk. False
    /// when the writer was still at it when the time ran out.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (lock, cv) = &*self.control;
        // Poisoned only by a panic on the writer thread, which has ended (or is ending) then.
        let mut c = lock.lock().unwrap_or_else(|e| e.into_inner());
        c.flush_requested += 1;
        let want = c.flush_requested;
        cv.notify_all();
        let deadline = std::time::Instant::now() + timeout;
        while c.flushed < want && !c.stopped {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            c = match cv.wait_timeout(c, left) {
                Ok((guard, _)) => guard,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }

    /// Writes everything queued so far, then asks the online analyses for the live blocks of
    /// the sites they judge leaking (waits at most `timeout`; `None` when the time ran out).
    pub fn leak_suspects(&self, timeout: Duration) -> Option<Vec<Suspect>> {
        if let Ok(mut c) = self.control.0.lock() {
            c.suspects_wanted = true;
            c.suspects = None;
        }
        if !self.flush(timeout) {
            return None;
        }
        self.control.0.lock().ok()?.suspects.take()
    }

    /// Asks a bounded dump to keep these steps' rows in full (as it keeps the peak's).
    pub fn keep_steps(&self, steps: &[u64]) -> bool {
        let Ok(mut c) = self.control.0.lock() else {
            return false;
        };
        c.keep_steps.extend_from_slice(steps);
        true
    }

    /// Writes everything queued so far, then the findings so far as JSON (see
    /// [`findings_json`]); waits at most `timeout` (`None` when the time ran out).
    pub fn findings(&self, timeout: Duration) -> Option<String> {
        if let Ok(mut c) = self.control.0.lock() {
            c.findings_wanted = true;
            c.findings = None;
        }
        if !self.flush(timeout) {
            return None;
        }
        self.control.0.lock().ok()?.findings.take()
    }

    /// Flushes and ends the thread (waits at most `timeout`); false when it still writes.
    pub fn stop(&self, timeout: Duration) -> bool {
        if let Ok(mut c) = self.control.0.lock() {
            c.stop = true;
        }
        self.flush(timeout)
    }
}

/// Marks the writer stopped when its thread ends.
struct Gone(Arc<(Mutex<Control>, Condvar)>);

impl Drop for Gone {
    fn drop(&mut self) {
        let (lock, cv) = &*self.0;
        lock.lock().unwrap_or_else(|e| e.into_inner()).stopped = true;
        cv.notify_all();
    }
}

fn run(control: &(Mutex<Control>, Condvar), state: &mut State) {
    let (lock, cv) = control;
    let mut acknowledged = 0;
    let mut tick = TICK;
    loop {
        let (stop, flush_to, suspects_wanted, findings_wanted, keep) = {
            let Ok(c) = lock.lock() else { return };
            let (mut c, _) = match cv
                .wait_timeout_while(c, tick, |c| !c.stop && c.flush_requested == c.flushed)
            {
                Ok(r) => r,
                Err(_) => return,
            };
            (
                c.stop,
                c.flush_requested,
                c.suspects_wanted,
                c.findings_wanted,
                std::mem::take(&mut c.keep_steps),
            )
        };
        state.sinks.keep_steps(keep);
        // A flush request writes everything queued, young rows included.
        let everything = stop || flush_to != acknowledged;
        let written = write_batch(state, everything);
        tick = if written > BUSY_ROWS { BUSY_TICK } else { TICK };
        acknowledged = flush_to;
        let suspects = (everything && suspects_wanted).then(|| {
            state
                .analyses
                .iter()
                .flat_map(|a| a.leak_suspects())
                .collect::<Vec<_>>()
        });
        let findings = (everything && findings_wanted).then(|| findings_json(state));
        if stop {
            // After a failed write the cause is logged already; this one would follow from it.
            let finished = state.sinks.finish();
            if let (Err(e), false) = (finished, state.dump_incomplete) {
                crate::log::error(&format!("event dump: the last step's summary: {e}"));
            }
            finish_analyses(state);
            // What the writer cost, for the benchmark and for users sizing a long run. Logged
            // before the acknowledgement: the process exits right after it.
            let cpu = thread_cpu_seconds();
            crate::log::info(&format!(
                "writer: {} rows written in {:.3} s of writer CPU ({:.0} rows/s)",
                state.written,
                cpu,
                state.written as f64 / cpu.max(1e-9)
            ));
        }
        if let Ok(mut c) = lock.lock() {
            if suspects.is_some() {
                c.suspects_wanted = false;
                c.suspects = suspects;
            }
            if findings.is_some() {
                c.findings_wanted = false;
                c.findings = findings;
            }
            c.flushed = flush_to;
            if stop {
                c.stopped = true;
            }
            cv.notify_all();
        }
        if stop {
            return;
        }
    }
}

/// The online analyses' reports: their files in the run directory, their console text in
/// `analysis_report.txt` (which the launcher prints when the program has ended).
fn finish_analyses(state: &mut State) {
    let mut console = String::new();
    for analysis in &mut state.analyses {
        let output = analysis.finish();
        console.push_str(&output.console);
        for (relative, content) in output.files {
            // Its directories (`leaks/`, …) 0750 like the run directory, through its descriptor.
            let written = state
                .run_dir
                .write_new(Path::new(&relative), content.as_bytes());
            if let Err(e) = written {
                crate::log::error(&format!("{}: {e}", analysis.name()));
            }
        }
    }
    if !console.is_empty() {
        let written = state
            .run_dir
            .write_new(Path::new(ANALYSIS_REPORT), console.as_bytes());
        if let Err(e) = written {
            crate::log::error(&format!("analysis report: {e}"));
        }
    }
}

/// The file the launcher prints after the program ends.
pub const ANALYSIS_REPORT: &str = msmemscope_core::launch_env::ANALYSIS_REPORT;

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer; the thread CPU clock always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Takes what the threads queued and writes what is old enough (everything when `all`);
/// returns the number of rows written.
fn write_batch(state: &mut State, all: bool) -> usize {
    state.backlog.refill();
    let watermark = if all {
        u64::MAX
    } else {
        precise_realtime_ns().saturating_sub(WATERMARK_NS)
    };
    // After a failed write the dump stops for good: a disk with room again later, or a
    // SQLite file committing row by row past its failed transaction, would leave a gap or
    // hold up the program's exit, and the dump would no longer end where the log says.
    let stopped = state.dump_incomplete;
    let State {
        backlog,
        sinks,
        analyses,
        next_id,
        symbolizer,
        symbols,
        steps,
        growth,
        ..
    } = state;
    let mut result = Ok(());
    let mut written = 0u64;
    let handed = backlog.write_until(watermark, |q: &mut Queued| {
        q.row.id = *next_id;
        *next_id += 1;
        if !q.c_frames.is_empty() {
            q.row.c_stack = symbolize(symbolizer, symbols, &q.c_frames);
        }
        if q.row.event == Event::System && q.row.event_type == EventType::Step {
            // The analyses judge the step that ended first: the flight recorder keeps the
            // steps they want and summarizes the step with what they saw.
            for analysis in analyses.iter_mut() {
                analysis.feed(&q.row);
            }
            let notes = analyses
                .iter()
                .find_map(|a| a.step_notes())
                .unwrap_or_default();
            *steps += 1;
            *growth = (notes.sites_grown, notes.bytes_grown);
            if result.is_ok() && !stopped {
                let next = q.row.name.trim().parse().ok();
                result = sinks.step(&q.row, next, &notes);
                written += 1;
            }
            return;
        }
        if result.is_ok() && !stopped {
            result = sinks.write(&q.row);
            written += 1;
        }
        for analysis in analyses.iter_mut() {
            analysis.feed(&q.row);
        }
    });
    if stopped {
        return handed;
    }
    // Rows handed to the file; a failed write or flush below loses some of them, said once.
    state.written += written;
    // A turn without rows only closes the Parquet segments whose time is up.
    let idle = handed == 0 && !all;
    let done = result.and_then(|()| match idle {
        true => state.sinks.close_due(false),
        false => state.sinks.flush(all),
    });
    if let Err(e) = done {
        state.dump_incomplete = true;
        crate::log::error(&format!(
            "event dump incomplete: {}; the dump stops there: the rows from ID {} on are not \
             all in the file, and no row after them is written",
            super::write_failure::cause(&e, &state.run_dir),
            state.next_id.saturating_sub(written)
        ));
    }
    handed
}

/// The schema of [`findings_json`]'s document.
pub const FINDINGS_SCHEMA: &str = "msmemscope.findings/1";

/// What the online analyses found so far, for `msmemscope.findings()`: the sites the leaks
/// analysis judges leaking now (as `leaks/findings.json` will list them: by line, the largest
/// growth first) and each device's highest bytes in use. Built from the analyses' state on the
/// writer thread, without I/O (no source lines): cheap enough for a trainer's log interval.
fn findings_json(state: &State) -> String {
    let leaks = state
        .analyses
        .iter()
        .find_map(|a| a.findings_now(state.steps));
    let (sites, bytes_per_step) = match &leaks {
        Some(found) => (
            found.get("leak_sites").cloned().unwrap_or_default(),
            found
                .get("leak_bytes_per_step")
                .cloned()
                .unwrap_or_default(),
        ),
        None => (serde_json::json!([]), serde_json::json!(0)),
    };
    let peaks = state.sinks.peaks();
    let peak_bytes = peaks.iter().map(|p| p.1).max();
    let doc = serde_json::json!({
        "schema": FINDINGS_SCHEMA,
        "available": true,
        "leaks_analysis": leaks.is_some(),
        "steps": state.steps,
        "leak_sites": sites,
        "leak_bytes_per_step": bytes_per_step,
        "last_step_growth": {"sites": state.growth.0, "bytes": state.growth.1},
        "peak_bytes": peak_bytes,
        "peaks": peaks.iter().map(|(device, bytes, step)| serde_json::json!({
            "device": device.to_string(),
            "bytes": bytes,
            "step": step,
        })).collect::<Vec<_>>(),
    });
    doc.to_string()
}

/// C frames as `function file:line` lines, symbolized once per address.
fn symbolize(
    symbolizer: &mut Option<Symbolizer>,
    symbols: &mut HashMap<u64, String>,
    frames: &[u64],
) -> String {
    let symbolizer = symbolizer.get_or_insert_with(|| {
        crate::unwind::modules::refresh(false);
        Symbolizer::new(crate::unwind::modules::seen_modules())
    });
    let mut lines = Vec::with_capacity(frames.len());
    for &address in frames {
        let line = symbols.entry(address).or_insert_with(|| {
            symbolizer
                .symbolize_return_address(address)
                .iter()
                .map(|f| f.render())
                .collect::<Vec<_>>()
                .join("\n")
        });
        lines.push(line.clone());
    }
    lines.join("\n")
}
