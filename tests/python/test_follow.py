"""The whole job is traced (``--follow exec``, the default): real process trees under the real
CLI on CPU. torchrun's workers, the Python process a shell wrapper starts, ``multiprocessing``
``spawn`` workers and DataLoader workers each get a run directory of their own, linked to the
job in its ``config.json``; processes that record nothing (torchrun's agent, the shell, the
``fork`` workers) get none; the launcher prints every traced process's findings and one table
of all of them."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from conftest import CLI, NEEDS_CLI_AND_TORCH, REPO, clean_env, run_command_under_cli

pytestmark = NEEDS_CLI_AND_TORCH

SCRIPTS = REPO / "tests" / "python" / "scripts"
JOB_TRAIN = SCRIPTS / "job_train.py"
SPAWN_WORKERS = SCRIPTS / "spawn_workers.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def launch(tmp: Path, *command: str, options: tuple[str, ...] = ()) -> tuple[str, str, Path]:
    """Runs ``command`` under the CLI with its output in ``tmp/out``; returns stdout, stderr
    and the output directory. The command must succeed."""
    proc, out = run_command_under_cli(tmp, *command, options=options)
    return proc.stdout, proc.stderr, out


def runs(out: Path) -> tuple[Path, dict[Path, dict]]:
    """The job's own run directory and the followed ones with their config.json."""
    configs = {d: json.loads((d / "config.json").read_text()) for d in sorted(out.iterdir())}
    top = [d for d, c in configs.items() if "job" not in c]
    assert len(top) == 1, configs
    followed = {d: c for d, c in configs.items() if "job" in c}
    for config in followed.values():
        assert config["job"]["job_run"] == str(top[0])
    return top[0], followed


def records_nothing(run: Path) -> bool:
    """The program's own run recorded no event: its dump holds only the trace's start and stop,
    or it has none (dash ends with ``_exit``, skipping the exit handlers that write it)."""
    if not list(run.glob("device_*/dump/memscope_dump_*.csv")):
        return True
    return [r["Event Type"] for r in dump_rows(run)] == ["START_TRACE", "STOP_TRACE"]


def pid_of(run: Path) -> int:
    return int(run.name.split("_")[1])


def report(run: Path) -> str:
    return (run / "analysis_report.txt").read_text()


