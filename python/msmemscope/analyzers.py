"""Offline analyses of a dump file (``memscope_dump_{ts}.csv``, ``.db`` or ``.parquet``), run
in Rust.

They need no tracing and no runtime library: any dump written by msmemscope can be checked,
in the process that wrote it or anywhere else::

    import msmemscope
    msmemscope.check_leaks("/abs/path/memscope_dump_x.csv", mstx_info="step", start_index=0)
    blocks = msmemscope.check_inefficient("dump.csv", inefficient_type="late_deallocation")

    msmemscope.list_analyzers()       # ['decompose', 'inefficient', 'leaks', 'peak']
    msmemscope.get_analyzer_config("inefficient")
    msmemscope.analyze("inefficient", input_path="dump.csv", idle_threshold=100)

Misuse raises ``TypeError`` (a wrong type) or ``ValueError`` (a bad value, a missing or malformed
file) with a message naming the argument; an unreadable file raises ``OSError``. An input must be
a regular file (a FIFO or a device is refused, not read); a row longer than 16 MiB, a field that
does not parse (an Attr ``size`` beyond 64 bits included) or rows out of ID order make it
malformed, named by its line (CSV) or row ID (SQLite, Parquet).
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable
from typing import Any, Union

from . import _native

__all__ = [
    "INEFFICIENT_TYPES",
    "analyze",
    "check_decompose",
    "check_inefficient",
    "check_leaks",
    "check_peak",
    "get_analyzer_config",
    "list_analyzers",
]

#: The ``inefficient_type`` values: ``early_allocation``, ``late_deallocation``,
#: ``temporary_idleness``.
INEFFICIENT_TYPES: tuple[str, ...] = tuple(_native.INEFFICIENT_TYPES)

PathArg = Union[str, "os.PathLike[str]"]  # not `|`: evaluated at import, on Python 3.9 too


def check_leaks(input_path: PathArg, mstx_info: str, start_index: int) -> list[dict[str, Any]]:
    """Leaks between marks: A, B and C are the ``start_index``-th (from 0), the next and the one
    after of the MSTX ``Mark`` rows whose message equals ``mstx_info``; a block allocated between
    A and B and not freed before C leaks (every pool: PTA, HAL, HOST). With ``mstx_info="step"``
    the dump's steps (``msmemscope.step()``, ``step start`` ranges) count as such marks too.

    ``input_path`` must be absolute (as the original msMemScope requires). Prints the report (the
    blocks, then the same bytes by site) and returns the leaked blocks in allocation order as dicts:
    ``id`` (the MALLOC row's ID), ``ptr``, ``size``, ``device`` (as the Device Id column: ``"cpu"``,
    ``"0"``...), ``pool``, ``python_stack``, ``site`` (the user's ``file:line (function)``) and
    ``op`` (None when the dump has none).
    ``ValueError`` when the file is missing or malformed or has too few marks.
    """
    console, leaks = _native.check_leaks(input_path, mstx_info, start_index)
    print(console, end="")
    return leaks


def check_inefficient(
    input_path: PathArg,
    mem_size: int = 0,
    inefficient_type: str | None = None,
    idle_threshold: int = 3000,
    *,
    output_path: PathArg | None = None,
) -> list[dict[str, Any]]:
    """Inefficient memory at op granularity (op k = the k-th ``ATEN_START`` row of the device):

    - ``early_allocation``: another tensor of the device is freed in an op strictly between the
      op that allocates the block and the op of its first access;
    - ``late_deallocation``: another tensor of the device is allocated in an op strictly between
      the op of the block's last access and the op that frees it;
    - ``temporary_idleness``: more than ``idle_threshold`` ops lie strictly between two
      consecutive accesses of the block.

    Returns one dict per (block, kind), ordered by the MALLOC row's ID: ``id``, ``ptr``,
    ``size``, ``device``, ``inefficient_type``; only blocks of at least ``mem_size`` bytes, and
    only ``inefficient_type`` when given. Writes nothing, unless ``output_path`` is given: then
    the result is also written there as CSV (``ID,Ptr,size,Device Id,inefficient_type``, the
    format of the online analysis's ``inefficient/inefficient_blocks.csv``); ``ValueError`` when
    ``output_path`` is the input file itself, a symlink or not a regular file, which are never
    written.
    """
    return _native.check_inefficient(
        input_path, mem_size, inefficient_type, idle_threshold, output_path=output_path
    )


def check_decompose(input_path: PathArg) -> list[dict[str, Any]]:
    """What memory was made of, per step, from a dump written with owners (``--analysis=decompose``
    or ``describe`` labels): one dict per (step, device, pool, owner) with ``current`` (live bytes
    at the step's end), ``peak`` (the owner's bytes when the pool's total peaked in the step) and
    ``max`` (the owner's own highest); the owner ``total`` sums each step. The same table the
    online analysis writes as ``memscope_decompose.csv``."""
    return _native.check_decompose(input_path)


def check_peak(input_path: PathArg) -> list[dict[str, Any]]:
    """What each device's peak is made of, from a dump: one dict per device (``device``,
    ``pool``, ``peak``: its bytes, step, op, phase, owners and the user's lines whose blocks were
    live then, largest first; ``steps``: each step's peak). The same document the online leaks
    analysis writes as ``leaks/peak.json`` (its ``devices``)."""
    doc = json.loads(_native.check_peak(input_path))
    devices: list[dict[str, Any]] = doc["devices"]
    return devices


_ANALYZERS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "decompose": check_decompose,
    "inefficient": check_inefficient,
    "leaks": check_leaks,
    "peak": check_peak,
}


def list_analyzers() -> list[str]:
    """The names of the analyzers :func:`analyze` runs offline, sorted."""
    return sorted(_ANALYZERS)


def _analyzer(name: object) -> Callable[..., list[dict[str, Any]]]:
    if not isinstance(name, str):
        raise TypeError(f"the analyzer name must be a str, got {type(name).__name__}")
    try:
        return _ANALYZERS[name]
    except KeyError:
        raise ValueError(
            f"unknown analyzer {name!r}; available: {', '.join(list_analyzers())}"
        ) from None


def get_analyzer_config(name: str) -> dict[str, Any]:
    """The parameters of analyzer ``name`` with their defaults, in order; a required parameter
    (``input_path``; ``mstx_info`` and ``start_index`` of ``leaks``) has the value ``None``."""
    params = inspect.signature(_analyzer(name)).parameters.values()
    return {p.name: (None if p.default is inspect.Parameter.empty else p.default) for p in params}


def analyze(name: str, **kw: Any) -> list[dict[str, Any]]:
    """Runs analyzer ``name`` with keyword arguments (those of :func:`get_analyzer_config`)."""
    func = _analyzer(name)
    params = inspect.signature(func).parameters
    unknown = sorted(set(kw) - set(params))
    if unknown:
        raise TypeError(
            f"analyzer {name!r} takes no argument {', '.join(unknown)}; "
            f"it takes {', '.join(params)}"
        )
    missing = [
        p.name for p in params.values() if p.default is inspect.Parameter.empty and p.name not in kw
    ]
    if missing:
        raise TypeError(f"analyzer {name!r} needs {', '.join(missing)}")
    return func(**kw)
