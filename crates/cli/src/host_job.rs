//! The console summary of a host-leak job with more than one process: the leak sites the
//! processes share, merged by their innermost frame, and where each process's report lies.
//! A DataLoader's workers all run the same code, so printing every worker's full report says
//! the same thing once per worker (thousands of lines); the reports stay in their files.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use msmemscope_core::time_fmt::human_bytes;
use serde_json::Value;

/// Merged sites listed on the console.
const SHOWN_SITES: usize = 5;
/// Processes whose report paths are listed one by one; beyond, the output directory is named.
const LISTED_PROCESSES: usize = 12;

/// One process of the job and the reports its windows left.
pub struct Process {
    pub pid: u32,
    /// The launched program itself, rather than a process it started.
    pub program: bool,
    /// `traced process 705: python -c ...`, the line that introduces it.
    pub title: String,
    /// `leak_overview_{stage}.txt` paths, in stage order.
    pub overviews: Vec<PathBuf>,
}

/// The leak ranking one process's windows gave a site (all windows and stacks that share its
/// innermost frame together).
#[derive(Clone, Debug, PartialEq)]
struct Found {
    pid: u32,
    program: bool,
    /// Best rank among the process's TOP N (1 = its top leak site).
    rank: usize,
    blocks: u64,
    bytes: u64,
}

/// One innermost frame and the processes that rank it a leak.
#[derive(Debug)]
struct Merged {
    frame: String,
    found: Vec<Found>,
}

impl Merged {
    fn tops(&self) -> usize {
        self.found.iter().filter(|f| f.rank == 1).count()
    }

    fn bytes(&self) -> u64 {
        self.found.iter().map(|f| f.bytes).sum()
    }
}

/// `dataloader_workers_leak.py:19 (Samples.__getitem__)` for a Python frame
/// (`/path/file.py(19): Samples.__getitem__`); a C frame as it is.
pub fn short_frame(frame: &str) -> String {
    let parsed = frame.split_once("): ").and_then(|(place, function)| {
        let (file, line) = place.rsplit_once('(')?;
        line.parse::<u64>().ok()?;
        let name = Path::new(file).file_name()?.to_string_lossy().into_owned();
        Some(format!("{name}:{line} ({function})"))
    });
    parsed.unwrap_or_else(|| frame.to_string())
}