def dump_rows(run: Path) -> list[dict[str, str]]:
    (dump,) = (run / "device_cpu" / "dump").glob("memscope_dump_*.csv")
    with dump.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available() and TORCHRUN.is_file()),
    reason="torchrun with the gloo backend is not installed",
)
def test_torchrun_workers_are_traced_and_the_leaking_rank_named(tmp_path: Path) -> None:
    stdout, stderr, out = launch(
        tmp_path, str(TORCHRUN), "--standalone", "--nproc-per-node=2", str(JOB_TRAIN)
    )
    assert "rank 0 done" in stdout and "rank 1 done" in stdout, stdout
    top, followed = runs(out)
    # torchrun's own agent process records nothing, and has no directory besides the job's.
    assert records_nothing(top)
    assert f"msmemscope: {TORCHRUN} recorded no events itself" in stderr
    by_rank = {c["distributed"]["rank"]: d for d, c in followed.items()}
    assert sorted(by_rank) == [0, 1], followed
    for run in by_rank.values():
        config = followed[run]
        assert config["distributed"]["world_size"] == 2
        assert config["job"]["command"][-1] == str(JOB_TRAIN)
        assert all(int(r["Process Id"]) == pid_of(run) for r in dump_rows(run))
    leaky = report(by_rank[1])
    assert "job_train.py:28 (<module>): +97.7 KiB (100000 bytes) in 1 block(s) per step" in leaky, (
        leaky
    )
    assert "held by: kept (global of job_train.py)" in leaky, leaky
    assert "Leaking sites" not in report(by_rank[0])
    # The console: each process with its rank, then the job's table naming rank 1.
    assert f"msmemscope: traced process {pid_of(by_rank[0])} (rank 0): " in stderr
    assert f"msmemscope: traced process {pid_of(by_rank[1])} (rank 1): " in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"msmemscope: stands out: rank 1 (pid {pid_of(by_rank[1])}) on cpu ("), (
        stderr
    )
    assert "leaks" in last.split("(")[-1], last
    # `ranks` over the job's output directory shows both workers (and torchrun's own run, whose
    # dump holds only the trace's start and stop, last: it has no rank).
    table = subprocess.run(
        [str(CLI), "ranks", str(out), "--output-format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )
    assert table.returncode == 0, table.stderr
    rows = json.loads(table.stdout)["rows"]
    assert [(r["rank"], r["leaked_bytes"], r["leaked_blocks"]) for r in rows] == [
        (0, 0, 0),
        (1, 200_000, 2),
        (None, 0, 0),
    ]


@pytest.mark.parametrize("wrapper", ["bash -c", "script"])
def test_the_python_process_a_wrapper_starts_is_traced(tmp_path: Path, wrapper: str) -> None:
    train = REPO / "examples" / "train.py"
    line = f"{sys.executable} {train}; echo done"
    if wrapper == "script":
        script = tmp_path / "run.sh"
        script.write_text(f"#!/bin/sh\n{line}\n")
        script.chmod(0o755)
        command: tuple[str, ...] = (str(script),)
        shell = str(script)
    else:
        command = ("bash", "-c", line)
        shell = "bash"
    stdout, stderr, out = launch(tmp_path, *command)
    assert stdout.endswith("done\n") and "trained 5 steps" in stdout, stdout
    top, followed = runs(out)
    assert records_nothing(top)
    assert f"msmemscope: {shell} recorded no events itself" in stderr, stderr
    (run,) = followed
    assert followed[run]["job"]["command"] == [sys.executable, str(train)]
    findings = report(run)
    assert "train.py:26 (<module>)" in findings, findings
    assert "held by: history (global of train.py)" in findings, findings
    # The findings are on the console too, under the process's line.
    assert f"msmemscope: traced process {pid_of(run)}: {sys.executable} {train}" in stderr
    assert "train.py:26 (<module>)" in stderr


def test_a_spawned_worker_is_traced(tmp_path: Path) -> None:
    stdout, stderr, out = launch(tmp_path, sys.executable, str(SPAWN_WORKERS), "spawn_leak")
    assert stdout == "worker kept 6\nworker exit 0\n"
    top, followed = runs(out)
    assert records_nothing(top)
    assert f"msmemscope: {sys.executable} recorded no events itself" in stderr, stderr
    (run,) = followed
    assert "--multiprocessing-fork" in followed[run]["job"]["command"]
    findings = report(run)
    assert (
        "spawn_workers.py:26 (train_and_keep): +39.1 KiB (40000 bytes) in 1 block(s) per step"
        in findings
    ), findings


def test_dataloader_spawn_and_fork_workers(tmp_path: Path) -> None:
    stdout, _, out = launch(tmp_path, sys.executable, str(SPAWN_WORKERS), "dataloader")
    assert stdout == "spawn 129024 fork 129024\n"
    top, followed = runs(out)
    # The two spawn workers are traced; the fork workers record nothing of their own (the
    # parent's rows never include theirs).
    assert len(followed) == 2, followed
    # The job's directory is named after the launcher; the program's rows are its own.
    for run, pid in [(top, None), *((run, pid_of(run)) for run in followed)]:
        rows = dump_rows(run)
        pids = {int(r["Process Id"]) for r in rows}
        assert len(pids) == 1 and pid in (None, *pids), pids
        ids = [int(r["ID"]) for r in rows]
        assert len(ids) == len(set(ids))
    # Each spawn worker made its samples: 64 tensors of 4x8 float32 over the two epochs between
    # them... 128 in all, 128 bytes each.
    samples = sum(
        1
        for run in followed
        for r in dump_rows(run)
        if r["Event"] == "MALLOC" and json.loads(r["Attr"]).get("size") == 128
    )
    assert samples == 128


def test_follow_none_traces_the_program_alone(tmp_path: Path) -> None:
    stdout, stderr, out = launch(
        tmp_path,
        sys.executable,
        str(SPAWN_WORKERS),
        "spawn_leak",
        options=("--follow=none",),
    )
    assert stdout == "worker kept 6\nworker exit 0\n"
    top, followed = runs(out)
    assert followed == {}
    assert records_nothing(top)
    assert "traced process" not in stderr
    assert "recorded no events itself" not in stderr
