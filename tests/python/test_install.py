"""msmemscope installed into a user's own environment, not the project's ``.venv``.

Two fresh virtual environments, each with its own Python and torch from PyPI:

- Python 3.10 with torch 2.6.0, into which the wheel goes that ``pip wheel . -C
  manylinux=2_28`` builds from this checkout (the distributable wheel: every binary in it linked
  against glibc 2.28 and checked);
- Python 3.13 with the current torch, into which ``pip install .`` installs from the checkout.

In each, from the environment's ``bin/`` alone (no variable of ours, no source tree on any
path): the command runs when exec'ed, a decompose run of a small training loop prints the
owner table with the exact weight bytes (the native capture built on first use against that
torch and Python), the Python API reads the run's dump and finds the leak's Python line, a
host-leak window works after ``source msmemscope --load-api-env=host`` (bash, and zsh where
installed), installing kept the user's torch, and ``pip uninstall`` leaves nothing behind.

Slow (each environment downloads torch) and needs PyPI, as scripts/setup.sh does.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, clean_env, interpreter, unfreed_blocks_of_size

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TRAIN = SCRIPTS / "install_train.py"
WEIGHT_BYTES = (64 * 256 + 256 + 256 * 10 + 10) * 4  # install_train.py's model
BASELINE = (2, 28)
# The libraries a manylinux wheel may link against (PEP 600's policy for x86_64).
MANYLINUX_LIBS = {
    "libgcc_s.so.1",
    "libstdc++.so.6",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libc.so.6",
    "libnsl.so.1",
    "libutil.so.1",
    "libpthread.so.0",
    "libresolv.so.2",
    "libX11.so.6",
    "libXext.so.6",
    "libXrender.so.1",
    "libICE.so.6",
    "libSM.so.6",
    "libGL.so.1",
    "libgobject-2.0.so.0",
    "libgthread-2.0.so.0",
    "libglib-2.0.so.0",
    "ld-linux-x86-64.so.2",
}


def run(
    cmd: list[str], *, env: dict[str, str], cwd: Path | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{cmd}: exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    )
    return proc


def project_free_env(**extra: str) -> dict[str, str]:
    """This test's environment less everything of the project's: no variable of ours, no
    virtual environment, no ``.venv/bin`` on ``PATH``."""
    env = clean_env(**extra)
    env.pop("VIRTUAL_ENV", None)
    env.pop("MSMEMSCOPE_TORCH_CAPTURE", None)
    ours = {str(REPO / ".venv" / "bin"), str(Path(sys.executable).parent)}
    env["PATH"] = os.pathsep.join(
        d for d in env.get("PATH", "").split(os.pathsep) if d and d not in ours
    )
    return env


def glibc_needs(path: Path) -> tuple[tuple[int, int], set[str]]:
    """The newest ``GLIBC_2.x`` version an ELF file needs, and the libraries it links."""
    versions = subprocess.run(
        ["readelf", "-V", "--wide", str(path)], capture_output=True, text=True, check=True
    ).stdout
    newest = max(((2, int(m)) for m in re.findall(r"GLIBC_2\.(\d+)", versions)), default=(2, 0))
    dynamic = subprocess.run(
        ["readelf", "-d", "--wide", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return newest, set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The distributable wheel, built by pip (with build isolation) from the checkout."""
    out = tmp_path_factory.mktemp("wheel")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(REPO),
            "--no-deps",
            "-w",
            str(out),
            "-C",
            f"manylinux={BASELINE[0]}_{BASELINE[1]}",
        ],
        env=project_free_env(),
        timeout=1800,
    )
    (built,) = out.glob("msmemscope-*.whl")
    return built


