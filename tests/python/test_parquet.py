"""The Parquet dump read by other engines: a real PyTorch CPU training run under the CLI,
exported with ``msmemscope export --format parquet`` and read back with pyarrow (every column
and type against the same run's CSV, the typed columns against its Attr JSON), and with DuckDB;
``--format=parquet`` launches, also when the target is SIGKILLed; ``config(format="parquet")``
in a program without the launcher; and check_leaks on a Parquet dump."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import msmemscope
from conftest import (
    CLI,
    NEEDS_CLI_AND_TORCH,
    REPO,
    RUNTIME_LIB,
    clean_env,
    ok,
    run_python,
    run_under_cli,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

pytestmark = NEEDS_CLI_AND_TORCH

SCRIPT = REPO / "tests" / "python" / "scripts" / "marked_train.py"
INTS = ("ID", "Timestamp(ns)", "Process Id", "Thread Id")
TEXTS = (
    "Event",
    "Event Type",
    "Name",
    "Device Id",
    "Ptr",
    "Attr",
    "Call Stack(Python)",
    "Call Stack(C)",
)
COLUMNS = (
    "ID",
    "Event",
    "Event Type",
    "Name",
    "Timestamp(ns)",
    "Process Id",
    "Thread Id",
    "Device Id",
    "Ptr",
    "Attr",
    "Call Stack(Python)",
    "Call Stack(C)",
)
TYPED = (("size", pa.int64()), ("allocation_id", pa.int64()), ("owner", pa.string()))
TYPED += (("used", pa.int64()), ("total", pa.int64()))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *args], capture_output=True, text=True, timeout=300, env=clean_env()
    )


def _dumps(out: Path, ext: str) -> list[Path]:
    return sorted(out.glob(f"msmemscope_*/device_*/dump/memscope_dump_*.{ext}"))


def _csv_rows(text: str) -> list[list[str]]:
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0] == list(COLUMNS)
    return rows[1:]


def _check_schema(table) -> None:
    expected = [
        pa.field(c, pa.int64() if c in INTS else pa.string(), nullable=False) for c in COLUMNS
    ]
    expected += [pa.field(name, kind, nullable=True) for name, kind in TYPED]
    assert table.schema == pa.schema(expected), table.schema


def _check_typed(table) -> None:
    """Each typed column holds its Attr key's value, null where the key is absent."""
    for row in table.to_pylist():
        attrs = json.loads(row["Attr"])
        for name, _ in TYPED:
            assert row[name] == attrs.get(name), (name, row)


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    """A training run with Python stacks and accesses, as CSV, exported to Parquet."""
    tmp = tmp_path_factory.mktemp("parquet_csv")
    _, out = run_under_cli(
        tmp,
        "--call-stack=python:6",
        "--events=alloc,free,launch,access",
        script=SCRIPT,
        args=("--steps", "4"),
    )
    done = _cli("export", "--format", "parquet", str(out))
    assert done.returncode == 0, done.stderr
    written = [Path(line) for line in done.stdout.splitlines()]
    assert written == _dumps(out, "parquet"), done.stdout
    assert written, "no Parquet file"
    return out


def test_export_has_the_csv_rows_values_and_types(csv_run: Path) -> None:
    for dump in _dumps(csv_run, "csv"):
        rows = _csv_rows(dump.read_text())
        table = pq.read_table(dump.with_suffix(".parquet"))
        _check_schema(table)
        assert table.num_rows == len(rows) > 100
        columns = {c: table.column(c).to_pylist() for c in COLUMNS}
        for i, row in enumerate(rows):
            for c, text in zip(COLUMNS, row):
                value = columns[c][i]
                assert value == (int(text) if c in INTS else text), (c, i, text, value)
        _check_typed(table)
        events = set(columns["Event"])
        assert {"MALLOC", "FREE", "ACCESS", "OP_LAUNCH", "MSTX"} <= events, events
        # Stacks came through, line ends and all; and a name CSV quotes.
        assert any("\n" in s for s in columns["Call Stack(Python)"])
        assert 'epoch "0", start' in columns["Name"]
        sizes = table.column("size").to_pylist()
        assert sum(s for s, e in zip(sizes, columns["Event"]) if e == "MALLOC" and s) > 0


