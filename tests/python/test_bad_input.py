"""Inputs that are not usable dumps, through the Python readers (check_leaks, check_inefficient,
check_decompose): a sparse 3 GiB file (a line that never ends), a FIFO, a symlink to /dev/zero,
an Attr ``size`` beyond 64 bits, rows out of ID order or repeated, a SQLite dump of another
schema, and an ``output_path`` that is the input or a symlink. Each is one ``ValueError`` and
leaves every input as it was.

The cases that a regression would turn into an abort, a machine-wide memory exhaustion or a hang
run in a child interpreter under a 4 GiB address-space limit and a timeout."""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import msmemscope
from conftest import REPO, clean_env

DUMPS = REPO / "tests" / "fixtures" / "dumps"
HEADER = (
    "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,"
    "Call Stack(Python),Call Stack(C)"
)
CAP = 16 << 20
READERS = ("check_leaks", "check_inefficient", "check_decompose")

# Runs one reader on argv[2] under the limit and prints what it raised, as JSON (check_leaks
# looks for marks that are not there, so that it reads to the end).
CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
import msmemscope
name, path = sys.argv[1], sys.argv[2]
args = (path, "no such mark", 0) if name == "check_leaks" else (path,)
try:
    getattr(msmemscope, name)(*args)
    print(json.dumps(None))
except BaseException as e:
    print(json.dumps([type(e).__name__, str(e)]))