def test_the_wheel_is_abi3_manylinux_and_holds_the_command_and_the_runtime(
    wheel: Path, tmp_path: Path
) -> None:
    tag = f"cp39-abi3-manylinux_{BASELINE[0]}_{BASELINE[1]}_x86_64"
    assert wheel.name == f"msmemscope-0.1.0-{tag}.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path)
        metadata = z.read("msmemscope-0.1.0.dist-info/METADATA").decode()
        script = z.read("msmemscope-0.1.0.data/scripts/msmemscope").decode()
        modes = {i.filename: i.external_attr >> 16 for i in z.infolist()}
    binaries = [
        "msmemscope/_native.abi3.so",
        "msmemscope-0.1.0.data/platlib/msmemscope/bin/msmemscope-cli",
        "msmemscope-0.1.0.data/platlib/msmemscope/lib/libmsmemscope_runtime.so",
    ]
    for name in [*binaries, "msmemscope-0.1.0.data/scripts/msmemscope"]:
        assert name in names, sorted(names)
        assert modes[name] & 0o111, f"{name} is not executable in the wheel"
    # The runtime's C ABI, which the native capture is compiled against on first use.
    assert "msmemscope-0.1.0.data/platlib/msmemscope/include/msmemscope/runtime.h" in names
    assert script.startswith("#!/bin/sh\n")
    assert "Requires-Python: >=3.9" in metadata
    # Nothing pinned that the user already has: no dependency but the SQL engines' extras.
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires == [
        "Requires-Dist: duckdb>=1.1 ; extra == 'duckdb'",
        "Requires-Dist: pyspark>=3.5 ; extra == 'spark'",
    ], metadata
    for name in binaries:
        newest, libraries = glibc_needs(tmp_path / name)
        assert newest <= BASELINE, f"{name} needs GLIBC_{newest[0]}.{newest[1]}"
        assert libraries <= MANYLINUX_LIBS, f"{name} links {libraries - MANYLINUX_LIBS}"


@dataclass
class UserEnv:
    """A virtual environment of the user's with msmemscope installed in it."""

    root: Path
    torch_version: str
    before: set[str]  # its files before msmemscope was installed
    cache: Path  # where the native capture is built (MSMEMSCOPE_CACHE_DIR)

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        env = project_free_env(OMP_NUM_THREADS="1", MSMEMSCOPE_CACHE_DIR=str(self.cache), **extra)
        env["PATH"] = f"{self.bin}{os.pathsep}{env['PATH']}"
        return env


def files_of(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}


def torch_version(venv: Path, env: dict[str, str]) -> str:
    code = "import torch; print(torch.__version__)"
    return run([str(venv / "bin" / "python"), "-c", code], env=env).stdout.strip()


# (Python, torch requirement, how msmemscope gets in): the oldest torch the tracker supports
# from the distributable wheel, and the current torch from `pip install .` of the checkout.
ENVIRONMENTS = {
    "py3.10-torch2.6.0-wheel": ("3.10", "torch==2.6.0", "wheel"),
    "py3.13-torch-current-source": ("3.13", "torch", "source"),
}


