//! The host-leak end-to-end harness: runs programs under `msmemscope-cli --analysis=host-leaks`
//! with a hang timeout, and parses the written overview (every section the tests check).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{msmemscope_runs, output_with_timeout, Scratch, BIN};

// ------------------------------------------------------------------------------------------
// Running

/// One run of the fixture under `msmemscope-cli --analysis=host-leaks`.
pub struct Run {
    pub scratch: Scratch,
    pub out: Output,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    /// The program's run directory `OUT/msmemscope_{pid}_{stamp}`: the one not made by a process
    /// the program started (those record the job in their `config.json`).
    pub fn run_dir(&self) -> PathBuf {
        let out = self.scratch.path().join("out");
        let dirs: Vec<PathBuf> = msmemscope_runs(&out)
            .unwrap_or_else(|e| {
                panic!(
                    "no output dir {}: {e}\nstderr:\n{}",
                    out.display(),
                    self.stderr()
                )
            })
            .into_iter()
            .filter(|p| {
                !std::fs::read_to_string(p.join("config.json"))
                    .is_ok_and(|c| c.contains("\"job\": {"))
            })
            .collect();
        assert_eq!(
            dirs.len(),
            1,
            "expected exactly one run directory of the program, got {dirs:?}"
        );
        dirs.into_iter().next().unwrap()
    }

    pub fn host_leak_files(&self) -> Vec<String> {
        let dir = self.run_dir().join("host_leak");
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("no {}: {e}\nstderr:\n{}", dir.display(), self.stderr()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    pub fn overview_text(&self) -> String {
        self.overview_text_of(1)
    }

    /// The overview of window `stage` (`leak_overview_{stage}.txt`).
    pub fn overview_text_of(&self, stage: u32) -> String {
        let path = self
            .run_dir()
            .join(format!("host_leak/leak_overview_{stage}.txt"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read {}: {e}\nstderr:\n{}",
                path.display(),
                self.stderr()
            )
        })
    }

    pub fn overview(&self) -> Overview {
        Overview::parse(&self.overview_text())
    }
}

/// Runs `prog target...` under `msmemscope-cli --analysis=host-leaks TOOL_ARGS -o OUT` in a
/// scratch directory, with the runtime knobs cleared, then
/// `MSMEMSCOPE_HOST_TOP_N=1024` and `env` set.
pub fn run_tool_cmd(tool_args: &[&str], env: &[(&str, &str)], prog: &str, target: &[&str]) -> Run {
    let scratch = Scratch::new("run");
    let mut cmd = Command::new(BIN);
    cmd.arg("--analysis=host-leaks")
        .args(tool_args)
        .arg("-o")
        .arg(scratch.path().join("out"))
        .arg(prog)
        .args(target)
        .current_dir(scratch.path())
        .env_remove("LD_PRELOAD");
    clear_runtime_knobs(&mut cmd);
    cmd.env("MSMEMSCOPE_HOST_TOP_N", "1024");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = output_with_timeout(cmd);
    Run { scratch, out }
}

/// `prog args...` on its own, without the tool (and without `LD_PRELOAD`), with the hang
/// timeout.
pub fn run_plain_cmd(prog: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(prog);
    cmd.args(args).env_remove("LD_PRELOAD");
    output_with_timeout(cmd)
}

// ------------------------------------------------------------------------------------------
// The overview, parsed

/// `(blocks, bytes)`.
pub type Counts = (u64, u64);
/// `(unfreed, allocated, freed)` of a site or of all sites of one function.
pub type SiteTotals = (Counts, Counts, Counts);

#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    pub label: String,
    pub unfreed: (u64, u64),
    pub allocated: (u64, u64),
    pub freed: (u64, u64),
    /// `suspected_leak`, `growth_watch/turnover`, `resident/early`, ...
    pub class: String,
    pub lsi: f64,
    /// `Growth=1.00 ...` factors as printed (`-` when unknown).
    pub factors: BTreeMap<String, String>,
    pub resident: bool,
    pub frames: Vec<String>,
    /// Sampling by bytes: the samples the site's estimate rests on, and whether the overview
    /// marks it uncertain (`None` in an exact window).
    pub samples: Option<(u64, bool)>,
}

impl Site {
    /// The function name of the first frame (`function file:line` / `function (module+0x..)`).
    pub fn first_function(&self) -> &str {
        self.frames
            .first()
            .map(|f| f.split(' ').next().unwrap())
            .unwrap_or("")
    }
}

