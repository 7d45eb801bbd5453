"""Decompose end to end: owners on MALLOC rows, OWNER rows, the per-step table against PyTorch's
MemTracker on the same run, and msmemscope.describe in its four forms. Real torch on CPU under
the CLI."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from conftest import REPO, run_under_cli

CLI = REPO / "target" / "release" / "msmemscope-cli"
SCRIPTS = Path(__file__).resolve().parent / "scripts"

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"{CLI} is not built (scripts/setup.sh)")

# MemTracker's categories -> our owners.
CATEGORIES = {
    "Parameter": "PTA@weight",
    "Buffer": "PTA@buffer",
    "Gradient": "PTA@gradient",
    "Activation": "PTA@activation",
    "Temp": "PTA@temporary",
    "Optstate": "PTA@optimizer_state",
    "Total": "total",
}


def run(tmp: Path, script: str, *args: str, options=("--analysis=decompose",)):
    proc, out = run_under_cli(tmp, *options, script=SCRIPTS / script, args=args)
    (dump,) = out.glob("msmemscope_*/device_cpu/dump/memscope_dump_*.csv")
    with dump.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return proc, rows, dump.parent


def table(dump_dir: Path) -> dict[tuple[int, str], tuple[int, int, int]]:
    with (dump_dir / "memscope_decompose.csv").open(newline="") as f:
        lines = list(csv.DictReader(f))
    assert list(lines[0]) == [
        "Step",
        "Device Id",
        "Pool",
        "Owner",
        "Current(byte)",
        "Peak(byte)",
        "Max(byte)",
    ]
    return {
        (int(r["Step"]), r["Owner"]): (
            int(r["Current(byte)"]),
            int(r["Peak(byte)"]),
            int(r["Max(byte)"]),
        )
        for r in lines
        if r["Device Id"] == "cpu" and r["Pool"] == "PTA"
    }


def within_one_percent(ours: int, theirs: int) -> bool:
    return abs(ours - theirs) <= 0.01 * theirs


def test_per_step_owners_agree_with_memtracker(tmp_path: Path) -> None:
    steps = 4
    proc, rows, dump_dir = run(tmp_path, "decompose_train.py", str(steps))
    reference = {}
    for line in proc.stdout.splitlines():
        if line.startswith("MEMTRACKER "):
            snap = json.loads(line.split(" ", 1)[1])
            reference[snap["step"]] = snap
    assert sorted(reference) == list(range(steps + 1))
    ours = table(dump_dir)
    compared = 0
    for step in range(1, steps + 1):
        for category, owner in CATEGORIES.items():
            current, peak, _ = ours.get((step, owner), (0, 0, 0))
            want_current = reference[step]["current"][category]
            want_peak = reference[step]["peak"][category]
            assert within_one_percent(current, want_current), (step, owner, current, want_current)
            assert within_one_percent(peak, want_peak), (step, owner, peak, want_peak)
            compared += want_current > 0 or want_peak > 0
    # The comparison covered weights, gradients, optimizer state and activations every step.
    assert compared >= 4 * steps
    # Model: 64*256+256 + 256*128+128 + 128*10+10 float32 parameters; Adam keeps two states per
    # parameter and a float32 step count per parameter tensor (6).
    params = (64 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10) * 4
    assert ours[(steps, "PTA@weight")][0] == params
    assert ours[(steps, "PTA@optimizer_state")][0] == 2 * params + 6 * 4
    assert ours[(steps, "PTA@gradient")][2] == params
    # The owners are on the rows themselves: MALLOC owners and OWNER rows that move blocks.
    owners = {json.loads(r["Attr"])["owner"] for r in rows if r["Event"] == "MALLOC"}
    assert {"PTA@activation", "PTA@temporary", "PTA@optimizer_state"} <= owners
    relabels = [r for r in rows if r["Event"] == "SYSTEM" and r["Event Type"] == "OWNER"]
    assert {r["Name"] for r in relabels} >= {"PTA@weight", "PTA@gradient"}
    assert all(json.loads(r["Attr"])["owner"] == r["Name"] for r in relabels)
    assert (
        "====== Memory decomposition on device cpu (PTA pool) ======" in proc.stderr + proc.stdout
    )


def test_optimizer_steps_end_steps_without_the_leaks_analysis(tmp_path: Path) -> None:
    """A loop that marks no steps, under --analysis=decompose alone: each optimizer.step() offers
    the runtime a step boundary, and the runtime writes every offer but the first (a program that
    marks its steps at their end would otherwise count its first step twice). Four calls make
    three STEP rows, steps 1 to 3, so the console's last step is step 3."""
    proc, rows, dump_dir = run(tmp_path, "optimizer_steps.py")
    assert proc.stdout == "trained 4 steps\n", proc.stdout
    steps = [r for r in rows if r["Event"] == "SYSTEM" and r["Event Type"] == "STEP"]
    assert [r["Name"] for r in steps] == ["1", "2", "3"], steps
    assert all(json.loads(r["Attr"])["source"] == "optimizer.step" for r in steps), steps
    assert sorted({step for step, _ in table(dump_dir)}) == [0, 1, 2, 3]
    assert (
        "====== Memory decomposition on device cpu (PTA pool) ======\nStep 3 (last step):\n"
        in proc.stderr
    ), proc.stderr
    assert "Step 0 (last step)" not in proc.stderr, proc.stderr


