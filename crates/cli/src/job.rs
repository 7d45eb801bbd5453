//! A job's processes (`--follow exec`): the run directories the processes the program started
//! made for themselves under the output path, found by the job link in their `config.json`,
//! and the one summary the launcher prints for all of them once the program has ended.

use std::path::{Path, PathBuf};

use msmemscope_core::config::{LogLevel, RunConfig};
use msmemscope_core::launch_env;

use crate::ranks;

/// One process of the job that recorded something (it has a run directory of its own).
pub struct Followed {
    pub dir: PathBuf,
    pub pid: u32,
    pub rank: Option<u64>,
    pub command: Vec<String>,
}

impl Followed {
    /// The command line as one short line (the arguments after the 6th elided).
    pub fn command_line(&self) -> String {
        const SHOWN: usize = 6;
        let mut line = self
            .command
            .iter()
            .take(SHOWN)
            .cloned()
            .collect::<Vec<_>>()
            .join(" ");
        if self.command.len() > SHOWN {
            line.push_str(" …");
        }
        line
    }

    fn who(&self) -> String {
        match self.rank {
            Some(rank) => format!("process {} (rank {rank})", self.pid),
            None => format!("process {}", self.pid),
        }
    }
}

/// A `config.json` is a few KiB; anything far larger (or not a plain file) is not one.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The run directories under `output` whose `config.json` links them to the job whose own run
/// directory is `job_run`, by rank (runs without one last) and then pid.
pub fn followed_runs(output: &Path, job_run: &Path) -> Vec<Followed> {
    let mut found: Vec<Followed> = std::fs::read_dir(output)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let pid = name
                .strip_prefix("msmemscope_")?
                .split('_')
                .next()?
                .parse()
                .ok()?;
            let dir = e.path();
            let config = read_config(&dir)?;
            let link = config.job?;
            (same_dir(&link.job_run, job_run) && dir != job_run).then(|| Followed {
                rank: config.distributed.map(|d| d.rank),
                command: link.command,
                pid,
                dir,
            })
        })
        .collect();
    found.sort_by_key(|f| (f.rank.is_none(), f.rank, f.pid));
    found
}

fn read_config(dir: &Path) -> Option<RunConfig> {
    let path = dir.join(launch_env::CONFIG_FILE);
    let meta = std::fs::symlink_metadata(&path).ok()?;
    if !meta.is_file() || meta.len() > MAX_CONFIG_BYTES {
        return None;
    }
    RunConfig::from_json(&std::fs::read_to_string(&path).ok()?).ok()
}

