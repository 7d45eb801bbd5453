"""Memory block watch (msmemscope.watcher, --watch): checksums and byte dumps around real
PyTorch ops on CPU, under the real CLI, checked against an independent CRC-64 and against the
bytes the test computes itself."""

from __future__ import annotations

import csv
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, clean_env, run_under_cli

CLI = REPO / "target" / "release" / "msmemscope-cli"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
STOMP = SCRIPTS / "watch_stomp.py"
OUTID = SCRIPTS / "watch_outid.py"

try:
    import torch

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

needs_cli = pytest.mark.skipif(not CLI.is_file(), reason=f"{CLI} is not built (scripts/setup.sh)")
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")


# --- an independent CRC-64 (bit by bit, from the definition) ------------------------------------
def crc64_reference(data: bytes) -> int:
    """CRC-64 with the reflected polynomial 0x42F0E1EBA9EA3693, init and xorout all ones."""
    poly = int(f"{0x42F0E1EBA9EA3693:064b}"[::-1], 2)  # the polynomial bit-reversed
    crc = (1 << 64) - 1
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ poly if crc & 1 else crc >> 1
    return crc ^ ((1 << 64) - 1)


def floats(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def crc_hex(data: bytes) -> str:
    return f"{crc64_reference(data):016x}"


# The watched block of watch_stomp.py (buf[8:16]) in its three states.
FRESH = floats(*[0.0] * 8)
AFTER_ALIAS_ADD = floats(0, 0, 0, 0, 1, 1, 1, 1)
AFTER_STOMP = floats(7, 7, 0, 0, 1, 1, 1, 1)
# The ops watch_stomp.py runs between watch() and remove(), with the block's state before and
# after each. The op name carries its call number since the watch began.
STOMP_OPS = [
    ("aten::ones.default_1", FRESH, FRESH),
    ("aten::add.Tensor_1", FRESH, FRESH),
    ("aten::slice.Tensor_1", FRESH, FRESH),
    ("aten::add_.Tensor_1", FRESH, AFTER_ALIAS_ADD),
    ("aten::mul.Tensor_1", AFTER_ALIAS_ADD, AFTER_ALIAS_ADD),
    ("aten::add_.Tensor_2", AFTER_ALIAS_ADD, AFTER_ALIAS_ADD),
    ("mswatch::stomp.default_1", AFTER_ALIAS_ADD, AFTER_STOMP),
    ("aten::sum.default_1", AFTER_STOMP, AFTER_STOMP),
]
ALIAS_LINE = (
    'msmemscope: watch: block "w" changed in aten::add_.Tensor (call 1); its schema writes it '
    "(argument self)"
)
STOMP_LINE = (
    'msmemscope: watch: block "w" changed in mswatch::stomp.default (call 1), whose schema does '
    "not write it"
)
FIRST_LINE = (
    'msmemscope: watch: first unexpected change: block "w" changed in mswatch::stomp.default '
    "(call 1), whose schema does not write it"
)


class Run:
    def __init__(self, proc: subprocess.CompletedProcess[str], out: Path):
        self.proc, self.out = proc, out
        dirs = sorted(out.glob("msmemscope_*"))
        assert len(dirs) == 1, f"{dirs}\n{proc.stderr}"
        self.run_dir = dirs[0]
        self.watch_dir = self.run_dir / "watch_dump"

    @property
    def summary(self) -> list[str]:
        return [line for line in self.proc.stderr.splitlines() if "msmemscope: watch:" in line]

    def csv_rows(self) -> list[tuple[str, str]]:
        files = sorted(self.watch_dir.glob("watch_dump_data_check_sum_cpu_*.csv"))
        assert len(files) == 1, f"{files}\n{self.proc.stderr}"
        assert re.fullmatch(r"watch_dump_data_check_sum_cpu_\d{14}\.csv", files[0].name)
        with files[0].open(newline="") as f:
            reader = csv.reader(f)
            assert next(reader) == ["Tensor info", "Check data sum"]
            return [tuple(row) for row in reader]

    def tids(self) -> set[str]:
        return {info.split("_")[1] for info, _ in self.csv_rows()}

    def without_tid(self) -> list[tuple[str, str]]:
        """Rows with the thread id taken out, so runs can be compared."""
        return [(re.sub(r"^cpu_\d+_", "cpu_", info), crc) for info, crc in self.csv_rows()]


def run_cli(tmp: Path, *options: str, script: Path = STOMP, args: tuple[str, ...] = ()) -> Run:
    return Run(*run_under_cli(tmp, *options, script=script, args=args))


def expected_rows(ops, name: str = "w", outid: int = 0) -> list[tuple[str, str]]:
    rows = []
    for op, before, after in ops:
        rows.append((f"cpu_{op}-{name}_{outid}_before", crc_hex(before)))
        rows.append((f"cpu_{op}-{name}_{outid}_after", crc_hex(after)))
    return rows


# --- the checksum itself -------------------------------------------------------------------------
def test_reference_crc_matches_the_published_check_value():
    assert crc64_reference(b"123456789") == 0x995DC9BBDF1939FA
    assert crc64_reference(b"") == 0


@needs_torch
def test_native_crc64_reads_memory_in_place_and_matches_the_reference():
    from msmemscope import _native

    vectors = [b"123456789", b"a", bytes(range(256)) * 5, b"\xff" * 1031, bytes(17)]
    for data in vectors:
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        assert _native.watch_crc64(t.data_ptr(), len(data)) == crc64_reference(data), data[:16]
        assert _native.watch_crc64_checked(t.data_ptr(), len(data)) == crc64_reference(data)
    # Unmapped memory is "not readable" for the checked reader, never a crash.
    assert _native.watch_crc64_checked(8, 16) is None
    assert _native.watch_crc64(0, 0) == 0


# --- under the CLI -------------------------------------------------------------------------------
@needs_cli
@needs_torch
def test_tensor_watch_changes_exactly_at_the_alias_write_and_the_stomping_op(tmp_path):
    run = run_cli(tmp_path, "--analysis=none", args=("tensor",))
    assert run.without_tid() == expected_rows(STOMP_OPS)
    assert len(run.tids()) == 1
    assert run.summary[:2] == [ALIAS_LINE, STOMP_LINE]
    assert 'msmemscope: watch: block "w": 8 op(s) dumped; stopped: removed' in run.summary
    assert FIRST_LINE in run.summary
    # The block was removed before w.mul_(3): nothing after the sum was dumped.
    assert not any("mul_" in info for info, _ in run.csv_rows())
    summary_file = (run.watch_dir / "watch_summary.txt").read_text().splitlines()
    assert [f"msmemscope: watch: {line}" for line in summary_file] == run.summary
    csv_file = next(run.watch_dir.glob("*.csv"))
    assert (
        f"msmemscope: watch: 1 file(s), {csv_file.stat().st_size} bytes written in "
        f"{run.watch_dir}" in run.summary
    )


@needs_cli
@needs_torch
def test_address_and_length_watch_gives_the_same_dumps_as_the_tensor(tmp_path):
    by_tensor = run_cli(tmp_path / "t", "--analysis=none", args=("tensor",))
    by_address = run_cli(tmp_path / "a", "--analysis=none", args=("address",))
    assert by_address.without_tid() == by_tensor.without_tid() == expected_rows(STOMP_OPS)
    assert by_address.summary[:2] == [ALIAS_LINE, STOMP_LINE]
    assert FIRST_LINE in by_address.summary


@needs_cli
@needs_torch
def test_dump_nums_limits_the_ops_dumped(tmp_path):
    run = run_cli(tmp_path, "--analysis=none", args=("tensor", "5"))
    assert run.without_tid() == expected_rows(STOMP_OPS[:5])
    assert 'msmemscope: watch: block "w": 5 op(s) dumped; stopped: dump_nums=5 reached' in (
        run.summary
    )
    # The stomp came after the fifth op: only the alias write was seen.
    assert ALIAS_LINE in run.summary and STOMP_LINE not in run.summary
    assert run.summary[-2] == (
        "msmemscope: watch: no unexpected change: every change came from an op whose schema "
        "writes the block"
    )


@needs_cli
@needs_torch
def test_full_content_dumps_the_exact_bytes_of_the_range(tmp_path):
    run = run_cli(
        tmp_path,
        "--analysis=none",
        "--watch=aten::add.Tensor,mswatch::stomp.default,full-content",
        args=("tensor",),
    )
    files = sorted(p.name for p in run.watch_dir.glob("*.bin"))
    tid = re.match(r"cpu_(\d+)_", files[0]).group(1)
    in_range = STOMP_OPS[1:7]  # from the first aten::add.Tensor to the stomp, both included
    expected = {}
    for op, before, after in in_range:
        # With --watch the calls count from the start of tracking: the script's two slices
        # before watch() count too.
        op = op.replace("aten::slice.Tensor_1", "aten::slice.Tensor_3")
        expected[f"cpu_{tid}_{op}-w_0_before.bin"] = before
        expected[f"cpu_{tid}_{op}-w_0_after.bin"] = after
    # After remove(), `e = c + 1` opens the range again; with no block registered it watches
    # what that start op returned: e = (ones + 1) * 2 + 1 + 1.
    expected[f"cpu_{tid}_aten::add.Tensor_2-aten::add.Tensor_0_after.bin"] = floats(*[6.0] * 8)
    assert files == sorted(expected)
    for name, data in expected.items():
        assert (run.watch_dir / name).read_bytes() == data, name
    assert not list(run.watch_dir.glob("*.csv"))
    assert STOMP_LINE in run.summary and FIRST_LINE in run.summary
    total = sum(len(d) for d in expected.values())
    assert (
        f"msmemscope: watch: {len(expected)} file(s), {total} bytes written in {run.watch_dir}"
        in run.summary
    )


@needs_cli
@needs_torch
def test_cli_range_without_python_watches_the_start_ops_output(tmp_path):
    run = run_cli(
        tmp_path, "--analysis=none", "--watch=aten::mul.Tensor,aten::sum.default", args=("none",)
    )
    c = floats(*[4.0] * 8)  # (ones + 1) * 2
    c_plus = floats(*[5.0] * 8)  # after c.add_(1)
    name = "aten::mul.Tensor"
    assert run.without_tid() == [
        (f"cpu_aten::mul.Tensor_1-{name}_0_after", crc_hex(c)),
        *expected_rows(
            [
                ("aten::add_.Tensor_2", c, c_plus),
                ("mswatch::stomp.default_1", c_plus, c_plus),
                ("aten::sum.default_1", c_plus, c_plus),
            ],
            name=name,
        ),
    ]
    assert run.summary[0] == (
        'msmemscope: watch: block "aten::mul.Tensor" changed in aten::add_.Tensor (call 2); its '
        "schema writes it (argument self)"
    )
    assert (
        'msmemscope: watch: block "aten::mul.Tensor": 4 op(s) dumped; stopped: the watch range '
        "closed" in run.summary
    )


@needs_cli
@needs_torch
def test_outid_picks_one_output_of_a_list_returning_start_op(tmp_path):
    run = run_cli(
        tmp_path, "--analysis=none", "--watch=aten::split.Tensor:1,aten::mul_.Tensor", script=OUTID
    )
    piece = floats(4, 5, 6, 7)
    name = "aten::split.Tensor"
    assert run.without_tid() == [
        (f"cpu_aten::split.Tensor_1-{name}_1_after", crc_hex(piece)),
        *expected_rows(
            [
                ("aten::add_.Tensor_1", piece, piece),
                ("aten::mul_.Tensor_1", piece, floats(8, 10, 12, 14)),
            ],
            name=name,
            outid=1,
        ),
    ]


@needs_cli
@needs_torch
def test_a_start_op_that_never_ran_is_reported(tmp_path):
    run = run_cli(tmp_path, "--analysis=none", "--watch=aten::mul,aten::sum", args=("none",))
    assert run.summary[0] == (
        'msmemscope: watch: start op "aten::mul" never ran (ops that ran: aten::mul.Tensor), so '
        "nothing was watched; op names are written as in the dump's OP_LAUNCH rows "
        "(aten::add_.Tensor)"
    )
    assert not run.watch_dir.exists() or not list(run.watch_dir.glob("*.csv"))

    open_to_the_end = run_cli(
        tmp_path / "end", "--analysis=none", "--watch=aten::mul.Tensor,aten::nosuch", args=("none",)
    )
    assert open_to_the_end.summary[0] == (
        'msmemscope: watch: end op "aten::nosuch" never ran: the range stayed open to the end'
    )
    # Every op from the start op's after to the end of the program was dumped.
    assert open_to_the_end.without_tid()[-1][0] == (
        "cpu_aten::add.Tensor_2-aten::mul.Tensor_0_after"
    )


# --- the Python API without the CLI -------------------------------------------------------------
API_SCRIPT = """
import sys, torch, msmemscope
from msmemscope import watcher
msmemscope.config(output_path=sys.argv[1], analysis="none")
msmemscope.start()
t = torch.zeros(4)
watcher.watch(t, name="api")
t.add_(2)
watcher.remove(name="api")
t.add_(2)
"""


@needs_torch
def test_api_mode_writes_into_the_run_directory_of_the_runtime(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", API_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(OMP_NUM_THREADS="1"),
    )
    assert result.returncode == 0, result.stderr
    (csv_file,) = tmp_path.glob("msmemscope_*/watch_dump/watch_dump_data_check_sum_cpu_*.csv")
    with csv_file.open(newline="") as f:
        rows = list(csv.reader(f))[1:]
    assert [(re.sub(r"_\d+_", "_T_", info, count=1), crc) for info, crc in rows] == [
        ("cpu_T_aten::add_.Tensor_1-api_0_before", crc_hex(floats(0, 0, 0, 0))),
        ("cpu_T_aten::add_.Tensor_1-api_0_after", crc_hex(floats(2, 2, 2, 2))),
    ]


MISUSE = """
import torch
from msmemscope import watcher

t = torch.arange(8.0)
cases = {
    "no name": lambda: watcher.watch(t),
    "long name": lambda: watcher.watch(t, name="x" * 65),
    "slash": lambda: watcher.watch(t, name="a/b"),
    "name type": lambda: watcher.watch(t, name=3),
    "dump_nums 0": lambda: watcher.watch(t, name="n", dump_nums=0),
    "dump_nums str": lambda: watcher.watch(t, name="n", dump_nums="2"),
    "length with tensor": lambda: watcher.watch(t, length=8, name="n"),
    "address without length": lambda: watcher.watch(t.data_ptr(), name="n"),
    "length past storage": lambda: watcher.watch(t.data_ptr() + 8, length=32, name="n"),
    "zero length": lambda: watcher.watch(t.data_ptr(), length=0, name="n"),
    "unmapped": lambda: watcher.watch(16, length=8, name="n"),
    "non contiguous": lambda: watcher.watch(t.view(2, 4).t(), name="n"),
    "meta": lambda: watcher.watch(torch.empty(4, device="meta"), name="n"),
    "not a block": lambda: watcher.watch("t", name="n"),
    "remove unknown name": lambda: watcher.remove(name="nope"),
    "remove unwatched": lambda: watcher.remove(t),
}
for label, case in cases.items():
    try:
        case()
        print(f"{label}: accepted")
    except (TypeError, ValueError) as exc:
        print(f"{label}: {type(exc).__name__}: {exc}")
watcher.watch(t, name="dup")
try:
    watcher.watch(t[:4], name="dup")
except ValueError as exc:
    print(f"duplicate: {exc}")
"""


@needs_cli
@needs_torch
def test_misuse_raises_one_clear_error_each(tmp_path):
    script = tmp_path / "misuse.py"
    script.write_text(MISUSE)
    run = run_cli(tmp_path, "--analysis=none", script=script)
    lines = dict(line.split(": ", 1) for line in run.proc.stdout.splitlines())
    for label, expected in {
        "no name": 'TypeError: watch() needs name="..."',
        "long name": "ValueError: name must have 1 to 64 characters, not 65",
        "slash": "ValueError: name 'a/b' must not contain '/'",
        "name type": "TypeError: name must be a str, not int",
        "dump_nums 0": "ValueError: dump_nums must be at least 1",
        "dump_nums str": "TypeError: dump_nums must be an int or None, not str",
        "length with tensor": "TypeError: with length=, the block is given by its address",
        "address without length": "TypeError: watching an address needs length=",
        "length past storage": "ValueError: length 32 runs past the end of the tensor storage",
        "zero length": "ValueError: length must be at least 1 byte, not 0",
        "unmapped": "ValueError: 0x10 + 8 bytes is not readable memory of this process",
        "non contiguous": "ValueError: the tensor (shape (4, 2), strides (1, 4)) is not contiguous",
        "meta": "ValueError: a tensor on meta has no memory msmemscope can read",
        "not a block": "TypeError: watch() takes a torch.Tensor or an int address",
        "remove unknown name": "ValueError: no block named 'nope' is watched; watched: none",
        "remove unwatched": "ValueError: 0x",
    }.items():
        assert lines[label].startswith(expected), (label, lines[label])
    assert "the storage (32 bytes at 0x" in lines["length past storage"]
    assert "has 24 bytes from that address" in lines["length past storage"]
    assert lines["duplicate"].startswith('a block named "dup" is watched already')


LIFETIMES = """
import numpy as np
import torch
from msmemscope import watcher

t = torch.ones(1024)
watcher.watch(t, name="freed")
t.add_(1)
del t  # the storage dies: its watch ends at the next op, and no memory is read after
x = torch.zeros(1024)
x.add_(1)

a = np.zeros(16, dtype=np.float32)  # memory no tensor op made: read through the checked path
watcher.watch(a.ctypes.data, length=a.nbytes, name="numpy")
torch.from_numpy(a).add_(3)
watcher.remove(a.ctypes.data, length=a.nbytes)
"""


@needs_cli
@needs_torch
def test_freed_storage_ends_the_watch_and_untracked_memory_is_read_checked(tmp_path):
    script = tmp_path / "lifetimes.py"
    script.write_text(LIFETIMES)
    run = run_cli(tmp_path, "--analysis=none", script=script)
    rows = run.without_tid()
    freed = [r for r in rows if r[0].endswith(("-freed_0_before", "-freed_0_after"))]
    assert freed == expected_rows(
        [("aten::add_.Tensor_1", floats(*[1.0] * 1024), floats(*[2.0] * 1024))], name="freed"
    )
    numpy_rows = [r for r in rows if "-numpy_0_" in r[0]]
    zeros, threes = floats(*[0.0] * 16), floats(*[3.0] * 16)
    assert numpy_rows == expected_rows(
        [("aten::lift_fresh.default_1", zeros, zeros), ("aten::add_.Tensor_2", zeros, threes)],
        name="numpy",
    )
    assert (
        'msmemscope: watch: block "freed": 1 op(s) dumped; stopped: its storage was freed or '
        "shrank" in run.summary
    )
    assert 'msmemscope: watch: block "numpy": 2 op(s) dumped; stopped: removed' in run.summary
    assert (
        'msmemscope: watch: block "numpy" changed in aten::add_.Tensor (call 2); its schema '
        "writes it (argument self)" in run.summary
    )


@needs_torch
def test_device_blocks_are_copied_to_the_host_byte_for_byte():
    # The CUDA path's copy, run on a CPU storage: the same bytes from the same offset.
    from msmemscope.watch.state import _host_copy

    t = torch.arange(16, dtype=torch.float32)
    host = _host_copy(t.untyped_storage(), 8, 20)
    assert bytes(host.numpy()) == struct.pack("<16f", *range(16))[8:28]


BETWEEN = """
import torch
from msmemscope import watcher

x = torch.zeros(4)
w = torch.zeros(4)
watcher.watch(w, name="w")
x.add_(1)
w.numpy()[0] = 9.0  # a write no ATen op makes: seen as a change between two ops
x.mul_(2)
"""


@needs_cli
@needs_torch
def test_a_change_between_two_ops_is_the_first_unexpected_one(tmp_path):
    script = tmp_path / "between.py"
    script.write_text(BETWEEN)
    run = run_cli(tmp_path, "--analysis=none", script=script)
    zeros, nine = floats(0, 0, 0, 0), floats(9, 0, 0, 0)
    assert run.without_tid() == expected_rows(
        [
            ("aten::add_.Tensor_1", zeros, zeros),
            ("aten::detach.default_1", zeros, zeros),  # w.numpy() detaches first
            ("aten::mul_.Tensor_1", nine, nine),
        ]
    )
    between = (
        'block "w" changed between aten::detach.default (call 1) and aten::mul_.Tensor (call 1), '
        "outside every op msmemscope saw"
    )
    assert run.summary[0] == f"msmemscope: watch: {between}"
    assert f"msmemscope: watch: first unexpected change: {between}" in run.summary
