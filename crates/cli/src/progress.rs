//! Progress bars of the offline commands (report, export, `--compare`, ranks) on stderr. A bar
//! appears once its work has taken a second, so quick runs print nothing, and never when
//! stderr is not a terminal (a log or a pipe would fill with redraws) or under `-q`.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Set once from the command line (`-q`) before any bar starts.
static QUIET: AtomicBool = AtomicBool::new(false);

pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// What a bar counts.
pub enum Unit {
    Bytes,
    /// Items of the given name ("dumps").
    Items(&'static str),
}

/// A bar drawn from a thread of its own until dropped.
pub struct Bar {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

const DELAY: Duration = Duration::from_secs(1);
const TICK: Duration = Duration::from_millis(100);

impl Bar {
    /// Shows `label` and `done()` against `total` (0: unknown, a spinner) from a second on.
    pub fn start(
        label: impl Into<String>,
        total: u64,
        unit: Unit,
        done: impl Fn() -> u64 + Send + 'static,
    ) -> Bar {
        let stop = Arc::new(AtomicBool::new(false));
        if QUIET.load(Ordering::Relaxed) || !std::io::stderr().is_terminal() {
            return Bar { stop, thread: None };
        }
        let label = label.into();
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("msmemscope-progress".into())
            .spawn(move || draw(&label, total, &unit, &done, &stopped))
            .ok();
        Bar { stop, thread }
    }
}

fn draw(label: &str, total: u64, unit: &Unit, done: &dyn Fn() -> u64, stop: &AtomicBool) {
    let started = Instant::now();
    while started.elapsed() < DELAY {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        std::thread::sleep(TICK);
    }
    let counts = match unit {
        Unit::Bytes => "{bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)".to_string(),
        Unit::Items(name) => format!("{{pos}}/{{len}} {name} ({{eta}} left)"),
    };
    let (bar, template) = if total == 0 {
        (
            ProgressBar::new_spinner(),
            format!("{{spinner}} {label} {{elapsed}}"),
        )
    } else {
        (
            ProgressBar::new(total),
            format!("{label} [{{bar:30}}] {counts}"),
        )
    };
    if let Ok(style) = ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_draw_target(ProgressDrawTarget::stderr());
    while !stop.load(Ordering::Relaxed) {
        bar.set_position(done());
        std::thread::sleep(TICK);
    }
    bar.finish_and_clear();
}

impl Drop for Bar {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A bar over the bytes the given readers have got through.
pub fn over_readers(
    label: impl Into<String>,
    readers: Vec<msmemscope_core::events::csv::scan::Progress>,
) -> Bar {
    let total = readers.iter().map(|r| r.total_bytes()).sum();
    Bar::start(label, total, Unit::Bytes, move || {
        readers.iter().map(|r| r.done_bytes()).sum()
    })
}
