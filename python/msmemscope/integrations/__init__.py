"""Trainer callbacks: per-step memory capture from inside a training framework.

- :class:`msmemscope.integrations.transformers.MsMemScopeCallback` for Hugging Face
  ``transformers.Trainer``;
- :class:`msmemscope.integrations.lightning.MsMemScopeCallback` for PyTorch Lightning
  (``lightning.pytorch`` or ``pytorch_lightning``, whichever is installed).

Each marks one msmemscope step per optimizer step (at its start: msmemscope's step N is the
trainer's global step N, gradient accumulation included), labels the ``train``, ``eval`` and
``save`` phases as MSTX ranges, and puts the running leaks analysis's findings into the
trainer's log (``msmemscope/leak_sites``, ``msmemscope/leak_bytes_per_step``,
``msmemscope/peak_bytes``) and, at the end of training, on stderr. They do nothing (and warn
once) where the program is not traced: run it under ``msmemscope`` or call
``msmemscope.start()`` first.

This package imports neither framework: each callback's module imports its own.
"""

from __future__ import annotations

from ._tracer import LOG_KEYS, Tracer, log_values, summary

__all__ = ["LOG_KEYS", "Tracer", "log_values", "summary"]
