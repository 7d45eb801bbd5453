//! The runtime's log: `msmemscope_logs/runtime_{pid}.log` in the run directory. Never the
//! target's stdout or stderr, whose output must stay as it was.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use msmemscope_core::config::LogLevel;
use msmemscope_core::held_fd::HeldFile;
use msmemscope_core::run_dir::RunDir;
use msmemscope_core::time_fmt::utc_timestamp;

struct Sink {
    /// Held by identity: a program that closes every descriptor and reuses the numbers never
    /// gets our lines in its files.
    file: HeldFile,
    level: LogLevel,
}

static SINK: Mutex<Option<Sink>> = Mutex::new(None);

pub fn init(run_dir: &RunDir, level: LogLevel) {
    let relative = Path::new(msmemscope_core::launch_env::LOG_DIR)
        .join(format!("runtime_{}.log", std::process::id()));
    let path = run_dir.path().join(&relative);
    let file = run_dir
        .append_file(&relative)
        .and_then(|f| HeldFile::new(f, &path).map_err(|e| e.to_string()));
    if let (Ok(file), Ok(mut sink)) = (file, SINK.lock()) {
        *sink = Some(Sink { file, level });
    }
}

fn write(level: LogLevel, tag: &str, message: &str) {
    let Ok(mut sink) = SINK.lock() else { return };
    if let Some(sink) = sink.as_mut() {
        if level >= sink.level {
            let now = utc_timestamp(crate::clock::realtime_ns());
            let _ = writeln!(sink.file, "{now} [{tag}] {message}");
        }
    }
}

pub fn info(message: &str) {
    write(LogLevel::Info, "INFO", message)
}

pub fn error(message: &str) {
    write(LogLevel::Error, "ERROR", message)
}
