"""FSDP1 and FSDP2 decompose hooks end to end: two gloo ranks on CPU, each its own process under
``msmemscope --analysis=decompose`` (the rendezvous variables torchrun would set), assertions on
each rank's dump."""

from __future__ import annotations

import csv
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, clean_env

CLI = REPO / "target" / "release" / "msmemscope-cli"
SCRIPT = Path(__file__).resolve().parent / "scripts" / "fsdp_train.py"

try:
    import torch.distributed as dist

    HAVE_GLOO = dist.is_available() and dist.is_gloo_available()
except ImportError:
    HAVE_GLOO = False

pytestmark = [
    pytest.mark.skipif(not CLI.is_file(), reason=f"{CLI} is not built (scripts/setup.sh)"),
    pytest.mark.skipif(not HAVE_GLOO, reason="torch with the gloo backend is not installed"),
]

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank:
    def __init__(self, rank: int, proc: subprocess.CompletedProcess[str], out: Path | None):
        self.rank = rank
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        if out is not None:
            files = sorted(out.glob("msmemscope_*/device_cpu/dump/memscope_dump_*.csv"))
            assert len(files) == 1, f"rank {rank}: expected one dump, got {files}\n{proc.stderr}"
            self.read(files[0])

    def read(self, dump: Path) -> None:
        with dump.open(newline="") as f:
            self.rows = list(csv.DictReader(f))

    def printed(self, tag: str) -> str:
        for line in self.stdout.splitlines():
            if line.startswith(tag + " "):
                return line[len(tag) + 1 :]
        raise AssertionError(f"rank {self.rank} printed no {tag} line:\n{self.stdout}")

    def malloc_owners(self) -> set[str]:
        """Every owner a block had: at its MALLOC and in later OWNER rows."""
        found = set()
        for r in self.rows:
            if r["Event"] == "MALLOC" or (r["Event"] == "SYSTEM" and r["Event Type"] == "OWNER"):
                found.add(json.loads(r["Attr"])["owner"])
        return found

    def live_at_mark(self, message: str) -> dict[int, tuple[int, str]]:
        """allocation_id -> (size, owner) of the blocks live at the MSTX mark ``message``."""
        live: dict[int, tuple[int, str]] = {}
        for r in self.rows:
            event, kind = r["Event"], r["Event Type"]
            if event == "MSTX" and kind == "Mark" and r["Name"] == message:
                return live
            if event not in ("MALLOC", "FREE", "SYSTEM") or r["Attr"] in ("", "{}"):
                continue
            attr = json.loads(r["Attr"])
            aid = attr.get("allocation_id")
            if event == "MALLOC":
                live[aid] = (attr["size"], attr["owner"])
            elif event == "FREE":
                live.pop(aid, None)
            elif kind == "OWNER" and aid in live:
                live[aid] = (live[aid][0], attr["owner"])
        raise AssertionError(f"rank {self.rank}: no mark {message!r} in the dump")


