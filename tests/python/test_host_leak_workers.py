"""Host leaks of a DataLoader's short-lived workers, and the job's one console summary.

scripts/dataloader_workers_leak.py reads two epochs with two non-persistent ``spawn`` workers,
four worker processes in all, each keeping a 4 KiB ``bytearray`` per sample it reads. Each
worker spends most of its short life importing torch and keeps its 384 blocks in its last
fraction of a second, so its report rests on a handful of beats, however many the machine's
load left it. Under ``msmemscope --analysis=host-leaks`` every worker's report ranks the
appending line its top leak site, and the console prints one line for that site across the
workers, with the report files, in fewer than 80 lines.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import NEEDS_CLI_AND_TORCH, REPO, run_command_under_cli

pytestmark = NEEDS_CLI_AND_TORCH

SCRIPT = REPO / "tests" / "python" / "scripts" / "dataloader_workers_leak.py"
WORKERS = 4
SAMPLES_PER_WORKER = 384


def leak_line() -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.rstrip().endswith("# the leak"))


class Job:
    def __init__(self, stderr: str, out: Path) -> None:
        self.stderr = stderr
        self.out = out
        configs = {d: json.loads((d / "config.json").read_text()) for d in out.iterdir()}
        # The DataLoader's workers; multiprocessing's resource tracker is traced too, but it
        # outlives the program, so the launcher's summary cannot wait for its report.
        self.workers = sorted(
            d
            for d, c in configs.items()
            if "job" in c and any("spawn_main" in arg for arg in c["job"]["command"])
        )


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    tmp = tmp_path_factory.mktemp("workers")
    proc, out = run_command_under_cli(
        tmp, sys.executable, str(SCRIPT), options=("--analysis=host-leaks",)
    )
    assert proc.stdout.startswith("sum "), proc.stdout
    return Job(proc.stderr, out)


def sites(run: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((run / "host_leak" / "leak_sites_1.json").read_text())
    return document


def test_every_worker_ranks_the_appending_line_its_top_leak(job: Job) -> None:
    assert len(job.workers) == WORKERS, job.stderr
    want = f"{SCRIPT}({leak_line()}): Samples.__getitem__"
    for run in job.workers:
        top = sites(run)["sites"][0]
        assert top["python_frames"][0] == want, (run, top)
        assert top["class"] == "suspected_leak", (run, top)
        # Two objects a sample (the bytearray and its buffer), all kept.
        assert top["unfreed"]["count"] >= 2 * SAMPLES_PER_WORKER, top
        assert top["unfreed"]["bytes"] >= SAMPLES_PER_WORKER * 4096, top
        overview = (run / "host_leak" / "leak_overview_1.txt").read_text()
        first = overview[overview.index("\n#1 ") :].split("\n#2 ")[0]
        assert f"py {want}" in first, first


def test_the_console_merges_the_workers_into_one_line(job: Job) -> None:
    lines = job.stderr.splitlines()
    assert len(lines) < 80, job.stderr
    # No process's full report on the console: they are in their files.
    assert "Host Leak Overview" not in job.stderr
    named = [line for line in lines if f"{SCRIPT.name}:{leak_line()} " in line]
    assert len(named) == 1, job.stderr
    assert f"in {WORKERS} of {WORKERS} child processes" in named[0], named[0]
    assert f"the top leak site in {WORKERS}" in named[0], named[0]
    assert named[0].lstrip().startswith("1. "), named[0]
    for run in job.workers:
        report = run / "host_leak" / "leak_overview_1.txt"
        assert f"host leak report: {report}" in job.stderr, job.stderr


if __name__ == "__main__":
    subprocess.run([sys.executable, "-m", "pytest", __file__], check=True)
