"""Jupyter and IPython: ``%load_ext msmemscope`` and the ``%%msmemscope`` cell magic.

``%%msmemscope [options]`` traces one cell's PyTorch memory in the kernel's own process and
shows what it found inline: the leaking lines (bytes per step, what holds them), the cell's
peak with its largest lines, a chart of the bytes in use per step and the run directory.
Options are the command line's long options that ``msmemscope.config`` accepts
(``--analysis=leaks,decompose``, ``--call-stack=python:10``...), ``-o DIR`` (or
``--output-path``) for the output directory, and ``--no-holders`` to skip the search for what
keeps leaked tensors alive. Options stay in force for later cells, as ``config()`` does.

Steps come from ``msmemscope.step()`` in the cell or from ``optimizer.step()`` of the first
optimizer that steps in the kernel. The runtime keeps one run directory per process (the first
traced cell's) and one step count, so a later cell's rows are appended to the same dump and
its steps continue the numbering; the cell's findings are the part of the process's that falls
in its steps. ``leaks/findings.json`` and ``leaks/peak.json`` are written when the kernel exits.

IPython is imported only here, never by ``import msmemscope``.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import gc
import html
import importlib
import importlib.util
import io
import json
import linecache
import shlex
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

__all__ = ["load_ipython_extension", "parse_options", "render_html"]

# How long the search for what keeps leaked tensors alive may take after a cell (seconds).
_HOLDER_BUDGET_S = 1.0
# The dump's columns by position (the header is not in a piece read from an offset).
_COL_ID, _COL_EVENT, _COL_TYPE, _COL_NAME, _COL_DEVICE, _COL_PTR, _COL_ATTR = 0, 1, 2, 3, 7, 8, 9
_MAX_SITES = 10
_MAX_PEAK_LINES = 5


def load_ipython_extension(ipython: Any) -> None:
    """Registers the ``%%msmemscope`` cell magic (``%load_ext msmemscope``)."""

    def msmemscope(line: str, cell: str) -> object:
        return _CellMagic(ipython).run(line, cell)

    msmemscope.__doc__ = __doc__
    ipython.register_magic_function(msmemscope, magic_kind="cell", magic_name="msmemscope")


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext msmemscope``: nothing to undo but the magic, which IPython keeps."""


# --- options -----------------------------------------------------------------------------------
@dataclass
class Options:
    """What the magic's line asks for: ``config`` keys (as ``msmemscope.config`` takes them)
    and whether to search for holders."""

    config: dict[str, str] = field(default_factory=dict)
    holders: bool = True


def parse_options(line: str, config_keys: list[str]) -> Options:
    """The magic's line: ``--key=value`` or ``--key value`` for each key of ``config_keys``
    (``-`` for ``_``), ``-o DIR``, ``--no-holders``. ValueError names what it does not take."""
    opts = Options()
    tokens = shlex.split(line)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--no-holders":
            opts.holders = False
            continue
        if token == "-o" or token.startswith("-o="):
            name, value = "output_path", token[3:] if token.startswith("-o=") else None
        elif token.startswith("--") and len(token) > 2:
            name, sep, text = token[2:].partition("=")
            name = name.replace("-", "_")
            value = text if sep else None
        else:
            raise ValueError(f"%%msmemscope: unexpected argument {token!r}")
        if name not in config_keys:
            accepted = ", ".join("--" + k.replace("_", "-") for k in config_keys)
            raise ValueError(
                f"%%msmemscope: unknown option {token!r}; accepted: -o DIR, --no-holders, "
                f"{accepted}"
            )
        if value is None:
            if i >= len(tokens):
                raise ValueError(f"%%msmemscope: {token} needs a value")
            value = tokens[i]
            i += 1
        opts.config[name] = value
    return opts