#[derive(Debug)]
pub struct Overview {
    pub text: String,
    /// `Key: value` lines of the Data Health Analysis section.
    pub health: BTreeMap<String, String>,
    pub total_unfreed: (u64, u64),
    /// `of which in the overflow channel (no stack): N blocks, B bytes`, if present.
    pub overflow_unfreed: (u64, u64),
    pub unfreed_dist: Vec<(String, u64, u64)>,
    pub pre_window_dist: Vec<(String, u64, u64)>,
    /// `(shown, with_unfreed)` from the TOP header.
    pub top_shown: (u64, u64),
    pub sites: Vec<Site>,
}

pub fn num(s: &str) -> u64 {
    s.trim()
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {s:?}"))
}

/// `N (B bytes)` at the start of `s`.
pub fn count_bytes(s: &str) -> (u64, u64) {
    let s = s.trim();
    let (n, rest) = s
        .split_once(" (")
        .unwrap_or_else(|| panic!("no `N (B bytes)` in {s:?}"));
    let b = rest
        .split_once(" bytes)")
        .unwrap_or_else(|| panic!("no `bytes)` in {s:?}"))
        .0;
    (num(n), num(b))
}

/// `N / B` (from `unfreed N blocks / B bytes` etc.).
pub fn slash_pair(s: &str) -> (u64, u64) {
    let (a, b) = s
        .split_once(" / ")
        .unwrap_or_else(|| panic!("no ` / ` in {s:?}"));
    let a = a.trim().split(' ').next().unwrap();
    let b = b.trim().split(' ').next().unwrap();
    (num(a), num(b))
}

