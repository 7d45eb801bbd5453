"""The pytest plugin (python/msmemscope/pytest_plugin/): its markers' arguments and accounting
in-process, and real pytest sessions in subprocesses over a small suite written into tmp_path
(tests that keep a tensor, free their tensors, peak high, peak low, keep host memory), with the
real torch on CPU: exactly the breaking tests fail, each message naming the exact bytes and the
allocating line of the suite."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import CLI, HAVE_TORCH, REPO, RUNTIME_LIB, clean_env, needs_runtime_abi
from msmemscope.pytest_plugin.limits import (
    DeviceSelector,
    MarkerError,
    format_bytes,
    parse_device,
    parse_size,
    plan_for,
)
from msmemscope.pytest_plugin.usage import SiteNamer, TensorUsage, parse_rows

NEEDS_TORCH = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
HAVE_XDIST = importlib.util.find_spec("xdist") is not None

# --- sizes, devices, plans (in-process) --------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "size"),
    [
        ("0 B", 0),
        ("64 KB", 64_000),
        ("64KB", 64_000),
        ("1 MB", 1_000_000),
        ("1.5 MB", 1_500_000),
        ("2 GB", 2_000_000_000),
        ("1 KiB", 1024),
        ("1 MiB", 1 << 20),
        ("0.5 GiB", 1 << 29),
        (" 3 mb ", 3_000_000),
        (4096, 4096),
    ],
)
def test_sizes_in_decimal_and_binary_units(written: object, size: int) -> None:
    assert parse_size(written) == size


@pytest.mark.parametrize("written", ["12 parsecs", "1", "MB", "-1 MB", "1 M B", 1.5, True, None])
def test_a_malformed_size_is_refused_naming_it_and_the_forms(written: object) -> None:
    with pytest.raises(MarkerError) as info:
        parse_size(written)
    assert repr(written) in str(info.value)
    assert "KB, MB, GB" in str(info.value) and "KiB, MiB" in str(info.value)


def test_devices() -> None:
    assert parse_device(None) == DeviceSelector()
    assert parse_device("cpu") == DeviceSelector("cpu")
    assert parse_device("cuda") == DeviceSelector("cuda")
    assert parse_device("cuda:1") == DeviceSelector("cuda", 1)
    assert parse_device("npu:2") == DeviceSelector("cuda", 2)
    # The dump's Device Id column: cpu, 0, 1...
    assert DeviceSelector("cuda", 1).matches("1") and not DeviceSelector("cuda", 1).matches("0")
    assert DeviceSelector("cuda").matches("0") and not DeviceSelector("cuda").matches("cpu")
    assert DeviceSelector().matches("cpu") and DeviceSelector().matches("3")
    for bad in ("tpu", "cuda:x", "cpu:1", 7):
        with pytest.raises(MarkerError, match=r'"cpu", "cuda", "cuda:N"'):
            parse_device(bad)


def _marker(name: str):
    """A marker as ``item.iter_markers()`` gives it (made by hand: this session may not have
    the plugin registering the names)."""

    def make(*args: object, **kwargs: object) -> SimpleNamespace:
        return SimpleNamespace(name=name, args=args, kwargs=kwargs)

    return make


def test_plans_from_markers() -> None:
    mem = _marker("msmemscope_limit_memory")
    leaks = _marker("msmemscope_limit_leaks")
    host = _marker("msmemscope_limit_host_leaks")
    plan = plan_for([mem("1 MB", device="cpu"), mem("9 MB"), leaks("1 KiB")])
    assert [(lim.kind, lim.limit, str(lim.device)) for lim in plan.tensor] == [
        ("msmemscope_limit_memory", 1_000_000, "cpu"),
        ("msmemscope_limit_memory", 9_000_000, "all devices"),
        ("msmemscope_limit_leaks", 1024, "all devices"),
    ]
    # The closest marker (the function's, given first) wins over a module's for one device.
    assert plan_for([leaks("1 KB"), leaks("5 KB")]).tensor[0].limit == 1000
    assert plan_for([host("2 MiB")]).host.limit == 2 << 20
    assert not plan_for([_marker("slow")()])
    for marks, message in [
        ([mem()], "msmemscope_limit_memory: a size is required"),
        ([mem("1 MB", colour="red")], "msmemscope_limit_memory: unknown argument colour"),
        ([host("1 MB", device="cpu")], "msmemscope_limit_host_leaks: takes one size and no"),
        ([host("1 MB"), mem("1 MB")], "cannot be combined"),
    ]:
        with pytest.raises(MarkerError, match=re.escape(message)):
            plan_for(marks)


def test_format_bytes() -> None:
    assert format_bytes(999) == "999 B"
    assert format_bytes(3_000_000) == "3.0 MB"
    assert format_bytes(1_000_000, binary=True) == "976.6 KiB"


# --- accounting over hand-made rows ------------------------------------------------------------


def _row(rid: int, event: str, aid: int, size: int, stack: str = "", device: str = "cpu") -> str:
    attrs = json.dumps({"allocation_id": aid, "addr": f"0x{aid:016x}", "size": size})
    cells = [str(rid), event, "PTA", "N/A", "1", "1", "1", device, f"0x{aid:016x}"]
    quoted = '"' + attrs.replace('"', '""') + '"'
    return ",".join([*cells, quoted, f'"{stack}"', ""]) + "\n"


def test_usage_counts_only_blocks_allocated_in_the_window() -> None:
    a, b, c = "/t/test_x.py(3): test_x", "/t/test_x.py(4): test_x", "/t/test_x.py(5): test_x"
    rows = "".join(
        [
            _row(10, "MALLOC", 7, 100, a),
            _row(11, "FREE", 1, 5000),  # a block from before the window: not the test's
            _row(12, "MALLOC", 8, 300, b),
            _row(13, "FREE", 7, 100),
            _row(14, "MALLOC", 9, 250, c, device="0"),
        ]
    )
    usage = TensorUsage(parse_rows(rows))
    peak, blocks = usage.peak(DeviceSelector())
    assert peak == 550 and sorted(blk.size for blk in blocks) == [250, 300]
    peak, blocks = usage.peak(DeviceSelector("cpu"))
    assert peak == 400 and sorted(blk.size for blk in blocks) == [100, 300]
    kept, blocks = usage.alive_at_end(DeviceSelector("cuda", 0))
    assert kept == 250 and blocks[0].frames == (c,)
    assert usage.alive_at_end(DeviceSelector("cuda", 1)) == (0, [])


def test_site_is_the_innermost_frame_of_the_test_file(tmp_path: Path) -> None:
    test_file = tmp_path / "tests" / "test_x.py"
    namer = SiteNamer(test_file, tmp_path)
    helper = f"{tmp_path}/lib/helper.py(9): make"
    frames = [
        helper,
        f"{test_file}(42): test_x",
        "/p/pytest.py(1): c",
    ]
    assert namer.name(frames) == "tests/test_x.py:42 (test_x)"
    assert namer.name([helper]) == "lib/helper.py:9 (make)"
    assert namer.name([]) == "<no Python stack>"


# --- real pytest sessions ----------------------------------------------------------------------

SUITE = """
import json
import os
import sys
import unittest

