"""take_snapshot: SNAPSHOT rows with the memory totals, under the real CLI."""

import csv
import glob
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.path.join(ROOT, "target", "release", "msmemscope-cli")

SCRIPT = """
import msmemscope
print(msmemscope.take_snapshot(name="after-init"))
"""


def test_snapshot_row_has_the_totals(tmp_path):
    out = subprocess.run(
        [CLI, "--analysis=none", "-o", str(tmp_path), sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "1\n"
    dump = glob.glob(str(tmp_path / "*" / "device_cpu" / "dump" / "*.csv"))[0]
    with open(dump, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["Event"] == "SNAPSHOT"]
    assert len(rows) == 1
    row = rows[0]
    assert (row["Event Type"], row["Name"], row["Device Id"]) == ("SNAPSHOT", "after-init", "cpu")
    attrs = json.loads(row["Attr"])
    assert list(attrs) == [
        "reserved",
        "max_reserved",
        "allocated",
        "max_allocated",
        "total",
        "free",
    ]
    assert attrs["reserved"] > 0 and attrs["total"] >= attrs["free"] > 0


def test_bad_arguments():
    import msmemscope

    with pytest.raises(TypeError, match="device_mask"):
        msmemscope.take_snapshot(device_mask="cpu")
    with pytest.raises(ValueError, match="negative"):
        msmemscope.take_snapshot(device_mask=-1)
    with pytest.raises(TypeError, match="name"):
        msmemscope.take_snapshot(name="")
