"""How `msmemscope report` scales: a synthetic 10,000,000-row dump (bench/gen_dump.c, the same
generator as bench/offline_analyses.py) in a run directory, with a compare CSV of it against a
slightly modified copy; then the time, peak memory and HTML size of the report, the time of the
torch-snapshot export, and (when selenium and Debian's chromium are installed) how long
headless Chromium takes to show the page's timeline.

    .venv/bin/python bench/report_scale.py [--rows N] [--compare-rows N] [--no-build] [--keep]

Prints one line per measurement and writes bench/out/report_scale_{ts}.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = os.path.join(ROOT, "target", "release")


def timed(cmd: list[str]) -> tuple[float, float, int, str]:
    """Runs `cmd`; returns wall seconds, CPU seconds (user + system), the child's peak RSS in
    KiB, and its stdout. CPU time is the fairer figure on a shared machine."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu_before = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime - cpu_before
    # ru_maxrss of children is the largest of them so far (the report runs first).
    return seconds, cpu, max(usage.ru_maxrss, before), done.stdout


def browser_seconds(page: str) -> float | None:
    """Seconds from navigation until the page's timeline is drawn, or None without a browser."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if not (os.path.exists("/usr/bin/chromium") and os.path.exists("/usr/bin/chromedriver")):
        return None
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="report-bench-chromium-")
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        start = time.perf_counter()
        driver.get("file://" + page)
        while not driver.execute_script(
            "return !!(window.msmemscopeReport && window.msmemscopeReport.ready);"
        ):
            time.sleep(0.01)
        return time.perf_counter() - start
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=10_000_000, help="rows of the dump (10M)")
    p.add_argument(
        "--compare-rows",
        type=int,
        default=2_000_000,
        help="rows of each dump of the compare pair (2M; 0: no compare view)",
    )
    p.add_argument("--no-build", action="store_true", help="do not run cargo build --release")
    p.add_argument("--keep", action="store_true", help="keep the temp dir")
    opts = p.parse_args()

    if not opts.no_build:
        subprocess.run(
            ["cargo", "build", "--release", "--quiet", "-p", "msmemscope-cli"], cwd=ROOT, check=True
        )
    tmp = tempfile.mkdtemp(prefix="report-scale-")
    try:
        gen = os.path.join(tmp, "gen_dump")
        subprocess.run(
            ["gcc", "-O2", "-o", gen, os.path.join(ROOT, "bench", "gen_dump.c")], check=True
        )
        # A private copy, so a concurrent cargo build cannot swap it mid-run.
        cli = os.path.join(tmp, "msmemscope-cli")
        shutil.copy2(os.path.join(RELEASE, "msmemscope-cli"), cli)

        run = os.path.join(tmp, "msmemscope_1_20260101000000")
        dump_dir = os.path.join(run, "device_cpu", "dump")
        os.makedirs(dump_dir)
        dump = os.path.join(dump_dir, "memscope_dump_20260101000000.csv")
        out = subprocess.run(
            [gen, str(opts.rows), "0", dump], capture_output=True, text=True, check=True
        )
        rows = int(out.stdout.split()[0])
        dump_bytes = os.path.getsize(dump)
        print(f"dump: {rows:,} rows, {dump_bytes / 2**20:,.0f} MiB")

        compare_rows = 0
        if opts.compare_rows:
            base = os.path.join(tmp, "base.csv")
            copy = os.path.join(tmp, "copy.csv")
            out = subprocess.run(
                [gen, str(opts.compare_rows), "0", base], capture_output=True, text=True, check=True
            )
            ops = out.stdout.split()[1]
            subprocess.run(
                [gen, str(opts.compare_rows), "1", copy, ops], capture_output=True, check=True
            )
            subprocess.run(
                [cli, "--compare", f"--input-path={base},{copy}", "--level=op", "-o", run],
                capture_output=True,
                check=True,
            )
            (name,) = os.listdir(os.path.join(run, "compare"))
            with open(os.path.join(run, "compare", name)) as f:
                compare_rows = sum(1 for _ in f) - 2
            print(
                f"compare CSV: {compare_rows:,} aligned ops (two {opts.compare_rows:,}-row dumps)"
            )

        seconds, cpu, rss_kib, stdout = timed([cli, "report", run])
        page = stdout.strip()
        html_bytes = os.path.getsize(page)
        print(
            f"report: {seconds:.2f} s wall, {cpu:.2f} s CPU "
            f"({rows / seconds / 1e6:.2f} M rows/s wall), peak RSS {rss_kib / 1024:.0f} MiB, "
            f"HTML {html_bytes / 1024:.0f} KiB"
        )
        export_seconds, export_cpu, _, stdout = timed(
            [cli, "export", "--format", "torch-snapshot", run]
        )
        snapshot_bytes = os.path.getsize(stdout.strip())
        print(
            f"export torch-snapshot: {export_seconds:.2f} s wall, {export_cpu:.2f} s CPU, "
            f"pickle {snapshot_bytes / 2**20:.0f} MiB"
        )
        shown = browser_seconds(page)
        if shown is not None:
            print(f"headless Chromium: timeline drawn {shown:.2f} s after navigation")

        result = {
            "rows": rows,
            "dump_bytes": dump_bytes,
            "compare_rows": compare_rows,
            "report_seconds": round(seconds, 3),
            "report_cpu_seconds": round(cpu, 3),
            "report_peak_rss_kib": rss_kib,
            "html_bytes": html_bytes,
            "export_seconds": round(export_seconds, 3),
            "export_cpu_seconds": round(export_cpu, 3),
            "snapshot_bytes": snapshot_bytes,
            "browser_ready_seconds": None if shown is None else round(shown, 3),
            "cpus": os.cpu_count(),
        }
        os.makedirs(os.path.join(ROOT, "bench", "out"), exist_ok=True)
        stamp = time.strftime("%Y%m%d_%H%M%S")
        with open(os.path.join(ROOT, "bench", "out", f"report_scale_{stamp}.json"), "w") as f:
            json.dump(result, f, indent=2)
    finally:
        if opts.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
