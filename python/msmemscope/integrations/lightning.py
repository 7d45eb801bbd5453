"""``MsMemScopeCallback`` for PyTorch Lightning (``lightning.pytorch``, else
``pytorch_lightning``)::

    from msmemscope.integrations.lightning import MsMemScopeCallback

    trainer = L.Trainer(max_steps=1000, callbacks=[MsMemScopeCallback()])
    trainer.fit(model, train_loader)  # run under `msmemscope -o out python train.py`

- Steps: ``trainer.global_step`` counts optimizer steps; the first batch of each optimizer
  step (``on_train_batch_start`` seeing a new ``global_step``) starts the next msmemscope step,
  so one step per optimizer step whatever ``accumulate_grad_batches`` is, and msmemscope's step
  N is the trainer's N-th optimizer step.
- Phases: MSTX ranges ``train`` (``on_train_start`` to ``on_train_end``), ``eval`` (the
  validation, sanity check included) and ``save`` (from ``on_save_checkpoint`` to the next
  hook: the checkpoint is written in between).
- Log: after each optimizer step ``pl_module.log_dict`` logs ``msmemscope/leak_sites``,
  ``msmemscope/leak_bytes_per_step``, ``msmemscope/peak_bytes``, refreshed from the running
  findings every ``trainer.log_every_n_steps`` optimizer steps; at the end of training they go
  to ``trainer.loggers`` once more, and the leak sites and the peak to stderr
  (:attr:`MsMemScopeCallback.findings` keeps them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._tracer import Tracer, log_values

if TYPE_CHECKING:
    _Base = object
else:
    try:
        from lightning.pytorch import Callback as _Base
    except ImportError:
        from pytorch_lightning import Callback as _Base

__all__ = ["MsMemScopeCallback"]


class MsMemScopeCallback(_Base):
    """Per-step memory capture for a Lightning ``Trainer`` (see the module's text).

    ``log_findings``: log the findings (each refresh costs a flush of the event queue).
    ``keep_steps``: global steps whose rows a bounded dump keeps in full
    (``msmemscope.keep_steps``)."""

    def __init__(self, log_findings: bool = True, keep_steps: Iterable[int] = ()) -> None:
        super().__init__()
        self.log_findings = log_findings
        self.tracer = Tracer("MsMemScopeCallback", keep_steps)
        self._marked_at: int | None = None
        self._refreshed_at: int | None = None
        self._values: dict[str, float] = {}
        self.findings: dict[str, Any] | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.tracer.end("save")
        self.tracer.begin("train")

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self.tracer.end("save")
        step = int(trainer.global_step)
        if step != self._marked_at:
            self._marked_at = step
            self.tracer.step()

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = int(trainer.global_step)
        if not self.log_findings or step == self._marked_at:
            return  # a micro-batch that did not step the optimizer
        every = max(int(getattr(trainer, "log_every_n_steps", 50) or 1), 1)
        if step % every == 0 and step != self._refreshed_at:
            self._refreshed_at = step
            self._values = log_values(self.tracer.findings())
        if self._values:
            pl_module.log_dict(self._values, on_step=True, on_epoch=False, logger=True)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self.tracer.end("save")
        self.tracer.begin("eval")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self.tracer.end("eval")

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        self.tracer.begin("save")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.tracer.end_all()
        found = self.tracer.report()
        self.findings = found
        values = log_values(found)
        if self.log_findings and values:
            for logger in getattr(trainer, "loggers", None) or []:
                logger.log_metrics(values, step=int(trainer.global_step))

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.tracer.end_all()
