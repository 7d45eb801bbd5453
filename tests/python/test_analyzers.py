"""The offline analyzers: check_inefficient on the hand-written dumps of
tests/fixtures/dumps/inefficient_*.csv (their answers are known), check_leaks on a small dump
with marks, the registry (list_analyzers, get_analyzer_config, analyze), and argument errors."""

from __future__ import annotations

import csv
import importlib.util
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import msmemscope
from conftest import REPO, clean_env

DUMPS = REPO / "tests" / "fixtures" / "dumps"
EARLY = DUMPS / "inefficient_early.csv"
LATE = DUMPS / "inefficient_late.csv"
IDLE = DUMPS / "inefficient_idle.csv"
HEADER = (
    "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,"
    "Call Stack(Python),Call Stack(C)"
)


def block(id_: int, ptr: int, size: int, kind: str) -> dict[str, object]:
    return {"id": id_, "ptr": ptr, "size": size, "device": "cpu", "inefficient_type": kind}


# --- check_inefficient on the hand-written dumps --------------------------------------------


def test_early_allocation_dump() -> None:
    # A (row 3, 4096 B) is allocated in op 1 and first written in op 3; B is freed after op 2.
    assert msmemscope.check_inefficient(str(EARLY)) == [block(3, 0x1000, 4096, "early_allocation")]


def test_late_deallocation_dump() -> None:
    # A (row 3, 2048 B) is last read in op 2 and freed after op 4; B is allocated in op 3.
    assert msmemscope.check_inefficient(LATE) == [block(3, 0x1000, 2048, "late_deallocation")]


def test_temporary_idleness_dump_and_threshold() -> None:
    # 3001 ops between A's (row 3) two accesses, 3000 between B's (row 4): the default
    # threshold (3000) marks A only; 2999 marks both.
    a = block(3, 0x1000, 8192, "temporary_idleness")
    b = block(4, 0x2000, 64, "temporary_idleness")
    assert msmemscope.check_inefficient(IDLE) == [a]
    assert msmemscope.check_inefficient(IDLE, idle_threshold=2999) == [a, b]
    assert msmemscope.check_inefficient(IDLE, idle_threshold=0) == [a, b]
    assert msmemscope.check_inefficient(IDLE, idle_threshold=3001) == []


def test_filters() -> None:
    assert msmemscope.check_inefficient(IDLE, 64, None, 2999) == [
        block(3, 0x1000, 8192, "temporary_idleness"),
        block(4, 0x2000, 64, "temporary_idleness"),
    ]
    assert msmemscope.check_inefficient(IDLE, mem_size=65, idle_threshold=2999) == [
        block(3, 0x1000, 8192, "temporary_idleness")
    ]
    assert msmemscope.check_inefficient(EARLY, inefficient_type="early_allocation") != []
    assert msmemscope.check_inefficient(EARLY, inefficient_type="late_deallocation") == []
    assert msmemscope.check_inefficient(EARLY, mem_size=4097) == []


def test_writes_nothing_unless_asked(tmp_path: Path) -> None:
    dump = tmp_path / "dump.csv"
    dump.write_bytes(LATE.read_bytes())
    msmemscope.check_inefficient(dump)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump.csv"]
    out = tmp_path / "blocks.csv"
    result = msmemscope.check_inefficient(dump, output_path=out)
    with out.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows == [
        ["ID", "Ptr", "size", "Device Id", "inefficient_type"],
        ["3", "0x0000000000001000", "2048", "cpu", "late_deallocation"],
    ]
    assert len(result) == 1


