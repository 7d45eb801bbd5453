"""The capture of PyTorch memory events: tensor blocks, ATen ops and tensor accesses as rows of
the dump, through one of two trackers behind one interface.

- :mod:`.tracker`: the ``Tracker`` Protocol both captures satisfy, and ``OpWatch``, what a
  tracker runs around each op while something is watched;
- :mod:`.torch_tracker`: ``install()`` (picks the capture) and the dispatch-mode fallback
  (``MSMEMSCOPE_TORCH_CAPTURE=python``, or when the native library cannot be built);
- :mod:`.native_tracker`: the native capture (``native/capture.cpp``, ``native/pyframes.cpp``),
  built and cached by :mod:`.native_build`;
- :mod:`.owners`: the ``owner`` of each block (category at allocation, OWNER rows later);
- :mod:`.sites`: the allocation site (which files are the user's own code);
- :mod:`.cuda_allocator`: the CUDA caching allocator's OOM observer, device totals from NVML;
- :mod:`.extensions`: what the layers above plug into the capture (the memory block watch, the
  frameworks' decompose hooks, the leak holders' search), set by ``msmemscope/__init__.py``.

May import: only the bottom modules (``msmemscope._runtime``, and through it the extension
``msmemscope._native``). The capture is the lowest layer over PyTorch: it never imports
:mod:`msmemscope.watch`, :mod:`msmemscope.snapshot`, :mod:`msmemscope.frameworks`,
:mod:`msmemscope.holders` or the package's public modules; it calls them only through
:mod:`.extensions`. This file and :mod:`.extensions` import nothing (``import msmemscope``
imports them without torch); the trackers import torch.
"""
