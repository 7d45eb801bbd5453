"""The HTML report and the torch snapshot export, on real runs.

Real runs of tests/report/workload.py (a PyTorch CPU loop: steps, marks, a kept tensor per
step, a watched tensor, a failed allocation) and of examples/leaky.c under host-leaks, each
with `--report`. Headless Chromium (Debian's chromium + chromium-driver, which
scripts/test.sh installs) opens the pages: no console errors, the timeline's peak is the
dump's peak, and the leak, host-leak, compare, OOM and watch rows are the analyses' own
outputs. A screenshot of every view goes to target/report-screenshots/.

The exported snapshot is loaded with torch.cuda._memory_viz (trace, segments, stats), and its
alloc/free entries are the dump's MALLOC/FREE rows one for one.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "target" / "release" / "msmemscope-cli"
WORKLOAD = REPO / "tests" / "report" / "workload.py"
SCREENSHOTS = REPO / "target" / "report-screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
POOLS = ("PTA", "HAL", "HOST")


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", "PYTHONPATH") and not k.startswith("MSMEMSCOPE_")
    }
    env.update(extra)
    return env


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, env=env or _env(), timeout=300
    )


def _only_run(out: Path) -> Path:
    runs = sorted(out.glob("msmemscope_*"))
    assert len(runs) == 1, runs
    return runs[0]


def _dump(run: Path) -> Path:
    dumps = glob.glob(str(run / "device_cpu" / "dump" / "memscope_dump_*.csv"))
    assert len(dumps) == 1, dumps
    return Path(dumps[0])


def _rows(dump: Path) -> list[dict[str, str]]:
    with open(dump, newline="") as f:
        return list(csv.DictReader(f))


def _peak(rows: list[dict[str, str]]) -> int:
    """The most bytes live at once: MALLOC adds its block (pool, Ptr), FREE removes it."""
    live: dict[tuple[str, str], int] = {}
    level = peak = 0
    for r in rows:
        if r["Event Type"] not in POOLS or r["Ptr"] == "N/A":
            continue
        key = (r["Event Type"], r["Ptr"])
        if r["Event"] == "MALLOC":
            level -= live.get(key, 0)
            live[key] = json.loads(r["Attr"]).get("size", 0)
            level += live[key]
            peak = max(peak, level)
        elif r["Event"] == "FREE" and key in live:
            level -= live.pop(key)
    return peak


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two workload runs (base, variant) compared into the base run, and a host-leaks run."""
    assert CLI.is_file(), f"{CLI} is missing: run cargo build --release"
    tmp = tmp_path_factory.mktemp("report")
    made = {}
    for name, extra in (("base", []), ("variant", ["variant"])):
        out = tmp / name
        done = _cli(
            "--report",
            "--analysis=leaks,oom:3,decompose",
            "-o",
            str(out),
            sys.executable,
            str(WORKLOAD),
            *extra,
        )
        assert done.returncode == 0, done.stderr
        assert "allocation failed as planned" in done.stdout
        run = _only_run(out)
        assert f"msmemscope: report: {run / 'msmemscope_report.html'}" in done.stderr
        made[name] = run
    base, variant = made["base"], made["variant"]
    compared = _cli(
        "--compare", f"--input-path={_dump(base)},{_dump(variant)}", "--level=op", "-o", str(base)
    )
    assert compared.returncode == 0, compared.stderr
    again = _cli("report", str(base))
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"{base / 'msmemscope_report.html'}\n"

    leaky = tmp / "leaky"
    subprocess.run(
        ["gcc", "-O2", "-g", "-pthread", "-o", str(leaky), str(REPO / "examples" / "leaky.c")],
        check=True,
    )
    out = tmp / "host"
    done = _cli(
        "--report",
        "--analysis=host-leaks",
        "-o",
        str(out),
        str(leaky),
        env=_env(MSMEMSCOPE_HOST_BEAT_MS="200"),
    )
    assert done.returncode == 0, done.stderr
    made["host"] = _only_run(out)
    return made


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    assert os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER), (
        "chromium and chromium-driver are needed (scripts/test.sh installs them)"
    )
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def _open(driver, page: Path, view: str, shot: str):
    """Shows one view of the page; saves its screenshot; returns the console's messages."""
    driver.get(page.as_uri() + "#" + view)
    driver.execute_script("window.location.hash = arguments[0];", view)
    ready = driver.execute_script(
        "return window.msmemscopeReport && window.msmemscopeReport.ready"
        " && window.msmemscopeReport.views.includes(arguments[0]);",
        view,
    )
    assert ready, f"the {view} view was not built"
    driver.save_screenshot(str(SCREENSHOTS / f"{shot}.png"))
    return driver.get_log("browser")


