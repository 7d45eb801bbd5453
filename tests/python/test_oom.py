"""The OOM analysis on a real CPU tensor allocation that fails: trigger rows name the op and
the requested size, the live blocks follow, and the program's own exception is unchanged."""

import csv
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.path.join(ROOT, "target", "release", "msmemscope-cli")

SCRIPT = """
import torch
keep = [torch.ones(1000), torch.ones(5000), torch.ones(300)]
try:
    torch.empty(2**50)
except RuntimeError as e:
    print("caught", "can't allocate memory" in str(e))
"""


def test_failed_tensor_allocation_is_dumped(tmp_path):
    out = subprocess.run(
        [CLI, "--analysis=oom:2", "-o", str(tmp_path), sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "caught True\n"
    dump = glob.glob(str(tmp_path / "*" / "device_cpu" / "dump" / "*.csv"))[0]
    with open(dump, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["Event"] in ("OOM_DETAIL", "SNAPSHOT")]
    triggers = [r for r in rows if r["Event Type"] == "OOM_TRIGGER"]
    requested = 4 * 2**50
    op = [json.loads(r["Attr"]) for r in triggers if r["Name"] == "aten::empty.memory_format"]
    assert len(op) == 1
    assert op[0]["func"] == "aten::empty.memory_format"
    assert op[0]["req_size"] == requested
    assert "can't allocate memory" in op[0]["error"]
    # The allocator's own failed request (posix_memalign under c10) triggers too, first.
    assert json.loads(triggers[0]["Attr"])["req_size"] == requested
    top = [json.loads(r["Attr"])["size"] for r in rows if r["Event Type"] == "OOM_TOP_ALLOC"]
    assert top == [20000, 4000]
    recent = [json.loads(r["Attr"])["size"] for r in rows if r["Event Type"] == "OOM_RECENT_ALLOC"]
    assert recent == [1200, 20000]
    snapshot = [json.loads(r["Attr"]) for r in rows if r["Event"] == "SNAPSHOT"]
    assert snapshot[0]["allocated"] == 25200
