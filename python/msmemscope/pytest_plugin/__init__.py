"""``pytest --msmemscope``: tensor memory limits and leak checks in a test suite.

Registered as the ``pytest11`` entry point ``msmemscope`` (also ``-p msmemscope``). Off unless
``--msmemscope`` is given or ``msmemscope = true`` is set in the ini file; the markers are always
registered, and do nothing while it is off::

    @pytest.mark.msmemscope_limit_memory("1 MB", device="cpu")   # peak of tensor memory
    @pytest.mark.msmemscope_limit_leaks("64 KB")                 # tensor blocks kept at the end
    @pytest.mark.msmemscope_limit_host_leaks("1 MiB")            # host heap (runtime preloaded)

What is measured is the test's call (its fixtures' setup and teardown are not part of it), and
only memory allocated during it: blocks alive when the test starts count towards neither the
peak nor the leaks. ``device=None`` counts every device together. A block allocated by the test
and still alive after a ``gc.collect()`` at its end is a leak. Sizes: ``B``, ``KB``, ``MB``...
are powers of 1000, ``KiB``, ``MiB``... powers of 1024.

A test over a limit fails with the bytes, the limit and its largest allocating sites (the line
of the test's own file that allocated, from the tracker's Python stacks);
``--msmemscope-dump-dir DIR`` keeps the dump of each such test in ``DIR/<test>/`` for
``msmemscope report``. A test that fails (or skips) on its own is not judged: its traceback
keeps its locals alive. A malformed marker is a collection error, before any test runs.
Unmarked tests run untracked, and their outcome is never changed. Under pytest-xdist each
worker tracks the tests it runs.

The folder is the plugin: limits.py (the markers), tracking.py (the trace or host-leak window
around a test), usage.py (peak and alive blocks, sites), verdict.py (the failure text). May
import: the public API (``msmemscope``: config/start/stop) and the bottom modules
(``msmemscope._runtime``); the running tracker is looked up in ``sys.modules``
(``msmemscope.capture.torch_tracker``), never imported. Nothing else in msmemscope imports it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

# Everything the plugin runs is imported now: an import inside a test's host-leak window
# would be counted as the test's (and pytest rewrites a plugin's modules as they are imported).
from .limits import MARKERS, MarkerError, Plan, plan_for
from .tracking import Tracking, keep_dump, worker_id
from .usage import SiteNamer
from .verdict import host_breach, render, tensor_breaches

__all__ = ["MemoryLimits"]

_PLUGIN_NAME = "msmemscope-limits"
_PLAN = pytest.StashKey[Plan]()
HOST_SKIP_REASON = (
    "msmemscope_limit_host_leaks needs the msmemscope runtime preloaded: run "
    "`source msmemscope --load-api-env=host` before pytest"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("msmemscope", "msmemscope: tensor memory limits")
    group.addoption(
        "--msmemscope",
        action="store_true",
        default=False,
        help="check the msmemscope_limit_* markers (tracks the tensor memory of marked tests)",
    )
    group.addoption(
        "--msmemscope-dump-dir",
        metavar="DIR",
        default=None,
        help="keep the dump of each test over a limit in DIR/<test>/ (for msmemscope report)",
    )
    parser.addini("msmemscope", "check the msmemscope_limit_* markers", type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    if config.getoption("msmemscope") or config.getini("msmemscope"):
        config.pluginmanager.register(MemoryLimits(config), _PLUGIN_NAME)


@dataclass
class _Outcome:
    """What the plugin concluded about one test's call: the failure text, if any."""

    text: str = ""


_OUTCOME = pytest.StashKey[_Outcome]()
_HOST_SKIPPED = pytest.StashKey[bool]()


