"""The plugin's use of the tracker: the one owner of what it configured and of its run.

Tracking is off between tests. For a test with tensor markers, :meth:`Tracking.begin_tensor`
starts the event trace (MALLOC/FREE rows with Python stacks; the PyTorch tracker is installed
for the test and uninstalled after it, so unmarked tests run without it), and at the end reads
the rows the test added to the run's dump files. For a host-leak marker,
:meth:`Tracking.begin_host` opens a host-leak window around the test and reads the report
the runtime writes when it closes. The run lives in a private temporary directory, removed
when pytest ends; the dump of a failing test is copied out on request (:func:`keep_dump`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import msmemscope

from .._runtime import native as _runtime
from .usage import HEADER, TensorUsage, parse_rows

__all__ = ["HostResult", "TensorResult", "Tracking", "keep_dump"]

# Deep enough to reach the test function from an allocation inside nested modules' forward
# (PyTorch's own frames at the innermost end are skipped by the tracker).
_PYTHON_DEPTH = 32


@dataclass
class TensorResult:
    """The rows of one test's window: the accounting, and the raw pieces of each dump file
    (path relative to the run directory -> text) for keeping them."""

    usage: TensorUsage
    pieces: dict[str, str] = field(default_factory=dict)


@dataclass
class HostResult:
    """The host-leak report of one test's window: ``leak_sites_N.json`` as read, and the run
    files it came with (relative path -> text)."""

    unfreed_bytes: int
    unfreed_blocks: int
    sites: list[dict[str, Any]]
    files: dict[str, str] = field(default_factory=dict)


class Tracking:
    """Configures the runtime for the mode a test needs and runs its windows."""

    def __init__(self) -> None:
        self._output: str | None = None

    # --- the run -----------------------------------------------------------------------------
    def _configure(self, mode: str) -> None:
        """Sets the configuration ``mode`` ("tensor" or "host") needs, before every window: a
        test may have called ``msmemscope.config()`` itself."""
        if self._output is None:
            self._output = tempfile.mkdtemp(prefix="msmemscope-pytest-")
        if mode == "tensor":
            keys = {"events": "alloc,free", "analysis": "none", "format": "csv"}
        else:
            keys = {"analysis": "host-leaks", "host_leak_mode": "summary"}
        with warnings.catch_warnings():
            # A warning would mean a window is open: never while this plugin owns the runtime,
            # and the user's filterwarnings=error must not turn it into an error of a test.
            warnings.simplefilter("ignore")
            msmemscope.config(
                output_path=self._output, call_stack=f"python:{_PYTHON_DEPTH}", **keys
            )

    def run_dir(self) -> Path:
        return Path(_runtime().run_dir())

    def config_text(self) -> str:
        """The configuration in force (the window's), as the run's ``config.json`` holds it."""
        return cast(str, _runtime().current_config())

    def close(self) -> None:
        """Removes the run's directory (pytest is ending; nothing is recorded any more)."""
        if self._output is not None:
            shutil.rmtree(self._output, ignore_errors=True)
            self._output = None

    # --- host heap ---------------------------------------------------------------------------
    def host_hooks_active(self) -> bool:
        return bool(_runtime().host_hooks_active())

    def begin_host(self) -> set[Path]:
        """Opens a host-leak window; returns what :meth:`end_host` needs."""
        self._configure("host")
        before = set((self.run_dir() / "host_leak").glob("leak_sites_*.json"))
        _start()
        return before

    def end_host(self, before: set[Path]) -> HostResult:
        """Closes the window (after a garbage collection) and reads its report."""
        try:
            gc.collect()
        finally:
            msmemscope.stop()  # closes the window and writes its report
        return _read_host_report(self.run_dir(), before)

    # --- tensors -----------------------------------------------------------------------------
    def begin_tensor(self) -> dict[Path, int]:
        """Starts the event trace; returns what :meth:`end_tensor` needs (where each dump
        file ends now)."""
        self._configure("tensor")
        _import_torch()
        offsets = {p: p.stat().st_size for p in _dump_files(self.run_dir())}
        _start()
        return offsets

    def end_tensor(self, offsets: dict[Path, int]) -> TensorResult:
        """Stops the trace and reads the rows written since :meth:`begin_tensor`."""
        try:
            # Garbage the test made dies now, so that only what it keeps counts as alive.
            gc.collect()
        finally:
            msmemscope.stop()  # writes every row recorded so far
            _uninstall_tracker()
        run = self.run_dir()
        pieces = {}
        for path in _dump_files(run):
            text = _read_from(path, offsets.get(path, 0))
            if text:
                pieces[str(path.relative_to(run))] = text
        events = [e for text in pieces.values() for e in parse_rows(text)]
        return TensorResult(TensorUsage(events), pieces)


def _start() -> None:
    """``msmemscope.start()``; a start that failed half-way is stopped again, so that the
    session's other tests are not recorded."""
    try:
        msmemscope.start()
    except BaseException:
        with contextlib.suppress(Exception):
            msmemscope.stop()
            _uninstall_tracker()
        raise


def _import_torch() -> None:
    """Imports torch before tracing starts, so the tracker is installed for a test that imports
    it only in its body. A process without torch has no tensors to track."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401


def _uninstall_tracker() -> None:
    tracker = sys.modules.get("msmemscope.capture.torch_tracker")
    if tracker is not None:
        tracker.uninstall()


def _dump_files(run: Path) -> list[Path]:
    return sorted(run.glob("device_*/dump/memscope_dump_*.csv"))


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    return data.decode("utf-8", errors="replace")


def _read_host_report(run: Path, before: set[Path]) -> HostResult:
    """The report of the window that just closed: the newest ``leak_sites_N.json``."""
    fresh = [p for p in (run / "host_leak").glob("leak_sites_*.json") if p not in before]
    if not fresh:
        raise RuntimeError(f"the host-leak window wrote no report into {run / 'host_leak'}")
    newest = max(fresh, key=lambda p: int(p.stem.rpartition("_")[2]))
    data = json.loads(newest.read_text())
    stage = newest.stem.rpartition("_")[2]
    files = {}
    for name in (newest.name, f"leak_overview_{stage}.txt"):
        with contextlib.suppress(OSError):
            files[f"host_leak/{name}"] = (run / "host_leak" / name).read_text()
    unfreed = data.get("unfreed") or {}
    sites = list(data.get("sites") or ()) + list(data.get("resident") or ())
    return HostResult(int(unfreed.get("bytes", 0)), int(unfreed.get("count", 0)), sites, files)


def keep_dump(directory: Path, name: str, config_text: str, files: dict[str, str]) -> Path:
    """Writes one test's run (``config.json`` and the given files, dump pieces with their
    header) into a new directory ``directory/name`` (``name-2``... when taken), which
    ``msmemscope report`` reads as a run directory. Returns the directory made."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / name
    n = 1
    while True:
        try:
            target.mkdir()
            break
        except FileExistsError:
            n += 1
            target = directory / f"{name}-{n}"
    (target / "config.json").write_text(config_text)
    for relative, text in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.name.startswith("memscope_dump_") and not text.startswith(HEADER):
            text = HEADER + "\n" + text
        path.write_text(text)
    return target


def worker_id(config: object) -> str | None:
    """The pytest-xdist worker this session is (``gw0``...), None outside xdist. Read from the
    session's config, which xdist gives its workers: the ``PYTEST_XDIST_WORKER`` variable is
    inherited by every program a worker starts, a pytest run inside a test among them."""
    workerinput = getattr(config, "workerinput", None)
    if not isinstance(workerinput, dict):
        return None
    worker = workerinput.get("workerid")
    return worker if isinstance(worker, str) else None
