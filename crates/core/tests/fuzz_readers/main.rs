//! Every reader against damaged, cut, oversized and hostile input, on stable Rust in the
//! normal test command (`cargo test -p msmemscope-core --test fuzz_readers`): real files
//! (the repository's dumps and ones the project's writers make) mutated a bounded number of
//! times per reader ([`harness`] checks each result), the inputs that once broke a reader
//! (`tests/fuzz_corpus/<reader>/`) replayed, and the files no reader may wait on or fill
//! memory from (a FIFO, a directory, a sparse file claiming gigabytes).
//!
//! `MSMEMSCOPE_FUZZ_CASES=N` runs N mutations per seed instead of the default few (a longer
//! hunt); `MSMEMSCOPE_FUZZ_SEED` changes the mutations. A failing input is saved under
//! `target/fuzz_readers_failures/` to be added to the corpus. The libFuzzer targets (`fuzz/`,
//! `bench/fuzz_readers.sh`) run the same checks for longer.
//!
//! Each case runs alone (a lock), so that this binary's own allocation counter and the
//! process's peak resident size measure that case only.

mod harness;
mod mutate;
mod seeds;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use harness::TARGETS;

// --- memory: what one case allocates at most -----------------------------------------------

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; the counters are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

fn grew(size: usize) {
    let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most one case may allocate, through Rust or in C (SQLite, zstd): a reader's buffers
/// and a batch of rows at the row cap, never what a file claims.
const CASE_MEMORY: usize = 512 << 20;

/// The process's peak resident size, reset, where Linux lets it be (`clear_refs`).
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn peak_rss() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

// --- hangs: a watchdog that saves the input and ends the process ---------------------------

/// When the running case started (ms since the watchdog's start; 0: none running).
static STARTED: AtomicU64 = AtomicU64::new(0);
static RUNNING: Mutex<(String, Vec<u8>)> = Mutex::new((String::new(), Vec::new()));

/// The longest one case may take: a hang, not a slow machine.
fn case_limit() -> Duration {
    Duration::from_secs(
        std::env::var("MSMEMSCOPE_FUZZ_HANG_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    )
}

/// Any panic that reaches the process's hook while a case runs, on any thread: one a reader
/// catches itself but lets the hook print is lines on stderr, so it is a failure too (the Parquet
/// reader's guard keeps the Parquet crate's own panics from the hook).
static PANICKED: AtomicBool = AtomicBool::new(false);

fn watchdog() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(|| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, Ordering::Relaxed);
            hook(info);
        }));
        let epoch = Instant::now();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(200));
            let started = STARTED.load(Ordering::Relaxed);
            if started == 0 {
                continue;
            }
            let ran = epoch
                .elapsed()
                .saturating_sub(Duration::from_millis(started));
            if ran > case_limit() {
                let (target, input) = RUNNING.lock().map(|g| g.clone()).unwrap_or_default();
                let saved = save_failure(&target, &input);
                eprintln!(
                    "fuzz_readers: the {target} reader ran {ran:?} on one input (a hang): saved \
                     as {}",
                    saved.display()
                );
                std::process::abort();
            }
        });
        epoch
    })
}

/// Where failing inputs are saved: `target/fuzz_readers_failures/<target>-<hash>`.
fn save_failure(target: &str, input: &[u8]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz_readers_failures");
    let _ = std::fs::create_dir_all(&dir);
    let hash = input.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let path = dir.join(format!("{target}-{hash:016x}"));
    let _ = std::fs::write(&path, input);
    path
}

// --- one case ---------------------------------------------------------------------------------

/// One case at a time in this binary: the measures above are the process's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A directory of this process's own for `target`'s files.
fn scratch(target: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "msmemscope-fuzz-readers-{}/{target}",
        std::process::id()
    ))
}

/// Runs `target`'s check on `input`: `Err` with what went wrong (the input saved) on a panic,
/// a hang (the process ends) or a case over the memory bound.
fn run_case(target: &str, input: &[u8], _lock: &MutexGuard<'_, ()>) -> Result<(), String> {
    let epoch = watchdog();
    *RUNNING.lock().unwrap() = (target.to_owned(), input.to_vec());
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let rss = reset_peak_rss().then(peak_rss).flatten();
    PANICKED.store(false, Ordering::Relaxed);
    STARTED.store(epoch.elapsed().as_millis().max(1) as u64, Ordering::Relaxed);
    let dir = scratch(target);
    let result = std::panic::catch_unwind(|| harness::check(target, input, &dir));
    STARTED.store(0, Ordering::Relaxed);
    let allocated = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let resident = rss.and_then(|before| Some(peak_rss()?.saturating_sub(before)));
    let why = match result {
        Err(panic) => Some(
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".to_owned()),
        ),
        Ok(_) if PANICKED.load(Ordering::Relaxed) => {
            Some("a panic inside the reader, caught there".to_owned())
        }
        Ok(_) if allocated > CASE_MEMORY => Some(format!("allocated {allocated} bytes")),
        Ok(_) if resident.is_some_and(|r| r > CASE_MEMORY) => {
            Some(format!("grew the resident size by {resident:?} bytes"))
        }
        Ok(_) => None,
    };
    match why {
        None => Ok(()),
        Some(why) => Err(format!(
            "{target}: {why} (input saved as {})",
            save_failure(target, input).display()
        )),
    }
}

