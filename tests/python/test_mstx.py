"""msmemscope.mstx: argument checks (before any runtime is needed) and the calls that reach the
runtime library's MSTX C API (through the fake runtime)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from conftest import clean_env, ok, run_python
from msmemscope import mstx


@pytest.mark.parametrize("call", [mstx.mark, mstx.range_start])
@pytest.mark.parametrize(
    ("message", "error", "text"),
    [
        (None, TypeError, "message must be a str, got NoneType"),
        (b"bytes", TypeError, "message must be a str, got bytes"),
        (3, TypeError, "message must be a str, got int"),
        ("", ValueError, "message must not be empty"),
        ("a\0b", ValueError, "message must not contain a NUL character"),
    ],
)
def test_message_is_checked(call, message: object, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        call(message)


@pytest.mark.parametrize(
    ("stream", "error", "text"),
    [
        ("s", TypeError, "stream must be None, an int handle or a stream object, got str"),
        (True, TypeError, "got bool"),
        (-1, ValueError, "stream handle -1 is not a 64-bit pointer value"),
        (2**64, ValueError, "is not a 64-bit pointer value"),
    ],
)
def test_stream_is_checked(stream: object, error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        mstx.mark("m", stream)


def test_range_end_checks_the_id() -> None:
    with pytest.raises(TypeError, match="range_id must be an int, got str"):
        mstx.range_end("1")
    with pytest.raises(ValueError, match="unknown range id 12345: not returned by range_start"):
        mstx.range_end(12345)
    mstx.range_end(0)  # the id of a range the runtime did not open: nothing to end


def test_marks_and_ranges_reach_the_c_api(fake_libs: dict[str, Path]) -> None:
    code = """
    import ctypes, os
    from msmemscope import mstx

    class Stream:
        cuda_stream = 0x1234

    mstx.mark("hello")
    mstx.mark("on a stream", Stream())
    first = mstx.range_start("step start", 0x10)
    second = mstx.range_start("inner")
    mstx.range_end(second)
    mstx.range_end(first)
    try:
        mstx.range_end(first)
    except ValueError as e:
        print(e)
    fake = ctypes.CDLL(os.environ["MSMEMSCOPE_RUNTIME_LIB"])
    fake.fake_journal.restype = ctypes.c_char_p
    print(fake.fake_journal().decode(), end="")
    """
    env = clean_env(MSMEMSCOPE_RUNTIME_LIB=str(fake_libs["good"]))
    out = ok(run_python(textwrap.dedent(code), env=env)).splitlines()
    assert out == [
        "unknown range id 1: not returned by range_start() or already ended",
        "mark|hello|(nil)",
        "mark|on a stream|0x1234",
        "range_start|step start|0x10",
        "range_start|inner|(nil)",
        "range_end|2",
        "range_end|1",
    ]
