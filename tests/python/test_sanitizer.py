"""The stream-race sanitizer from Python: the mark parser's rules with their exact messages,
marks from a Python script run under the real CLI (race reported with both operators, none
with the synchronization), ``enable_npu_sanitizer()`` on a machine without CUDA, and the bridge
that hands marks from Python and from C (``mstxMarkA``) to PyTorch's CUDA sanitizer, exercised
with its real (pure Python) event handler."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, clean_env, needs_runtime_abi, ok, run_python
from msmemscope import sanitizer

CLI = REPO / "target" / "release" / "msmemscope-cli"
SCRIPT = Path(__file__).resolve().parent / "scripts" / "sanitizer_streams.py"
FORMAT = "sanitizer-op: name=<operator>;read=<alias:addr:size>,...;write=<alias:addr:size>,..."

# ------------------------------------------------------------------------------------------
# The parser (core's, through the extension)


def test_the_original_example_parses() -> None:
    assert sanitizer.parse_mark(
        "sanitizer-op: name=my_ext.my_fused_op;read=input_a:0x7f00:1024,input_b:0x7f04:512;"
        "write=output:0x7f08:2048"
    ) == {
        "name": "my_ext.my_fused_op",
        "read_only": [("input_a", 0x7F00, 1024), ("input_b", 0x7F04, 512)],
        "read_write": [],
        "write_only": [("output", 0x7F08, 2048)],
    }


def test_decimal_hex_in_place_and_optional_fields() -> None:
    assert sanitizer.parse_mark(
        "sanitizer-op:write=x:4096:0x40,o:0X2000:8;name=ns::add_;read=x:0x1000:64"
    ) == {
        "name": "ns::add_",
        "read_only": [],
        "read_write": [("x", 4096, 64)],
        "write_only": [("o", 0x2000, 8)],
    }
    assert sanitizer.parse_mark("sanitizer-op: name=noop") == {
        "name": "noop",
        "read_only": [],
        "read_write": [],
        "write_only": [],
    }


NAME_RULE = "an operator name cannot contain `,`, `=`, `;` or whitespace"
NOT_A_NUMBER = "is neither decimal nor 0x-prefixed hexadecimal"
PARTS = "`:`-separated parts; expected alias:addr:size"
REJECTED = [
    ("sanitizer op: name=x", "column 1: the message does not start with `sanitizer-op:`"),
    (
        "sanitizer-op: name=x;read",
        "column 22: field `read` has no `=`; fields are name=, read=, write=",
    ),
    (
        "sanitizer-op: name=x;size=3",
        "column 22: unknown field `size`; fields are name, read, write",
    ),
    ("sanitizer-op: name=x;name=y", "column 22: field `name` is given twice"),
    ("sanitizer-op: read=a:1:1", "column 25: field `name=<operator>` is missing"),
    (
        "sanitizer-op: name=x;;read=a:1:1",
        "column 22: empty field (`;` twice in a row, or at the start or end)",
    ),
    ("sanitizer-op: name=a,b", f"column 21: `name` contains `,`; {NAME_RULE}"),
    ("sanitizer-op: name=my op", f"column 22: `name` contains the character ' '; {NAME_RULE}"),
    (
        "sanitizer-op: name=x;read=a:1:1,",
        "column 33: empty item in `read` (`,` twice in a row, or at the start or end)",
    ),
    ("sanitizer-op: name=x;read=a:1", f"column 27: item `a:1` of `read` has 2 {PARTS}"),
    ("sanitizer-op: name=x;write=a:1:2:3", f"column 28: item `a:1:2:3` of `write` has 4 {PARTS}"),
    ("sanitizer-op: name=x;read=a:(nil):4", f"column 29: address `(nil)` of `a` {NOT_A_NUMBER}"),
    (
        "sanitizer-op: name=x;read=a:0x10000000000000000:4",
        "column 29: address `0x10000000000000000` of `a` does not fit in 64 bits",
    ),
    ("sanitizer-op: name=x;write=out:16:1k", f"column 35: size `1k` of `out` {NOT_A_NUMBER}"),
    (
        "sanitizer-op: name=x;write=out:0xffffffffffffff00:0x100",
        (
            "column 32: the range of `out` (0xffffffffffffff00 + 256 bytes) passes the end of the "
            "64-bit address space"
        ),
    ),
    (
        f"sanitizer-op: name=x;read={'a' * 32}:1:1",
        f"column 27: alias `{'a' * 32}` is 32 bytes; aliases must be shorter than 32 bytes",
    ),
    (
        "sanitizer-op: name=" + "n" * 1006,
        "column 1025: the message is 1025 bytes; at most 1024 are accepted",
    ),
]


@pytest.mark.parametrize(("message", "reason"), REJECTED)
def test_rejected_marks_name_column_and_rule(message: str, reason: str) -> None:
    with pytest.raises(ValueError) as e:
        sanitizer.parse_mark(message)
    assert str(e.value) == f"invalid sanitizer-op mark: {reason}"


def test_limits_are_inclusive_where_the_original_says_so() -> None:
    assert sanitizer.parse_mark(f"sanitizer-op: name=x;read={'a' * 31}:1:1")["read_only"] == [
        ("a" * 31, 1, 1)
    ]
    message = "sanitizer-op: name=" + "n" * 1005
    assert len(message) == 1024
    assert sanitizer.parse_mark(message)["name"] == "n" * 1005


def test_parse_mark_wants_a_str() -> None:
    with pytest.raises(TypeError, match="message must be a str, got bytes"):
        sanitizer.parse_mark(b"sanitizer-op: name=x")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------
# Marks from a Python script under the CLI


def run_script(tmp_path: Path, mode: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "out"
    cmd = [str(CLI), "-o", str(out), sys.executable, str(SCRIPT), mode]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=clean_env()
    )
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    (report,) = out.glob("msmemscope_*/sanitizer/race_report_*.txt")
    return proc, report


@pytest.mark.skipif(not CLI.is_file(), reason=f"{CLI} is not built (scripts/setup.sh)")
def test_python_marks_on_two_streams_race(tmp_path: Path) -> None:
    proc, report = run_script(tmp_path, "race")
    ptr, nbytes = (int(v) for v in re.fullmatch(r"ptr=(\d+) bytes=(\d+)\n", proc.stdout).groups())
    half, end = ptr + nbytes // 2, ptr + nbytes
    text = report.read_text()
    assert text == (
        "====== msmemscope sanitizer: 1 possible data race between streams (1 occurrence) ======\n"
        f"Race 1 (1 occurrence) on memory [{half:#x}, {end:#x}) (2048 bytes):\n"
        f"  write by stream 0x16 in operator demo.py_overwrite, argument dst "
        f"([{half:#x}, {end:#x}), 2048 bytes)\n"
        "  not ordered after the earlier\n"
        f"  write by stream 0xb in operator demo.py_produce, argument out "
        f"([{ptr:#x}, {end:#x}), 4096 bytes)\n"
        "====== SUMMARY: 1 race, 2 sanitizer-op marks checked, 0 malformed marks skipped ======\n"
    )
    assert text in proc.stderr
    assert f"msmemscope: sanitizer report: {report}\n" in proc.stderr


@pytest.mark.skipif(not CLI.is_file(), reason=f"{CLI} is not built (scripts/setup.sh)")
def test_python_marks_with_event_record_and_wait_do_not_race(tmp_path: Path) -> None:
    proc, report = run_script(tmp_path, "sync")
    expected = (
        "====== msmemscope sanitizer: no data race between streams in 2 sanitizer-op marks ======\n"
    )
    assert report.read_text() == expected
    assert expected in proc.stderr
    assert "possible data race" not in proc.stderr


# ------------------------------------------------------------------------------------------
# The Python API without the launcher


@needs_runtime_abi
def test_enable_without_cuda_warns_and_the_native_checker_reports(tmp_path: Path) -> None:
    result = run_python(
        f"""
        import warnings
        import msmemscope
        from msmemscope import mstx, sanitizer
        msmemscope.config(output_path={str(tmp_path)!r})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            msmemscope.enable_npu_sanitizer()
        for w in caught:
            print(w.category.__name__, w.message)
        assert msmemscope.enable_sanitizer is msmemscope.enable_npu_sanitizer
        mstx.mark("sanitizer-op: name=k1;write=o:0x1000:64", 1)
        mstx.mark("sanitizer-op: name=k2;read=i:0x1020:64", 2)
        mstx.mark("sanitizer-op: name=k3;read=i:0x1020", 2)
        print(sanitizer.report(), end="")
        """
    )
    out = ok(result)
    assert out == (
        "RuntimeWarning CUDA is not available: PyTorch's CUDA sanitizer is not enabled; "
        "msmemscope's own race checker analyses the sanitizer-op marks\n"
        "====== msmemscope sanitizer: 1 possible data race between streams (1 occurrence) ======\n"
        "Race 1 (1 occurrence) on memory [0x1020, 0x1040) (32 bytes):\n"
        "  read by stream 0x2 in operator k2, argument i ([0x1020, 0x1060), 64 bytes)\n"
        "  not ordered after the earlier\n"
        "  write by stream 0x1 in operator k1, argument o ([0x1000, 0x1040), 64 bytes)\n"
        "====== SUMMARY: 1 race, 2 sanitizer-op marks checked, 1 malformed mark skipped ======\n"
    )
    # The malformed mark: one warning line; at exit the report goes to stderr and its file.
    warnings = [line for line in result.stderr.splitlines() if "warning:" in line]
    assert warnings == [
        (
            "msmemscope: warning: skipped a malformed sanitizer-op mark: column 28: item "
            f"`i:0x1020` of `read` has 2 {PARTS} (format: {FORMAT})"
        )
    ]
    (report,) = tmp_path.glob("msmemscope_*/sanitizer/race_report_*.txt")
    assert "operator k2, argument i" in report.read_text()
    assert report.read_text() in result.stderr
    assert f"msmemscope: sanitizer report: {report}\n" in result.stderr


@needs_runtime_abi
def test_python_misuse_raises_clear_errors(tmp_path: Path) -> None:
    out = ok(
        run_python(
            """
            from msmemscope import sanitizer, _runtime
            for call in (
                lambda: sanitizer.event_record("e", 1),
                lambda: sanitizer.stream_wait_event(1.5, 2),
                lambda: sanitizer.stream_synchronize(-1),
                lambda: sanitizer.stream_synchronize(True),
                lambda: _runtime.native().sanitizer_sync(9),
                lambda: _runtime.native().sanitizer_enable(42),
            ):
                try:
                    call()
                except (TypeError, ValueError) as e:
                    print(type(e).__name__, e)
            """,
            # The checker, once on, writes its report into ./memscopeDumpResults at exit.
            cwd=tmp_path,
        )
    )
    assert out.splitlines() == [
        "TypeError event must be an int handle or an event object, got str",
        "TypeError stream must be an int handle or a stream object, got float",
        "ValueError stream handle -1 is not a 64-bit pointer value",
        "TypeError stream must be an int handle or a stream object, got bool",
        "ValueError unknown synchronization kind 9: accepted are 1 to 5",
        "TypeError forward must be callable or None, got int",
    ]


# ------------------------------------------------------------------------------------------
# The bridge to torch.cuda._sanitizer, with its real event handler on CPU

BRIDGE = """
import ctypes, sys
from torch.cuda import _sanitizer as csan
from msmemscope import mstx, sanitizer, _runtime