def _to_db(csv_path: Path, db_path: Path) -> None:
    con = sqlite3.connect(db_path)
    con.execute(
        'CREATE TABLE memscope_dump ("ID" INTEGER PRIMARY KEY, "Event" TEXT, "Event Type" TEXT, '
        '"Name" TEXT, "Timestamp(ns)" INTEGER, "Process Id" INTEGER, "Thread Id" INTEGER, '
        '"Device Id" TEXT, "Ptr" TEXT, "Attr" TEXT, "Call Stack(Python)" TEXT, '
        '"Call Stack(C)" TEXT)'
    )
    with csv_path.open(newline="") as f:
        rows = list(csv.reader(f))[1:]
    con.executemany("INSERT INTO memscope_dump VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)
    con.commit()
    con.close()


def test_db_dump_gives_the_same_answer(tmp_path: Path) -> None:
    for src in (EARLY, LATE, IDLE):
        db = tmp_path / (src.stem + ".db")
        _to_db(src, db)
        assert msmemscope.check_inefficient(db, idle_threshold=2999) == (
            msmemscope.check_inefficient(src, idle_threshold=2999)
        ), src.name


# --- argument errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "exc", "message"),
    [
        (
            {"inefficient_type": "early"},
            ValueError,
            (
                "inefficient_type must be one of early_allocation, late_deallocation, "
                'temporary_idleness or None, got "early"'
            ),
        ),
        ({"inefficient_type": 1}, TypeError, "inefficient_type must be a str or None, got int"),
        ({"idle_threshold": -1}, ValueError, "idle_threshold must be >= 0, got -1"),
        ({"mem_size": -5}, ValueError, "mem_size must be >= 0, got -5"),
        ({"idle_threshold": "3000"}, TypeError, "idle_threshold must be an int, got str"),
        ({"idle_threshold": 2.5}, TypeError, "idle_threshold must be an int, got float"),
        ({"mem_size": True}, TypeError, "mem_size must be an int, got bool"),
        ({"idle_threshold": 1 << 70}, ValueError, "idle_threshold is too large"),
        ({"output_path": 3}, TypeError, "output_path must be a str or os.PathLike, got int"),
    ],
)
def test_check_inefficient_argument_errors(kw: dict, exc: type, message: str) -> None:
    with pytest.raises(exc) as info:
        msmemscope.check_inefficient(EARLY, **kw)
    assert str(info.value).startswith(message), str(info.value)


def test_check_inefficient_input_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nope\.csv: no such file"):
        msmemscope.check_inefficient(tmp_path / "nope.csv")
    with pytest.raises(TypeError, match=r"input_path must be a str or os\.PathLike, got int"):
        msmemscope.check_inefficient(5)
    with pytest.raises(ValueError, match="input_path must not be empty"):
        msmemscope.check_inefficient("")
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a memscope dump"):
        msmemscope.check_inefficient(other)
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "\n1,MALLOC,PTA,N/A,x,1,1,cpu,0x10,{},,\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: malformed row: Timestamp\(ns\)"):
        msmemscope.check_inefficient(bad)
    with pytest.raises(OSError, match="output_path: cannot write"):
        msmemscope.check_inefficient(EARLY, output_path=tmp_path / "missing" / "x.csv")


# --- check_leaks -----------------------------------------------------------------------------


def _row(id_: int, event: str, etype: str, name: str, dev: str, ptr: int | None, attrs: dict):
    return [
        str(id_),
        event,
        etype,
        name,
        str(1000 + id_),
        "7",
        "7",
        dev,
        "N/A" if ptr is None else f"0x{ptr:016x}",
        json.dumps(attrs) if attrs else "{}",
        "",
        "",
    ]


def _marks_dump(path: Path) -> None:
    rows = [
        _row(1, "MSTX", "Mark", "step", "N/A", None, {}),
        _row(2, "MALLOC", "PTA", "N/A", "cpu", 0x100, {"size": 1048576}),
        _row(3, "MALLOC", "PTA", "N/A", "cpu", 0x200, {"size": 64}),
        _row(4, "MSTX", "Mark", "step", "N/A", None, {}),
        _row(5, "FREE", "PTA", "N/A", "cpu", 0x200, {"size": 64}),
        _row(6, "MALLOC", "PTA", "N/A", "cpu", 0x300, {"size": 32}),
        _row(7, "MSTX", "Mark", "step", "N/A", None, {}),
    ]
    with path.open("w", newline="") as f:
        f.write(HEADER + "\n")
        csv.writer(f, lineterminator="\n").writerows(rows)


def test_check_leaks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "marks.csv"
    _marks_dump(dump)
    leaks = msmemscope.check_leaks(str(dump), "step", 0)
    assert [(b["id"], b["ptr"], b["size"], b["device"], b["pool"]) for b in leaks] == [
        (2, 0x100, 1048576, "cpu", "PTA")
    ]
    out = capsys.readouterr().out
    assert "Detected memory leaks" in out and "0x0000000000000100" in out, out
    assert msmemscope.analyze("leaks", input_path=dump, mstx_info="step", start_index=0) == leaks


