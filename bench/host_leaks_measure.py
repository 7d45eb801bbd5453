"""Measuring one run of bench/host_leaks.py's workload, and naming the build measured.

Wall time and peak memory of a command (run_once), instructions by part of the host-leak hook
under callgrind (callgrind_run, cg_annotate, classify and the tables that drive it), and the
provenance every result file starts with (sha256, git_info, provenance). The script,
bench/host_leaks.py, decides what to run and reports it; bench/python_host_leaks.py shares the
provenance helpers.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TIME_BIN = "/usr/bin/time"
# Without /usr/bin/time the peak RSS comes from os.wait4, which also counts the forking Python.
HAVE_TIME = os.access(TIME_BIN, os.X_OK)
PAGE = os.sysconf("SC_PAGE_SIZE")
VMHWM_RE = re.compile(rb"alloc_workload: vmhwm_kb=(\d+)")

# ---------------------------------------------------------------- measurement


def _tree_pids(root: int) -> list[int]:
    """root and all its descendants, via /proc/PID/task/TID/children."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(x) for x in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return out


def _tree_rss_bytes(root: int) -> int:
    total = 0
    for pid in _tree_pids(root):
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * PAGE
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return total


class TreeSampler(threading.Thread):
    """Samples the summed RSS of a process tree every `period` seconds."""

    def __init__(self, root: int, period: float = 0.005):
        super().__init__(daemon=True)
        self.root, self.period, self.peak = root, period, 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, _tree_rss_bytes(self.root))
            self._halt.wait(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run_once(cmd: list[str], tmp: Path, sample_tree: bool, cleanup: list[Path]) -> dict[str, Any]:
    """Runs cmd (under /usr/bin/time for the peak RSS when available).

    Returns wall seconds, max_rss_kb (the largest single process of the tree,
    from wait4's ru_maxrss as /usr/bin/time reports it), vmhwm_kb (the
    workload's own peak RSS printed at the end of main), and, when
    sample_tree, tree_peak_kb (sampled peak of the tree's summed RSS).
    """
    timef = tmp / "time.out"
    outf, errf = tmp / "run.stdout", tmp / "run.stderr"
    full = [TIME_BIN, "-f", "%M", "-o", str(timef), *cmd] if HAVE_TIME else cmd
    with open(outf, "wb") as so, open(errf, "wb") as se:
        t0 = time.perf_counter()
        proc = subprocess.Popen(full, stdout=so, stderr=se, stdin=subprocess.DEVNULL)
        sampler = None
        if sample_tree:
            sampler = TreeSampler(proc.pid)
            sampler.start()
        if HAVE_TIME:
            rc = proc.wait()
            ru_kb = None
        else:
            _, status, ru = os.wait4(proc.pid, 0)
            proc.returncode = rc = os.waitstatus_to_exitcode(status)
            ru_kb = ru.ru_maxrss  # includes the forking Python's pre-exec RSS: an overestimate
        wall = time.perf_counter() - t0
        if sampler:
            sampler.stop()
    out = outf.read_bytes()
    if rc != 0:
        sys.stderr.write(f"command failed (rc={rc}): {shlex.join(cmd)}\n")
        sys.stderr.write(errf.read_bytes()[-4000:].decode(errors="replace"))
        sys.exit(1)
    if HAVE_TIME:
        lines = timef.read_text().strip().splitlines()
        ru_kb = int(lines[-1])
    m = VMHWM_RE.search(out)
    for c in cleanup:
        shutil.rmtree(c, ignore_errors=True)
    return {
        "wall_s": wall,
        "max_rss_kb": ru_kb,
        "vmhwm_kb": int(m.group(1)) if m else None,
        "tree_peak_kb": (sampler.peak // 1024) if sampler else None,
    }


# ---------------------------------------------------------------- provenance


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def provenance(
    stamp: str, cli_src: Path, cli: Path, runtime: Path, gi: dict[str, Any]
) -> dict[str, Any]:
    """The head of a result file: when, on what machine, with which msmemscope build."""
    return {
        "timestamp": stamp,
        "machine": {
            "nproc": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "msmemscope": {
            "cli": str(cli_src),
            "cli_sha256": sha256(cli),
            "runtime_sha256": sha256(runtime),
            "git": gi,
        },
    }


def git_info() -> dict[str, Any]:
    def g(*a: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(REPO), *a], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    return {
        "head": g("rev-parse", "--short", "HEAD"),
        "dirty_files": len(g("status", "--porcelain").splitlines()),
    }


# ---------------------------------------------------------------- instructions by part (callgrind)

# The parts of the cost of a malloc/free pair, in print order. Callgrind counts instructions
# (deterministic, unlike wall time on a shared machine), but Rust inlines most of the hook into a
# few symbols, so the parts come from the *source file* of each instruction (callgrind_annotate's
# `file:function` self costs), not from function names. See classify() for the rules.
PARTS = [
    ("unwind", "unwind: capture + memo (unwind/*.rs)"),
    ("stack", "stack id + counters (stack_table, striped, atomics)"),
    ("block", "block table (block_table, block_map, hashing)"),
    ("mutex", "locks (shard spin lock, std Mutex, poison)"),
    ("clock", "clock (clock.rs, clock_gettime)"),
    ("beats", "beats (beats.rs)"),
    ("python", "python frames (python/*.rs)"),
    ("ledger", "ledger glue (ledger.rs)"),
    ("hooks", "hooks + guard (hooks/*.rs, guard.rs)"),
    ("tls", "TLS (__tls_get_addr, std thread_local)"),
    ("runtime_other", "runtime: other Rust code"),
    ("glibc", "glibc malloc/free (malloc/*.c)"),
    ("workload", "the workload's own code"),
]
# Runtime source files (path below crates/runtime/src/) -> part. First match wins.
RUNTIME_FILE_PARTS = [
    ("unwind/", "unwind"),
    ("host_leak/stack_table.rs", "stack"),
    ("host_leak/striped.rs", "stack"),
    # hashing.rs's mix() picks the block table's shard and hashes its keys; on this path the
    # stack id comes from the unwind memo, not from hashing a stack
    ("host_leak/block_table.rs", "block"),
    ("host_leak/spin_lock.rs", "mutex"),
    ("host_leak/block_map.rs", "block"),
    ("host_leak/hashing.rs", "block"),
    ("host_leak/overflow.rs", "block"),
    ("clock.rs", "clock"),
    ("host_leak/beats.rs", "beats"),
    ("python/", "python"),
    ("host_leak/ledger.rs", "ledger"),
    ("hooks/", "hooks"),
    ("guard.rs", "hooks"),
]
# std/core/dependency source inlined into the runtime whose file alone says what it is doing.
# panicking.rs is there because a MutexGuard checks thread::panicking() when taken and dropped
# (poisoning); the hooks' catch_unwind costs nothing on the path that does not panic.
LIB_FILE_PARTS = [
    ("/std/src/sys/sync/", "mutex"),
    ("/std/src/sync/poison", "mutex"),
    ("/std/src/sync/mutex", "mutex"),
    ("/std/src/panicking.rs", "mutex"),
    ("/std/src/sys/thread_local/", "tls"),
    ("/std/src/thread/local.rs", "tls"),
    ("/std/src/collections/hash/", "block"),
    ("/hashbrown-", "block"),
]
# The rest of the inlined library code (pointer, slice, option, integer helpers...) goes to the
# part of the function it was inlined into. First match wins.
SYMBOL_PARTS = [
    ("msmemscope_runtime::unwind::", "unwind"),
    # not inlined; on the hot path its one caller is capture.rs's per-thread unwinder slot
    ("core::option::Option<T>::get_or_insert_with", "unwind"),
    ("hashbrown::", "block"),
    ("msmemscope_runtime::host_leak::stack_table::", "stack"),
    ("msmemscope_runtime::host_leak::block_table::", "block"),
    ("msmemscope_runtime::host_leak::block_map::", "block"),
    ("msmemscope_runtime::host_leak::beats::", "beats"),
    ("msmemscope_runtime::python::", "python"),
    ("msmemscope_runtime::host_leak::ledger::", "ledger"),
    ("msmemscope_runtime::hooks::", "hooks"),
]
# The exported hooks are plain C symbols (hooks/malloc.rs).
HOOK_SYMBOLS = {
    "malloc",
    "free",
    "calloc",
    "realloc",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
    "malloc_usable_size",
}
# Inclusive costs (self + callees) from `callgrind_annotate --inclusive=yes`. A function has an
# entry per source file it inlines; the entry of its own file (the one calls go to) holds the whole
# inclusive cost, the others only their own lines, so the largest entry is the function's cost.
INCLUSIVE = [
    ("malloc", "malloc hook (hooks/malloc.rs; incl. glibc malloc)"),
    ("free", "free hook (hooks/malloc.rs; incl. glibc free)"),
    ("msmemscope_runtime::host_leak::ledger::Ledger::on_alloc", "Ledger::on_alloc"),
    ("msmemscope_runtime::unwind::capture::with_stack", "unwind::capture::with_stack"),
    ("msmemscope_runtime::host_leak::ledger::Ledger::insert", "Ledger::insert (in with_stack)"),
]
CG_LINE_RE = re.compile(r"^\s*([\d,]+)\s+(\S.*?)(?: \[([^\[\]]+)\])?$")


def classify(file: str, fn: str, obj: str | None, exe: str) -> str:
    """The part (a PARTS key) of one `file:function` self cost, or "other"."""
    if file.endswith(".rs"):  # the only Rust in the workload process is the runtime
        if "crates/runtime/src/" in file:
            rel = file.split("crates/runtime/src/", 1)[1]
            return next(
                (p for pre, p in RUNTIME_FILE_PARTS if rel.startswith(pre)), "runtime_other"
            )
        if file.endswith("/core/src/sync/atomic.rs"):
            # the counters are the atomics of the hot path (stack_table.rs, striped.rs); the
            # unwind code's few are its own
            return "unwind" if fn.startswith("msmemscope_runtime::unwind::") else "stack"
        for frag, part in LIB_FILE_PARTS:
            if frag in file:
                return part
        for pre, part in SYMBOL_PARTS:
            if fn.startswith(pre):
                return part
        return "hooks" if fn in HOOK_SYMBOLS else "runtime_other"
    if fn.startswith("__tls_get_addr"):
        return "tls"
    if "/malloc/" in file:  # glibc's malloc/malloc.c, arena.c ...
        return "glibc"
    if fn.startswith(("clock_gettime", "__clock_gettime", "__vdso_clock_gettime")):
        return "clock"
    if obj == exe:
        return "workload"
    return "other"


def cg_annotate(path: Path, inclusive: bool) -> tuple[int, list[tuple[int, str, str, str | None]]]:
    """callgrind_annotate's program total and its (Ir, file, function, object) rows, all of them."""
    cmd = [
        "callgrind_annotate",
        f"--inclusive={'yes' if inclusive else 'no'}",
        "--threshold=100",
        "--auto=no",
        "--show-percs=no",
        str(path),
    ]
    # stderr dropped: with --threshold=100 the script warns about uninitialized values
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    total, rows, in_rows = None, [], False
    for line in text.splitlines():
        if line.rstrip().endswith("PROGRAM TOTALS"):
            total = int(line.split()[0].replace(",", ""))
        elif line.split()[1:2] == ["file:function"]:
            in_rows = True
        elif in_rows and (m := CG_LINE_RE.match(line)):
            file, _, fn = m.group(2).partition(":")
            rows.append((int(m.group(1).replace(",", "")), file, fn, m.group(3)))
    if total is None:
        sys.exit(f"no PROGRAM TOTALS in callgrind_annotate output of {path}")
    return total, rows


def callgrind_run(cmd: list[str], out_dir: Path, exe: Path) -> Path:
    """Runs cmd under callgrind (following children) and returns the workload process's file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    full = [
        "valgrind",
        "--tool=callgrind",
        "--trace-children=yes",
        f"--callgrind-out-file={out_dir}/cg.%p",
        *cmd,
    ]
    p = subprocess.run(full, stdin=subprocess.DEVNULL, capture_output=True)
    if p.returncode != 0:
        sys.stderr.write(f"command failed (rc={p.returncode}): {shlex.join(full)}\n")
        sys.stderr.write(p.stderr[-4000:].decode(errors="replace"))
        sys.exit(1)

    def cmd_line(f: Path) -> str:
        with open(f, errors="replace") as fh:
            return next((ln for ln in fh if ln.startswith("cmd:")), "")

    # Under the CLI there are two files (the CLI, the workload it runs): the workload's is the
    # one whose cmd: names it, and the largest such (it holds every malloc/free).
    files = [f for f in out_dir.glob("cg.*") if str(exe) in cmd_line(f).split()[1:2]]
    if not files:
        sys.exit(f"no callgrind file of {exe} in {out_dir}")
    return max(files, key=lambda f: f.stat().st_size)
