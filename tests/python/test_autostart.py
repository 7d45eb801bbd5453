"""The launcher's sitecustomize (python/msmemscope/_autostart): lazy torch hook, chaining to the
user's own sitecustomize, and never raising into the program."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import AUTOSTART, PACKAGE, clean_env, ok, run_python

# Stands in for the tracker (written elsewhere) so these tests see exactly when it is called:
# the tracker module is looked up in sys.modules first.
FAKE_TRACKER = """
import sys, types
tracker = types.ModuleType("msmemscope.capture.torch_tracker")
def install():
    torch = sys.modules["torch"]
    print("install: torch fully imported =", getattr(torch, "DONE", True), flush=True)
tracker.install = install
sys.modules["msmemscope.capture.torch_tracker"] = tracker
"""


def launched_env(*extra_paths: Path) -> dict[str, str]:
    """The environment the launcher gives a Python program: the autostart directory and the
    package's parent directory on PYTHONPATH."""
    paths = [str(AUTOSTART), str(PACKAGE.parent), *map(str, extra_paths)]
    return clean_env(PYTHONPATH=os.pathsep.join(paths))


def fake_torch(root: Path, body: str = "") -> Path:
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(f"DONE = False\n{body}\nDONE = True\n")
    return root


def test_nothing_is_imported_without_torch() -> None:
    code = """
    import sys
    print("sitecustomize" in sys.modules, "torch" in sys.modules, "msmemscope" in sys.modules)
    """
    assert ok(run_python(code, env=launched_env())).split() == ["True", "False", "False"]


def test_tracker_installed_once_after_torch_is_fully_imported(tmp_path: Path) -> None:
    code = (
        FAKE_TRACKER
        + """
import torch, importlib
import torch as again
importlib.reload(torch)
print(type(torch.__spec__.loader).__name__, "exec_module" in vars(torch.__spec__.loader))
"""
    )
    out = ok(run_python(code, env=launched_env(fake_torch(tmp_path)))).splitlines()
    assert out == ["install: torch fully imported = True", "SourceFileLoader False"]


def test_failed_torch_import_installs_nothing_and_a_retry_does(tmp_path: Path) -> None:
    body = "import os\nif os.environ.get('BREAK') == '1':\n    raise ImportError('broken torch')"
    code = (
        FAKE_TRACKER
        + """
import os, sys
os.environ["BREAK"] = "1"
try:
    import torch
except ImportError as e:
    print("import failed:", e)
os.environ["BREAK"] = "0"
import torch
"""
    )
    out = ok(run_python(code, env=launched_env(fake_torch(tmp_path, body)))).splitlines()
    assert out == ["import failed: broken torch", "install: torch fully imported = True"]


def test_tracker_failure_is_reported_once_and_the_program_goes_on(tmp_path: Path) -> None:
    code = """
import sys, types
tracker = types.ModuleType("msmemscope.capture.torch_tracker")
def install():
    raise RuntimeError("tracker broke")
tracker.install = install
sys.modules["msmemscope.capture.torch_tracker"] = tracker
import torch
print("still running")
"""
    result = run_python(code, env=launched_env(fake_torch(tmp_path)))
    assert ok(result) == "still running\n"
    assert result.stderr == "msmemscope: PyTorch tracking is off: RuntimeError: tracker broke\n"


def test_user_sitecustomize_still_runs(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import sys\nMARK = 'user'\nprint('user site ran')\n")
    code = (
        FAKE_TRACKER
        + """
import sitecustomize
print(sitecustomize.MARK)
import torch
"""
    )
    env = launched_env(user, fake_torch(tmp_path / "t"))
    out = ok(run_python(code, env=env)).splitlines()
    assert out == ["user site ran", "user", "install: torch fully imported = True"]


def test_real_torch(tmp_path: Path) -> None:
    code = (
        FAKE_TRACKER
        + """
import torch
x = torch.ones(3) + 1
print(float(x.sum()))
"""
    )
    out = ok(run_python(code, env=launched_env(), timeout=300)).splitlines()
    assert out == ["install: torch fully imported = True", "6.0"]
