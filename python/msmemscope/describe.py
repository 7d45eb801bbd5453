"""User labels on allocations: ``describer`` (the original msMemScope's ``msmemscope.describe``).

Each form appends a label to the ``owner`` of MALLOC rows, after the framework part
(``PTA@activation@train1``)::

    import msmemscope.describe as describe

    @describe.describer(owner="train1")     # every allocation made while train1() runs
    def train1(): ...

    with describe.describer(owner="train2"):  # every allocation made in the block
        train2()

    describe.describer(owner="train3").__enter__()   # the same, by explicit calls
    train3()
    describe.describer(owner="train3").__exit__()

    describe.describer(t, owner="weights")  # the block of tensor t, already allocated

Regions nest; their labels compose outermost first. At most 3 distinct labels can be active at
once and a label has at most 128 characters; beyond that ``ValueError`` says what is active.
Labels apply process-wide (a labelled region includes the autograd threads that run its
backward). The labels are recorded while the PyTorch tracker runs (programs launched by
``msmemscope``, or after ``msmemscope.start()``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

import torch

from .capture import owners

__all__ = ["describer"]

_F = TypeVar("_F", bound="Callable[..., Any]")


class describer:
    """Labels allocations with ``owner``; see the module documentation for the four forms."""

    __slots__ = ("_owner",)

    def __init__(self, tensor: torch.Tensor | None = None, *, owner: str) -> None:
        self._owner = owners.check_label(owner)
        if tensor is not None:
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(
                    "describer: the positional argument must be a torch.Tensor to label "
                    f"(got {type(tensor).__name__}); use describer(owner=...) as a decorator "
                    "or context manager"
                )
            if tensor.layout != torch.strided:
                # Sparse and other layouts have no single storage to label.
                raise ValueError(
                    f"describer: a {tensor.layout} tensor has no single storage to label; "
                    "label its strided parts (e.g. t.values() of a sparse COO tensor) instead"
                )
            owners.add_user_label(tensor, self._owner)

    def __enter__(self) -> describer:
        owners.push_user_label(self._owner)
        return self

    def __exit__(self, *exc_info: object) -> Literal[False]:
        owners.pop_user_label(self._owner)
        return False

    def __call__(self, func: _F) -> _F:
        if not callable(func):
            raise TypeError(f"describer: can only decorate a callable, not {type(func).__name__}")
        label = self._owner

        @functools.wraps(func)
        def labelled(*args: Any, **kwargs: Any) -> Any:
            owners.push_user_label(label)
            try:
                return func(*args, **kwargs)
            finally:
                owners.pop_user_label(label)

        return cast(_F, labelled)
