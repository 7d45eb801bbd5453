"""Terminating signals under the launcher: the run is finished (STOP_TRACE row, analyses) and
the program ends the way it would have without the tool."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from conftest import CLI, clean_env

SCRIPTS = Path(__file__).parent / "scripts"


def _run(cmd: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(OMP_NUM_THREADS="1", **env),
        cwd=cwd,
    )


def test_ctrl_c_on_a_traced_python_program_finishes_the_dump(tmp_path: Path) -> None:
    script = SCRIPTS / "interrupted.py"
    plain = _run([sys.executable, str(script)], tmp_path)
    assert plain.returncode == -2, plain.stderr
    assert "KeyboardInterrupt" in plain.stderr

    out = tmp_path / "out"
    run = _run([str(CLI), "-o", str(out), sys.executable, str(script)], tmp_path)
    # The same end as without the tool: the launcher dies of SIGINT as the program did.
    assert run.returncode == -2, run.stderr
    assert run.stdout == plain.stdout == "ready\n"
    assert "KeyboardInterrupt" in run.stderr
    dumps = sorted(out.glob("msmemscope_*/device_cpu/dump/memscope_dump_*.csv"))
    assert len(dumps) == 1, run.stderr
    with dumps[0].open(newline="") as f:
        rows = list(csv.DictReader(f))
    kinds = [(r["Event"], r["Event Type"]) for r in rows]
    assert kinds[0] == ("SYSTEM", "START_TRACE")
    assert kinds[-1] == ("SYSTEM", "STOP_TRACE"), kinds[-5:]
    sizes = [r["Attr"] for r in rows if r["Event"] == "MALLOC" and '"size":4096' in r["Attr"]]
    assert sizes, "the 4096-byte tensor's MALLOC row"
    # The default leaks analysis ran at the end and wrote its report.
    (report,) = out.glob("msmemscope_*/leaks/leak_report.txt")
    assert report.read_text() == "====== No memory leaks detected ======\n"


def test_python_stop_and_start_in_a_launched_host_leak_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = _run(
        [
            str(CLI),
            "--analysis=host-leaks",
            "-o",
            str(out),
            sys.executable,
            str(SCRIPTS / "host_windows.py"),
        ],
        tmp_path,
        MSMEMSCOPE_HOST_TOP_N="1024",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "analysis ['host-leaks']\ndone\n"
    # Everything under the output path; nothing in the program's working directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    (run_dir,) = out.iterdir()
    overviews = sorted((run_dir / "host_leak").glob("leak_overview_*.txt"))
    assert [p.name for p in overviews] == ["leak_overview_1.txt", "leak_overview_2.txt"]
    first, second = (p.read_text() for p in overviews)
    assert "] unfreed 1 blocks / 123457 bytes; allocated 1 / 123457 bytes;" in first
    assert "234567" not in first and "234567" not in second
    # The C block's site; the window also holds the Python objects the script still has (the
    # int `second` names), since Python objects are accounted too.
    assert "] unfreed 1 blocks / 345679 bytes; allocated 1 / 345679 bytes;" in second, second
    assert "123457" not in second
    assert not (run_dir / "leaks").exists()
    assert "without running exit handlers" not in run.stderr