# --- the magic ---------------------------------------------------------------------------------
class _CellMagic:
    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def run(self, line: str, cell: str) -> object:
        import msmemscope

        from ._runtime import native

        nat = native()
        try:
            opts = parse_options(line, [k.strip() for k in nat.CONFIG_KEYS.split(",")])
            if nat.tracing():
                raise ValueError(
                    "%%msmemscope: the process is being traced already (msmemscope.start() or "
                    "the launcher): call msmemscope.stop() first, or run the cell without it"
                )
            if opts.config:
                msmemscope.config(**opts.config)
        except ValueError as exc:
            raise _usage_error(str(exc)) from None
        code, last = self._compile(cell)
        _import_torch()
        wanted = Path(json.loads(nat.current_config()).get("output_path") or ".").resolve()
        run = Path(nat.run_dir())
        offsets = {p: p.stat().st_size for p in _dump_files(run)}
        before = msmemscope.findings()
        first_step = _int(before.get("steps")) if before.get("available") else 0
        found: dict[str, Any] = {}
        holders: list[dict[str, object]] = []
        msmemscope.start()
        try:
            exec(code, self.shell.user_global_ns, self.shell.user_ns)
            value = eval(last, self.shell.user_global_ns, self.shell.user_ns) if last else None
        finally:
            try:
                gc.collect()  # garbage the cell made dies now: only what it keeps is live
                with contextlib.suppress(Exception):
                    found = msmemscope.findings()
                if opts.holders and found.get("leak_sites"):
                    with contextlib.suppress(Exception), warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        holders = msmemscope.leak_holders(_HOLDER_BUDGET_S)
            finally:
                msmemscope.stop()  # writes every row recorded so far
                _uninstall_tracker()
            try:
                report = _report(run, offsets, first_step, found, holders, self._cell_names())
                report.other_output = wanted if run.parent.resolve() != wanted else None
                _display(render_html(report))
            except Exception as exc:  # the cell's own error, if any, is the one to see
                _display(f"<p>msmemscope: no report ({html.escape(repr(exc))})</p>")
        return value

    def _compile(self, cell: str) -> tuple[Any, Any]:
        """The cell compiled as IPython compiles a cell (its magics and ``!`` lines
        transformed, its text in linecache under the kernel's pseudo-file for the cell), the
        last expression apart so that its value is shown as a cell's is."""
        compiler = self.shell.compile
        source = self.shell.transform_cell(cell)
        name = compiler.cache(source, self._execution_count(), raw_code=cell)
        tree = compiler.ast_parse(source, filename=name)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = compiler(ast.Expression(tree.body.pop().value), name, "eval")
        return compiler(tree, name, "exec"), last

    def _execution_count(self) -> int:
        """The running cell's number (IPython counts the next cell from the start of this
        one)."""
        result = getattr(self.shell.displayhook, "exec_result", None)
        count = getattr(result, "execution_count", None)
        return count if isinstance(count, int) else int(self.shell.execution_count)

    def _cell_names(self) -> dict[str, int]:
        """The kernel's pseudo-files of cells -> their execution counts."""
        names = getattr(self.shell.compile, "_filename_map", None)
        return dict(names) if isinstance(names, dict) else {}


def _usage_error(message: str) -> Exception:
    """IPython's UsageError (shown without a traceback). IPython is imported by name: its
    types, where it is installed, are not checked against."""
    try:
        error: Any = importlib.import_module("IPython.core.error")
    except ImportError:
        return ValueError(message)
    return cast(Exception, error.UsageError(message))


def _display(text: str) -> None:
    try:
        shown: Any = importlib.import_module("IPython.display")
    except ImportError:
        sys.stdout.write(text + "\n")
        return
    shown.display(shown.HTML(text))


def _import_torch() -> None:
    """Imports torch before tracing starts, so that its tracker is installed for a cell that
    imports it itself."""
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401


def _uninstall_tracker() -> None:
    """PyTorch tracking off between traced cells (as the pytest plugin does between tests)."""
    tracker = sys.modules.get("msmemscope.capture.torch_tracker")
    if tracker is not None:
        tracker.uninstall()


# --- what one cell's rows say ------------------------------------------------------------------
@dataclass
class StepUse:
    """One device's tensor bytes in use in one step: the highest, and at the step's end."""

    step: int
    high: int
    end: int


@dataclass
class Report:
    run_dir: Path
    first_step: int
    last_step: int
    found: dict[str, Any]
    holders: dict[str, str]
    cell_names: dict[str, int]
    # device -> its steps in order
    per_step: dict[str, list[StepUse]] = field(default_factory=dict)
    # device, bytes, step, [(site, bytes)] of the cell's own highest moment
    peak: tuple[str, int, int, list[tuple[str, int]]] | None = None
    other_output: Path | None = None


