"""FSDP1 (``torch.distributed.fsdp.FullyShardedDataParallel``) decompose hooks.

FSDP1 keeps each wrapped module's parameters in one ``FlatParameter`` per handle
(``torch/distributed/fsdp/_flat_param.py``, ``_runtime_utils.py``, PyTorch 2.6 and later):

- ``FlatParamHandle.shard``: the rank's shard of the flat parameter -> ``fsdp1@sharded_weight``
  (the full flat parameter it replaces is freed by a storage resize, reported as a FREE);
- ``FlatParamHandle.init_flat_param_attributes``: the padded unsharded flat parameter that
  the all-gather fills (``_full_param_padded``, the unsharded weight) ->
  ``fsdp1@unsharded_weight``, and the low-precision shard used as all-gather input with mixed
  precision (``_mp_shard``) -> ``fsdp1@all_gather``;
- ``FlatParamHandle.unshard``: anything the all-gather allocates -> ``fsdp1@all_gather``; the
  unsharded flat parameter's storage, re-allocated by resizing, -> ``fsdp1@unsharded_weight``;
- ``_runtime_utils._reduce_grad``: the padded unsharded gradient and the reduce-scatter output
  -> ``fsdp1@reduce_scatter``; the unsharded gradient it consumes and the sharded gradient it
  leaves on the flat parameter -> ``fsdp1@gradient``;
- ``FullyShardedDataParallel.forward``: the wrapped module's forward computation ->
  ``fsdp1@activation`` (nested FSDP units' all-gathers keep their own category).

``_alloc_storage``/``_free_storage`` (in-place storage resizes) are reported to the tracker as a
FREE and a MALLOC of the same owner.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import _label

if TYPE_CHECKING:
    from ._patch import Patcher

PREFIX = "fsdp1"
SHARDED_WEIGHT = f"{PREFIX}@sharded_weight"
UNSHARDED_WEIGHT = f"{PREFIX}@unsharded_weight"
ALL_GATHER = f"{PREFIX}@all_gather"
REDUCE_SCATTER = f"{PREFIX}@reduce_scatter"
GRADIENT = f"{PREFIX}@gradient"
ACTIVATION = f"{PREFIX}@activation"

TRIGGER = "torch.distributed.fsdp.fully_sharded_data_parallel"


def _modules() -> tuple[ModuleType, ModuleType, ModuleType]:
    from torch.distributed.fsdp import _flat_param, _runtime_utils, fully_sharded_data_parallel

    return _flat_param, _runtime_utils, fully_sharded_data_parallel


# FSDP1's FlatParameter is a plain nn.Parameter to the tracker: the automatic labelling (module
# pre-forward, Optimizer.step, gradient hooks) would call it `weight`, but an automatic relabel
# never replaces a framework category (owners._relabel_quietly), so these names stay.


def _label_padded(flat_param: Any) -> None:
    for name in ("_full_param_padded", "_full_prec_full_param_padded"):
        _label.relabel(getattr(flat_param, name, None), UNSHARDED_WEIGHT)
    _label.relabel(getattr(flat_param, "_mp_shard", None), ALL_GATHER)


def install(patcher: Patcher) -> None:
    flat_module, runtime_module, fsdp_module = _modules()
    handle_cls = flat_module.FlatParamHandle

    patcher.wrap(flat_module, "_alloc_storage", _label.after_resize)
    patcher.wrap(flat_module, "_free_storage", _label.after_resize)

    def shard(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            # The full flat parameter's storage is resized to 0 inside: keep a plain alias to
            # report that FREE.
            before = _label.plain(self.flat_param)
            with _label.scope(SHARDED_WEIGHT):
                out = original(self, *args, **kwargs)
            if before is not None:
                _label.resized(before)
            if self.uses_sharded_strategy:
                _label.relabel(self.flat_param, SHARDED_WEIGHT)
            return out

        return wrapper

    patcher.wrap(handle_cls, "shard", shard)

    def init_attributes(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _label.scope(UNSHARDED_WEIGHT):
                out = original(self, *args, **kwargs)
            _label_padded(self.flat_param)
            return out

        return wrapper

    patcher.wrap(handle_cls, "init_flat_param_attributes", init_attributes)

    def unshard(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _label.scope(ALL_GATHER):
                out = original(self, *args, **kwargs)
            _label_padded(self.flat_param)
            return out

        return wrapper

    patcher.wrap(handle_cls, "unshard", unshard)

    def reduce_grad(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(state: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
            flat_param = handle.flat_param
            _label.relabel(flat_param.grad, GRADIENT)
            with _label.scope(REDUCE_SCATTER):
                out = original(state, handle, *args, **kwargs)
            _label.relabel(flat_param.grad, GRADIENT)
            _label.relabel(getattr(flat_param, "_saved_grad_shard", None), GRADIENT)
            return out

        return wrapper

    patcher.wrap(runtime_module, "_reduce_grad", reduce_grad)

    def forward(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _label.scope(ACTIVATION):
                return original(self, *args, **kwargs)

        return wrapper

    patcher.wrap(fsdp_module.FullyShardedDataParallel, "forward", forward)