def test_check_leaks_errors(tmp_path: Path) -> None:
    dump = tmp_path / "marks.csv"
    _marks_dump(dump)
    with pytest.raises(ValueError, match="input_path must be an absolute path"):
        msmemscope.check_leaks("marks.csv", "step", 0)
    with pytest.raises(ValueError, match=r"found 3 marks named \"step\", need start_index\+3 = 4"):
        msmemscope.check_leaks(dump, "step", 1)
    with pytest.raises(ValueError, match="start_index must be >= 0, got -1"):
        msmemscope.check_leaks(dump, "step", -1)
    with pytest.raises(TypeError, match="mstx_info must be a str"):
        msmemscope.check_leaks(dump, 3, 0)
    with pytest.raises(ValueError, match="no such file"):
        msmemscope.check_leaks(tmp_path / "nope.csv", "step", 0)


# --- the registry ----------------------------------------------------------------------------


def test_list_and_config() -> None:
    names = msmemscope.list_analyzers()
    assert {"leaks", "inefficient"} <= set(names) and names == sorted(names)
    assert msmemscope.get_analyzer_config("inefficient") == {
        "input_path": None,
        "mem_size": 0,
        "inefficient_type": None,
        "idle_threshold": 3000,
        "output_path": None,
    }
    assert msmemscope.get_analyzer_config("leaks") == {
        "input_path": None,
        "mstx_info": None,
        "start_index": None,
    }
    assert msmemscope.analyzers.INEFFICIENT_TYPES == (
        "early_allocation",
        "late_deallocation",
        "temporary_idleness",
    )


def test_analyze_dispatches_and_checks_arguments() -> None:
    assert msmemscope.analyze("inefficient", input_path=IDLE, idle_threshold=2999) == (
        msmemscope.check_inefficient(IDLE, idle_threshold=2999)
    )
    config = msmemscope.get_analyzer_config("inefficient")
    config.update(input_path=str(EARLY))
    assert msmemscope.analyze("inefficient", **config) == msmemscope.check_inefficient(EARLY)
    with pytest.raises(ValueError, match=r"unknown analyzer 'bogus'; available: .*inefficient"):
        msmemscope.analyze("bogus")
    with pytest.raises(ValueError, match="unknown analyzer"):
        msmemscope.get_analyzer_config("bogus")
    with pytest.raises(TypeError, match="the analyzer name must be a str, got int"):
        msmemscope.get_analyzer_config(3)
    with pytest.raises(TypeError, match="takes no argument threshold; it takes input_path"):
        msmemscope.analyze("inefficient", input_path=IDLE, threshold=3)
    with pytest.raises(TypeError, match="analyzer 'leaks' needs mstx_info, start_index"):
        msmemscope.analyze("leaks", input_path=IDLE)


# --- online and offline agree on a real PyTorch run ------------------------------------------

CLI = REPO / "target" / "release" / "msmemscope-cli"

# A tensor used, left alone for 3100 ops, used again (temporary idleness at the default
# threshold); `b`'s storages are read once, then freed after the next op allocated the new one.
TORCH_PROGRAM = """
import torch
a = torch.ones(1000)
b = torch.zeros(10)
for _ in range(3100):
    b = b + 1
c = a * 2
print("ok", float(c.sum()), float(b[0]))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or not CLI.is_file(),
    reason=f"needs torch and {CLI} (scripts/setup.sh installs and builds them)",
)
def test_online_and_offline_agree_on_a_pytorch_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run = subprocess.run(
        [
            str(CLI),
            "--analysis=inefficient",
            "--events=alloc,free,launch,access",
            "-o",
            str(out),
            sys.executable,
            "-c",
            TORCH_PROGRAM,
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("ok 2000.0 3100.0"), run.stdout
    (run_dir,) = out.iterdir()
    (dump,) = (run_dir / "device_cpu" / "dump").glob("memscope_dump_*.csv")
    with (run_dir / "inefficient" / "inefficient_blocks.csv").open(newline="") as f:
        online = [
            {
                "id": int(r["ID"]),
                "ptr": int(r["Ptr"], 16),
                "size": int(r["size"]),
                "device": r["Device Id"],
                "inefficient_type": r["inefficient_type"],
            }
            for r in csv.DictReader(f)
        ]
    offline = msmemscope.check_inefficient(dump)
    assert online == offline
    # `a` (4000 B) is idle between its first op and `a * 2`.
    idle = [m for m in offline if m["inefficient_type"] == "temporary_idleness"]
    assert [m["size"] for m in idle] == [4000], offline
    assert "temporary idleness 1 block (4000 bytes)" in run.stderr, run.stderr