def test_check_leaks_reads_parquet(csv_run: Path, capsys) -> None:
    dump = _dumps(csv_run, "csv")[0]
    on_csv = msmemscope.check_leaks(str(dump), mstx_info="iter", start_index=0)
    csv_report = capsys.readouterr().out
    on_parquet = msmemscope.check_leaks(str(dump.with_suffix(".parquet")), "iter", 0)
    assert on_parquet == on_csv
    assert capsys.readouterr().out == csv_report
    # The step's kept tensor leaks.
    assert any(block["size"] == 4096 for block in on_csv), on_csv
    blocks = msmemscope.check_inefficient(str(dump.with_suffix(".parquet")))
    assert blocks == msmemscope.check_inefficient(str(dump))


def test_duckdb_reads_bigint_and_varchar(csv_run: Path) -> None:
    duckdb = pytest.importorskip("duckdb")
    dump = _dumps(csv_run, "csv")[0]
    path = str(dump.with_suffix(".parquet"))
    con = duckdb.connect()
    described = con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [path]).fetchall()
    types = {name: kind for name, kind, *_ in described}
    assert [name for name, *_ in described] == [*COLUMNS, *(n for n, _ in TYPED)]
    for name, kind in types.items():
        want = (
            "BIGINT"
            if name in INTS or name in ("size", "allocation_id", "used", "total")
            else "VARCHAR"
        )
        assert kind == want, (name, kind)
    rows = _csv_rows(dump.read_text())
    mallocs = [r for r in rows if r[1] == "MALLOC"]
    count, total = con.execute(
        "SELECT count(*), sum(size) FROM read_parquet(?) WHERE \"Event\" = 'MALLOC'", [path]
    ).fetchone()
    assert count == len(mallocs)
    assert total == sum(json.loads(r[9])["size"] for r in mallocs)


def _segments(head: Path) -> list[Path]:
    """A Parquet dump's files in the order of their rows: the head, its later segments, then
    the step parts (as the dump readers chain them)."""
    parts = head.with_suffix(".steps")
    later = sorted(parts.glob("head_*.parquet")) + sorted(parts.glob("step_*.parquet"))
    return [head, *later]


def _read_dump(head: Path):
    return pa.concat_tables([pq.read_table(f) for f in _segments(head)])


def test_a_parquet_launch_is_read_by_pyarrow(tmp_path: Path) -> None:
    proc, out = run_under_cli(tmp_path, "--format=parquet", script=SCRIPT, args=("--steps", "3"))
    assert _dumps(out, "csv") == [], "no CSV is written"
    assert list(out.rglob("*.open")) == [], "every segment is complete"
    dumps = _dumps(out, "parquet")
    assert dumps
    for dump in dumps:
        assert f"msmemscope: event dump: {dump}" in proc.stderr, proc.stderr
    table = _read_dump(dumps[0])
    _check_schema(table)
    _check_typed(table)
    ids = table.column("ID").to_pylist()
    assert ids == list(range(1, len(ids) + 1))
    names = table.column("Name").to_pylist()
    events = table.column("Event").to_pylist()
    assert [n for n, e in zip(names, events) if e == "MSTX"] == ['epoch "0", start'] + ["iter"] * 3
    assert events.count("MALLOC") > 10