def _assert_quiet(logs):
    errors = [e for e in logs if e["level"] in ("SEVERE", "WARNING")]
    assert errors == [], errors


def test_timeline_peak_is_the_dumps_peak(runs, browser):
    page = runs["base"] / "msmemscope_report.html"
    _assert_quiet(_open(browser, page, "timeline", "timeline"))
    peak = _peak(_rows(_dump(runs["base"])))
    assert peak > 0
    shown = browser.execute_script(
        "return document.getElementById('timeline-peak-0').dataset.bytes;"
    )
    assert int(shown) == peak
    assert browser.execute_script("return window.msmemscopeReport.peaks['cpu'];") == peak
    # The steps the program marked are drawn on the timeline (data in the page).
    steps = browser.execute_script(
        "return JSON.parse(document.getElementById('report-data').textContent)"
        ".timelines[0].steps.map(s => s[1]);"
    )
    assert steps == ["1", "2", "3", "4", "5", "6"]


def test_the_timeline_reads_by_step_and_its_peak_opens(runs, browser):
    """With steps, the timeline's x axis is by step (start-up one band); the peak marker, on
    click, lists the lines live at the peak as leaks/peak.json has them; the axis toggles to
    time and back."""
    run = runs["base"]
    _assert_quiet(_open(browser, run / "msmemscope_report.html", "timeline", "timeline-steps"))
    axis = browser.execute_script(
        "return document.querySelector('#view-timeline .chart-wrap').dataset.axis;"
    )
    assert axis == "step"
    doc = json.loads((run / "leaks" / "peak.json").read_text())
    peak = doc["devices"][0]["peak"]
    marker = browser.execute_script(
        "const m = document.querySelector('#view-timeline .peak-marker');"
        " return [m.dataset.step, m.dataset.bytes, getComputedStyle(m).display];"
    )
    assert marker[0] == str(peak["step"]) and marker[2] == "block", marker
    browser.execute_script("document.querySelector('#view-timeline .peak-marker').click();")
    lines = browser.execute_script(
        "return [...document.querySelectorAll('#view-timeline .peak-panel-line')]"
        ".map(l => l.dataset.site);"
    )
    assert lines == [line["site"] or "" for line in peak["lines"]][:10]
    browser.save_screenshot(str(SCREENSHOTS / "timeline-peak.png"))
    browser.execute_script("document.querySelector('#view-timeline .axis-toggle').click();")
    axis = browser.execute_script(
        "return document.querySelector('#view-timeline .chart-wrap').dataset.axis;"
    )
    assert axis == "time"
    _assert_quiet(browser.get_log("browser"))


def test_owners_are_the_decompose_analysis(runs, browser):
    run = runs["base"]
    _assert_quiet(_open(browser, run / "msmemscope_report.html", "timeline", "timeline-owners"))
    with open(run / "device_cpu" / "dump" / "memscope_decompose.csv", newline="") as f:
        table = list(csv.reader(f))[1:]
    expected = [[int(r[0]), r[1], r[2], r[3], int(r[4]), int(r[5]), int(r[6])] for r in table]
    assert any(line[3] == "PTA@weight" for line in expected)
    shown = browser.execute_script(
        "return [...document.querySelectorAll('tr.decompose-row')]"
        ".map(r => JSON.parse(r.dataset.line));"
    )
    assert shown == expected
    # The stacked areas: the owners' bytes at the moment of the peak add up to the peak.
    at_peak = browser.execute_script(
        """const t = JSON.parse(document.getElementById('report-data').textContent).timelines[0];
        const i = t.max.indexOf(Math.max(...t.max));
        return [t.max[i], t.owners.map(o => [o.name, o.bytes[i]])];"""
    )
    peak, owners = at_peak
    assert peak == _peak(_rows(_dump(run)))
    assert sum(b for _, b in owners) == peak
    assert {"PTA@weight", "PTA@gradient", "PTA@activation"} <= {n for n, _ in owners}


def test_leak_rows_are_the_leaks_analysis(runs, browser):
    run = runs["base"]
    _assert_quiet(_open(browser, run / "msmemscope_report.html", "leaks", "leaks"))
    online = (run / "leaks" / "leak_report.txt").read_text()
    assert "Direct PTA leak" in online
    shown = browser.execute_script("return document.getElementById('leak-text').textContent;")
    assert shown == online
    lines = [line for line in online.splitlines() if line.startswith("Direct ")]
    ptrs = [re.search(r" at (0x[0-9a-f]{16}) ", line).group(1) for line in lines]
    rows = browser.execute_script(
        "return [...document.querySelectorAll('tr.leak-row')].map(r => r.dataset.ptr);"
    )
    assert sorted(rows) == sorted(ptrs)


