"""Megatron training-loop snapshot hooks (Megatron-Core, ``megatron.core``).

A Megatron training iteration is the schedule's forward-backward over the micro-batches
(``megatron.core.pipeline_parallel.schedules.forward_backward_*``, which
``get_forward_backward_func`` looks up at each call) followed by the optimizer's ``step``
(``megatron.core.optimizer``: every optimizer class that defines its own ``step``). SNAPSHOT
rows ``megatron@forward_backward@before``/``@after`` and ``megatron@optimizer_step@before``/
``@after`` are written around them (on CUDA with the allocator's pickle); with Megatron-LM's
``megatron.training`` present, ``megatron@train_step`` around ``training.train_step`` too.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ...snapshot.pickles import around
from . import _label

if TYPE_CHECKING:
    from ._patch import Patcher

TRIGGER = "megatron.core"

SCHEDULES = (
    "forward_backward_no_pipelining",
    "forward_backward_pipelining_without_interleaving",
    "forward_backward_pipelining_with_interleaving",
)


def install_snapshot(patcher: Patcher) -> None:
    from megatron.core.optimizer import optimizer as opt_module
    from megatron.core.pipeline_parallel import schedules

    for name in SCHEDULES:
        patcher.wrap(schedules, name, around("megatron@forward_backward", _label.report))
    optimizers = [
        cls
        for cls in vars(opt_module).values()
        if isinstance(cls, type)
        and issubclass(cls, opt_module.MegatronOptimizer)
        and "step" in vars(cls)
        and not getattr(vars(cls)["step"], "__isabstractmethod__", False)
    ]
    try:
        from megatron.core.optimizer import distrib_optimizer

        optimizers += [
            cls
            for cls in vars(distrib_optimizer).values()
            if isinstance(cls, type)
            and issubclass(cls, opt_module.MegatronOptimizer)
            and "step" in vars(cls)
            and cls not in optimizers
        ]
    except ImportError:
        pass
    if not optimizers:
        raise AttributeError("megatron.core.optimizer defines no optimizer class with a step")
    for cls in optimizers:
        patcher.wrap(cls, "step", around("megatron@optimizer_step", _label.report))
    training = sys.modules.get("megatron.training.training")
    if training is not None and hasattr(training, "train_step"):
        patcher.wrap(training, "train_step", around("megatron@train_step", _label.report))