def _dump_files(run: Path) -> list[Path]:
    return sorted(run.glob("device_*/dump/memscope_dump_*.csv")) + sorted(
        run.glob("device_*/dump/memscope_dump_*.steps/step_*.csv")
    )


def _rows(run: Path, offsets: dict[Path, int]) -> list[list[str]]:
    """The dump rows written since ``offsets`` (every CSV file of the run), in ID order."""
    rows: list[list[str]] = []
    for path in _dump_files(run):
        try:
            with open(path, "rb") as f:
                f.seek(offsets.get(path, 0))
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        for row in csv.reader(io.StringIO(text)):
            if len(row) > _COL_ATTR and row[_COL_ID].isdigit():
                rows.append(row)
    rows.sort(key=lambda r: int(r[_COL_ID]))
    return rows


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def _attr(row: list[str]) -> dict[str, Any]:
    try:
        value = json.loads(row[_COL_ATTR])
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _report(
    run: Path,
    offsets: dict[Path, int],
    first_step: int,
    found: dict[str, Any],
    holders: list[dict[str, object]],
    cell_names: dict[str, int],
) -> Report:
    rows = _rows(run, offsets)
    step = first_step
    per_step: dict[str, list[StepUse]] = {}
    used: dict[str, int] = {}
    peak: tuple[str, int, int, int] | None = None  # device, bytes, step, row index
    for index, row in enumerate(rows):
        if row[_COL_EVENT] == "SYSTEM" and row[_COL_TYPE] == "STEP":
            with contextlib.suppress(ValueError):
                step = int(row[_COL_NAME])
            for device, value in used.items():
                per_step[device].append(StepUse(step, value, value))
            continue
        if row[_COL_EVENT] not in ("MALLOC", "FREE") or row[_COL_TYPE] != "PTA":
            continue
        now = _attr(row).get("used")
        if not isinstance(now, int):
            continue
        device = row[_COL_DEVICE]
        used[device] = now
        steps = per_step.setdefault(device, [])
        if not steps or steps[-1].step != step:
            steps.append(StepUse(step, now, now))
        steps[-1].high = max(steps[-1].high, now)
        steps[-1].end = now
        if peak is None or now > peak[1]:
            peak = (device, now, step, index)
    report = Report(
        run_dir=run,
        first_step=first_step,
        last_step=step,
        found=found,
        holders=_holders_by_site(holders),
        cell_names=cell_names,
        per_step=per_step,
    )
    if peak is not None:
        report.peak = (peak[0], peak[1], peak[2], _lines_at(rows, peak[0], peak[3], peak[1]))
    if report.last_step == first_step and found.get("available"):
        report.last_step = max(first_step, int(found.get("steps") or 0))
    return report


def _lines_at(rows: list[list[str]], device: str, upto: int, total: int) -> list[tuple[str, int]]:
    """The bytes each site had live on ``device`` at row ``upto`` (the cell's own blocks; the
    rest of ``total`` was allocated before the cell), largest first."""
    live: dict[str, tuple[int, str]] = {}
    for row in rows[: upto + 1]:
        if row[_COL_DEVICE] != device or row[_COL_TYPE] != "PTA":
            continue
        if row[_COL_EVENT] == "MALLOC":
            attr = _attr(row)
            size = attr.get("size")
            if isinstance(size, int):
                live[row[_COL_PTR]] = (size, str(attr.get("site") or "(no Python line)"))
        elif row[_COL_EVENT] == "FREE":
            live.pop(row[_COL_PTR], None)
    by_site: dict[str, int] = {}
    for size, site in live.values():
        by_site[site] = by_site.get(site, 0) + size
    earlier = total - sum(by_site.values())
    if earlier > 0:
        by_site["(allocated before this cell)"] = earlier
    return sorted(by_site.items(), key=lambda kv: -kv[1])