def test_leak_sites_are_the_findings(runs, browser):
    """The Leaks tab leads with the sites of leaks/findings.json: the line that allocated the
    kept logits, its source text and the list that holds them."""
    run = runs["base"]
    _assert_quiet(_open(browser, run / "msmemscope_report.html", "leaks", "leak-sites"))
    findings = json.loads((run / "leaks" / "findings.json").read_text())
    (site,) = findings["leaks"]
    assert site["file"] == str(WORKLOAD) and site["source"] == "logits = model(x)", site
    shown = browser.execute_script(
        "return [...document.querySelectorAll('tr.leak-site')].map(r => [r.dataset.site,"
        " r.querySelector('.site-source').textContent, r.querySelector('.holder').textContent]);"
    )
    assert len(shown) == 1, shown
    assert shown[0][0] == site["site"] and shown[0][1] == "logits = model(x)"
    assert shown[0][2].startswith("history (global of workload.py) -> list["), shown
    # The raw blocks are one click away, not the default view.
    opened = browser.execute_script("return document.getElementById('leak-blocks').open;")
    assert opened is False


def test_the_peak_view_is_leaks_peak_json(runs, browser):
    """The Leaks tab shows what each device's peak is made of: its bytes and step, and the
    user's lines live then, largest first, as leaks/peak.json has them."""
    run = runs["base"]
    _assert_quiet(_open(browser, run / "msmemscope_report.html", "leaks", "peak"))
    doc = json.loads((run / "leaks" / "peak.json").read_text())
    peak = doc["devices"][0]["peak"]
    when = browser.execute_script(
        "const p = document.querySelector('.peak-when'); return [p.dataset.step, p.dataset.bytes];"
    )
    assert when == [str(peak["step"]), str(peak["bytes"])]
    sites = browser.execute_script(
        "return [...document.querySelectorAll('tr.peak-line')].map(r => r.dataset.site);"
    )
    assert sites == [line["site"] or "" for line in peak["lines"]]
    assert sites[0].startswith(str(WORKLOAD)), sites


def test_compare_rows_are_the_compare_csv(runs, browser):
    run = runs["base"]
    _assert_quiet(_open(browser, run / "msmemscope_report.html", "compare", "compare"))
    (path,) = glob.glob(str(run / "compare" / "memory_compare_*.csv"))
    with open(path, newline="") as f:
        expected = list(csv.reader(f))[2:]
    assert any(r[3] == "N/A" for r in expected), "the variant's extra op is compare-only"
    shown = browser.execute_script(
        "return [...document.querySelectorAll('tr.compare-row')]"
        ".map(r => JSON.parse(r.dataset.fields));"
    )
    assert shown == expected


def test_oom_and_watch_views(runs, browser):
    run = runs["base"]
    page = run / "msmemscope_report.html"
    _assert_quiet(_open(browser, page, "oom", "oom"))
    rows = [r for r in _rows(_dump(run)) if r["Event"] == "OOM_DETAIL"]
    assert rows
    shown = browser.execute_script(
        "return [...document.querySelectorAll('tr.oom-row')].map(r => r.dataset.type);"
    )
    assert shown == [r["Event Type"] for r in sorted(rows, key=_oom_order)]
    # The OOM summary made from the dump is the one the run printed (analysis_report.txt).
    summary = browser.execute_script(
        "return document.querySelector('pre.oom-summary').textContent;"
    )
    assert summary.startswith(
        "====== OOM: an allocation of 4.00 PiB (4503599627370496 bytes) failed on device cpu"
    )
    assert summary in (run / "analysis_report.txt").read_text()

    _assert_quiet(_open(browser, page, "watch", "watch"))
    (path,) = glob.glob(str(run / "watch_dump" / "watch_dump_data_check_sum_*.csv"))
    with open(path, newline="") as f:
        watch = list(csv.DictReader(f))
    last: dict[str, str] = {}
    changes = []
    for r in watch:
        info = r["Tensor info"]
        block = info.split("-", 1)[1].rsplit("_", 1)[0]
        if last.get(block, r["Check data sum"]) != r["Check data sum"]:
            changes.append(info)
        last[block] = r["Check data sum"]
    assert changes, "the in-place add changes the watched tensor"
    shown = browser.execute_script(
        "return [...document.querySelectorAll('tr.watch-change')]"
        ".map(r => r.children[1].textContent);"
    )
    assert shown == changes


