"""verl TaskRunner snapshot hooks.

verl's ``TaskRunner`` (a Ray actor, ``verl.trainer.main_ppo``) drives PPO through
``RayPPOTrainer`` (``verl.trainer.ppo.ray_trainer``): ``init_workers``, then ``fit``, whose
iterations compute old/reference log-probabilities and values and update the critic and the
actor. SNAPSHOT rows ``verl@<phase>@before``/``@after`` are written around each of these
methods in the process that runs them (on CUDA with the allocator's pickle; per-iteration
phases write pickles for their first call only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...snapshot.pickles import around
from . import _label

if TYPE_CHECKING:
    from ._patch import Patcher

TRIGGER = "verl.trainer.ppo.ray_trainer"

# (method, phase, pickles written: None = every call)
PHASES = (
    ("init_workers", "init_workers", None),
    ("fit", "fit", None),
    ("_compute_old_log_prob", "old_log_prob", 1),
    ("_compute_ref_log_prob", "ref_log_prob", 1),
    ("_compute_values", "values", 1),
    ("_update_critic", "update_critic", 1),
    ("_update_actor", "update_actor", 1),
)


def install_snapshot(patcher: Patcher) -> None:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    for method, phase, pickles in PHASES:
        patcher.wrap(
            RayPPOTrainer, method, around(f"verl@{phase}", _label.report, pickle_calls=pickles)
        )
