"""What the trackers know of one ATen op overload, worked out once from its schema (its tensor
arguments, those it writes, its new outputs), and how they find those tensors among the
arguments and the result of one call."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch._ops import OpOverload

__all__ = [
    "OP_OVERLOAD",
    "PLAIN_TENSOR_TYPES",
    "OpInfo",
    "arg",
    "dtensor_in",
    "fresh_outputs",
    "is_tensor_type",
]

# The class of an ATen op overload (a higher-order operator is another class).
OP_OVERLOAD = torch._ops.OpOverload
# Tensors whose memory is their storage's (subclasses such as FakeTensor or DTensor are not).
PLAIN_TENSOR_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
_Tensor = torch.Tensor

# Ops that may give an argument they write a new block (out= arguments are keyword-only).
_RESIZING_OPS = frozenset(
    {"aten::resize_", "aten::resize_as_", "aten::set_", "aten::_resize_output_", "aten::resize"}
)


def is_tensor_type(ty: torch._C.JitType) -> bool:
    """Whether a schema argument type holds Tensors (Tensor, Tensor?, Tensor[], Tensor?[])."""
    text = str(ty)
    return (
        text.startswith("Tensor")
        or text.startswith("Optional[Tensor]")
        or (text.startswith("List[") and "Tensor" in text)
    )


class OpInfo:
    """What the tracker needs to know about one op overload, computed once from its schema."""

    __slots__ = ("access_args", "fresh", "name", "op", "resize_args", "single")

    def __init__(self, func: OpOverload) -> None:
        s = func._schema
        self.name = f"{s.name}.{func._overloadname}"
        self.op = s.name  # `aten::addmm`: the op an allocation site names
        # (positional index or None, name, is_write) of Tensor arguments
        access_args: list[tuple[int | None, str, bool]] = []
        # (positional index or None, name) of written args that may get a block
        resize_args: list[tuple[int | None, str]] = []
        for i, a in enumerate(s.arguments):
            if not is_tensor_type(a.type):
                continue
            ai = a.alias_info
            write = bool(ai is not None and ai.is_write)
            pos = None if a.kwarg_only else i
            access_args.append((pos, a.name, write))
            if write and (a.kwarg_only or s.name in _RESIZING_OPS):
                resize_args.append((pos, a.name))
        self.access_args = tuple(access_args)
        self.resize_args = tuple(resize_args)
        # Indices of the returns that are new tensors (no alias annotation) holding Tensors.
        self.fresh = tuple(
            i for i, r in enumerate(s.returns) if r.alias_info is None and is_tensor_type(r.type)
        )
        self.single = len(s.returns) == 1


def arg(args: Sequence[Any], kwargs: dict[str, Any], pos: int | None, name: str) -> Any:
    if pos is not None and pos < len(args):
        return args[pos]
    return kwargs.get(name)


def fresh_outputs(info: OpInfo, out: Any) -> Sequence[torch.Tensor]:
    """The tensors among ``out`` that the schema says are new."""
    if not info.fresh:
        return ()
    if info.single:
        if isinstance(out, _Tensor):
            return (out,)
        if isinstance(out, (list, tuple)):
            return [t for t in out if isinstance(t, _Tensor)]
        return ()
    found: list[torch.Tensor] = []
    for i in info.fresh:
        o = out[i]
        if isinstance(o, _Tensor):
            found.append(o)
        elif isinstance(o, (list, tuple)):
            found.extend(t for t in o if isinstance(t, _Tensor))
    return found


_dtensor_type: type | None = None


def dtensor_in(types: Sequence[type]) -> bool:
    """Whether a DTensor takes part in the op (DTensor is looked up once PyTorch loaded it)."""
    global _dtensor_type
    dt = _dtensor_type
    if dt is None:
        api = sys.modules.get("torch.distributed.tensor._api")
        if api is None:
            return False
        dt = _dtensor_type = api.DTensor
    return dt in types