@pytest.fixture(scope="module", params=list(ENVIRONMENTS))
def user_env(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[UserEnv]:
    version, torch_req, how = ENVIRONMENTS[request.param]
    python = interpreter(version)
    if python is None:
        pytest.skip(
            f"CPython {version} is not installed (looked in pyenv, /usr/local/bin, /usr/bin and "
            "uv's ~/.local/share/uv/python; scripts/setup.sh installs it with uv)"
        )
    root = tmp_path_factory.mktemp(request.param)
    venv = root / "venv"
    env = project_free_env()
    run([str(python), "-m", "venv", str(venv)], env=env)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    run([*pip, torch_req], env=env, timeout=1800)
    before_torch = torch_version(venv, env)
    before = files_of(venv)
    if how == "wheel":
        # The wheel installs where no Rust toolchain is: nothing of cargo's on PATH.
        rustless = dict(env)
        rustless["PATH"] = os.pathsep.join(
            d
            for d in env["PATH"].split(os.pathsep)
            if not (Path(d) / "cargo").exists() and not (Path(d) / "rustc").exists()
        )
        assert shutil.which("cargo", path=rustless["PATH"]) is None
        assert shutil.which("rustc", path=rustless["PATH"]) is None
        run([*pip, str(request.getfixturevalue("wheel"))], env=rustless)
    else:
        run([*pip, str(REPO)], env=env, timeout=1800)
    assert torch_version(venv, env) == before_torch, "installing msmemscope changed torch"
    yield UserEnv(venv, before_torch, before, root / "capture-cache")
    shutil.rmtree(root, ignore_errors=True)  # several GB of torch


def test_the_command_runs_when_execed(user_env: UserEnv) -> None:
    proc = run([str(user_env.bin / "msmemscope"), "--version"], env=user_env.env())
    assert proc.stdout == "msmemscope 0.1.0\n"


def test_decompose_prints_the_weight_bytes_and_check_leaks_reads_the_dump(
    user_env: UserEnv, tmp_path: Path
) -> None:
    env = user_env.env()
    proc = run(
        [
            *("msmemscope", "--analysis=decompose", "--call-stack=python", "-o", "out"),
            *("python", str(TRAIN)),
        ],
        env=env,
        cwd=tmp_path,
    )
    assert f"trained with torch {user_env.torch_version}\n" in proc.stdout
    # The native capture was compiled on first use, against this environment's torch.
    building = f"building the native PyTorch capture for torch {user_env.torch_version}"
    assert building in proc.stderr, proc.stderr
    assert list(user_env.cache.glob("*/libmsmemscope_torch.so")), proc.stderr
    assert "tracker error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    weight = re.search(r"^\s+PTA@weight\s+(\d+)\s+(\d+)$", proc.stderr, re.M)
    assert weight is not None, proc.stderr
    assert int(weight[2]) == WEIGHT_BYTES

    (dump,) = tmp_path.glob("out/msmemscope_*/device_cpu/dump/memscope_dump_*.csv")
    with (dump.parent / "memscope_decompose.csv").open(newline="") as f:
        peaks = {r["Owner"]: int(r["Peak(byte)"]) for r in csv.DictReader(f) if r["Pool"] == "PTA"}
    assert peaks["PTA@weight"] == WEIGHT_BYTES

    code = f"""
    import msmemscope
    leaks = msmemscope.check_leaks({str(dump)!r}, "step", 0)
    print("LEAKS", [(b["pool"], b["device"], b["size"]) for b in leaks])
    print("WHERE", leaks[0]["python_stack"].splitlines()[0])
    """
    proc = run(["python", "-c", textwrap.dedent(code)], env=env, cwd=tmp_path)
    assert "LEAKS [('PTA', 'cpu', 4000)]\n" in proc.stdout, proc.stdout
    # The interpreter's own frame records, read by the native capture (per Python version).
    line = next(n for n, text in enumerate(TRAIN.read_text().splitlines(), 1) if "kept." in text)
    assert f"WHERE {TRAIN}({line}): <module>\n" in proc.stdout, proc.stdout


HOST_WINDOW = """
import ctypes, sys
import msmemscope

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
msmemscope.config(analysis=["host-leaks"], output_path=sys.argv[1])
msmemscope.start()
kept = [libc.malloc(1111) for _ in range(7)]
msmemscope.stop()
print("window closed")
"""


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_a_host_leak_window_after_sourcing_load_api_env(
    user_env: UserEnv, tmp_path: Path, shell: str
) -> None:
    if shutil.which(shell) is None:
        pytest.skip(f"{shell} is not installed (scripts/test.sh installs zsh as root)")
    (tmp_path / "window.py").write_text(HOST_WINDOW)
    script = (
        "source msmemscope --load-api-env=host || exit 9\n"
        'case "$LD_PRELOAD" in *libmsmemscope_runtime.so*) ;; *) exit 8 ;; esac\n'
        "python window.py out\n"
    )
    env = user_env.env()
    proc = run([shell, "-c", script], env=env, cwd=tmp_path)
    assert proc.stdout == "window closed\n"
    (overview,) = tmp_path.glob("out/msmemscope_*/host_leak/leak_overview_1.txt")
    assert unfreed_blocks_of_size(overview.read_text(), 1111) == 7, overview.read_text()


def test_uninstall_leaves_nothing_behind(user_env: UserEnv) -> None:
    env = user_env.env()
    run([str(user_env.bin / "python"), "-m", "pip", "uninstall", "--yes", "msmemscope"], env=env)
    left = files_of(user_env.root) - user_env.before
    # Programs run in the environment may leave byte code of the user's own packages.
    left = {p for p in left if "msmemscope" in p or "__pycache__" not in p}
    assert not left, sorted(left)
    assert not (user_env.bin / "msmemscope").exists()
