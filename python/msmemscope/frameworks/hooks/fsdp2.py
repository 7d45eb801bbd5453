"""FSDP2 (``torch.distributed.fsdp.fully_shard``) decompose hooks.

Where FSDP2's memory comes from (PyTorch 2.6 and later, ``torch/distributed/fsdp/_fully_shard``):

- ``FSDPParam._init_sharded_param`` / ``reset_sharded_param``: each rank's padded shard of a
  parameter (``_sharded_param_data``) -> ``fsdp2@sharded_weight``;
- ``FSDPParamGroup.unshard``: ``foreach_all_gather``'s flat input and output buffers ->
  ``fsdp2@all_gather``;
- ``FSDPParamGroup.wait_for_unshard``: the copy-out into each parameter's unsharded storage
  (``FSDPParam.all_gather_outputs``, which the unsharded parameter views) ->
  ``fsdp2@unsharded_weight``;
- ``FSDPParamGroup.post_backward``: ``foreach_reduce``'s reduce-scatter input and output buffers
  -> ``fsdp2@reduce_scatter``; the unsharded gradients it consumes and the sharded gradients it
  leaves on the parameters (views of the reduce-scatter output) -> ``fsdp2@gradient``;
- between ``FSDPParamGroup.pre_forward`` and ``post_forward``: the module's forward computation
  -> ``fsdp2@activation`` (an inner group's all-gather keeps its own category: the innermost
  region wins).

``alloc_storage``/``free_storage`` (the in-place storage resizes that free and re-allocate
unsharded parameters, invisible to a dispatch mode) are reported to the tracker as a FREE and a
MALLOC of the same owner.

Methods are patched on the classes, so modules sharded before the hooks were installed are
covered too (except their sharded weights, which already exist: they are relabelled at the next
unshard).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import _label

if TYPE_CHECKING:
    from ._patch import Patcher

PREFIX = "fsdp2"
SHARDED_WEIGHT = f"{PREFIX}@sharded_weight"
UNSHARDED_WEIGHT = f"{PREFIX}@unsharded_weight"
ALL_GATHER = f"{PREFIX}@all_gather"
REDUCE_SCATTER = f"{PREFIX}@reduce_scatter"
GRADIENT = f"{PREFIX}@gradient"
ACTIVATION = f"{PREFIX}@activation"

TRIGGER = "torch.distributed.fsdp._fully_shard"


def _modules() -> tuple[ModuleType, ModuleType]:
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    return _fsdp_param, _fsdp_param_group


def _label_sharded(fsdp_param: Any) -> None:
    _label.relabel(getattr(fsdp_param, "_sharded_param_data", None), SHARDED_WEIGHT)


def _label_unsharded(group: Any) -> None:
    for fsdp_param in group.fsdp_params:
        _label_sharded(fsdp_param)
        for t in getattr(fsdp_param, "all_gather_outputs", None) or ():
            _label.relabel(t, UNSHARDED_WEIGHT)


def _label_grads(group: Any, sharded: bool) -> None:
    for fsdp_param in group.fsdp_params:
        if sharded:
            param = getattr(fsdp_param, "sharded_param", None)
        else:
            param = getattr(fsdp_param, "_unsharded_param", None)
        if param is not None:
            _label.relabel(param.grad, GRADIENT)


def install(patcher: Patcher) -> None:
    param_module, group_module = _modules()
    fsdp_param_cls = param_module.FSDPParam
    group_cls = group_module.FSDPParamGroup

    # Unsharded parameters are freed and re-allocated by resizing their storage in place.
    patcher.wrap(param_module, "alloc_storage", _label.after_resize)
    patcher.wrap(param_module, "free_storage", _label.after_resize)
    if "alloc_storage" in vars(group_module):
        patcher.wrap(group_module, "alloc_storage", _label.after_resize)

    def sharded_init(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _label.scope(SHARDED_WEIGHT):
                out = original(self, *args, **kwargs)
            _label_sharded(self)
            return out

        return wrapper

    patcher.wrap(fsdp_param_cls, "_init_sharded_param", sharded_init)
    patcher.wrap(fsdp_param_cls, "reset_sharded_param", sharded_init)

    def all_gather_outputs(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _label.scope(UNSHARDED_WEIGHT):
                return original(self, *args, **kwargs)

        return wrapper

    patcher.wrap(fsdp_param_cls, "init_all_gather_outputs", all_gather_outputs)

    def unshard(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _label.scope(ALL_GATHER):
                return original(self, *args, **kwargs)

        return wrapper

    patcher.wrap(group_cls, "unshard", unshard)

    def wait_for_unshard(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _label.scope(UNSHARDED_WEIGHT):
                out = original(self, *args, **kwargs)
            _label_unsharded(self)
            return out

        return wrapper

    patcher.wrap(group_cls, "wait_for_unshard", wait_for_unshard)

    def pre_forward(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = original(self, *args, **kwargs)
            _label.enter(ACTIVATION)
            return out

        return wrapper

    def post_forward(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            _label.leave(ACTIVATION)
            return original(self, *args, **kwargs)

        return wrapper

    patcher.wrap(group_cls, "pre_forward", pre_forward)
    patcher.wrap(group_cls, "post_forward", post_forward)

    def post_backward(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            _label_grads(self, sharded=False)
            with _label.scope(REDUCE_SCATTER):
                out = original(self, *args, **kwargs)
            _label_grads(self, sharded=True)
            return out

        return wrapper

    patcher.wrap(group_cls, "post_backward", post_backward)