def test_a_sigkilled_training_run_keeps_its_closed_segments(tmp_path: Path) -> None:
    """The writer encodes Parquet itself, in segments that are complete files once closed: a
    SIGKILL loses only the open one, which the launcher and every reader name; the offline
    tools read the rest as one dump."""
    out = tmp_path / "out"
    launcher = subprocess.Popen(
        [str(CLI), "--format=parquet", "-o", str(out), sys.executable, str(SCRIPT), "--forever"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(OMP_NUM_THREADS="1"),
        cwd=tmp_path,
    )
    try:
        for line in launcher.stdout:
            if line.startswith("STEP 5 "):
                break
        else:
            pytest.fail(f"the program never reached step 5: {launcher.stderr.read()}")
        target = int(
            Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()[0]
        )
        # Segments close 0, 1 and 2 s after their first rows: three are complete by now.
        time.sleep(3.5)
        os.kill(target, signal.SIGKILL)
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    # The launcher ends as its target did.
    assert launcher.returncode == -signal.SIGKILL, err
    assert _dumps(out, "csv") == [], err
    (dump,) = _dumps(out, "parquet")
    assert f"msmemscope: event dump: {dump}" in err, err
    # The segment being written has no footer: named, with what is missing.
    open_segments = sorted(out.rglob("*.parquet.open"))
    assert len(open_segments) <= 1, open_segments
    for segment in open_segments:
        assert f"msmemscope: {segment}: the run ended while this segment" in err, err
    # The closed ones are the dump: every row from ID 1 on, none twice, steps 1-5 included.
    files = _segments(dump)
    assert len(files) >= 3, files
    table = _read_dump(dump)
    _check_schema(table)
    _check_typed(table)
    ids = table.column("ID").to_pylist()
    assert ids == list(range(1, len(ids) + 1)), ids[:10]
    rows = table.to_pylist()
    assert sum(r["Name"] == "iter" for r in rows) >= 5
    ops = sum(r["Event Type"] == "ATEN_START" for r in rows)
    assert ops > 50
    # The real CLI reads it back as one dump, every segment: the dump compared with itself has
    # a line per operator pyarrow counts, none with a difference; the reader names the lost
    # segment.
    compared = subprocess.run(
        [str(CLI), "--compare", f"--input-path={dump},{dump}", "--level=op"],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
        cwd=tmp_path,
    )
    assert compared.returncode == 0, compared.stderr
    for segment in open_segments:
        assert f"msmemscope: note: {segment}: the run ended while this segment" in (
            compared.stderr
        ), compared.stderr
    (table_file,) = (tmp_path / "memscopeDumpResults" / "compare").glob("*.csv")
    lines = list(csv.reader(io.StringIO(table_file.read_text(), newline="")))[2:]
    assert len(lines) == ops
    assert {line[-1] for line in lines} == {"0"}
    # The offline analyses read the segments as the one file they make.
    joined = tmp_path / "memscope_dump_joined.parquet"
    pq.write_table(table, joined)
    on_segments = msmemscope.check_leaks(str(dump), mstx_info="iter", start_index=0)
    assert on_segments == msmemscope.check_leaks(str(joined), mstx_info="iter", start_index=0)


def test_config_format_parquet_without_the_launcher(tmp_path: Path) -> None:
    code = f"""
    import msmemscope
    from msmemscope import mstx
    msmemscope.config(output_path={str(tmp_path)!r}, data_format="parquet")
    msmemscope.start()
    for i in range(3):
        mstx.mark(f"m{{i}}")
    """
    env = clean_env(PYTHONPATH=str(REPO / "python"), MSMEMSCOPE_RUNTIME_LIB=str(RUNTIME_LIB))
    ok(run_python(code, env=env))
    assert _dumps(tmp_path, "csv") == []
    (dump,) = _dumps(tmp_path, "parquet")
    table = pq.read_table(dump)
    _check_schema(table)
    names = [r["Name"] for r in table.to_pylist() if r["Event"] == "MSTX"]
    assert names == ["m0", "m1", "m2"]


def test_files_rewritten_by_other_engines_are_read(csv_run: Path, tmp_path: Path) -> None:
    """A dump filtered or rewritten by DuckDB (every column OPTIONAL) or pyarrow without the
    typed columns is still a dump to the analyses."""
    duckdb = pytest.importorskip("duckdb")
    dump = _dumps(csv_run, "csv")[0]
    want = msmemscope.check_leaks(str(dump), "iter", 0)
    copied = tmp_path / "memscope_dump_duckdb.parquet"
    duckdb.connect().execute(
        f"COPY (SELECT * FROM read_parquet('{dump.with_suffix('.parquet')}') ORDER BY \"ID\") "
        f"TO '{copied}' (FORMAT parquet)"
    )
    assert msmemscope.check_leaks(str(copied), "iter", 0) == want
    narrow = tmp_path / "memscope_dump_narrow.parquet"
    table = pq.read_table(dump.with_suffix(".parquet")).select(list(COLUMNS))
    pq.write_table(table, narrow)
    assert msmemscope.check_leaks(str(narrow), "iter", 0) == want
    # One typed value changed: the file contradicts its Attr and is refused, naming the row.
    ids = table.column("ID").to_pylist()
    full = pq.read_table(dump.with_suffix(".parquet"))
    size = full.column("size").to_pylist()
    first = next(i for i, s in enumerate(size) if s is not None)
    size[first] += 1
    bad = tmp_path / "memscope_dump_bad.parquet"
    pq.write_table(full.set_column(12, full.schema.field(12), pa.array(size, pa.int64())), bad)
    with pytest.raises(ValueError, match=rf":{ids[first]}: malformed row: column size is "):
        msmemscope.check_leaks(str(bad), "iter", 0)
    # A codec this build does not read is said so.
    gzip = tmp_path / "memscope_dump_gzip.parquet"
    pq.write_table(table, gzip, compression="gzip")
    with pytest.raises(ValueError, match="compressed with a codec that is not read here"):
        msmemscope.check_leaks(str(gzip), "iter", 0)