def _oom_order(row):
    order = ("OOM_TRIGGER", "OOM_RECENT_ALLOC", "OOM_TOP_ALLOC")
    return (order.index(row["Event Type"]), int(row["ID"]))


def test_host_leak_sites_are_the_overview(runs, browser):
    run = runs["host"]
    _assert_quiet(_open(browser, run / "msmemscope_report.html", "leaks", "host-leaks"))
    overview = (run / "host_leak" / "leak_overview_1.txt").read_text()
    expected = []
    lines = overview.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(#R?\d+) \[", line)
        if m:
            cls, lsi = re.match(r"^  (\S+) LSI=(\S+) ", lines[i + 1]).groups()
            expected.append([m.group(1), cls, lsi])
    assert any(e[1] == "suspected_leak" for e in expected), overview
    shown = browser.execute_script(
        "return [...document.querySelectorAll('tr.site-row')]"
        ".map(r => [r.dataset.rank, r.dataset.class, r.dataset.lsi]);"
    )
    assert shown == expected
    # A click shows the site's symbolized stack, as the overview prints it.
    first_frame = lines[next(i for i, e in enumerate(lines) if e.startswith("#1 [")) + 2].strip()
    browser.execute_script("document.querySelector('tr.site-row').click();")
    stack = browser.execute_script(
        "return document.querySelector('tr.site-row').nextElementSibling.textContent;"
    )
    assert stack.splitlines()[0] == first_frame
    sparks = browser.execute_script("return document.querySelectorAll('svg.spark').length;")
    assert sparks >= 1
    browser.save_screenshot(str(SCREENSHOTS / "host-leaks-stack.png"))


def test_torch_snapshot_matches_the_dump(runs, tmp_path):
    from torch.cuda import _memory_viz

    run = runs["base"]
    done = _cli("export", "--format", "torch-snapshot", str(run))
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path == run / "torch_snapshot.pickle"
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    assert set(snapshot) == {"device_traces", "segments"}
    (trace,) = snapshot["device_traces"]  # the run's only device, cpu
    rows = [r for r in _rows(_dump(run)) if r["Event"] in ("MALLOC", "FREE")]
    mallocs = [
        (int(r["Ptr"], 16), json.loads(r["Attr"])["size"]) for r in rows if r["Event"] == "MALLOC"
    ]
    frees = [int(r["Ptr"], 16) for r in rows if r["Event"] == "FREE"]
    assert [(e["addr"], e["size"]) for e in trace if e["action"] == "alloc"] == mallocs
    assert [e["addr"] for e in trace if e["action"] == "free_completed"] == frees
    assert [e["addr"] for e in trace if e["action"] == "free_requested"] == frees
    # Row order is kept: the n-th MALLOC/FREE row is the n-th alloc/free_completed entry.
    kinds = [e["action"] for e in trace if e["action"] in ("alloc", "free_completed")]
    assert kinds == ["alloc" if r["Event"] == "MALLOC" else "free_completed" for r in rows]
    assert any(e["action"] == "oom" for e in trace)

    text = _memory_viz.trace(snapshot)
    assert f"{len(trace)} entries" in text
    live = {}
    for r in rows:
        if r["Event"] == "MALLOC":
            live[int(r["Ptr"], 16)] = json.loads(r["Attr"])["size"]
        else:
            live.pop(int(r["Ptr"], 16), None)
    assert {s["address"]: s["total_size"] for s in snapshot["segments"]} == live
    flame = _memory_viz.segments(snapshot, format_flamegraph=lambda lines: lines)
    assert flame.count(";active_allocated;") == len(live)
    assert "segments: " in _memory_viz.segsum(snapshot)
    # The module's own command line (trace) runs on the file.
    cli = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "trace", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.startswith("Device 0 ----------------\n")


def test_usage_errors_are_one_line(tmp_path):
    for args, line in (
        (["report"], "msmemscope: report needs a directory: msmemscope report DIR"),
        (["export", str(tmp_path)], "msmemscope: export needs --format torch-snapshot"),
        (["export", "--format=svg", str(tmp_path)], 'msmemscope: invalid export --format "svg"'),
        (["report", str(tmp_path / "missing")], f"msmemscope: {tmp_path / 'missing'}: no such"),
        (["report", str(tmp_path)], f"msmemscope: {tmp_path}: not a run directory"),
    ):
        done = _cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith(line), (args, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