impl Overview {
    pub fn parse(text: &str) -> Overview {
        let mut health = BTreeMap::new();
        let mut total_unfreed = None;
        let mut overflow_unfreed = (0, 0);
        let mut unfreed_dist = Vec::new();
        let mut pre_window_dist = Vec::new();
        let mut top_shown = None;
        let mut sites: Vec<Site> = Vec::new();
        let mut section = String::new();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines
                .first()
                .is_some_and(|l| l.starts_with("====== Host Leak Overview: stage=")),
            "bad header in:\n{text}"
        );
        for line in &lines[1..] {
            if line.starts_with("--- ") {
                section = line.to_string();
                if section.starts_with("--- TOP ") {
                    // --- TOP 1024 Leak Sites (by unfreed bytes; X of Y sites with unfreed blocks shown) ---
                    let inner = section.split_once("; ").expect("TOP header").1;
                    let (x, rest) = inner.split_once(" of ").expect("TOP header X of Y");
                    let y = rest.split(' ').next().unwrap();
                    top_shown = Some((num(x), num(y)));
                }
                continue;
            }
            if line.trim().is_empty() {
                continue;
            }
            if section.starts_with("--- Data Health Analysis") {
                if let Some((k, v)) = line.split_once(": ") {
                    health.insert(k.to_string(), v.to_string());
                }
            } else if section.starts_with("--- Total Unfreed") {
                if let Some(rest) =
                    line.strip_prefix("of which in the overflow channel (no stack): ")
                {
                    let (n, b) = rest.split_once(" blocks, ").expect("overflow line");
                    overflow_unfreed = (num(n), num(b.trim_end_matches(" bytes")));
                } else if total_unfreed.is_none() {
                    let (n, rest) = line.split_once(" blocks, ").expect("total line");
                    let b = rest.split(' ').next().unwrap();
                    total_unfreed = Some((num(n), num(b)));
                }
            } else if section.starts_with("--- Unfreed Block Size Distribution")
                || section.starts_with("--- Pre-Window Free Size Distribution")
            {
                let cols: Vec<&str> = line.split_whitespace().collect();
                if cols[0] == "Size" {
                    continue;
                }
                assert_eq!(cols.len(), 4, "bad distribution row {line:?}");
                let row = (cols[0].to_string(), num(cols[1]), num(cols[2]));
                if section.starts_with("--- Unfreed") {
                    unfreed_dist.push(row);
                } else {
                    pre_window_dist.push(row);
                }
            } else if section.starts_with("--- TOP ") || section.starts_with("--- Resident") {
                if line.starts_with("Series: ") {
                    continue;
                }
                if let Some(frame) = line.strip_prefix("    ") {
                    sites
                        .last_mut()
                        .expect("frame before site")
                        .frames
                        .push(frame.to_string());
                } else if let Some(assessment) = line.strip_prefix("  ") {
                    // suspected_leak LSI=94.0 Growth=1.00 ... slope=+1.0 B/beat beats=16
                    let site = sites.last_mut().expect("assessment before site");
                    let mut words = assessment.split(' ');
                    site.class = words.next().unwrap().to_string();
                    for word in words {
                        if let Some((k, v)) = word.split_once('=') {
                            site.factors.insert(k.to_string(), v.to_string());
                        }
                    }
                    site.lsi = site.factors["LSI"].parse().expect("LSI value");
                } else if line.starts_with('#') {
                    // #1 [stack 21] unfreed 1 blocks / 40000 bytes; allocated 1 / 40000 bytes; freed 0 / 0 bytes
                    let label =
                        line[line.find('[').unwrap() + 1..line.find(']').unwrap()].to_string();
                    let rest = &line[line.find("] ").unwrap() + 2..];
                    let parts: Vec<&str> = rest.split("; ").collect();
                    // `; estimated from N samples[ (uncertain)]` ends a sampled window's line.
                    let samples = parts.get(3).map(|p| {
                        let n = p
                            .strip_prefix("estimated from ")
                            .and_then(|p| p.split(' ').next())
                            .unwrap_or_else(|| panic!("bad samples in {line:?}"));
                        (num(n), p.ends_with(" (uncertain)"))
                    });
                    assert!(
                        parts.len() == 3 || (parts.len() == 4 && samples.is_some()),
                        "bad site line {line:?}"
                    );
                    let unfreed = slash_pair(parts[0].strip_prefix("unfreed ").expect("unfreed"));
                    let allocated =
                        slash_pair(parts[1].strip_prefix("allocated ").expect("allocated"));
                    let freed = slash_pair(parts[2].strip_prefix("freed ").expect("freed"));
                    sites.push(Site {
                        label,
                        unfreed,
                        allocated,
                        freed,
                        class: String::new(),
                        lsi: f64::NAN,
                        factors: BTreeMap::new(),
                        resident: section.starts_with("--- Resident"),
                        frames: Vec::new(),
                        samples,
                    });
                }
            }
        }
        let ov = Overview {
            text: text.to_string(),
            health,
            total_unfreed: total_unfreed.unwrap_or_else(|| panic!("no Total Unfreed in:\n{text}")),
            overflow_unfreed,
            unfreed_dist,
            pre_window_dist,
            top_shown: top_shown.unwrap_or_else(|| panic!("no TOP section in:\n{text}")),
            sites,
        };
        ov.check_consistency();
        ov
    }

    pub fn h(&self, key: &str) -> &str {
        self.health
            .get(key)
            .unwrap_or_else(|| panic!("no Data Health line {key:?} in:\n{}", self.text))
    }

    pub fn allocations_tracked(&self) -> (u64, u64) {
        count_bytes(self.h("Allocations tracked"))
    }

    pub fn frees_tracked(&self) -> (u64, u64) {
        count_bytes(self.h("Frees tracked"))
    }

    pub fn truncation_bits(&self) -> u64 {
        let v = self.h("Truncation");
        num(v.strip_prefix("bits=").unwrap().split(' ').next().unwrap())
    }

    /// `Overflow channel: A (B bytes) allocations, F (G bytes) frees (no stacks)`.
    pub fn overflow_channel(&self) -> ((u64, u64), (u64, u64)) {
        let v = self.h("Overflow channel");
        let (a, f) = v
            .split_once(" allocations, ")
            .expect("overflow channel line");
        (count_bytes(a), count_bytes(f))
    }

    pub fn unattributed(&self) -> u64 {
        num(self
            .h("Unattributed allocations (unknown bucket)")
            .split(' ')
            .next()
            .unwrap())
    }

    pub fn distinct_stacks(&self) -> u64 {
        num(self.h("Distinct stacks (key = first 20 frames)"))
    }

    pub fn recycled(&self) -> u64 {
        num(self.h("Dead-stack recycling").split(' ').next().unwrap())
    }

    pub fn verdict(&self) -> &str {
        self.h("Verdict")
    }

    /// Sums of the listed sites whose first frame is `function`: (unfreed, allocated, freed).
    pub fn by_function(&self, function: &str) -> Option<SiteTotals> {
        let mine: Vec<&Site> = self
            .sites
            .iter()
            .filter(|s| s.first_function() == function)
            .collect();
        if mine.is_empty() {
            return None;
        }
        let sum = |f: fn(&Site) -> (u64, u64)| {
            mine.iter()
                .fold((0, 0), |acc, s| (acc.0 + f(s).0, acc.1 + f(s).1))
        };
        Some((sum(|s| s.unfreed), sum(|s| s.allocated), sum(|s| s.freed)))
    }

    pub fn expect_function(&self, function: &str) -> SiteTotals {
        self.by_function(function)
            .unwrap_or_else(|| panic!("no site with first frame {function} in:\n{}", self.text))
    }

    /// The first listed site whose first frame is `function`.
    pub fn expect_site(&self, function: &str) -> &Site {
        self.sites
            .iter()
            .find(|s| s.first_function() == function)
            .unwrap_or_else(|| panic!("no site with first frame {function} in:\n{}", self.text))
    }

    /// Invariants that hold for every report.
    pub fn check_consistency(&self) {
        let names: Vec<&str> = self.unfreed_dist.iter().map(|r| r.0.as_str()).collect();
        let want = [
            "0-256B",
            "256B-1kB",
            "1kB-4kB",
            "4kB-32kB",
            "32kB-256kB",
            "256kB-1MB",
            ">1MB",
        ];
        assert_eq!(names, want, "unfreed size buckets in:\n{}", self.text);
        let names: Vec<&str> = self.pre_window_dist.iter().map(|r| r.0.as_str()).collect();
        assert_eq!(names, want, "pre-window size buckets in:\n{}", self.text);
        let dist_sum = self
            .unfreed_dist
            .iter()
            .fold((0, 0), |a, r| (a.0 + r.1, a.1 + r.2));
        assert_eq!(
            dist_sum, self.total_unfreed,
            "size distribution vs Total Unfreed in:\n{}",
            self.text
        );
        let pre_sum = self
            .pre_window_dist
            .iter()
            .fold((0, 0), |a, r| (a.0 + r.1, a.1 + r.2));
        let pre_window = self.h("Pre-window frees");
        // Sampling by bytes does not tell pre-window frees apart, and counts none.
        let pre_window = if pre_window.starts_with("not told apart") {
            (0, 0)
        } else {
            count_bytes(pre_window)
        };
        assert_eq!(
            pre_sum, pre_window,
            "pre-window distribution vs Pre-window frees in:\n{}",
            self.text
        );
        let top: Vec<&Site> = self.sites.iter().filter(|s| !s.resident).collect();
        let resident: Vec<&Site> = self.sites.iter().filter(|s| s.resident).collect();
        assert_eq!(
            self.top_shown.0,
            top.len() as u64,
            "TOP header count in:\n{}",
            self.text
        );
        for w in top.windows(2) {
            assert!(
                w[0].lsi >= w[1].lsi,
                "TOP sites not sorted by LSI:\n{}",
                self.text
            );
        }
        for w in resident.windows(2) {
            assert!(
                w[0].unfreed.1 >= w[1].unfreed.1,
                "resident sites not sorted by unfreed bytes:\n{}",
                self.text
            );
        }
        for s in &self.sites {
            assert!(
                !s.class.is_empty(),
                "site without its assessment line: {s:?}"
            );
            assert_eq!(
                s.resident,
                s.class.starts_with("resident/"),
                "class {} in the wrong section:\n{}",
                s.class,
                self.text
            );
            assert!(s.unfreed.0 > 0, "listed site without unfreed blocks: {s:?}");
            assert_eq!(s.allocated.0 - s.freed.0, s.unfreed.0, "site counts {s:?}");
            assert_eq!(s.allocated.1 - s.freed.1, s.unfreed.1, "site bytes {s:?}");
            if s.label != "unknown bucket" {
                assert!(!s.frames.is_empty(), "site without frames {s:?}");
            }
        }
    }

    /// When every site with unfreed blocks is shown: the sites plus the overflow channel make
    /// up Total Unfreed exactly.
    pub fn check_sites_sum_to_total(&self) {
        assert_eq!(
            self.top_shown.0, self.top_shown.1,
            "not all sites shown in:\n{}",
            self.text
        );
        let sum = self.sites.iter().fold(self.overflow_unfreed, |a, s| {
            (a.0 + s.unfreed.0, a.1 + s.unfreed.1)
        });
        assert_eq!(
            sum, self.total_unfreed,
            "sites + overflow vs Total Unfreed in:\n{}",
            self.text
        );
    }
}

pub fn assert_exited(out: &Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: status {:?}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Removes the `MSMEMSCOPE_HOST_*` knobs and `MSMEMSCOPE_NO_CONTROL` from `cmd`'s environment,
/// so a run sees only what its test sets.
pub fn clear_runtime_knobs(cmd: &mut Command) {
    for knob in msmemscope_core::host_leak::knobs::ALL {
        cmd.env_remove(knob.name);
    }
    cmd.env_remove("MSMEMSCOPE_NO_CONTROL");
}