import pytest
import torch

KEPT = []
PRE = [torch.empty(500_000, dtype=torch.float32)]  # 2 MB alive before any test


@pytest.mark.msmemscope_limit_leaks("64 KB")
def test_keeps_a_tensor():
    KEPT.append(torch.empty(250_000, dtype=torch.float32))  # KEEP


@pytest.mark.msmemscope_limit_leaks("64 KB")
def test_frees_its_tensors():
    a = torch.empty(250_000, dtype=torch.float32)
    b = a * 2
    cycle = [b]
    cycle.append(cycle)  # garbage only the collector frees
    del a, b, cycle


@pytest.mark.msmemscope_limit_leaks("1 MiB")
def test_keeps_less_than_its_limit():
    KEPT.append(torch.empty(250_000, dtype=torch.float32))


@pytest.mark.msmemscope_limit_leaks("0 B")
def test_frees_a_tensor_made_before_it():
    PRE.clear()


@pytest.mark.msmemscope_limit_memory("1 MB", device="cpu")
def test_peaks_high():
    a = torch.empty(250_000, dtype=torch.float32)  # PEAK_A
    b = torch.empty(500_000, dtype=torch.float32)  # PEAK_B
    del a, b


@pytest.mark.msmemscope_limit_memory("1 MB")
def test_peaks_low():
    for _ in range(4):
        a = torch.empty(200_000, dtype=torch.float32)
        del a


