"""What both trackers are told and share besides ops: the parts of the runtime's configuration
they act on, the directories (torch's and msmemscope's) whose frames are not the program's, and
how they report their first internal error."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, cast

import torch

if TYPE_CHECKING:
    from .tracker import Tracker

__all__ = ["SKIP_DIRS", "Config", "report_once"]

# Frames from these directories are skipped at the top (innermost end) of Python stacks.
SKIP_DIRS = tuple(
    {
        # Both are packages loaded from files: their __file__ is never None.
        os.path.dirname(resolve(cast(str, m.__file__))) + os.sep
        for m in (torch, sys.modules[__package__.rpartition(".")[0]])
        for resolve in (os.path.abspath, os.path.realpath)
    }
)


class Config:
    """The parts of the runtime's RunConfig the tracker acts on, read once per (re)load."""

    __slots__ = (
        "access",
        "alloc",
        "c_stack",
        "decompose",
        "free",
        "launch",
        "oom",
        "python_depth",
    )

    def __init__(self, config_json: str | None = None) -> None:
        cfg = json.loads(config_json) if config_json else {}
        events = set(cfg.get("events", ("alloc", "free", "launch")))
        level = cfg.get("level", "op")
        levels = {level} if isinstance(level, str) else set(level or ())
        self.access = "access" in events
        # access implies alloc and free (the CLI resolves that too).
        self.alloc = "alloc" in events or self.access
        self.free = "free" in events or self.access
        self.launch = "launch" in events and "op" in levels
        stacks = cfg.get("call_stack") or {}
        self.python_depth = stacks.get("python") or 0
        self.c_stack = stacks.get("c") is not None
        self.decompose = "decompose" in (cfg.get("analysis") or ())
        analyses = cfg.get("analysis") or ()
        self.oom = any(a == "oom" or (isinstance(a, dict) and "oom" in a) for a in analyses)


def report_once(tracker: Tracker, exc: BaseException) -> None:
    """Reports a tracker's first internal error on stderr; later ones are dropped."""
    if tracker.reported:
        return
    tracker.reported = True
    try:
        sys.stderr.write(f"msmemscope: tracker error: {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
    except Exception:
        pass