def _holders_by_site(holders: list[dict[str, object]]) -> dict[str, str]:
    """The first holder found for each site, with how many more blocks it has. The kernel's
    namespace is ``__main__``, which the holder search names after the kernel's launcher."""
    main = sys.modules.get("__main__")
    launcher = ""
    if main is not None and getattr(main, "__file__", None) is None and sys.argv and sys.argv[0]:
        launcher = f"(global of {Path(sys.argv[0]).name})"
    chains: dict[str, list[str]] = {}
    for record in holders:
        site, holder = record.get("site"), record.get("holder")
        if isinstance(site, str) and isinstance(holder, str) and holder:
            if launcher:
                holder = holder.replace(launcher, "(global of the notebook)")
            chains.setdefault(site, []).append(holder)
    return {
        site: found[0] + (f" (and {len(found) - 1} more block(s))" if len(found) > 1 else "")
        for site, found in chains.items()
    }


# --- HTML --------------------------------------------------------------------------------------
def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _where(file: str, line: int, cell_names: dict[str, int]) -> str:
    """A site's place: ``Cell In[3], line 7`` for a notebook cell, else ``file:line``."""
    count = cell_names.get(file)
    if count is not None:
        return f"Cell In[{count}], line {line}"
    return f"{file}:{line}"


def _code(file: str, line: int) -> str:
    return linecache.getline(file, line).strip()


def _site_where(site: str, cell_names: dict[str, int]) -> tuple[str, str]:
    """``file:line (function)`` -> its place and its code."""
    place, _, _ = site.partition(" (")
    file, _, number = place.rpartition(":")
    if not file or not number.isdigit():
        return site, ""
    return _where(file, int(number), cell_names), _code(file, int(number))


def _cell_leaks(report: Report) -> list[dict[str, Any]]:
    """The leak sites that grew at a step end of this cell."""
    sites = report.found.get("leak_sites") or []
    return [
        s
        for s in sites
        if isinstance(s, dict) and int(s.get("last_step") or 0) >= report.first_step
    ]


def render_html(report: Report) -> str:
    """The report of one traced cell as an HTML fragment (no script, no external resource)."""
    e = html.escape
    cells = report.cell_names
    steps = report.last_step - report.first_step
    out = ['<div class="msmemscope-cell" style="font-family:sans-serif;font-size:13px">']
    out.append(
        f"<p><b>msmemscope</b>: {steps} step(s) in this cell "
        f"(steps {report.first_step}&ndash;{report.last_step} of the kernel)</p>"
    )
    found = report.found
    if not found.get("available"):
        out.append("<p>No findings: the runtime was not tracing.</p>")
    elif not found.get("leaks_analysis"):
        out.append("<p>The leaks analysis is off (<code>--analysis</code>).</p>")
    elif steps > 0 or _cell_leaks(report):
        leaks = _cell_leaks(report)
        if leaks:
            out.append(f"<h4>Leak sites: {len(leaks)} (memory that grows step over step)</h4>")
            out.append(
                '<table><tr><th style="text-align:left">line</th>'
                '<th style="text-align:left">code</th><th>per step</th><th>leaked</th>'
                '<th>steps</th><th style="text-align:left">held by</th></tr>'
            )
            for s in leaks[:_MAX_SITES]:
                file, line = str(s.get("file") or ""), int(s.get("line") or 0)
                if file:
                    where = f"{_where(file, line, cells)} ({s.get('function')})"
                else:
                    where = str(s.get("site") or "(no Python line recorded)")
                holder = report.holders.get(str(s.get("site")), "")
                out.append(
                    f'<tr><td title="{e(file)}:{line}">{e(where)}</td>'
                    f"<td><code>{e(_code(file, line))}</code></td>"
                    f'<td style="text-align:right">+{e(_size(int(s.get("bytes_per_step") or 0)))}'
                    f"</td>"
                    f'<td style="text-align:right">{e(_size(int(s.get("bytes") or 0)))}</td>'
                    f"<td>{s.get('first_step')}&ndash;{s.get('last_step')}</td>"
                    f"<td><code>{e(holder)}</code></td></tr>"
                )
            out.append("</table>")
            if len(leaks) > _MAX_SITES:
                out.append(f"<p>... and {len(leaks) - _MAX_SITES} more</p>")
        else:
            note = ""
            if int(found.get("steps") or 0) < 5:
                note = " (judging a leak takes 5 marked steps in the kernel)"
            out.append(
                f"<p>No leak: no line's tensor memory grew step over step in this cell{note}.</p>"
            )
    if steps == 0:
        out.append(
            "<p>No step boundary in this cell: steps come from <code>msmemscope.step()</code>"
            " or from <code>step()</code> of the first optimizer that steps in the kernel.</p>"
        )
    out.extend(_peak_html(report))
    chart = _svg(report.per_step)
    if chart:
        out.append("<h4>Tensor bytes in use per step (highest in each step)</h4>")
        out.append(chart)
    out.append(f"<p>Run directory: <code>{e(str(report.run_dir))}</code> (shared by every traced")
    out.append(" cell of this kernel; <code>leaks/findings.json</code> and")
    out.append(" <code>leaks/peak.json</code> are written when the kernel exits)</p>")
    if report.other_output is not None:
        out.append(
            f"<p>The runtime keeps one run directory per process: <code>-o "
            f"{e(str(report.other_output))}</code> takes effect in a new kernel only.</p>"
        )
    out.append("</div>")
    return "\n".join(out)