@pytest.mark.msmemscope_limit_memory("1 MB", device="cuda:0")
def test_peaks_high_on_another_device():
    a = torch.empty(750_000, dtype=torch.float32)
    del a


@pytest.mark.msmemscope_limit_leaks("64 KB")
def test_fails_on_its_own():
    a = torch.empty(250_000, dtype=torch.float32)  # alive in the traceback: not judged
    assert a.numel() == 0, "its own failure"


def test_marked_by_conftest():
    KEPT.append(torch.empty(100_000, dtype=torch.float32))  # CONFTEST_KEEP


class TestCaseStyle(unittest.TestCase):  # run by unittest's machinery, not as a function
    @pytest.mark.msmemscope_limit_leaks("64 KB")
    def test_unittest_keeps(self):
        KEPT.append(torch.empty(125_000, dtype=torch.float32))  # UNITTEST_KEEP


def test_unmarked_probe():
    KEPT.append(torch.empty(1_000_000, dtype=torch.float32))
    from msmemscope import _native

    tracker = sys.modules.get("msmemscope.capture.torch_tracker")
    state = {
        "runtime_loaded": _native.runtime_loaded(),
        "tracing": _native.runtime_loaded() and _native.tracing(),
        "tracker_imported": tracker is not None,
        "tracker_installed": tracker is not None and tracker.installed(),
    }
    with open(os.environ["PROBE_FILE"], "w") as f:
        json.dump(state, f)
"""

# A conftest that marks a test after collection, as projects do for a whole directory.
CONFTEST = """
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if item.name == "test_marked_by_conftest":
            item.add_marker(pytest.mark.msmemscope_limit_leaks("64 KB"))
"""

HOST_SUITE = """
import pytest

KEPT = []


@pytest.mark.msmemscope_limit_host_leaks("64 KB")
def test_host_keeps():
    KEPT.append(bytearray(1_000_000))  # HOST_KEEP


@pytest.mark.msmemscope_limit_host_leaks("64 KB")
def test_host_frees():
    b = bytearray(1_000_000)
    del b
"""

BAD_SUITE = """
import pytest


@pytest.mark.msmemscope_limit_memory("12 parsecs")
def test_bad_size():
    pass


@pytest.mark.msmemscope_limit_leaks("1 MB", device="tpu:0")
def test_bad_device():
    pass
"""

# filterwarnings=error and --strict-markers: an unregistered marker would be an error.
INI = "[pytest]\nfilterwarnings = error\naddopts = --strict-markers -p no:cacheprovider\n"

EXPECTED = {
    "test_keeps_a_tensor": "failed",
    "test_frees_its_tensors": "passed",
    "test_keeps_less_than_its_limit": "passed",
    "test_frees_a_tensor_made_before_it": "passed",
    "test_peaks_high": "failed",
    "test_peaks_low": "passed",
    "test_peaks_high_on_another_device": "passed",
    "test_fails_on_its_own": "failed",
    "test_marked_by_conftest": "failed",
    "test_unittest_keeps": "failed",
    "test_unmarked_probe": "passed",
    "test_host_keeps": "skipped",
    "test_host_frees": "skipped",
}


def line_of(source: str, tag: str) -> int:
    """The 1-based line of ``source`` (as written to its file) holding ``# tag``."""
    lines = textwrap.dedent(source).splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.endswith(f"# {tag}"))


class Session:
    """One pytest run over the suite: exit status, output, and each test's outcome and text."""

    def __init__(self, proc: subprocess.CompletedProcess[str], xml: Path):
        self.proc = proc
        self.output = proc.stdout + proc.stderr
        self.outcomes: dict[str, str] = {}
        self.texts: dict[str, str] = {}
        if not xml.is_file():
            return
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = case.get("name", "")
            outcome, text = "passed", ""
            for tag in ("failure", "error", "skipped"):
                found = case.find(tag)
                if found is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    text = found.get("message", "") + "\n" + (found.text or "")
                    break
            self.outcomes[name] = outcome
            self.texts[name] = text

    def text(self, name: str) -> str:
        return self.texts[name]


