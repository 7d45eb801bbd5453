"""``msmemscope ranks`` on a real two-rank FSDP2 job on CPU (gloo), one rank of which leaks:
the table names the leaking rank, and the native, DuckDB and Spark engines give identical
tables over the same run directories."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from conftest import CLI, NEEDS_CLI_AND_TORCH, REPO, clean_env

pytestmark = [
    *NEEDS_CLI_AND_TORCH,
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()),
        reason="torch with the gloo backend is not installed",
    ),
]

SCRIPT = REPO / "tests" / "python" / "scripts" / "ranks_train.py"
WORLD = 2
LEAKY = 1
# ranks_train.py keeps two tensors of 250,000 float32 on the leaky rank.
KEPT_BYTES = 2 * 1_000_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ranks(*args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), "ranks", *map(str, args)],
        env=clean_env(MSMEMSCOPE_PYTHON=sys.executable, **env),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both ranks at once, each under its own launcher (as the FSDP tests run them), rank 1
    leaking; then the dumps exported to Parquet for the SQL engines."""
    out = tmp_path_factory.mktemp("job")
    port = _free_port()
    procs = []
    for rank in range(WORLD):
        env = clean_env(
            OMP_NUM_THREADS="1",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(WORLD),
            LOCAL_WORLD_SIZE=str(WORLD),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        cmd = [str(CLI), "--analysis=decompose,leaks", "-o", str(out / f"rank{rank}")]
        cmd += [sys.executable, str(SCRIPT), f"leak={LEAKY}"]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for rank, proc in enumerate(procs):
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, f"rank {rank}: exit {proc.returncode}\n{stdout}\n{stderr}"
    for rank in range(WORLD):
        exported = subprocess.run(
            [str(CLI), "export", "--format", "parquet", str(out / f"rank{rank}")],
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert exported.returncode == 0, exported.stderr
    return out


def table(job: Path, engine: str) -> dict:
    done = ranks(job, "--engine", engine, "--output-format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_leaking_rank_stands_out(job: Path) -> None:
    rows = table(job, "native")["rows"]
    assert [(r["rank"], r["device"]) for r in rows] == [(0, "cpu"), (1, "cpu")]
    healthy, leaky = rows
    # The leaky rank leaks exactly what the healthy one does, plus the two kept tensors.
    assert leaky["leaked_bytes"] - healthy["leaked_bytes"] == KEPT_BYTES
    assert leaky["leaked_blocks"] - healthy["leaked_blocks"] == 2
    assert "leaks" in leaky["stands_out"].split(",")
    assert healthy["stands_out"] == ""
    # Both kept tensors are alive at the leaky rank's peak, labelled as activations.
    assert leaky["top_owner"] == "PTA@activation"
    assert leaky["peak_allocated"] >= leaky["top_owner_bytes"] >= KEPT_BYTES
    # The model is tiny: each rank's own transient peak (some 12 KB, varying by a few hundred
    # bytes from run to run with gloo's buffers) is far below what the leaky rank keeps.
    assert healthy["peak_allocated"] < KEPT_BYTES // 10
    assert healthy["reserved_peak"] is None  # CPU: no reserved pool
    text = ranks(job)
    assert text.returncode == 0, text.stderr
    assert (
        text.stdout.splitlines()[-1] == f"stands out: rank {LEAKY} on cpu ({leaky['stands_out']})"
    )


def test_native_duckdb_and_spark_give_identical_tables(job: Path) -> None:
    native = table(job, "native")
    assert table(job, "duckdb") == native
    assert table(job, "spark") == native


def _written_dump(root: Path) -> Path:
    """A run whose leaks need the site rule: line 1 keeps one block a step (a leak), line 2's
    block of step 3 is freed one step late (it outlived its step once: no leak), line 3's block
    is made once and kept (resident), a site known only by its Python stack grows too, and a
    HAL block lives to the end. The leaks are line 1's blocks of steps 2, 3 and (live at the
    end) 4, the stack site's two and the HAL block: 6 blocks of 1,000 + 100 * 3 + 2 * 30."""
    dump = root / "msmemscope_7_20260101000000" / "device_cpu" / "dump"
    dump.mkdir(parents=True)
    rows = []

    def add(event: str, kind: str, ptr: int | None, attr: str = "{}", stack: str = "") -> None:
        attr_cell = '"' + attr.replace('"', '""') + '"'
        pointer = "N/A" if ptr is None else f"0x{ptr:016x}"
        device = "N/A" if ptr is None else "cpu"
        name = "N/A"
        if kind == "STEP":
            name = str(sum(1 for r in rows if ",STEP," in r) + 1)
        rows.append(
            f"{len(rows) + 1},{event},{kind},{name},{1000 + len(rows)},7,7,{device},{pointer},"
            f'{attr_cell},"{stack}",'
        )

    def malloc(ptr: int, size: int, line: int, pool: str = "PTA") -> None:
        attr = f'{{"size":{size},"site":"t.py:{line} (f)","op":"aten::empty"}}'
        add("MALLOC", pool, ptr, attr)

    add("MALLOC", "HAL", 0x90, '{"size":1000}')
    add("SYSTEM", "STEP", None)
    add("SYSTEM", "STEP", None)
    malloc(0x10, 100, 1)
    malloc(0x20, 50, 2)
    malloc(0x30, 70, 3)
    add("MALLOC", "PTA", 0x40, '{"size":30}', "s.py(9): g")
    add("SYSTEM", "STEP", None)  # starts step 3
    malloc(0x11, 100, 1)
    malloc(0x21, 50, 2)
    add("MALLOC", "PTA", 0x41, '{"size":30}', "s.py(9): g")
    add("SYSTEM", "STEP", None)  # step 2's blocks are candidates
    add("FREE", "PTA", 0x20)
    malloc(0x12, 100, 1)
    add("SYSTEM", "STEP", None)  # step 3's: only lines 1 and s.py:9 reach a new high
    malloc(0x13, 100, 1)
    add("FREE", "PTA", 0x21)
    header = (
        "ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr,"
        "Call Stack(Python),Call Stack(C)"
    )
    (dump / "memscope_dump_20260101000000.csv").write_text("\n".join([header, *rows]) + "\n")
    return root


def test_every_engine_counts_the_blocks_of_growing_sites_as_leaks(tmp_path: Path) -> None:
    root = _written_dump(tmp_path / "job")
    native = table(root, "native")
    ((row,),) = [native["rows"]]
    assert (row["leaked_blocks"], row["leaked_bytes"]) == (6, 1_360)
    assert table(root, "duckdb") == native
    assert table(root, "spark") == native


def test_csv_output_and_the_rank_from_config_json(job: Path) -> None:
    done = ranks(job / "rank1", "--output-format", "csv")
    assert done.returncode == 0, done.stderr
    header, line, *rest = done.stdout.splitlines()
    assert rest == []
    assert header.split(",")[:4] == ["rank", "run", "device", "dump"]
    assert line.split(",")[0] == "1"
    config = json.loads(next((job / "rank1").glob("msmemscope_*/config.json")).read_text())
    assert config["distributed"] == {"rank": 1, "local_rank": 1, "world_size": WORLD}


def test_bad_input_is_one_line_and_status_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for args, expected in [
        ((), "ranks needs at least one directory"),
        ((tmp_path / "missing",), "no such directory"),
        ((empty,), "holds no run directory"),
        ((empty, "--engine", "pandas"), 'invalid ranks --engine "pandas"'),
        ((empty, "--threshold", "x"), 'invalid ranks --threshold "x"'),
        ((empty, "--output-format=xml"), 'invalid ranks --output-format "xml"'),
    ]:
        done = ranks(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and expected in done.stderr, (args, done.stderr)


def test_sql_engines_export_what_has_no_parquet_yet(job: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(job, copy)
    removed = list(copy.rglob("*.parquet"))
    assert len(removed) == WORLD
    for parquet in removed:
        parquet.unlink()
    done = ranks(copy, "--engine", "duckdb", "--output-format", "json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("for the SQL engine") == WORLD, done.stderr
    assert all(p.is_file() for p in removed)
    native = ranks(copy, "--output-format", "json")
    assert json.loads(done.stdout) == json.loads(native.stdout)