def test_describer_forms(tmp_path: Path) -> None:
    proc, rows, _ = run(tmp_path, "describe_forms.py")
    known = {}
    refused = {}
    for line in proc.stdout.splitlines():
        if line.startswith("KNOWN "):
            _, label, ptr, nbytes = line.split()
            known[label] = (f"0x{int(ptr):016x}", int(nbytes))
        elif line.startswith("REFUSED ") or line.startswith("ACCEPTED "):
            kind = line.split()[1]
            refused[kind] = line.split(" ", 2)[2] if line.startswith("REFUSED ") else "ACCEPTED"
    mallocs = [r for r in rows if r["Event"] == "MALLOC"]
    owner_of = {
        (r["Ptr"], json.loads(r["Attr"])["size"]): json.loads(r["Attr"])["owner"] for r in mallocs
    }
    expected = {
        "decorated": "PTA@activation@deco",
        "ctx": "PTA@activation@ctx",
        "nested": "PTA@activation@ctx@inner",
        "explicit": "PTA@activation@expl",
        "tagged": "PTA@activation",
        "plain": "PTA@activation",
        "repeat": "PTA@activation@a@b@c",
        "after": "PTA@activation",
    }
    for label, owner in expected.items():
        assert owner_of[known[label]] == owner, (label, owner_of)
    # Exactly the allocations made inside carry a label.
    labelled = sorted(
        json.loads(r["Attr"])["size"]
        for r in mallocs
        if json.loads(r["Attr"])["owner"] != "PTA@activation"
    )
    assert labelled == [40, 80, 120, 160, 280]
    # The tensor form relabels the existing block.
    (tag,) = [r for r in rows if r["Event Type"] == "OWNER"]
    assert (tag["Name"], tag["Ptr"], json.loads(tag["Attr"])["size"]) == (
        "PTA@activation@tagged",
        *known["tagged"],
    )
    assert refused == {
        "fourth": "ValueError: describer: at most 3 distinct owner labels can be active at once "
        "(active: a, b, c); cannot add 'd'",
        "long": "ValueError: describer: owner must have 1 to 128 characters, got 129",
        "type": "TypeError: describer: owner must be a str, not int",
        "at": "ValueError: describer: owner 'a@b' contains '@'; '@' separates labels and quotes, "
        "backslashes and control characters are not accepted",
        "not_tensor": "TypeError: describer: the positional argument must be a torch.Tensor to "
        "label (got list); use describer(owner=...) as a decorator or context manager",
        "exit_unknown": "ValueError: describer: no active region is labelled 'never'",
    }