# What enable_npu_sanitizer() sets up where CUDA exists, with the CUDA sanitizer's own (pure
# Python) event handler: every well-formed mark goes from the runtime to it.
sanitizer._csan_handler = csan.EventHandler()
_runtime.native().sanitizer_enable(sanitizer._forward_to_csan)

# From Python, and from C: mstxMarkA called directly, as a C++ extension would.
libc_mark = ctypes.CDLL(None).mstxMarkA
libc_mark.argtypes = (ctypes.c_char_p, ctypes.c_void_p)
mstx.mark("sanitizer-op: name=ext.py_op;write=out:4096:256", 7)
if SYNC:
    sanitizer.event_record(5, 7)
    sanitizer.stream_wait_event(8, 5)
libc_mark(b"sanitizer-op: name=ext.c_op;read=in:0x1000:256", 8)
print("done")
"""


@needs_runtime_abi
@pytest.mark.parametrize("sync", [False, True])
def test_marks_from_python_and_c_reach_the_cuda_sanitizer(sync: bool, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    result = run_python(f"SYNC = {sync}\n" + BRIDGE, cwd=tmp_path)
    assert ok(result) == "done\n"
    csan_lines = [line for line in result.stderr.splitlines() if "CSAN" in line]
    if sync:
        assert csan_lines == []
        assert "ext.c_op" not in result.stderr
    else:
        assert csan_lines == ["CSAN detected a possible data race on tensor with data pointer 4096"]
        assert "Access by stream 8 during kernel:\next.c_op\nreading from argument(s) in" in (
            result.stderr
        )
        assert (
            "Previous access by stream 7 during kernel:\next.py_op\nwriting to argument(s) out"
            in (result.stderr)
        )
