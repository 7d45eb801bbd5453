"""Shared fixtures: paths, the fake runtime library, and running Python snippets in a fresh
process (the runtime library is loaded once per process, so each loading scenario gets its own)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "python" / "msmemscope"
AUTOSTART = PACKAGE / "_autostart"
FAKE_SOURCE = Path(__file__).resolve().parent / "native" / "fake_runtime.c"
RUNTIME_INCLUDE = REPO / "crates" / "runtime" / "include"
RUNTIME_LIB = REPO / "target" / "release" / "libmsmemscope_runtime.so"
ABI_SYMBOLS = (
    "msmemscope_abi_version",
    "msmemscope_emit",
    "msmemscope_configure",
    "msmemscope_current_config",
    "msmemscope_start",
    "msmemscope_stop",
    "msmemscope_host_hooks_active",
)


def _exports(lib: Path) -> set[str]:
    if not lib.is_file():
        return set()
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def runtime_has_abi() -> bool:
    return set(ABI_SYMBOLS) <= _exports(RUNTIME_LIB)


needs_runtime_abi = pytest.mark.skipif(
    not runtime_has_abi(),
    reason=f"{RUNTIME_LIB} does not export the C ABI ({', '.join(ABI_SYMBOLS)}) yet",
)


# Kept for the programs the tests start: the test command's second pass runs the PyTorch tests
# again with MSMEMSCOPE_TORCH_CAPTURE=python (the dispatch-mode fallback).
KEPT_VARIABLES = ("MSMEMSCOPE_TORCH_CAPTURE",)


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without anything that would load a runtime library."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", "MSMEMSCOPE_RUNTIME_LIB", "PYTHONPATH")
        and (not k.startswith("MSMEMSCOPE_") or k in KEPT_VARIABLES)
    }
    env.update(extra)
    return env


def run_python(
    code: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter of this environment."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean_env() if env is None else env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


CLI = REPO / "target" / "release" / "msmemscope-cli"

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

# For the modules that run PyTorch programs under the CLI.
NEEDS_CLI_AND_TORCH = [
    pytest.mark.skipif(not CLI.is_file(), reason=f"{CLI} is not built (scripts/setup.sh)"),
    pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (scripts/setup.sh)"),
]


def run_under_cli(
    tmp: Path, *options: str, script: Path, args: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Runs ``script`` with this interpreter under the CLI (output in ``tmp/out``, one OpenMP
    thread); asserts it succeeded and the tracker reported no error. Returns (process, output)."""
    return run_command_under_cli(tmp, sys.executable, str(script), *args, options=options)


def run_command_under_cli(
    tmp: Path, *command: str, options: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Runs ``command`` (any program) under the CLI as :func:`run_under_cli` runs a script."""
    tmp.mkdir(parents=True, exist_ok=True)
    out = tmp / "out"
    cmd = [str(CLI), *options, "-o", str(out), *command]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(OMP_NUM_THREADS="1"),
        cwd=tmp,
    )
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "tracker error" not in proc.stderr, proc.stderr
    return proc, out


# One site line of a host-leak overview (leak_overview_N.txt).
_SITE = re.compile(
    r"^#R?\d+ \[(?:stack \d+(?:, pymalloc)?|unknown bucket)\] unfreed (\d+) blocks / (\d+) bytes;"
)


def unfreed_blocks_of_size(report: str, size: int) -> int:
    """Unfreed blocks of the sites (TOP N and resident) whose blocks are all `size` bytes."""
    total = 0
    for line in report.splitlines():
        m = _SITE.match(line)
        if m and int(m[1]) > 0 and int(m[2]) == int(m[1]) * size:
            total += int(m[1])
    return total


def interpreter(version: str) -> Path | None:
    """A CPython ``version`` (``"3.10"``) of this machine: pyenv's, else the system's, else one
    that uv installed (scripts/setup.sh installs 3.10 and 3.13 with uv where none is found)."""
    found: list[Path] = []
    for root in (os.environ.get("PYENV_ROOT"), str(Path.home() / ".pyenv")):
        if root:
            found += sorted(Path(root).glob(f"versions/{version}.*/bin/python{version}"))
    found += [Path(d) / f"python{version}" for d in ("/usr/local/bin", "/usr/bin")]
    uv_root = Path.home() / ".local" / "share" / "uv" / "python"
    found += sorted(uv_root.glob(f"cpython-{version}.*-linux-*/bin/python{version}"))
    for path in found:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


LEAKER_SOURCE = REPO / "tests" / "python" / "native" / "leaker.c"


def build_leaker(python: Path, out: Path) -> None:
    """Compiles the ``leaker`` C extension (tests/python/native/leaker.c) for `python` into
    `out`, against that interpreter's headers."""
    query = (
        "import sysconfig as s; "
        "print(s.get_paths()['include']); print(s.get_config_var('EXT_SUFFIX'))"
    )
    include, suffix = subprocess.run(
        [str(python), "-c", query], capture_output=True, text=True, check=True
    ).stdout.split()
    subprocess.run(
        [
            "gcc",
            "-O1",
            "-shared",
            "-fPIC",
            f"-I{include}",
            str(LEAKER_SOURCE),
            "-o",
            str(out / f"leaker{suffix}"),
        ],
        check=True,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """The stdout of a run that must have succeeded; its stderr in the failure message."""
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _build_fake(out: Path, name: str, *defines: str) -> Path:
    lib = out / name
    subprocess.run(
        # The runtime's C header: the fake's functions are checked against its declarations.
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O1",
            "-Wall",
            "-Werror",
            f"-I{RUNTIME_INCLUDE}",
            *defines,
            "-o",
            str(lib),
            str(FAKE_SOURCE),
        ],
        check=True,
    )
    return lib


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Fake runtime libraries: a complete one, one of another ABI version, one with only the
    version function."""
    out = tmp_path_factory.mktemp("fake_runtime")
    return {
        "good": _build_fake(out, "libfake_runtime.so"),
        "other_abi": _build_fake(out, "libfake_other_abi.so", "-DFAKE_ABI=999"),
        "incomplete": _build_fake(out, "libfake_incomplete.so", "-DONLY_VERSION"),
    }


# The modules that take minutes (builds from source, environments with torch downloaded), run
# first: under xdist (scripts/test.sh runs two workers, a module to a worker) the other worker
# takes the rest of the suite meanwhile, instead of one of these starting near the end.
SLOWEST_FIRST = ("test_install.py", "test_ranks.py", "test_framework_hooks.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return SLOWEST_FIRST.index(name) if name in SLOWEST_FIRST else len(SLOWEST_FIRST)

    items.sort(key=rank)  # stable: each module's tests keep their order