def _peak_html(report: Report) -> list[str]:
    e = html.escape
    if report.peak is not None:
        device, total, step, lines = report.peak
        out = [
            (
                f"<h4>Peak: {e(_size(total))} ({total} bytes) of tensors in use on {e(device)}"
                f" at step {step}</h4>"
            )
        ]
        if lines:
            out.append("<table>")
            for site, size in lines[:_MAX_PEAK_LINES]:
                where, code = _site_where(site, report.cell_names)
                out.append(
                    f"<tr><td>{e(where)}</td><td><code>{e(code)}</code></td>"
                    f'<td style="text-align:right">{e(_size(size))}</td></tr>'
                )
            out.append("</table>")
        return out
    peaks = report.found.get("peaks") or []
    return [
        f"<h4>Peak on {e(str(p.get('device')))}: {e(_size(int(p.get('bytes') or 0)))} "
        f"at step {p.get('step')} (the kernel's so far)</h4>"
        for p in peaks
        if isinstance(p, dict)
    ]


_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def _svg(per_step: dict[str, list[StepUse]]) -> str:
    """A line per device of each step's highest bytes in use, as inline SVG ("" if none)."""
    series = {d: s for d, s in per_step.items() if s}
    if not series:
        return ""
    width, height, left, bottom, top, right = 420, 140, 64, 22, 10, 10
    all_steps = [u.step for s in series.values() for u in s]
    lo, hi = min(all_steps), max(all_steps)
    top_bytes = max(u.high for s in series.values() for u in s) or 1

    def x(step: int) -> float:
        span = hi - lo or 1
        return left + (width - left - right) * (step - lo) / span

    def y(value: int) -> float:
        return top + (height - top - bottom) * (1 - value / top_bytes)

    base = height - bottom
    label = 'font-size="10"'
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="bytes in use per step">'
        ),
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{base}" stroke="#888"/>',
        f'<line x1="{left}" y1="{base}" x2="{width - right}" y2="{base}" stroke="#888"/>',
        (
            f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" {label}>'
            f"{html.escape(_size(top_bytes))}</text>"
        ),
        f'<text x="{left - 4}" y="{base}" text-anchor="end" {label}>0</text>',
        f'<text x="{left}" y="{height - 6}" {label}>step {lo}</text>',
        f'<text x="{width - right}" y="{height - 6}" text-anchor="end" {label}>step {hi}</text>',
    ]
    for n, (device, steps) in enumerate(sorted(series.items())):
        color = _COLORS[n % len(_COLORS)]
        points = " ".join(f"{x(u.step):.1f},{y(u.high):.1f}" for u in steps)
        parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{points}"/>'
        )
        for u in steps:
            parts.append(
                f'<circle cx="{x(u.step):.1f}" cy="{y(u.high):.1f}" r="2.5" fill="{color}">'
                f"<title>{html.escape(device)} step {u.step}: {u.high} bytes at most, "
                f"{u.end} at its end</title></circle>"
            )
        parts.append(
            f'<text x="{width - right}" y="{top + 12 + 12 * n}" text-anchor="end" '
            f'font-size="10" fill="{color}">{html.escape(device)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