/// Mutations per seed: the default keeps the whole binary to a few seconds.
fn cases(default: usize) -> usize {
    std::env::var("MSMEMSCOPE_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// Each seed of `target` cut at positions spread over it (every one for a small seed), then
/// mutated `cases` times; the failures, all of them, then the executions.
fn fuzz(target: &str, default_cases: usize) {
    let seeds = seeds::of(target);
    assert!(!seeds.is_empty(), "no seeds for {target}");
    let seed: u64 = std::env::var("MSMEMSCOPE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(61);
    let mut rng = mutate::Rng::new(seed ^ target.len() as u64);
    let mut failures = Vec::new();
    let mut runs = 0usize;
    let lock = lock();
    let started = Instant::now();
    for (i, s) in seeds.iter().enumerate() {
        let step = (s.len() / 64).max(1);
        for cut in (0..s.len()).step_by(step) {
            runs += 1;
            failures.extend(run_case(target, &s[..cut], &lock).err());
        }
        let other = &seeds[(i + 1) % seeds.len()];
        for _ in 0..cases(default_cases) {
            let input = mutate::mutate(&mut rng, s, other);
            runs += 1;
            failures.extend(run_case(target, &input, &lock).err());
        }
    }
    eprintln!(
        "fuzz_readers: {target}: {runs} executions in {:.1?}",
        started.elapsed()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// --- the readers ----------------------------------------------------------------------------

#[test]
fn csv() {
    fuzz("csv", 80);
}

#[test]
fn original_csv() {
    fuzz("original_csv", 40);
}

#[test]
fn sqlite() {
    fuzz("sqlite", 80);
}

#[test]
fn parquet() {
    fuzz("parquet", 200);
}

#[test]
fn step_summary() {
    fuzz("step_summary", 100);
}

#[test]
fn step_part() {
    fuzz("step_part", 100);
}

#[test]
fn control_frame() {
    fuzz("control_frame", 1000);
}

/// The inputs that once broke a reader, each read again.
#[test]
fn corpus_replays() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_corpus");
    let lock = lock();
    let mut failures = Vec::new();
    let mut replayed = 0;
    for target in TARGETS {
        let Ok(entries) = std::fs::read_dir(root.join(target)) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().ends_with(".md") {
                continue;
            }
            let input = std::fs::read(entry.path()).unwrap();
            replayed += 1;
            if let Err(e) = run_case(target, &input, &lock) {
                failures.push(format!("{}: {e}", entry.path().display()));
            }
        }
    }
    assert!(replayed > 0, "no corpus under {}", root.display());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The mutations start from valid files: each seed reads to its end without an error, both
/// ways, a bounded run's rows being its head's and its part's.
#[test]
fn every_starting_input_reads_cleanly() {
    let _lock = lock();
    for target in TARGETS.iter().filter(|t| **t != "control_frame") {
        let dir = scratch(&format!("clean-{target}"));
        for seed in seeds::of(target) {
            let (iterated, sourced) = harness::check(target, &seed, &dir).unwrap();
            assert_eq!(iterated.error, None, "{target}");
            assert_eq!(sourced, iterated, "{target}");
            assert!(!iterated.ids.is_empty(), "{target}");
            if target.starts_with("step_") {
                assert_eq!(iterated.ids, [1, 2, 3, 9, 10], "{target}");
            }
        }
    }
}

/// Where the file should be, something no reader may wait on or read: a FIFO (with no
/// writer: opening it for reading would block), a directory; for the dump, the summary and a
/// step part. Each read ends, with one line naming the path, or without the file.
#[test]
fn fifos_and_directories_in_place_of_files() {
    let _lock = lock();
    let epoch = watchdog();
    let dir = scratch("special");
    for kind in ["fifo", "dir"] {
        for place in ["head", "summary", "part"] {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let head = dir.join("memscope_dump_1.csv");
            let parts = msmemscope_core::events::parts::parts_dir(&head);
            std::fs::create_dir_all(&parts).unwrap();
            std::fs::write(
                &head,
                format!("{}\n{}", harness::HEADER, harness::HEAD_ROWS),
            )
            .unwrap();
            std::fs::write(
                parts.join(msmemscope_core::events::parts::SUMMARY_FILE),
                harness::STEP_SUMMARY,
            )
            .unwrap();
            let part = parts.join(msmemscope_core::events::parts::part_name(4, 0, "csv"));
            std::fs::write(
                &part,
                format!("{}\n{}", harness::HEADER, harness::PART_ROWS),
            )
            .unwrap();
            let path = match place {
                "head" => head.clone(),
                "summary" => parts.join(msmemscope_core::events::parts::SUMMARY_FILE),
                _ => part,
            };
            std::fs::remove_file(&path).unwrap();
            if kind == "dir" {
                std::fs::create_dir(&path).unwrap();
            } else {
                let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a NUL-terminated path this test owns.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }
            *RUNNING.lock().unwrap() = (format!("{kind} as {place}"), Vec::new());
            STARTED.store(epoch.elapsed().as_millis().max(1) as u64, Ordering::Relaxed);
            let (iterated, sourced) = harness::read_dump(&head);
            STARTED.store(0, Ordering::Relaxed);
            for outcome in [&iterated, &sourced] {
                match place {
                    // The rows are the head's, then step 4's; a summary that cannot be read
                    // only loses the note about the steps left out.
                    "summary" => {
                        assert_eq!(outcome.ids, [1, 2, 3, 9, 10], "{kind} as {place}");
                        assert_eq!(outcome.error, None, "{kind} as {place}");
                    }
                    // A FIFO has no length: passed over as the empty part a run killed as
                    // it made the file leaves.
                    "part" if kind == "fifo" => {
                        assert_eq!(outcome.ids, [1, 2, 3], "{kind} as {place}");
                        assert_eq!(outcome.error, None, "{kind} as {place}");
                    }
                    _ => {
                        let rows: &[u64] = if place == "part" { &[1, 2, 3] } else { &[] };
                        assert_eq!(outcome.ids, rows, "{kind} as {place}");
                        let error = outcome.error.as_deref().unwrap_or_default();
                        assert!(
                            error.starts_with(&path.display().to_string())
                                && error.contains(if kind == "dir" {
                                    "a directory"
                                } else {
                                    "a FIFO"
                                }),
                            "{kind} as {place}: {outcome:?}"
                        );
                    }
                }
            }
        }
    }
}

/// Files that claim, or are, gigabytes: a sparse dump of each format, a sparse step summary,
/// a Parquet footer claiming 4 GiB of metadata. Each is refused or read within the memory
/// bound, without reading the hole.
#[test]
fn huge_files_and_lengths_stay_bounded() {
    const HOLE: u64 = 6 << 30;
    let lock = lock();
    let mut failures = Vec::new();
    let sparse = |target: &str, name: &str, seed: &[u8], tail: &[u8]| -> Result<(), String> {
        // The check writes `seed`; the file then grows into a hole, `tail` at its end.
        let dir = scratch(&format!("huge-{target}"));
        harness::check(target, seed, &dir);
        let path = if target == "step_summary" {
            msmemscope_core::events::parts::parts_dir(&dir.join("memscope_dump_1.csv")).join(name)
        } else {
            dir.join(name)
        };
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(HOLE).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, tail, HOLE).unwrap();
        let head = dir.join("memscope_dump_1.csv");
        let head = if target == "step_summary" {
            head
        } else {
            path.clone()
        };
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let result = std::panic::catch_unwind(|| harness::read_dump(&head));
        let allocated = PEAK.load(Ordering::Relaxed) - base;
        let _ = std::fs::remove_dir_all(&dir);
        match result {
            Err(_) => Err(format!("{target} {name}: a panic")),
            Ok(_) if allocated > CASE_MEMORY => {
                Err(format!("{target} {name}: allocated {allocated} bytes"))
            }
            Ok(_) => Ok(()),
        }
    };
    let _ = &lock;
    for (target, name) in [
        ("csv", "memscope_dump_1.csv"),
        ("sqlite", "memscope_dump_1.db"),
        ("parquet", "memscope_dump_1.parquet"),
        ("step_summary", msmemscope_core::events::parts::SUMMARY_FILE),
    ] {
        let seed = seeds::of(target).swap_remove(0);
        let mut tails = vec![Vec::new(), b"\n1,2,3\n".to_vec()];
        if target == "parquet" {
            // A footer claiming about 4 GiB of metadata just before it, and the real one.
            let mut footer = (u32::MAX - 16).to_le_bytes().to_vec();
            footer.extend_from_slice(b"PAR1");
            tails.push(footer);
            tails.push(seed[seed.len() - 8..].to_vec());
        }
        for tail in tails {
            failures.extend(sparse(target, name, &seed, &tail).err());
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `MSMEMSCOPE_FUZZ_SEEDS_OUT=dir`: each target's seeds written to `dir/<target>/`, the
/// libFuzzer targets' starting corpus (bench/fuzz_readers.sh).
#[test]
fn write_seeds() {
    let Some(out) = std::env::var_os("MSMEMSCOPE_FUZZ_SEEDS_OUT") else {
        return;
    };
    for target in TARGETS {
        let dir = Path::new(&out).join(target);
        std::fs::create_dir_all(&dir).unwrap();
        for (i, seed) in seeds::of(target).iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), seed).unwrap();
        }
    }
}
