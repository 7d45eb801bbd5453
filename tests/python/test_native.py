"""The extension against a fake runtime library (tests/python/native/fake_runtime.c) that records
every call: finding and loading the library, and what crosses the C ABI."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from conftest import clean_env, ok, run_python
from msmemscope._native import ABI_VERSION

# Loads the fake through the package's own search (MSMEMSCOPE_RUNTIME_LIB), then gives the
# script `nat` (the extension), `fake` (ctypes view of the same library) and `journal()`.
PRELUDE = """
import ctypes, json, os, sys, warnings
import msmemscope
from msmemscope import _native as nat, _runtime
_runtime.native()
fake = ctypes.CDLL(os.environ["MSMEMSCOPE_RUNTIME_LIB"])
fake.fake_journal.restype = ctypes.c_char_p
def journal():
    return fake.fake_journal().decode().splitlines()
def set_int(name, value):
    ctypes.c_int.in_dll(fake, name).value = value
nat.configure(nat.default_config())
"""


def run_with_fake(lib: Path, code: str) -> str:
    env = clean_env(MSMEMSCOPE_RUNTIME_LIB=str(lib))
    return ok(run_python(PRELUDE + textwrap.dedent(code), env=env))


def test_loads_runtime_itself_when_not_preloaded(fake_libs: dict[str, Path]) -> None:
    out = run_with_fake(
        fake_libs["good"],
        "print(json.dumps([nat.runtime_loaded(), nat.runtime_preloaded(), nat.runtime_path()]))",
    )
    assert json.loads(out) == [True, False, str(fake_libs["good"])]


def test_finds_a_preloaded_runtime(fake_libs: dict[str, Path]) -> None:
    code = """
    import json
    from msmemscope import _native as nat
    print(json.dumps([nat.runtime_loaded(), nat.runtime_preloaded(), nat.runtime_path()]))
    """
    env = clean_env(LD_PRELOAD=str(fake_libs["good"]))
    assert json.loads(ok(run_python(code, env=env))) == [True, True, str(fake_libs["good"])]


def test_not_loaded_until_asked(fake_libs: dict[str, Path]) -> None:
    code = """
    from msmemscope import _native as nat
    print(nat.runtime_loaded())
    try:
        nat.start()
    except RuntimeError as e:
        print(e)
    """
    out = ok(run_python(code, env=clean_env(MSMEMSCOPE_RUNTIME_LIB=str(fake_libs["good"]))))
    assert out.splitlines() == [
        "False",
        "the msmemscope runtime library is not loaded: call load_runtime(path) first",
    ]


def test_other_abi_version_is_refused(fake_libs: dict[str, Path]) -> None:
    code = f"""
    from msmemscope import _native as nat
    try:
        nat.load_runtime({str(fake_libs["other_abi"])!r})
    except RuntimeError as e:
        print(e)
    print(nat.runtime_loaded())
    """
    out = ok(run_python(code)).splitlines()
    assert f"speaks ABI version 999, this msmemscope package speaks {ABI_VERSION}" in out[0]
    assert out[1] == "False"


def test_missing_functions_are_named(fake_libs: dict[str, Path]) -> None:
    code = f"""
    from msmemscope import _native as nat
    try:
        nat.load_runtime({str(fake_libs["incomplete"])!r})
    except RuntimeError as e:
        print(e)
    """
    out = ok(run_python(code))
    assert "does not export msmemscope_emit, msmemscope_tracing, msmemscope_configure" in out


def test_missing_library_names_every_path_tried(tmp_path: Path) -> None:
    missing = tmp_path / "nope.so"
    code = """
    import msmemscope
    try:
        msmemscope.start()
    except RuntimeError as e:
        print(e)
    """
    out = ok(run_python(code, env=clean_env(MSMEMSCOPE_RUNTIME_LIB=str(missing))))
    assert f"runtime library not found (tried {missing})" in out
    assert "MSMEMSCOPE_RUNTIME_LIB" in out


def test_emit_passes_every_field(fake_libs: dict[str, Path]) -> None:
    code = """
    attrs = {"size": 4096, "owner": "weights", "used": 2**63 + 1, "ok": True, "ratio": 0.5,
             "none": None, "shape": [2, 3]}
    print(nat.emit(nat.EVENT_MALLOC, nat.TYPE_PTA, "N/A", "cuda:3", 0xdead, attrs,
                   "a.py(1): f", True))
    print(nat.emit(nat.EVENT_MSTX, nat.TYPE_MARK, "hello", None, None, None))
    print(nat.emit(nat.EVENT_FREE, nat.TYPE_HOST, "", "cpu", 0, {}))
    print("\\n".join(journal()[1:]))
    """
    out = run_with_fake(fake_libs["good"], code).splitlines()
    attrs = (
        '{"size":4096,"owner":"weights","used":9223372036854775809,"ok":true,"ratio":0.5,'
        '"none":null,"shape":[2,3]}'
    )
    assert out == [
        "0",
        "0",
        "0",
        f"emit|1|2|N/A|2|3|1|57005|{attrs}|a.py(1): f|1",
        "emit|6|10|hello|0|0|0|0|||0",
        "emit|2|3||1|0|1|0|||0",
    ]


def test_emit_rejects_bad_arguments(fake_libs: dict[str, Path]) -> None:
    code = """
    cases = [
        (nat.EVENT_MALLOC, nat.TYPE_PTA, "", "gpu", None, None),
        (nat.EVENT_MALLOC, nat.TYPE_PTA, "", "cuda:", None, None),
        (nat.EVENT_MALLOC, nat.TYPE_PTA, "", "cpu", None, {"x": float("nan")}),
        (nat.EVENT_MALLOC, nat.TYPE_PTA, "", "cpu", None, {"x": object()}),
        (nat.EVENT_MALLOC, nat.TYPE_PTA, "", "cpu", None, {"x": [1, "a"]}),
        (nat.EVENT_MALLOC, nat.TYPE_PTA, "", "cpu", None, {1: 2}),
        (nat.EVENT_MALLOC, nat.TYPE_PTA, "", "cpu", None, {"x": 2**64}),
        (99, nat.TYPE_PTA, "", "cpu", None, None),
        (nat.EVENT_MALLOC, 99, "", "cpu", None, None),
    ]
    for args in cases:
        try:
            nat.emit(*args)
            print("accepted", args)
        except (ValueError, TypeError) as e:
            print(type(e).__name__, e)
    set_int("fake_emit_rc", -1)
    try:
        nat.emit(nat.EVENT_FREE, nat.TYPE_PTA, "", "cpu", 1, None)
    except RuntimeError as e:
        print("RuntimeError", e)
    """
    out = run_with_fake(fake_libs["good"], code).splitlines()
    assert out == [
        'ValueError invalid device "gpu": accepted values are cpu, cuda:N, or None',
        'ValueError invalid device "cuda:": accepted values are cpu, cuda:N, or None',
        'ValueError attribute "x": NaN is not a finite number',
        (
            'TypeError attribute "x": values must be int, float, str, bool, None or a list of'
            " ints, got object"
        ),
        'TypeError attribute "x": a list may hold only ints',
        "TypeError attribute names must be str",
        'ValueError attribute "x": the integer does not fit in 64 bits',
        "ValueError unknown event code 99",
        "ValueError unknown event type code 99",
        "RuntimeError msmemscope_emit rejected the event (FREE/PTA): code -1",
    ]


def test_config_configures_the_runtime(fake_libs: dict[str, Path]) -> None:
    code = """
    msmemscope.config(events="alloc\\uff0cfree", output_path="/tmp/o", analysis=["leaks"])
    config = json.loads(nat.current_config())
    print(config["events"], config["output_path"], config["analysis"])
    print(journal().count("configure"))
    """
    out = run_with_fake(fake_libs["good"], code).splitlines()
    assert out == ["['alloc', 'free'] /tmp/o ['leaks']", "2"]


def test_config_during_a_host_leak_window_warns_and_changes_nothing(
    fake_libs: dict[str, Path],
) -> None:
    code = """
    before = nat.current_config()
    set_int("fake_configure_rc", -2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        msmemscope.config(level="kernel")
    print(len(caught), caught[0].category.__name__, caught[0].filename == "<string>")
    print(caught[0].message)
    print(nat.current_config() == before)
    """
    out = run_with_fake(fake_libs["good"], code).splitlines()
    assert out[0] == "1 RuntimeWarning True"
    assert "no effect while a host-leak window is open" in out[1]
    assert out[2] == "True"


def test_config_errors_leave_the_runtime_untouched(fake_libs: dict[str, Path]) -> None:
    code = """
    for kw in ({"level": "foo"}, {"level": 1}, {"nope": "x"}):
        try:
            msmemscope.config(**kw)
        except (ValueError, TypeError) as e:
            print(type(e).__name__)
    print(journal().count("configure"))
    """
    assert run_with_fake(fake_libs["good"], code).splitlines() == [
        "ValueError",
        "TypeError",
        "ValueError",
        "1",
    ]


def test_start_with_host_leaks_needs_the_hooks(fake_libs: dict[str, Path]) -> None:
    code = """
    msmemscope.config(analysis="host-leaks")
    try:
        msmemscope.start()
    except ValueError as e:
        print(e)
    print("start" in journal())
    set_int("fake_hooks_active", 1)
    msmemscope.start()
    msmemscope.step()
    msmemscope.stop()
    print(journal()[-3:])
    """
    out = run_with_fake(fake_libs["good"], code).splitlines()
    assert "source msmemscope --load-api-env=host" in out[0]
    assert out[1] == "False"
    assert out[2] == "['start', 'step', 'stop']"


def test_runtime_error_codes_become_exceptions(fake_libs: dict[str, Path]) -> None:
    code = """
    for rc in (-2, -3, -4):
        set_int("fake_start_rc", rc)
        try:
            nat.start()
        except (ValueError, RuntimeError) as e:
            print(type(e).__name__, e)
    set_int("fake_configure_rc", -1)
    try:
        nat.configure(nat.default_config())
    except ValueError as e:
        print(type(e).__name__, e)
    """
    out = run_with_fake(fake_libs["good"], code).splitlines()
    assert out[0].startswith("ValueError a host-leak window is already open")
    assert out[1].startswith("ValueError host-leaks needs the host hooks: run `source msmemscope")
    assert out[2] == "RuntimeError msmemscope start failed with code -4"
    assert out[3] == "ValueError the runtime library rejected the configuration as invalid"
