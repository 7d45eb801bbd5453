"""The interface both PyTorch captures offer the rest of the package, and the one they call.

:mod:`.torch_tracker` installs one tracker per process: the native capture's
:class:`~.native_tracker.NativeTracker`, or the dispatch-mode fallback's
:class:`~.dispatch_tracker.DispatchTracker`.
Code that works with either (the owner hooks, the memory block watch, the watcher's address
lookups) uses only the members of :class:`Tracker` below. Members that only one capture has
(``live``/``used`` of the fallback; ``live_block``, ``usage``, ``configure``, ``start``/``stop``
of the native capture) are not part of it: callers look those up on the concrete class.

:class:`OpWatch` is what a tracker runs around each op while something is watched: the memory
block watch (:mod:`msmemscope.watch`) implements it, so the capture never imports the watch.

This module is for type checkers: it imports nothing at runtime beyond :mod:`typing`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import collections
    import threading
    from collections.abc import Collection, Mapping, Sequence
    from types import ModuleType

    import torch

    from .config import Config
    from .native_tracker import _Freed
    from .op_info import OpInfo

__all__ = ["OpWatch", "Tracker"]


class OpWatch(Protocol):
    """What a tracker calls around each op it sees while its :attr:`Tracker.watch` is set: the
    memory block watch (``msmemscope.watch.state.Watch``), which sets and clears that attribute
    itself. Neither call raises."""

    def before(self, info: OpInfo, args: Sequence[object], kwargs: Mapping[str, object]) -> None:
        """Before the op runs, with its arguments."""
        ...

    def after(
        self, info: OpInfo, args: Sequence[object], kwargs: Mapping[str, object], out: object
    ) -> None:
        """After the op returned ``out``."""
        ...


class Tracker(Protocol):
    """A PyTorch tracker, either capture's: what the owner hooks, the memory block watch and the
    watcher use of it."""

    nat: ModuleType
    """The runtime's native module (``msmemscope._native``) the tracker emits through."""

    cfg: Config
    """The parts of the runtime's configuration the tracker acts on; replaced by
    ``torch_tracker.reload_config`` when the configuration changes."""

    enabled: bool
    """Whether the tracker records (set when it is installed, cleared when it is uninstalled)."""

    reported: bool
    """Whether an internal error has been reported already (only the first one is printed)."""

    lock: threading.RLock
    """Guards the tracker's shared state; held while reading :attr:`freed` of the fallback,
    which weakref callbacks (FREEs) may update from any thread."""

    watch: OpWatch | None
    """The memory block watch run around each op, or None while nothing is watched (the watch
    sets it)."""

    @property
    def freed(self) -> collections.OrderedDict[int, tuple[int, str]] | _Freed:
        """The newest freed blocks, which the watcher refuses to watch: the fallback's ordered
        ``address -> (size, device)`` mapping (read under :attr:`lock`), or the native capture's
        lookup object whose ``block(addr)`` gives ``(start, size, device)`` or None."""
        ...

    def report(self, exc: BaseException) -> None:
        """Reports the tracker's first internal error on stderr; later ones are dropped."""
        ...

    def set_owner(
        self,
        t: torch.Tensor,
        category: str | None = None,
        label: str | None = None,
        unless_framework: bool = False,
    ) -> None:
        """Gives ``t``'s storage the framework ``category`` and/or one more user ``label`` (an
        OWNER row when the owner of a live block changes); a storage made before tracking is
        adopted with a MALLOC row. With ``unless_framework``, a category that a framework hook
        gave (one with an ``@``) is kept. ValueError when ``t`` would carry too many labels."""
        ...

    def next_aid(self) -> int:
        """The allocation id the next block will get: the blocks made before this call have
        smaller ones."""
        ...

    def relabel_activations(
        self, data_ptrs: Collection[int], before: int, data: str, other: str
    ) -> int:
        """Moves the live blocks whose category is still ``activation`` (user labels kept): a
        block starting at one of ``data_ptrs`` to category ``data``, any other allocated before
        allocation id ``before`` to ``other``; an OWNER row each. Walks the live blocks once.
        Returns how many moved."""
        ...

    def written_storage(self, t: torch.Tensor) -> None:
        """``t``'s storage may have a new block (resized outside the dispatcher, or by an op):
        a changed block gets a FREE of the old block and a MALLOC of the new one, keeping the
        storage's category."""
        ...
