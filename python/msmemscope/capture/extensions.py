"""What the layers above the capture plug into it, so that the capture never imports them.

``msmemscope/__init__.py`` sets all three when ``import msmemscope`` runs, which comes before
any import of this package's modules (Python imports a package before its submodules), so every
tracker is made with them. Unset (None), a tracker watches nothing, the frameworks' decompose
hooks stay off and no holder search is registered.

Torch-free: ``import msmemscope`` imports this module without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from .tracker import OpWatch, Tracker

attach_watch: Callable[[Tracker], OpWatch | None] | None = None
"""The memory block watch (:mod:`msmemscope.watch`), called from each tracker's constructor:
takes the tracker and returns what its ``watch`` attribute starts as (None: nothing watched)."""

framework_decompose_hooks: Callable[[bool], None] | None = None
"""The frameworks' automatic decompose hooks (:mod:`msmemscope.frameworks.hooks`), called at
each ``torch_tracker.reload_config`` with whether the decompose analysis is on."""

leaks_at_exit: Callable[[], None] | None = None
"""The search for the holders of leaked tensors at exit (:mod:`msmemscope.holders`), called
when the tracker is installed with the leaks analysis on."""