def write_suite(root: Path, ini: str = INI) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pytest.ini").write_text(ini)
    (root / "test_suite.py").write_text(textwrap.dedent(SUITE))
    (root / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (root / "test_host_suite.py").write_text(textwrap.dedent(HOST_SUITE))
    return root


def run_pytest(
    root: Path, *args: str, plugin: str = "msmemscope.pytest_plugin", path: str = "", **env: str
) -> Session:
    """pytest in a fresh interpreter, this checkout's package first on the path (after
    ``path``), the plugin named with -p (entry points not loaded: the installed one may be
    another checkout's)."""
    xml = root / "junit.xml"
    xml.unlink(missing_ok=True)
    variables = clean_env(
        PYTHONPATH=os.pathsep.join(p for p in (path, str(REPO / "python")) if p),
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        OMP_NUM_THREADS="1",
        PROBE_FILE=str(root / "probe.json"),
        **env,
    )
    cmd = [sys.executable, "-m", "pytest", "-p", plugin, "-rA"]
    cmd += [f"--junitxml={xml}", *args]
    proc = subprocess.run(cmd, cwd=root, env=variables, capture_output=True, text=True, timeout=300)
    return Session(proc, xml)


def assert_breaking_tests_fail(session: Session) -> None:
    assert session.outcomes == EXPECTED, session.output
    assert session.proc.returncode == 1, session.output
    keep = session.text("test_keeps_a_tensor")
    assert keep.startswith(
        "msmemscope_limit_leaks: 1000000 bytes (1.0 MB) of tensor memory in 1 block allocated by"
        " the test on all devices still alive at its end, over the limit of 64000 bytes (64 KB)"
    ), keep
    line = line_of(SUITE, "KEEP")
    assert f"- test_suite.py:{line} (test_keeps_a_tensor): 1000000 bytes (1.0 MB) in 1 block" in (
        keep
    ), keep
    peak = session.text("test_peaks_high")
    assert peak.startswith(
        "msmemscope_limit_memory: tensor memory allocated by the test peaked at 3000000 bytes "
        "(3.0 MB) on cpu, over the limit of 1000000 bytes (1 MB)"
    ), peak
    a, b = line_of(SUITE, "PEAK_A"), line_of(SUITE, "PEAK_B")
    assert f"- test_suite.py:{b} (test_peaks_high): 2000000 bytes (2.0 MB) in 1 block" in peak
    assert f"- test_suite.py:{a} (test_peaks_high): 1000000 bytes (1.0 MB) in 1 block" in peak
    own = session.text("test_fails_on_its_own")
    assert "its own failure" in own and "still alive at its end" not in own, own
    late = session.text("test_marked_by_conftest")
    line = line_of(SUITE, "CONFTEST_KEEP")
    assert late.startswith("msmemscope_limit_leaks: 400000 bytes (400.0 KB)"), late
    assert f"- test_suite.py:{line} (test_marked_by_conftest): 400000 bytes" in late, late
    unit = session.text("test_unittest_keeps")
    assert unit.startswith("msmemscope_limit_leaks: 500000 bytes (500.0 KB) of tensor memory"), unit
    line = line_of(SUITE, "UNITTEST_KEEP")
    assert f"- test_suite.py:{line} (test_unittest_keeps): 500000 bytes" in unit, unit
    reason = "needs the msmemscope runtime preloaded: run `source msmemscope --load-api-env=host`"
    assert reason in session.text("test_host_keeps"), session.text("test_host_keeps")


def assert_nothing_tracked_between_tests(root: Path) -> None:
    """The unmarked probe ran after marked tests: no trace, no tracker installed."""
    state = json.loads((root / "probe.json").read_text())
    assert state["tracing"] is False and state["tracker_installed"] is False, state


def kept_dumps(directory: Path) -> dict[str, Path]:
    """The kept run directories by test (an xdist worker's ``.gwN`` suffix dropped)."""
    return {re.sub(r"\.gw\d+$", "", p.name): p for p in directory.iterdir()}


def assert_dumps_of_failing_tests(directory: Path) -> Path:
    kept = kept_dumps(directory)
    assert set(kept) == {
        "test_suite.py_test_keeps_a_tensor",
        "test_suite.py_test_peaks_high",
        "test_suite.py_test_marked_by_conftest",
        "test_suite.py_TestCaseStyle_test_unittest_keeps",
    }
    run = kept["test_suite.py_test_peaks_high"]
    dumps = list(run.glob("device_cpu/dump/memscope_dump_*.csv"))
    assert len(dumps) == 1 and (run / "config.json").is_file(), list(run.rglob("*"))
    # The kept piece is the test's own rows: its peak, and both blocks freed within it.
    usage = TensorUsage(parse_rows(dumps[0].read_text()))
    assert usage.peak(DeviceSelector())[0] == 3_000_000
    assert usage.alive_at_end(DeviceSelector()) == (0, [])
    return run


@NEEDS_TORCH
@pytest.mark.parametrize("capture", ["native", "python"])
def test_exactly_the_breaking_tests_fail(tmp_path: Path, capture: str) -> None:
    # The fallback capture's run turns the plugin on from the ini file instead of the flag.
    ini = INI if capture == "native" else INI + "msmemscope = true\n"
    root = write_suite(tmp_path / "suite", ini)
    flag = ["--msmemscope"] if capture == "native" else []
    session = run_pytest(
        root, *flag, "--msmemscope-dump-dir=dumps", MSMEMSCOPE_TORCH_CAPTURE=capture
    )
    assert_breaking_tests_fail(session)
    assert "tracker error" not in session.output, session.output
    assert_nothing_tracked_between_tests(root)
    run = assert_dumps_of_failing_tests(root / "dumps")
    assert str(run) in session.text("test_peaks_high")
    if CLI.is_file():
        report = subprocess.run(
            [str(CLI), "report", str(run)], capture_output=True, text=True, timeout=120
        )
        assert report.returncode == 0, report.stderr
        assert (run / "msmemscope_report.html").is_file()


@NEEDS_TORCH
@pytest.mark.skipif(not HAVE_XDIST, reason="pytest-xdist is not installed (scripts/setup.sh)")
def test_each_xdist_worker_tracks_its_own_tests(tmp_path: Path) -> None:
    root = write_suite(tmp_path / "suite")
    session = run_pytest(
        root, "-p", "xdist", "-n", "2", "--msmemscope", "--msmemscope-dump-dir=dumps"
    )
    assert_breaking_tests_fail(session)
    names = [p.name for p in (root / "dumps").iterdir()]
    assert all(re.search(r"\.gw[01]$", n) for n in names), names
    assert_dumps_of_failing_tests(root / "dumps")


@NEEDS_TORCH
def test_without_the_flag_markers_are_known_and_nothing_is_tracked(tmp_path: Path) -> None:
    root = write_suite(tmp_path / "suite")
    session = run_pytest(root)
    # Every test passes but the one that fails on its own.
    own = {name: "failed" if name == "test_fails_on_its_own" else "passed" for name in EXPECTED}
    assert session.outcomes == own, session.output
    assert session.proc.returncode == 1, session.output
    state = json.loads((root / "probe.json").read_text())
    assert state == {
        "runtime_loaded": False,
        "tracing": False,
        "tracker_imported": False,
        "tracker_installed": False,
    }


@pytest.mark.parametrize("xdist", [False, True], ids=["plain", "xdist"])
def test_malformed_markers_are_one_collection_error(tmp_path: Path, xdist: bool) -> None:
    if xdist and not HAVE_XDIST:
        pytest.skip("pytest-xdist is not installed (scripts/setup.sh)")
    root = tmp_path / "suite"
    root.mkdir()
    (root / "pytest.ini").write_text(INI)
    (root / "test_bad.py").write_text(textwrap.dedent(BAD_SUITE))
    session = run_pytest(root, "--msmemscope", *(["-p", "xdist", "-n", "2"] if xdist else []))
    # pytest stops after collection: 2 (interrupted) on its own, 1 under xdist; nothing ran.
    assert session.proc.returncode == (1 if xdist else 2), session.output
    assert "ERROR collecting test_bad.py" in session.output, session.output
    assert "INTERNALERROR" not in session.output, session.output
    assert (
        "test_bad.py::test_bad_size: msmemscope_limit_memory: size '12 parsecs' is not a size; "
        'write a number and a unit, e.g. "64 KB", "1.5 MiB", "2GB": B, KB, MB, GB, TB, PB '
        "(powers of 1000) or KiB, MiB, GiB, TiB, PiB (powers of 1024); or an int of bytes"
    ) in session.output, session.output
    assert (
        "test_bad.py::test_bad_device: msmemscope_limit_leaks: device 'tpu:0' is not a device; "
        'write "cpu", "cuda", "cuda:N"'
    ) in session.output, session.output
    assert " passed" not in session.output and " failed" not in session.output


@needs_runtime_abi
def test_host_leaks_with_the_runtime_preloaded(tmp_path: Path) -> None:
    root = write_suite(tmp_path / "suite")
    session = run_pytest(
        root,
        "--msmemscope",
        "--msmemscope-dump-dir=dumps",
        "test_host_suite.py",
        LD_PRELOAD=str(RUNTIME_LIB),
        MSMEMSCOPE_API_ENV="host",
        # As when this suite itself runs under xdist: the worker's variable is inherited, but
        # the pytest started here is no worker, and its dumps are named without a suffix.
        PYTEST_XDIST_WORKER="gw9",
    )
    assert session.outcomes == {"test_host_keeps": "failed", "test_host_frees": "passed"}, (
        session.output
    )
    text = session.text("test_host_keeps")
    first = re.match(
        r"msmemscope_limit_host_leaks: (\d+) bytes \(1\.0 MB\) of host heap in \d+ blocks "
        r"allocated by the test and not freed by its end, over the limit of 64000 bytes \(64 KB\)",
        text,
    )
    assert first, text
    # bytearray(1_000_000): its buffer of 1,000,001 bytes (its trailing NUL) and the object
    # itself (Python objects are accounted too), kept in a list; the rest is what pytest's own
    # hook machinery still held when the test's window closed (a few hundred bytes at most).
    line = line_of(HOST_SUITE, "HOST_KEEP")
    own = re.search(rf"- test_host_suite\.py:{line} \(test_host_keeps\): (\d+) bytes", text)
    assert own, text
    assert 1_000_001 < int(own[1]) <= 1_000_001 + 256, text
    assert int(own[1]) <= int(first[1]) <= int(own[1]) + 1024, text
    (run,) = (root / "dumps").iterdir()
    assert run.name == "test_host_suite.py_test_host_keeps"
    assert list(run.glob("host_leak/leak_overview_*.txt")), list(run.rglob("*"))
    if CLI.is_file():
        report = subprocess.run(
            [str(CLI), "report", str(run)], capture_output=True, text=True, timeout=120
        )
        assert report.returncode == 0, report.stderr


def test_the_entry_point_is_registered() -> None:
    """`-p msmemscope` and autoloading name the plugin by this entry point: present once the
    package is installed (scripts/setup.sh runs maturin develop, which writes it)."""
    eps = importlib.metadata.entry_points()
    group = eps.select(group="pytest11") if hasattr(eps, "select") else eps.get("pytest11", [])
    found = {ep.name: ep.value for ep in group}
    assert found.get("msmemscope") == "msmemscope.pytest_plugin", found


def test_p_msmemscope_and_the_ini_option_turn_it_on(tmp_path: Path) -> None:
    """``-p msmemscope`` names the plugin by its entry point, and ``msmemscope = true`` in the
    ini file turns it on (shown here by its skip reason for host limits). The entry point comes
    from a distribution made here, so that this checkout's name is the one tested."""
    dist = tmp_path / "site" / "msmemscope_entry-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: msmemscope-entry\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nmsmemscope = msmemscope.pytest_plugin\n")
    root = tmp_path / "suite"
    root.mkdir()
    (root / "pytest.ini").write_text(INI + "msmemscope = true\n")
    (root / "test_host_suite.py").write_text(textwrap.dedent(HOST_SUITE))
    session = run_pytest(root, plugin="msmemscope", path=str(tmp_path / "site"))
    assert session.outcomes == {"test_host_keeps": "skipped", "test_host_frees": "skipped"}, (
        session.output
    )
    assert "msmemscope: checking the msmemscope_limit_* markers" in session.output


def test_the_plugin_module_is_light_without_the_flag() -> None:
    """Importing the plugin (as every pytest run does once it is installed) neither loads the
    runtime library nor imports torch."""
    code = (
        "import sys, msmemscope.pytest_plugin as p; from msmemscope import _native\n"
        "print(_native.runtime_loaded(), 'torch' in sys.modules)\n"
    )
    env = clean_env(PYTHONPATH=str(REPO / "python"))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.stdout.split() == ["False", "False"], out.stderr
