"""What the peak is made of, from the real CLI on a real attention model (leaks/peak.json).

The leaks analysis, on by default, names the moment each device's live tensor bytes were
highest and the user's lines whose blocks were live then. In a stack of attention layers the
softmax outputs kept for backward are most of the peak: their line is the top one, and with the
decompose labels on the split by owner adds up to the peak.
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path

import pytest

from conftest import run_command_under_cli

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
PROGRAM = REPO / "tests" / "fixtures" / "leak_programs" / "attention_peak.py"
SOFTMAX_LINE = 17  # probs = torch.softmax(scores, dim=-1)
SOFTMAX_BYTES = 8 * 4 * 256 * 256 * 4  # batch x heads x 256 x 256 float32, per layer


def _peak(tmp_path: Path, *options: str) -> tuple[str, dict]:
    proc, out = run_command_under_cli(tmp_path, sys.executable, str(PROGRAM), options=(*options,))
    (path,) = glob.glob(str(out / "*" / "leaks" / "peak.json"))
    doc = json.loads(Path(path).read_text())
    assert doc["schema"] == "msmemscope.leaks.peak/1"
    return proc.stderr, doc


def test_the_softmax_line_is_the_top_of_the_peak(tmp_path):
    stderr, doc = _peak(tmp_path)
    (device,) = doc["devices"]
    assert device["device"] == "cpu"
    peak = device["peak"]
    top = peak["lines"][0]
    assert (top["file"], top["line"], top["function"]) == (str(PROGRAM), SOFTMAX_LINE, "forward")
    # Four layers' softmax outputs, all kept for backward at the peak.
    assert top["bytes"] == 4 * SOFTMAX_BYTES, top
    assert top["blocks"] == 4, top
    assert "aten::_softmax" in top["ops"]
    # The module: each of the four layers' (the first three named, and more).
    assert top["modules"] == ["model.0", "model.1", "model.2"] and top["more_modules"], top
    assert top["source"] == "probs = torch.softmax(scores, dim=-1)  # the peak: kept for backward"
    # The lines listed and the rest add up to the peak.
    listed = sum(line["bytes"] for line in peak["lines"]) + peak["other_lines"]["bytes"]
    assert listed == peak["bytes"]
    # Every step's peak, and the run's is the highest of them.
    assert max(s["bytes"] for s in device["steps"]) == peak["bytes"]
    # The console: one block of at most 8 lines naming the line.
    block = stderr[stderr.index("====== Peak on device cpu") :].splitlines()
    shown = [line for line in block[1:] if line.startswith("  ")]
    assert 1 <= len(shown) <= 7, block
    assert shown[0].startswith(f"  [1] {PROGRAM}:{SOFTMAX_LINE} (forward): 32.0 MiB in 4 block(s)")


def test_the_owner_split_adds_up_to_the_peak(tmp_path):
    stderr, doc = _peak(tmp_path, "--analysis=leaks,decompose")
    peak = doc["devices"][0]["peak"]
    owners = {o["owner"]: o["bytes"] for o in peak["owners"]}
    assert sum(owners.values()) == peak["bytes"], owners
    # The kept softmax outputs are activations; the weights, Adam's state and gradients
    # are there too.
    assert owners["activation"] >= 4 * SOFTMAX_BYTES, owners
    assert {"weight", "optimizer_state"} <= owners.keys(), owners
    assert peak["phase"] in ("forward", "backward"), peak
    assert "  by owner: activation " in stderr, stderr


def test_check_peak_offline_is_the_online_peak(tmp_path):
    """``msmemscope.check_peak(dump)`` runs the same analysis over the dump's rows."""
    import msmemscope

    _, online = _peak(tmp_path)
    (dump,) = glob.glob(str(tmp_path / "out" / "*" / "device_cpu" / "dump" / "*.csv"))
    offline = msmemscope.check_peak(dump)
    assert offline == online["devices"]
    assert msmemscope.analyze("peak", input_path=dump) == offline
