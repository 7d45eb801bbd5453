"""The ``module`` member of MALLOC rows (capture/modules.py): the qualified path of the
``nn.Module`` whose forward allocated the block, with the native capture and the fallback."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CLI, NEEDS_CLI_AND_TORCH, clean_env

pytestmark = NEEDS_CLI_AND_TORCH

SCRIPT = """
import torch

class Attn(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x.new_ones(64, 64) + x, dim=-1)

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attn()
    def forward(self, x):
        return self.attn(x) * 2

class Broken(torch.nn.Module):
    def forward(self, x):
        raise ValueError("on purpose")

class Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(), Block()])
    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

model = torch.nn.Sequential(Block(), Block())
outside = torch.zeros(64, 64, dtype=torch.float64)
with torch.no_grad():
    y = model(outside.float())
    try:
        Broken()(outside)
    except ValueError:
        pass
    after = torch.ones(64, 64, dtype=torch.float64)
    # A root held by no global: its class name; a ModuleList's layers by their index.
    def local():
        net = Stack()
        return net(torch.zeros(64, 64, dtype=torch.float16))
    local()
print("done")
"""


def dump_attrs(out: Path) -> list[dict]:
    [dump] = sorted(out.glob("msmemscope_*/device_cpu/dump/memscope_dump_*.csv"))
    with dump.open(newline="") as f:
        return [json.loads(r["Attr"]) for r in csv.DictReader(f) if r["Event"] == "MALLOC"]


@pytest.mark.parametrize("capture", ["native", "python"])
def test_blocks_name_the_module_whose_forward_allocated_them(tmp_path: Path, capture: str) -> None:
    program = tmp_path / "program.py"
    program.write_text(SCRIPT)
    out = tmp_path / "out"
    env = clean_env(OMP_NUM_THREADS="1", MSMEMSCOPE_TORCH_CAPTURE=capture)
    cmd = [str(CLI), "--analysis=none", "-o", str(out), sys.executable, str(program)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "tracker error" not in proc.stderr and "unavailable" not in proc.stderr, proc.stderr
    assert "Exception ignored" not in proc.stderr, proc.stderr
    rows = dump_attrs(out)

    # float32 64x64 blocks: made inside the attention modules' forward (ones, add, softmax) and
    # the blocks' own (the product).
    f32 = [a.get("module") for a in rows if a["size"] == 64 * 64 * 4]
    assert f32.count("model.0.attn") >= 3 and f32.count("model.1.attn") >= 3, f32
    assert "model.0" in f32 and "model.1" in f32, f32
    assert set(f32) <= {"model.0.attn", "model.1.attn", "model.0", "model.1", None}, f32
    # float64 64x64 blocks are made outside any forward (the one after Broken's exception too).
    f64 = [a for a in rows if a["size"] == 64 * 64 * 8]
    assert len(f64) == 2 and all("module" not in a for a in f64), f64
    # float16: a root no global holds, a ModuleList's layers.
    f16 = {a.get("module") for a in rows if a["size"] == 64 * 64 * 2}
    assert {"stack.layers.0.attn", "stack.layers.1.attn", "stack.layers.1"} <= f16, f16
    # The other members are intact: the row is one JSON object with the op and the site.
    inside = next(a for a in rows if a.get("module") == "model.1.attn")
    assert inside["op"].startswith("aten::") and "program.py:6 (forward)" in inside["site"]