def run_ranks(tmp: Path, *script_args: str) -> list[Rank]:
    """Both ranks at once, each under its own launcher."""
    port = _free_port()
    procs = []
    for rank in range(WORLD):
        out = tmp / f"rank{rank}"
        env = clean_env(
            OMP_NUM_THREADS="1",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(WORLD),
            LOCAL_WORLD_SIZE=str(WORLD),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        cmd = [str(CLI), "--analysis=decompose", "-o", str(out), sys.executable, str(SCRIPT)]
        cmd += script_args
        procs.append(
            (
                rank,
                out,
                subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=tmp,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    ranks = []
    for rank, out, proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for _, _, p in procs:
                p.kill()
            raise
        done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        assert proc.returncode == 0, f"rank {rank}: exit {proc.returncode}\n{stdout}\n{stderr}"
        assert "error" not in stderr.lower(), f"rank {rank}:\n{stderr}"
        ranks.append(Rank(rank, done, out))
    return ranks


FSDP2_OWNERS = {
    "PTA@fsdp2@sharded_weight",
    "PTA@fsdp2@unsharded_weight",
    "PTA@fsdp2@all_gather",
    "PTA@fsdp2@reduce_scatter",
    "PTA@fsdp2@gradient",
    "PTA@fsdp2@activation",
}
# FSDP1 all-gathers straight into the unsharded flat parameter (no separate buffer without
# mixed precision), so its all-gather memory is the unsharded weight.
FSDP1_OWNERS = {
    "PTA@fsdp1@sharded_weight",
    "PTA@fsdp1@unsharded_weight",
    "PTA@fsdp1@reduce_scatter",
    "PTA@fsdp1@gradient",
    "PTA@fsdp1@activation",
}


def _sum(live: dict[int, tuple[int, str]], owner: str) -> int:
    return sum(size for size, o in live.values() if o == owner)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One two-rank run per FSDP flavour, shared by the tests below."""
    done: dict[str, list[Rank]] = {}

    def get(kind: str) -> list[Rank]:
        if kind not in done:
            done[kind] = run_ranks(tmp_path_factory.mktemp(kind), kind)
        return done[kind]

    return get


@pytest.mark.parametrize(("kind", "owners"), [("fsdp2", FSDP2_OWNERS), ("fsdp1", FSDP1_OWNERS)])
def test_each_rank_dump_carries_the_fsdp_owners(runs, kind, owners):
    for r in runs(kind):
        assert int(r.printed("KNOWN param_bytes")) == (16 * 32 + 32 + 32 * 8 + 8) * 4
        assert owners <= r.malloc_owners(), f"rank {r.rank}: {sorted(r.malloc_owners())}"
        live = r.live_at_mark("fsdp-check")
        # Between steps nothing of the unsharded parameters or the collectives is left.
        for transient in ("unsharded_weight", "all_gather", "reduce_scatter"):
            assert _sum(live, f"PTA@{kind}@{transient}") == 0, transient
        # Only the FSDP flavour in use activated; the other one still waits for a first use.
        version = "2.6+" if kind == "fsdp1" else "2.10+"
        assert r.printed("ACTIVE") == f"pytorch,{version},{kind},decompose,auto"
        assert r.printed("ARMED") == ("fsdp2" if kind == "fsdp1" else "fsdp1")


@pytest.mark.parametrize("kind", ["fsdp2", "fsdp1"])
def test_each_rank_keeps_half_the_weights_and_gradients(runs, kind):
    for r in runs(kind):
        param_bytes = int(r.printed("KNOWN param_bytes"))
        live = r.live_at_mark("fsdp-check")
        assert _sum(live, f"PTA@{kind}@sharded_weight") == param_bytes // WORLD
        assert _sum(live, f"PTA@{kind}@gradient") == param_bytes // WORLD
        # Adam's two moments of the local shard (DTensor states included) and a step count
        # (4 bytes) per parameter tensor.
        moments = _sum(live, "PTA@optimizer_state")
        assert 2 * param_bytes // WORLD <= moments <= 2 * param_bytes // WORLD + 4 * 16, moments


def test_manual_decompose_hooks_take_precedence_over_automatic_ones(tmp_path):
    ranks = run_ranks(tmp_path, "fsdp2", "manual")
    for r in ranks:
        active = r.printed("ACTIVE").split(";")
        # The automatic FSDP2 hook never activates; FSDP1's waits for an FSDP1 module.
        assert active == ["pytorch,2.10+,fsdp2,decompose,manual"]
        assert r.printed("ARMED") == "fsdp1"
        live = r.live_at_mark("fsdp-check")
        param_bytes = int(r.printed("KNOWN param_bytes"))
        assert _sum(live, "PTA@fsdp2@sharded_weight") == param_bytes // WORLD


TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.mark.skipif(not TORCHRUN.is_file(), reason=f"{TORCHRUN} is not installed")
def test_fsdp2_under_torchrun_traced_from_python(tmp_path):
    """The original msMemScope's way for distributed jobs: each torchrun worker configures
    decompose and starts tracing itself (the launcher traces only its direct child)."""
    out = tmp_path / "out"
    cmd = [str(TORCHRUN), "--nproc-per-node", str(WORLD), "--master-port", str(_free_port())]
    cmd += [str(SCRIPT), "fsdp2", f"api={out}"]
    proc = subprocess.run(
        cmd,
        env=clean_env(OMP_NUM_THREADS="1"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    dumps = sorted(out.glob("msmemscope_*/device_cpu/dump/memscope_dump_*.csv"))
    assert len(dumps) == WORLD, dumps
    for i, dump in enumerate(dumps):
        r = Rank(i, proc, None)
        r.read(dump)
        assert FSDP2_OWNERS <= r.malloc_owners(), f"{dump}: {sorted(r.malloc_owners())}"
        live = r.live_at_mark("fsdp-check")
        # The workers share torchrun's stdout, so their lines may interleave mid-line.
        known = re.search(r"KNOWN param_bytes (\d+)", proc.stdout)
        assert known, proc.stdout
        param_bytes = int(known.group(1))
        assert _sum(live, "PTA@fsdp2@sharded_weight") == param_bytes // WORLD
        assert _sum(live, "PTA@fsdp2@gradient") == param_bytes // WORLD
