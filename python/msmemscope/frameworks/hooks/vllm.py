"""vLLM worker hooks (``vllm.v1.worker.gpu_worker.Worker``, vLLM's V1 engine).

The worker's memory phases, the methods that run them and their decompose categories:

- load_weight: ``Worker.load_model`` -> ``vllm@load_weight``;
- profile_run: ``Worker.determine_available_memory`` (runs the model runner's ``profile_run``)
  -> ``vllm@profile_run``;
- kv_cache: ``Worker.initialize_from_config`` (allocates the KV cache) -> ``vllm@kv_cache``;
- activate: ``Worker.execute_model`` (one scheduler step) -> ``vllm@activate``.

decompose: tensors allocated inside each method get its category. snapshot: SNAPSHOT rows
``vllm@<phase>@before``/``@after`` around each (on CUDA with the allocator's pickle; for
``execute_model``, which runs every step, only the first step's pickles are written).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...snapshot.pickles import around
from . import _label

if TYPE_CHECKING:
    from ._patch import Patcher

TRIGGER = "vllm.v1.worker.gpu_worker"

PHASES = (
    ("load_model", "load_weight"),
    ("determine_available_memory", "profile_run"),
    ("initialize_from_config", "kv_cache"),
    ("execute_model", "activate"),
)


def _worker_cls() -> Any:
    from vllm.v1.worker.gpu_worker import Worker

    return Worker


def _in_scope(category: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _label.scope(category):
                return original(*args, **kwargs)

        return wrapper

    return make


def install_decompose(patcher: Patcher) -> None:
    worker = _worker_cls()
    for method, phase in PHASES:
        patcher.wrap(worker, method, _in_scope(f"vllm@{phase}"))


def install_snapshot(patcher: Patcher) -> None:
    worker = _worker_cls()
    for method, phase in PHASES:
        pickles = 1 if method == "execute_model" else None
        patcher.wrap(worker, method, around(f"vllm@{phase}", _label.report, pickle_calls=pickles))
