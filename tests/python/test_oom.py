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


PROGRAM = """\
import torch
weights = [torch.ones(1000), torch.ones(5000)]
scratch = torch.ones(300)
try:
    huge = torch.empty(2**50)
except RuntimeError:
    print("caught")
"""


def test_failed_allocation_prints_one_summary_with_the_users_line(tmp_path):
    """One failure (the malloc hook's trigger and the tensor allocator's) is one summary on
    the console: the bytes asked for, the op, the user's line and its text, and the largest
    live sites; the same text is in the run's analysis_report.txt."""
    program = tmp_path / "fails.py"
    program.write_text(PROGRAM)
    out = subprocess.run(
        [CLI, "--analysis=oom:2", "-o", str(tmp_path / "out"), sys.executable, str(program)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "caught\n"
    expected = (
        "====== OOM: an allocation of 4.00 PiB (4503599627370496 bytes) failed on device cpu"
        " ======\n"
        f"  op aten::empty.memory_format at {program}:5 (<module>)\n"
        "      huge = torch.empty(2**50)\n"
    )
    assert expected in out.stderr, out.stderr
    assert out.stderr.count("====== OOM:") == 1, out.stderr
    assert (
        "  live then: 24.6 KiB (25200 bytes) in 3 block(s); the largest sites:\n"
        f"    {program}:2 (<module>): 23.4 KiB (24000 bytes) in 2 block(s)\n"
        f"    {program}:3 (<module>): 1.17 KiB (1200 bytes) in 1 block(s)\n"
    ) in out.stderr, out.stderr
    (report,) = glob.glob(str(tmp_path / "out" / "*" / "analysis_report.txt"))
    with open(report) as f:
        assert expected in f.read()