"""


def fingerprint(path: Path) -> tuple[int, int, int, bytes]:
    """What a file is, to show it unchanged: size, blocks, mtime and first MiB (a sparse file's
    gigabytes of holes are not worth reading)."""
    st = os.stat(path)
    head = b""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            head = f.read(1 << 20)
    return st.st_size, st.st_blocks, st.st_mtime_ns, head


def in_child(name: str, path: Path) -> tuple[str, str]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, name, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(PYTHONPATH=str(REPO / "python")),
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result is not None, f"{name} read {path}"
    return result[0], result[1]


def assert_refused_in_child(path: Path, message: str) -> None:
    before = fingerprint(path)
    for name in READERS:
        assert in_child(name, path) == ("ValueError", message), name
    assert fingerprint(path) == before


def assert_refused(path: Path, message: str) -> None:
    before = path.read_bytes()
    for name in READERS:
        args = (path, "no such mark", 0) if name == "check_leaks" else (path,)
        with pytest.raises(ValueError) as info:
            getattr(msmemscope, name)(*args)
        assert str(info.value) == message, name
    assert path.read_bytes() == before


# --- the row cap, and files that are not regular -------------------------------------------


def test_sparse_three_gigabyte_file_is_refused_at_the_cap(tmp_path: Path) -> None:
    # A valid dump `truncate -s 3G`'d: after its last line comes one that never ends.
    src = DUMPS / "check_leaks.csv"
    dump = tmp_path / "sparse.csv"
    dump.write_bytes(src.read_bytes())
    os.truncate(dump, 3 << 30)
    text = src.read_text()
    # Rows count records (a quoted stack spans two lines), lines count lines.
    rows = len(list(csv.reader(io.StringIO(text)))) - 1
    line = text.count("\n") + 1
    message = f"{dump}:{line}: row {rows + 1} is longer than {CAP} bytes: not a memscope dump"
    assert_refused_in_child(dump, message)


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    for name in ("fifo.csv", "fifo.db"):
        fifo = tmp_path / name
        os.mkfifo(fifo)
        assert_refused_in_child(fifo, f"{fifo}: not a memscope dump: a FIFO, not a regular file")


def test_symlink_to_dev_zero_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "zero.csv"
    link.symlink_to("/dev/zero")
    assert_refused_in_child(
        link, f"{link}: not a memscope dump: a character device, not a regular file"
    )


def test_directory_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "dump.csv"
    folder.mkdir()
    for name in READERS:
        args = (folder, "no such mark", 0) if name == "check_leaks" else (folder,)
        with pytest.raises(ValueError) as info:
            getattr(msmemscope, name)(*args)
        assert str(info.value) == f"{folder}: not a memscope dump: a directory, not a regular file"


# --- malformed values ------------------------------------------------------------------------

START = "1,SYSTEM,START_TRACE,N/A,1000,42,42,N/A,N/A,{},,"
MARK = "{id},MSTX,Mark,test,{ts},42,42,N/A,N/A,{{}},,"


def malloc(id_: int, size: str) -> str:
    attrs = f'"{{""allocation_id"":{id_},""size"":{size},""owner"":""PTA""}}"'
    return f"{id_},MALLOC,PTA,N/A,{1000 + id_},42,42,cpu,0x{0x1000 * id_:016x},{attrs},,"


def write(path: Path, rows: list[str]) -> Path:
    path.write_text(HEADER + "\n" + "".join(r + "\n" for r in rows))
    return path


def test_size_beyond_64_bits_is_refused(tmp_path: Path) -> None:
    dump = write(
        tmp_path / "overflow.csv",
        [START, malloc(2, "18446744073709551616"), MARK.format(id=3, ts=1200)],
    )
    assert_refused(
        dump,
        f'{dump}:3: malformed row: Attr "size" is not an integer from 0 to '
        '18446744073709551615: "18446744073709551616"',
    )
    # The largest size is one.
    dump = write(tmp_path / "max.csv", [START, malloc(2, "18446744073709551615")])
    assert msmemscope.check_inefficient(dump) == []


def test_rows_out_of_id_order_or_repeated_are_refused(tmp_path: Path) -> None:
    dump = write(tmp_path / "repeat.csv", [START, malloc(2, "64"), malloc(2, "64")])
    assert_refused(dump, f"{dump}:4: malformed row: ID 2 repeats the previous row's ID")
    dump = write(tmp_path / "order.csv", [START, MARK.format(id=3, ts=1200), malloc(2, "64")])
    assert_refused(
        dump,
        f"{dump}:4: malformed row: ID 2 comes after ID 3: rows must be in ascending ID order",
    )


def test_sqlite_dump_of_another_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "wrong.db"
    con = sqlite3.connect(db)
    con.execute('CREATE TABLE memscope_dump ("ID" INTEGER PRIMARY KEY, "Event" TEXT)')
    con.execute("INSERT INTO memscope_dump VALUES (1, 'MALLOC')")
    con.commit()
    con.close()
    assert_refused(db, f'{db}: not a memscope dump: table memscope_dump lacks column "Event Type"')


def test_sqlite_value_beyond_64_bits_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "overflow.db"
    con = sqlite3.connect(db)
    columns = ", ".join(f'"{c}"' for c in HEADER.split(","))
    con.execute(f"CREATE TABLE memscope_dump ({columns})")
    con.execute(
        "INSERT INTO memscope_dump VALUES (1, 'MALLOC', 'PTA', 'N/A', 5, 1, 1, 'cpu', '0x10', "
        "?, '', '')",
        ('{"size":99999999999999999999}',),
    )
    con.commit()
    con.close()
    assert_refused(
        db,
        f'{db}:1: malformed row: Attr "size" is not an integer from 0 to '
        '18446744073709551615: "99999999999999999999"',
    )


# --- check_inefficient's output_path ----------------------------------------------------------


def test_output_path_is_never_the_input(tmp_path: Path) -> None:
    dump = tmp_path / "dump.csv"
    dump.write_bytes((DUMPS / "inefficient_late.csv").read_bytes())
    before = dump.read_bytes()
    hard = tmp_path / "hard.csv"
    os.link(dump, hard)
    for out in (dump, str(dump), hard, f"{tmp_path}/./dump.csv"):
        with pytest.raises(ValueError) as info:
            msmemscope.check_inefficient(dump, output_path=out)
        assert str(info.value) == f"output_path: {out} is the input file; give another path"
    assert dump.read_bytes() == before


def test_output_path_is_never_a_symlink(tmp_path: Path) -> None:
    dump = tmp_path / "dump.csv"
    dump.write_bytes((DUMPS / "inefficient_late.csv").read_bytes())
    before = dump.read_bytes()
    other = tmp_path / "other.txt"
    other.write_text("keep me\n")
    for target in (dump, other, tmp_path / "missing.csv"):
        link = tmp_path / "link.csv"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        with pytest.raises(ValueError) as info:
            msmemscope.check_inefficient(dump, output_path=link)
        assert str(info.value) == (
            f"output_path: {link} is a symlink; give the path of a regular file"
        )
        assert not (tmp_path / "missing.csv").exists()
    assert dump.read_bytes() == before
    assert other.read_text() == "keep me\n"


def test_output_path_is_never_a_fifo(tmp_path: Path) -> None:
    dump = tmp_path / "dump.csv"
    dump.write_bytes((DUMPS / "inefficient_late.csv").read_bytes())
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    with pytest.raises(ValueError) as info:
        msmemscope.check_inefficient(dump, output_path=fifo)
    assert str(info.value) == f"output_path: {fifo} is not a regular file"


def test_output_path_elsewhere_is_written(tmp_path: Path) -> None:
    # The refusals leave the ordinary case alone, an existing file being replaced.
    dump = tmp_path / "dump.csv"
    dump.write_bytes((DUMPS / "inefficient_late.csv").read_bytes())
    out = tmp_path / "blocks.csv"
    out.write_text("an older, longer result\n" * 10)
    msmemscope.check_inefficient(dump, output_path=out)
    assert out.read_text().splitlines() == [
        "ID,Ptr,size,Device Id,inefficient_type",
        "3,0x0000000000001000,2048,cpu,late_deallocation",
    ]