def test_user_labels_without_decompose(tmp_path: Path) -> None:
    """Without the decompose analysis the framework part is absent: owners are the pool and the
    user's labels, and no framework hook runs."""
    _, rows, dump_dir = run(tmp_path, "describe_forms.py", options=("--analysis=none",))
    owners = sorted({json.loads(r["Attr"])["owner"] for r in rows if r["Event"] == "MALLOC"})
    assert owners == ["PTA", "PTA@a@b@c", "PTA@ctx", "PTA@ctx@inner", "PTA@deco", "PTA@expl"]
    assert not (dump_dir / "memscope_decompose.csv").exists()


def test_tensors_made_before_the_first_step_are_data_or_other(tmp_path: Path) -> None:
    """A module-level TensorDataset (600 x 256 float32) behind a DataLoader, and a module-level
    lookup table: both are made before training and live throughout, so from the first step on
    they are `data` and `other`, not activations. The relabel happens once, at the first
    optimizer.step() (inside step 0, the only boundary the runtime does not record)."""
    proc, rows, dump_dir = run(tmp_path, "decompose_dataset.py")
    made = {}
    for line in proc.stdout.splitlines():
        name, ptr, nbytes = line.split()
        made[name] = (f"0x{int(ptr):016x}", int(nbytes))
    data_bytes, table_bytes = made["DATA"][1], made["TABLE"][1]
    assert (data_bytes, table_bytes) == (614400, 4000)

    # Their MALLOC rows say activation (nothing is known yet when they are made); one OWNER row
    # each moves them.
    mallocs = {
        (r["Ptr"], json.loads(r["Attr"])["size"]): json.loads(r["Attr"])["owner"]
        for r in rows
        if r["Event"] == "MALLOC"
    }
    assert mallocs[made["DATA"]] == "PTA@activation"
    assert mallocs[made["TABLE"]] == "PTA@activation"
    relabels = [r for r in rows if r["Event"] == "SYSTEM" and r["Event Type"] == "OWNER"]
    moved = {
        (r["Ptr"], json.loads(r["Attr"])["size"]): json.loads(r["Attr"])["owner"]
        for r in relabels
        if r["Name"] in ("PTA@data", "PTA@other")
    }
    assert moved[made["DATA"]] == "PTA@data"
    assert moved[made["TABLE"]] == "PTA@other"
    assert [block for block, owner in moved.items() if owner == "PTA@data"] == [made["DATA"]]
    # Besides the table, only the first batch (100 x 256 float32, made by the DataLoader before
    # the first forward and still in use then) is `other`, until it is freed; the model's
    # parameters are weights, never `other`.
    others = sorted(size for (_, size), owner in moved.items() if owner == "PTA@other")
    assert others == [table_bytes, 100 * 256 * 4]
    # One OWNER row per block, all before the first STEP row: step 0 already ends with them moved.
    kinds = [(r["Event"], r["Event Type"], r["Name"]) for r in rows]
    at = [
        i
        for i, (_, kind, name) in enumerate(kinds)
        if kind == "OWNER" and name in ("PTA@data", "PTA@other")
    ]
    assert len(at) == len(moved) == 3
    assert at[-1] < kinds.index(("SYSTEM", "STEP", "1"))

    ours = table(dump_dir)
    steps = sorted({step for step, _ in ours})
    assert steps == [0, 1, 2, 3, 4, 5]
    assert ours[(0, "PTA@data")][0] == data_bytes
    for step in steps[1:]:
        assert ours[(step, "PTA@data")] == (data_bytes, data_bytes, data_bytes), step
        assert ours[(step, "PTA@other")] == (table_bytes, table_bytes, table_bytes), step
        # The activations left are a batch's: far below the dataset's bytes, which they
        # included before.
        assert max(ours[(step, "PTA@activation")]) < data_bytes, (step, ours)
    assert "PTA@data" in proc.stderr and "PTA@other" in proc.stderr
