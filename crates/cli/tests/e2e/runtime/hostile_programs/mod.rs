//! The runtime inside processes nobody here wrote: other allocators, programs that close and
//! reuse descriptors, memory pressure, full disks, signals and exit paths. Each test builds a
//! real C program, runs it once without the tool and once under the real CLI, and checks that
//! the program's own output and exit status are the same, that nothing was written outside the
//! run directory, and what the tool said. This file holds what the tests share; they are in
//! `heap_and_resources.rs` and `exits_and_reasons.rs`.

mod exits_and_reasons;
mod heap_and_resources;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::util::host_leak::{clear_runtime_knobs, Overview};
use crate::util::{compile, fixture_src, output_with_timeout, repo, Scratch, BIN};

/// Builds `tests/fixtures/hostile/{name}` (C or C++ by its extension) into `dir`.
fn build(dir: &Path, source: &str, extra: &[&str]) -> PathBuf {
    let src = fixture_src("hostile").join(source);
    let stem = Path::new(source).file_stem().unwrap().to_str().unwrap();
    let exe = dir.join(stem);
    let compiler = if source.ends_with(".cc") {
        "g++"
    } else {
        "gcc"
    };
    let mut args: Vec<&str> = vec!["-O1", "-g", "-Wno-alloc-size-larger-than"];
    args.extend_from_slice(extra);
    let src_s = src.to_str().unwrap().to_string();
    let exe_s = exe.to_str().unwrap().to_string();
    args.extend_from_slice(&[&src_s, "-o", &exe_s]);
    compile(compiler, &args);
    exe
}

/// Builds a fixture that writes MSTX marks (weakly linked: it runs without the tool too).
fn build_with_mstx(dir: &Path, source: &str) -> PathBuf {
    let include = repo().join("crates/runtime/include");
    let include = format!("-I{}", include.display());
    build(dir, source, &["-DMSMEMSCOPE_MSTX_WEAK", &include])
}

/// A library the test command installs from Debian's packages.
fn debian_library(name: &str) -> PathBuf {
    let path = Path::new("/usr/lib/x86_64-linux-gnu").join(name);
    assert!(
        path.exists(),
        "{} is missing: scripts/test.sh installs libjemalloc2 and libtcmalloc-minimal4",
        path.display()
    );
    path
}

/// One program, run without the tool and under it, in directories of its own.
struct Pair {
    /// Where the traced run's program ran (its working directory) and the tool's output went.
    scratch: Scratch,
    plain: Output,
    traced: Output,
}

impl Pair {
    /// Runs `program` plainly and under `msmemscope {tool_args} -o OUT`, `env` for both, and
    /// checks that the tool changed nothing the program does ([`Pair::assert_unchanged`]).
    fn run(tool_args: &[&str], program: &[&str], env: &[(&str, &str)]) -> Pair {
        let scratch = Scratch::new("hostile");
        let plain_dir = scratch.path().join("plain");
        let traced_dir = scratch.path().join("work");
        std::fs::create_dir_all(&plain_dir).unwrap();
        std::fs::create_dir_all(&traced_dir).unwrap();
        let mut plain = Command::new(program[0]);
        plain.args(&program[1..]).current_dir(&plain_dir);
        let mut traced = Command::new(BIN);
        traced
            .args(tool_args)
            .arg("-o")
            .arg(scratch.path().join("out"))
            .args(program)
            .current_dir(&traced_dir);
        for cmd in [&mut plain, &mut traced] {
            cmd.env_remove("LD_PRELOAD");
            clear_runtime_knobs(cmd);
            for (k, v) in env {
                cmd.env(k, v);
            }
        }
        let plain = output_with_timeout(plain);
        let traced = output_with_timeout(traced);
        let pair = Pair {
            scratch,
            plain,
            traced,
        };
        pair.assert_unchanged();
        pair
    }

    /// [`Pair::run`] of `program` alone under `--analysis=host-leaks`.
    fn host_leaks(program: &Path) -> Pair {
        Pair::run(
            &["--analysis=host-leaks"],
            &[program.to_str().unwrap()],
            &[],
        )
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.traced.stderr).into_owned()
    }

    /// The program's output and status are what they are without the tool, and it wrote only
    /// what it writes without it.
    fn assert_unchanged(&self) {
        assert_eq!(
            String::from_utf8_lossy(&self.traced.stdout),
            String::from_utf8_lossy(&self.plain.stdout),
            "stdout changed; tool's stderr:\n{}",
            self.stderr()
        );
        assert_eq!(
            self.traced.status.code(),
            self.plain.status.code(),
            "exit status changed ({:?} vs {:?}); stderr:\n{}",
            self.traced.status,
            self.plain.status,
            self.stderr()
        );
        assert_eq!(
            listing(&self.scratch.path().join("work")),
            listing(&self.scratch.path().join("plain")),
            "the traced program's directory differs from the plain one's"
        );
    }

    /// The single run directory.
    fn run_dir(&self) -> PathBuf {
        let out = self.scratch.path().join("out");
        let dirs: Vec<PathBuf> = std::fs::read_dir(&out)
            .unwrap_or_else(|e| panic!("no {}: {e}\n{}", out.display(), self.stderr()))
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(dirs.len(), 1, "{dirs:?}");
        dirs.into_iter().next().unwrap()
    }

    /// The lines holding `needle` in all the run's CPU dump files.
    fn dump_lines_with(&self, needle: &str) -> usize {
        std::fs::read_dir(self.run_dir().join("device_cpu/dump"))
            .unwrap()
            .map(|e| {
                let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
                text.lines().filter(|l| l.contains(needle)).count()
            })
            .sum()
    }

    fn overview(&self) -> Overview {
        let path = self.run_dir().join("host_leak/leak_overview_1.txt");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", path.display(), self.stderr()));
        Overview::parse(&text)
    }
}

/// Every file under `dir` with its contents, sorted.
fn listing(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.push((rel, std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

/// A small file system, mounted for one test and unmounted when it ends.
struct SmallDisk(PathBuf);

impl SmallDisk {
    /// A tmpfs with mount `options` (`size=160k`, `ro,size=16k`).
    fn mount(at: &Path, options: &str) -> SmallDisk {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(at)
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs (as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk(at.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}
