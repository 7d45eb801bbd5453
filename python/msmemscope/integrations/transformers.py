"""``MsMemScopeCallback`` for Hugging Face ``transformers.Trainer``::

    from msmemscope.integrations.transformers import MsMemScopeCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[MsMemScopeCallback()])
    trainer.train()  # run under `msmemscope -o out python train.py`

- Steps: ``on_step_begin`` fires once per global step (after gradient accumulation, not per
  micro-batch): each starts the next msmemscope step, so msmemscope's step N is the trainer's
  global step N (rows before training are step 0).
- Phases: MSTX ranges ``train`` (``on_train_begin`` to ``on_train_end``), ``eval`` and
  ``save`` (opened before the evaluation or the checkpoint the step's control asks for, closed
  by ``on_evaluate`` / ``on_save``).
- Log: at each log event the running findings are added to ``logs`` and to the entry the
  trainer appended to ``state.log_history``: ``msmemscope/leak_sites``,
  ``msmemscope/leak_bytes_per_step``, ``msmemscope/peak_bytes``. Reporting callbacks the
  trainer placed before this one (``report_to``) have seen ``logs`` already.
- End: the leak sites and the peak on stderr; :attr:`MsMemScopeCallback.findings` keeps them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._tracer import Tracer, log_values

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    _Base = object
else:
    from transformers import TrainerCallback as _Base

__all__ = ["MsMemScopeCallback"]


class MsMemScopeCallback(_Base):
    """Per-step memory capture for ``transformers.Trainer`` (see the module's text).

    ``log_findings``: add the findings to each log event (each costs a flush of the event
    queue, at the trainer's ``logging_steps``). ``keep_steps``: global steps whose rows a
    bounded dump keeps in full (``msmemscope.keep_steps``)."""

    def __init__(self, log_findings: bool = True, keep_steps: Iterable[int] = ()) -> None:
        super().__init__()
        self.log_findings = log_findings
        self.tracer = Tracer("MsMemScopeCallback", keep_steps)
        # The phases the step's control asks for, in the order the trainer runs them.
        self._pending: list[str] = []
        self.findings: dict[str, Any] | None = None

    # --- training ----------------------------------------------------------------------------
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.tracer.begin("train")

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._close_phases()
        self.tracer.step()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        # The trainer logs, then evaluates, then saves (Trainer._maybe_log_save_evaluate); the
        # flow callback set what it will do on `control` before this one runs.
        self._pending = [
            phase
            for phase, wanted in (("eval", control.should_evaluate), ("save", control.should_save))
            if wanted
        ]
        if not control.should_log:
            self._next_phase()

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kw: Any,
    ) -> None:
        if self.log_findings and logs is not None and not self.tracer.is_open("eval"):
            values = log_values(self.tracer.findings())
            logs.update(values)
            # Trainer.log appended a copy of `logs` to the history before calling back.
            history = state.log_history
            if values and history and isinstance(history[-1], dict):
                history[-1].update(values)
        if not self.tracer.is_open("eval") and not self.tracer.is_open("save"):
            self._next_phase()

    # --- evaluation and saving ---------------------------------------------------------------
    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        # An evaluation the step did not ask for (trainer.evaluate()): from its first batch.
        if not self.tracer.is_open("eval"):
            self._pending = [p for p in self._pending if p != "eval"]
            self.tracer.begin("eval")

    def on_evaluate(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.tracer.end("eval")
        self._next_phase()

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self.tracer.end("save")
        self._pending = [p for p in self._pending if p != "save"]
        self._next_phase()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._close_phases()
        self.tracer.end("train")
        self.findings = self.tracer.report()

    # --- helpers -----------------------------------------------------------------------------
    def _next_phase(self) -> None:
        """Opens the next phase the step asked for (closing the one before)."""
        if not self._pending:
            return
        self._close_phases()
        self.tracer.begin(self._pending.pop(0))

    def _close_phases(self) -> None:
        self.tracer.end("eval")
        self.tracer.end("save")
