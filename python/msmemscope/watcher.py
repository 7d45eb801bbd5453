"""``msmemscope.watcher``: watch a memory block for changes around PyTorch ops
(docs/python-api.md#watcher).

::

    msmemscope.watcher.watch(t, name="w", dump_nums=2)                    # a contiguous tensor
    msmemscope.watcher.watch(t.data_ptr(), length=64, name="w")           # an address range
    msmemscope.watcher.remove(t)

The public name of :mod:`msmemscope.watch.watcher`, where these functions live beside the watch
itself (:mod:`msmemscope.watch.state`); see there for the details.
"""

from __future__ import annotations

from .watch.watcher import remove, watch

__all__ = ["remove", "watch"]
