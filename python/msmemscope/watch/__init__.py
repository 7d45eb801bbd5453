"""The memory block watch (docs/analyses.md#watch): checksums or bytes of watched blocks before and
after the ATen ops the PyTorch tracker sees, and a summary at exit.

- :mod:`.state`: the process's watch (:data:`~.state.WATCH`): registered blocks, the
  ``--watch`` op range, what changed, the ``watch_dump/`` files, the summary;
- :mod:`.watcher`: the public functions ``watch`` and ``remove``, importable as
  ``msmemscope.watcher``.

May import: :mod:`msmemscope.capture` (the ``Tracker`` and ``OpWatch`` interfaces, for type
checkers only; the running tracker is looked up in ``sys.modules``, so the watch never imports
torch or the capture's modules itself) and the bottom modules (``_runtime``, ``_native``). The
capture does not import the watch: ``msmemscope/__init__.py`` plugs ``WATCH.attach`` into
:mod:`msmemscope.capture.extensions`. Nothing here imports :mod:`msmemscope.frameworks`,
:mod:`msmemscope.snapshot` or the package's public modules.
"""