class MemoryLimits:
    """The plugin while it is on: one per pytest process (each xdist worker has its own)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.tracking = Tracking()
        self.worker = worker_id(config)
        dump = config.getoption("msmemscope_dump_dir")
        self.dump_dir = None if dump is None else Path(config.invocation_params.dir, dump)
        self._host_ok: bool | None = None
        self._host_why = HOST_SKIP_REASON

    def pytest_report_header(self) -> str:
        kept = f"; dumps of tests over a limit in {self.dump_dir}" if self.dump_dir else ""
        return f"msmemscope: checking the msmemscope_limit_* markers{kept}"

    def pytest_unconfigure(self) -> None:
        self.tracking.close()

    # --- collection: a malformed marker is refused as its test is collected -----------------
    # Refused as a collection error of the test's module rather than a usage error: pytest stops
    # before running anything either way, and workers of pytest-xdist report collection errors
    # to the controller (a usage error raised in a worker would end it as a crash).
    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(
        self, collector: pytest.Collector
    ) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
        report = yield
        if not report.passed:
            return report
        errors = []
        for node in report.result:
            if isinstance(node, pytest.Item):
                try:
                    plan_for(node.iter_markers())
                except Exception as exc:
                    errors.append(_marker_error(node, exc))
        if errors:
            report.outcome = "failed"
            report.longrepr = "\n".join(errors)
            report.result = []
        return report

    # --- one test -----------------------------------------------------------------------------
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        # Read again here: a conftest may have added markers after collection.
        try:
            plan = plan_for(item.iter_markers())
        except Exception as exc:
            pytest.fail(_marker_error(item, exc), pytrace=False)
        if not plan:
            return
        item.stash[_PLAN] = plan
        if plan.host is not None and not self._host_hooks():
            item.stash[_HOST_SKIPPED] = True
            pytest.skip(self._host_why)

    def _host_hooks(self) -> bool:
        if self._host_ok is None:
            try:
                self._host_ok = self.tracking.host_hooks_active()
            except Exception as exc:  # no runtime library at all: the same skip, and why
                self._host_ok = False
                self._host_why = f"{HOST_SKIP_REASON} ({exc})"
        return self._host_ok

    # Around the test function's call only (as pytest-memray measures): the runner's own work
    # of the call phase (its PYTEST_CURRENT_TEST variable, the other plugins' wrappers) is not
    # the test's. Items that run otherwise (unittest cases, other plugins' items) are tracked
    # around their whole call phase instead.
    @pytest.hookimpl(wrapper=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> Generator[None, object, object]:
        return (yield from self._tracked(pyfuncitem))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        if _calls_pyfunc(item):
            return (yield)
        return (yield from self._tracked(item))

    def _tracked(self, item: pytest.Item) -> Generator[None, object, object]:
        """The body of a call wrapper: the test runs inside its window when it has limits."""
        plan = item.stash.get(_PLAN, None)
        if plan is None:
            return (yield)
        outcome = item.stash[_OUTCOME] = _Outcome()
        host = plan.host is not None
        try:
            token = self.tracking.begin_host() if host else self.tracking.begin_tensor()
        except Exception as exc:
            outcome.text = _cannot_check(exc)
            return (yield)
        raised = False
        try:
            return (yield)
        except BaseException:
            # Not judged: its traceback keeps its locals (and their tensors) alive, and its own
            # failure (or skip) is the news.
            raised = True
            raise
        finally:
            try:
                outcome.text = self._judge(item, plan, token, judge=not raised)
            except Exception as exc:
                outcome.text = _cannot_check(exc)

    def _judge(
        self, item: pytest.Item, plan: Plan, token: set[Path] | dict[Path, int], judge: bool
    ) -> str:
        """Closes the test's window and returns the failure text ("" within the limits, or
        when not ``judge``)."""
        # The window closes first: nothing of this plugin's own is allocated inside it.
        if plan.host is not None:
            host = self.tracking.end_host(cast("set[Path]", token))
            if not judge:
                return ""
            found = host_breach(plan.host, host, self._namer(item))
            breaches, files = ([] if found is None else [found]), host.files
        else:
            tensors = self.tracking.end_tensor(cast("dict[Path, int]", token))
            if not judge:
                return ""
            breaches = tensor_breaches(plan.tensor, tensors, self._namer(item))
            files = tensors.pieces
        if not breaches:
            return ""
        kept = None
        if self.dump_dir is not None:
            name = _dir_name(item.nodeid, self.worker)
            kept = str(keep_dump(self.dump_dir, name, self.tracking.config_text(), files))
        return render(breaches, kept)

    def _namer(self, item: pytest.Item) -> SiteNamer:
        return SiteNamer(item.path, self.config.rootpath)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.when == "setup" and report.skipped and item.stash.get(_HOST_SKIPPED, False):
            # Told at the test, as a skip marker's reason is, not at this plugin's line.
            path, line = item.reportinfo()[:2]
            report.longrepr = (str(path), (line or 0) + 1, f"Skipped: {self._host_why}")
            return report
        outcome = item.stash.get(_OUTCOME, None)
        if report.when != "call" or outcome is None or not outcome.text:
            return report
        if report.passed:
            report.outcome = "failed"
            report.longrepr = outcome.text
        else:  # failed on its own (and tracking could not start): told beside its failure
            report.sections.append(("msmemscope", outcome.text))
        return report


def _calls_pyfunc(item: pytest.Item) -> bool:
    """Whether the item's call goes through ``pytest_pyfunc_call`` (a plain test function)."""
    return isinstance(item, pytest.Function) and type(item).runtest is pytest.Function.runtest


def _marker_error(item: pytest.Item, exc: Exception) -> str:
    if isinstance(exc, MarkerError):
        return f"{item.nodeid}: {exc}"
    # Arguments in a form no marker takes and the parser did not foresee.
    return f"{item.nodeid}: msmemscope markers unreadable: {exc!r}"


def _cannot_check(exc: BaseException) -> str:
    return f"msmemscope: the memory limits of this test could not be checked: {exc}"


def _dir_name(nodeid: str, worker: str | None) -> str:
    """A directory name for a test: its node id with separators and odd characters as ``_``
    (long ones shortened, with a hash of the id), and the xdist worker when there is one."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("._-") or "test"
    if len(name) > 120:
        name = f"{name[:100]}-{hashlib.sha1(nodeid.encode()).hexdigest()[:12]}"
    return f"{name}.{worker}" if worker else name
