"""The Python API against the real runtime library (target/release/libmsmemscope_runtime.so):
loading it without a preload, host-leak windows from Python under LD_PRELOAD (what
`source msmemscope --load-api-env=host` sets), and marks reaching the dump."""

from __future__ import annotations

import textwrap
from pathlib import Path

from conftest import (
    RUNTIME_LIB,
    clean_env,
    needs_runtime_abi,
    ok,
    run_python,
    unfreed_blocks_of_size,
)

pytestmark = needs_runtime_abi


def test_loads_the_runtime_itself_when_not_preloaded(tmp_path: Path) -> None:
    code = f"""
    import json, msmemscope
    from msmemscope import _native as nat
    print(nat.runtime_loaded())
    msmemscope.config(level="op", output_path={str(tmp_path)!r})
    print(nat.runtime_loaded(), nat.runtime_preloaded(), nat.host_hooks_active(), nat.tracing())
    print(nat.runtime_path().endswith("libmsmemscope_runtime.so"))
    print(json.loads(nat.current_config())["output_path"])
    """
    out = ok(run_python(code)).splitlines()
    assert out == ["False", "True False False False", "True", str(tmp_path)]


def test_host_leaks_without_the_preload_is_a_value_error(tmp_path: Path) -> None:
    code = f"""
    import msmemscope
    msmemscope.config(analysis=["host-leaks"], output_path={str(tmp_path)!r})
    try:
        msmemscope.start()
    except ValueError as e:
        print(e)
    """
    out = ok(run_python(code))
    assert "--load-api-env" in out and out.startswith("host-leaks needs the host hooks")


def test_two_host_leak_windows_each_report_their_own_leaks(tmp_path: Path) -> None:
    code = f"""
    import ctypes, warnings
    import msmemscope

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    kept = []

    def leak_first_window():
        for _ in range(7):
            kept.append(libc.malloc(1111))

    def leak_second_window():
        for _ in range(5):
            kept.append(libc.malloc(3333))

    msmemscope.config(analysis=["host-leaks"], output_path={str(tmp_path)!r})
    msmemscope.start()
    leak_first_window()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        msmemscope.config(host_leak_mode="event")
    print("warned:", len(caught))
    msmemscope.stop()
    msmemscope.start()
    leak_second_window()
    msmemscope.stop()
    """
    env = clean_env(LD_PRELOAD=str(RUNTIME_LIB))
    out = ok(run_python(textwrap.dedent(code), env=env, timeout=180))
    assert "warned: 1" in out
    run_dirs = list(tmp_path.glob("msmemscope_*_*"))
    assert len(run_dirs) == 1, run_dirs
    host_leak = run_dirs[0] / "host_leak"
    first = (host_leak / "leak_overview_1.txt").read_text()
    second = (host_leak / "leak_overview_2.txt").read_text()
    assert "stage=1" in first and "stage=2" in second
    assert unfreed_blocks_of_size(first, 1111) == 7, first
    assert unfreed_blocks_of_size(first, 3333) == 0, first
    assert unfreed_blocks_of_size(second, 3333) == 5, second
    assert unfreed_blocks_of_size(second, 1111) == 0, second
    # config() during the first window changed nothing: summary mode, no block detail.
    assert not list(host_leak.glob("block_detail_*.csv"))


def test_marks_from_python_reach_the_dump(tmp_path: Path) -> None:
    code = f"""
    import msmemscope
    from msmemscope import mstx
    msmemscope.config(output_path={str(tmp_path)!r})
    msmemscope.start()
    mstx.mark("hello from python")
    rid = mstx.range_start("step start")
    mstx.range_end(rid)
    msmemscope.stop()
    """
    ok(run_python(textwrap.dedent(code), timeout=120))
    dumps = list(tmp_path.glob("msmemscope_*/device_*/dump/memscope_dump_*.csv"))
    assert dumps, list(tmp_path.rglob("*"))
    text = "".join(p.read_text() for p in dumps)
    assert ",MSTX,Mark,hello from python," in text, text
    assert ",MSTX,Range_start,step start," in text, text
