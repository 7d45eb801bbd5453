"""A torch training loop SIGKILLed at a random iteration under the real CLI: the launcher passes
the signal on and says which files written at exit are missing; the Python readers and the
offline commands open the run directory, read the rows kept and say, once each, that the
program was killed and what is missing. ``scripts/long_train.py`` kills itself at the iteration
given; the iteration is drawn from a seed that is printed (``CUT_SHORT_SEED`` replays it).
"""

from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

import msmemscope
from conftest import clean_env

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "bin" / "msmemscope"
PYTHON = REPO / ".venv" / "bin" / "python"
SCRIPT = REPO / "tests" / "python" / "scripts" / "long_train.py"
EXIT_FILES = "leaks/findings.json, leaks/peak.json, analysis_report.txt"

pytest.importorskip("torch")


def test_a_training_loop_killed_at_a_random_iteration_leaves_a_run_every_reader_opens(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    seed = int(os.environ.get("CUT_SHORT_SEED", time.time_ns() % 1_000_000_007))
    kill_at = random.Random(seed).randint(5, 300)
    print(f"cut_short seed: {seed} (CUT_SHORT_SEED={seed} replays it): killed at {kill_at}")
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(CLI), "-o", str(out), str(PYTHON), str(SCRIPT), str(kill_at)],
        capture_output=True,
        text=True,
        env=clean_env(OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout == ""
    assert (
        "msmemscope: the program was killed by signal 9 (SIGKILL) before its exit: "
        f"{EXIT_FILES} (written at exit) are missing; the event dump holds the rows written "
        "until then"
    ) in proc.stderr
    assert "Traceback" not in proc.stderr and "panicked" not in proc.stderr

    (run,) = out.iterdir()
    (dump,) = glob.glob(str(run / "device_cpu" / "dump" / "memscope_dump_*.csv"))
    note = (
        f"msmemscope: note: {run}: the program was killed (signal: 9 (SIGKILL)) before the run "
        "ended: the event dump holds the rows written until then; missing: "
        f"{EXIT_FILES} (written when the program exits)"
    )

    # The readers give what was kept: the steps up to the last the writer thread wrote
    # (iterations 0 and 1 are step 0, iteration i >= 2 step i-1; what the program had queued
    # when it was killed is lost with it), with none left out before it.
    capfd.readouterr()
    steps = {line["step"] for line in msmemscope.check_decompose(dump)}
    assert steps == set(range(max(steps) + 1)) and max(steps) < kill_at, (kill_at, steps)
    (peak,) = msmemscope.check_peak(dump)
    assert peak["device"] == "cpu" and peak["peak"], peak
    assert isinstance(msmemscope.check_inefficient(dump), list)
    # The MLP keeps nothing from step to step before iteration 1200: no leak between steps;
    # a kill before three steps were written leaves too few marks, which is said.
    if len(steps) > 3:
        assert msmemscope.check_leaks(dump, "step", 0) == []
    else:
        with pytest.raises(ValueError, match='marks named "step", need start_index\\+3 = 3'):
            msmemscope.check_leaks(dump, "step", 0)
    said = capfd.readouterr().err
    assert said.count(note) == 1, said
    assert "Traceback" not in said

    for command in (["report", str(run)], ["ranks", str(run)]):
        done = subprocess.run(
            [str(CLI), *command], capture_output=True, text=True, env=clean_env(), timeout=300
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr.count(note) == 1, done.stderr
        assert "panicked" not in done.stderr