/// The innermost frame of a `leak_sites` site: its Python line where it has one (the program's
/// code), else its innermost C frame.
fn innermost(site: &Value) -> String {
    let first = |key: &str| {
        site.get(key)
            .and_then(Value::as_array)
            .and_then(|frames| frames.first())
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    first("python_frames")
        .or_else(|| first("frames"))
        .unwrap_or_else(|| "(unresolved stack)".to_string())
}

fn count_bytes(site: &Value) -> (u64, u64) {
    let unfreed = &site["unfreed"];
    (
        unfreed["count"].as_u64().unwrap_or(0),
        unfreed["bytes"].as_u64().unwrap_or(0),
    )
}

/// The TOP N leak sites of one process's `leak_sites_{stage}.json` documents, merged by
/// innermost frame.
fn sites_of(pid: u32, program: bool, documents: &[Value]) -> Vec<(String, Found)> {
    let mut by_frame: HashMap<String, Found> = HashMap::new();
    for document in documents {
        let Some(sites) = document["sites"].as_array() else {
            continue;
        };
        for (i, site) in sites.iter().enumerate() {
            let (blocks, bytes) = count_bytes(site);
            let entry = by_frame.entry(innermost(site)).or_insert(Found {
                pid,
                program,
                rank: i + 1,
                blocks: 0,
                bytes: 0,
            });
            entry.rank = entry.rank.min(i + 1);
            entry.blocks += blocks;
            entry.bytes += bytes;
        }
    }
    by_frame.into_iter().collect()
}

fn merge(processes: &[(u32, bool, Vec<Value>)]) -> Vec<Merged> {
    let mut merged: HashMap<String, Vec<Found>> = HashMap::new();
    for (pid, program, documents) in processes {
        for (frame, found) in sites_of(*pid, *program, documents) {
            merged.entry(frame).or_default().push(found);
        }
    }
    let mut list: Vec<Merged> = merged
        .into_iter()
        .map(|(frame, mut found)| {
            found.sort_by_key(|f| (!f.program, f.pid));
            Merged { frame, found }
        })
        .collect();
    // Where most processes rank it first, then where most rank it at all, then by size.
    list.sort_by(|a, b| {
        b.tops()
            .cmp(&a.tops())
            .then(b.found.len().cmp(&a.found.len()))
            .then(b.bytes().cmp(&a.bytes()))
            .then(a.frame.cmp(&b.frame))
    });
    list
}

/// `769 blocks / 1.5 MiB` when every process has the same, else the range (`769-770 blocks`).
fn each(found: &[Found]) -> String {
    let range = |values: Vec<u64>, show: &dyn Fn(u64) -> String| {
        let low = show(values.iter().copied().min().unwrap_or(0));
        let high = show(values.iter().copied().max().unwrap_or(0));
        // Equal once rounded (1.5 MiB and 1.5 MiB) reads as one value.
        if low == high {
            low
        } else {
            format!("{low}-{high}")
        }
    };
    let blocks = range(found.iter().map(|f| f.blocks).collect(), &|v| v.to_string());
    let bytes = range(found.iter().map(|f| f.bytes).collect(), &human_bytes);
    format!("{blocks} blocks / {bytes}")
}

/// `in the program and 4 of 4 child processes`.
fn where_found(found: &[Found], children: usize) -> String {
    let in_program = found.iter().any(|f| f.program);
    let in_children = found.iter().filter(|f| !f.program).count();
    match (in_program, in_children) {
        (true, 0) => "in the program".to_string(),
        (true, n) => format!("in the program and {n} of {children} child processes"),
        (false, n) => format!("in {n} of {children} child processes"),
    }
}

/// The summary's text (without the per-process report paths). `processes`: each process's
/// pid, whether it is the program, and its `leak_sites` documents.
fn render_sites(processes: &[(u32, bool, Vec<Value>)]) -> String {
    let children = processes.iter().filter(|p| !p.1).count();
    let with_program = processes.len() > children;
    let mut out = String::new();
    let who = if with_program {
        format!("the program and {children} child processes")
    } else {
        format!("{children} child processes")
    };
    let merged = merge(processes);
    if merged.is_empty() {
        let _ = writeln!(
            out,
            "msmemscope: host leaks of the job ({who}): no leak site in any report"
        );
        return out;
    }
    let _ = writeln!(
        out,
        "msmemscope: host leaks of the job ({who}), the leak sites of their reports merged by innermost frame:"
    );
    for (i, site) in merged.iter().take(SHOWN_SITES).enumerate() {
        let one = site.found.len() == 1;
        let top = match site.tops() {
            0 => String::new(),
            1 if one => ", its top leak site".to_string(),
            tops => format!(", the top leak site in {tops}"),
        };
        let amount = if one {
            format!("{} unfreed", each(&site.found))
        } else {
            format!(
                "{} unfreed in each ({} in all)",
                each(&site.found),
                human_bytes(site.bytes())
            )
        };
        let _ = writeln!(
            out,
            "  {}. {}: {}{top}; {amount}",
            i + 1,
            short_frame(&site.frame),
            where_found(&site.found, children),
        );
    }
    if merged.len() > SHOWN_SITES {
        let _ = writeln!(
            out,
            "  (and {} more sites; each process's full report is in its file below)",
            merged.len() - SHOWN_SITES
        );
    }
    out
}

fn sites_file(overview: &Path) -> Option<PathBuf> {
    let name = overview.file_name()?.to_str()?;
    let stage = name.strip_prefix("leak_overview_")?;
    Some(
        overview
            .with_file_name(format!("leak_sites_{stage}"))
            .with_extension("json"),
    )
}

fn documents(process: &Process) -> Vec<Value> {
    process
        .overviews
        .iter()
        .filter_map(|overview| {
            let text = crate::report::run_file::read(
                &sites_file(overview)?,
                crate::report::run_file::MAX_TEXT,
            )
            .ok()?;
            serde_json::from_str(&text).ok()
        })
        .collect()
}

/// The whole console summary: the merged sites, then each process and its report files.
pub fn render(processes: &[Process], output: &Path) -> String {
    let loaded: Vec<(u32, bool, Vec<Value>)> = processes
        .iter()
        .map(|p| (p.pid, p.program, documents(p)))
        .collect();
    let mut out = render_sites(&loaded);
    let _ = writeln!(out, "msmemscope: each process's full report:");
    for process in processes.iter().take(LISTED_PROCESSES) {
        let _ = writeln!(out, "msmemscope: {}", process.title);
        if process.overviews.is_empty() {
            let _ = writeln!(out, "msmemscope:   no host leak report was written");
        }
        for overview in &process.overviews {
            let _ = writeln!(
                out,
                "msmemscope:   host leak report: {}",
                overview.display()
            );
        }
    }
    if processes.len() > LISTED_PROCESSES {
        let _ = writeln!(
            out,
            "msmemscope: and {} more processes: run directories under {}",
            processes.len() - LISTED_PROCESSES,
            output.display()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn site(frame: &str, count: u64, bytes: u64) -> Value {
        json!({"python_frames": [frame], "frames": [], "unfreed": {"count": count, "bytes": bytes}})
    }

    fn report(sites: Vec<Value>) -> Value {
        json!({ "sites": sites })
    }

    const LEAK: &str = "/w/dataloader_workers_leak.py(19): Samples.__getitem__";
    const STORE: &str = "/v/torch/multiprocessing/reductions.py(624): reduce_storage";

    #[test]
    fn frames_are_shortened_to_file_line_and_function() {
        assert_eq!(
            short_frame(LEAK),
            "dataloader_workers_leak.py:19 (Samples.__getitem__)"
        );
        assert_eq!(
            short_frame("<frozen runpy>(88): _run_code"),
            "<frozen runpy>:88 (_run_code)"
        );
        assert_eq!(
            short_frame("leaker+0x1c (leak.c:12)"),
            "leaker+0x1c (leak.c:12)"
        );
    }

    #[test]
    fn the_same_line_in_every_worker_is_one_line() {
        let worker = |bytes| report(vec![site(LEAK, 769, bytes), site(STORE, 96, 4608)]);
        let processes = vec![
            (10, true, vec![report(vec![site(STORE, 126, 7056)])]),
            (11, false, vec![worker(1_597_952)]),
            (12, false, vec![worker(1_597_952)]),
            (13, false, vec![worker(1_597_952)]),
        ];
        let text = render_sites(&processes);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "msmemscope: host leaks of the job (the program and 3 child processes), the leak \
                 sites of their reports merged by innermost frame:",
                "  1. dataloader_workers_leak.py:19 (Samples.__getitem__): in 3 of 3 child \
                 processes, the top leak site in 3; 769 blocks / 1.5 MiB unfreed in each \
                 (4.6 MiB in all)",
                "  2. reductions.py:624 (reduce_storage): in the program and 3 of 3 child \
                 processes, the top leak site in 1; 96-126 blocks / 4.5 KiB-6.9 KiB unfreed in \
                 each (20.4 KiB in all)",
            ]
        );
    }

    #[test]
    fn a_site_of_one_process_says_so() {
        let processes = vec![
            (10, true, vec![report(vec![site(STORE, 126, 7056)])]),
            (11, false, vec![report(vec![site(LEAK, 769, 1_597_952)])]),
        ];
        let text = render_sites(&processes);
        assert!(
            text.contains(
                "  2. reductions.py:624 (reduce_storage): in the program, its top leak site; \
                 126 blocks / 6.9 KiB unfreed\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn stacks_sharing_a_line_in_one_process_add_up() {
        let processes = vec![(
            11,
            false,
            vec![
                report(vec![site(STORE, 1, 100), site(LEAK, 2, 200)]),
                report(vec![site(LEAK, 3, 300)]),
            ],
        )];
        let merged = merge(&processes);
        assert_eq!(merged[0].frame, LEAK);
        assert_eq!(
            merged[0].found,
            [Found {
                pid: 11,
                program: false,
                rank: 1,
                blocks: 5,
                bytes: 500
            }]
        );
    }

    #[test]
    fn many_processes_are_listed_up_to_a_limit() {
        let processes: Vec<Process> = (0..20)
            .map(|i| Process {
                pid: 100 + i,
                program: i == 0,
                title: format!("traced process {}", 100 + i),
                overviews: Vec::new(),
            })
            .collect();
        let text = render(&processes, Path::new("out"));
        assert!(text.contains("no leak site in any report"), "{text}");
        assert!(text.ends_with("msmemscope: and 8 more processes: run directories under out\n"));
        assert!(text.lines().count() < 40, "{text}");
    }
}