fn same_dir(a: &Path, b: &Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// The program's own run in the job's table: its run directory, its name and its pid.
pub type ProgramRun<'a> = (&'a Path, &'a str, u32);

/// What each traced process of the job left (its dumps and its analyses' report), then one
/// table of all of them with the ones that stand out; the program's own run is in the table
/// when given (it recorded events itself).
pub fn print_summary(config: &RunConfig, program: Option<ProgramRun<'_>>, followed: &[Followed]) {
    // Host-leak jobs get `print_host_leak_summary` instead.
    if followed.is_empty() || config.host_leaks() {
        return;
    }
    let verbose = config.log_level < LogLevel::Error;
    for process in followed {
        eprintln!(
            "msmemscope: traced {}: {}",
            process.who(),
            process.command_line()
        );
        print_event_results(&process.dir, verbose);
    }
    let mut runs: Vec<PathBuf> = followed.iter().map(|f| f.dir.clone()).collect();
    if let Some((dir, _, _)) = program {
        runs.push(dir.to_path_buf());
    }
    match ranks::rows_of_runs(runs) {
        Ok(rows) if !rows.is_empty() => eprint!("{}", job_table(&rows, program, followed)),
        Ok(_) => {}
        Err(failure) => eprintln!("msmemscope: job summary: {}", failure.message),
    }
}

fn print_event_results(dir: &Path, verbose: bool) {
    for (_, dump) in ranks::dump_files(dir) {
        eprintln!("msmemscope:   event dump: {}", dump.display());
    }
    if verbose {
        if let Ok(report) = std::fs::read_to_string(dir.join(launch_env::ANALYSIS_REPORT)) {
            for line in report.lines() {
                eprintln!("  {line}");
            }
        }
    }
}

/// The one host-leak summary of a job with processes besides the program (`program`: its run
/// directory and pid), in place of every process's full report.
pub fn print_host_leak_summary(config: &RunConfig, program: (&Path, u32), followed: &[Followed]) {
    let (dir, pid) = program;
    let mut processes = vec![crate::host_job::Process {
        pid,
        program: true,
        title: format!("the program, process {pid}"),
        overviews: overviews_in(&dir.join("host_leak"))
            .into_iter()
            .map(|name| dir.join("host_leak").join(name))
            .collect(),
    }];
    processes.extend(followed.iter().map(|f| {
        crate::host_job::Process {
            pid: f.pid,
            program: false,
            title: format!("traced {}: {}", f.who(), f.command_line()),
            overviews: overviews_in(&f.dir.join("host_leak"))
                .into_iter()
                .map(|name| f.dir.join("host_leak").join(name))
                .collect(),
        }
    }));
    eprint!(
        "{}",
        crate::host_job::render(&processes, &config.output_path)
    );
}

/// One line per traced process and device: pid, rank, peak, what the leaks analysis found, whether it
/// stands out from the others, its command and run directory.
fn job_table(
    rows: &[ranks::Row],
    program: Option<ProgramRun<'_>>,
    followed: &[Followed],
) -> String {
    let process_of = |run: &str| -> (String, String) {
        if let Some((dir, name, pid)) = program {
            if dir.file_name().is_some_and(|n| n.to_string_lossy() == run) {
                return (pid.to_string(), name.to_string());
            }
        }
        followed
            .iter()
            .find(|f| {
                f.dir
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy() == run)
            })
            .map_or_else(
                || ("-".to_string(), String::new()),
                |f| (f.pid.to_string(), f.command_line()),
            )
    };
    let header = [
        "pid",
        "rank",
        "device",
        "peak allocated",
        "leaked",
        "blocks",
        "stands out",
        "command",
    ];
    let lines: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            let (pid, command) = process_of(&r.run);
            [
                pid,
                r.rank.map_or_else(|| "-".into(), |k| k.to_string()),
                r.device.clone(),
                r.peak_allocated.map_or_else(|| "-".into(), ranks::bytes),
                ranks::bytes(r.leaked_bytes),
                r.leaked_blocks.to_string(),
                if r.stands_out.is_empty() {
                    "-".into()
                } else {
                    r.stands_out.clone()
                },
                command,
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = format!(
        "msmemscope: the job's traced processes ({} with a dump):\n",
        lines.len()
    );
    let mut push = |cells: &[String]| {
        let text: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str("  ");
        out.push_str(text.join("  ").trim_end());
        out.push('\n');
    };
    push(&header.map(String::from));
    for line in &lines {
        push(line);
    }
    let standing: Vec<String> = rows
        .iter()
        .filter(|r| !r.stands_out.is_empty())
        .map(|r| {
            let (pid, _) = process_of(&r.run);
            match r.rank {
                Some(rank) => format!("rank {rank} (pid {pid}) on {} ({})", r.device, r.stands_out),
                None => format!("pid {pid} on {} ({})", r.device, r.stands_out),
            }
        })
        .collect();
    if standing.is_empty() {
        out.push_str("msmemscope: no process stands out\n");
    } else {
        out.push_str(&format!(
            "msmemscope: stands out: {}\n",
            standing.join("; ")
        ));
    }
    out
}

/// The names of the `leak_overview_{stage}.txt` files in `dir`, by stage number (so `_10` comes after `_9`).
pub(crate) fn overviews_in(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let stage = name
                .to_str()?
                .strip_prefix("leak_overview_")?
                .strip_suffix(".txt")?
                .parse()
                .ok()?;
            Some((stage, PathBuf::from(name)))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, path)| path).collect()
}
