"""Python API misuse gets a ValueError naming the argument (never a bare OverflowError or
PyTorch's NotImplementedError), and a configuration that cannot work is refused at config()."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import msmemscope
from conftest import run_under_cli
from msmemscope import watcher
from msmemscope.describe import describer

SCRIPTS = Path(__file__).parent / "scripts"


def test_an_address_beyond_64_bits_is_a_value_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"^address must be a positive int below 2\*\*64"):
        watcher.watch(2**64, length=8, name="far")
    with pytest.raises(ValueError, match=r"^length must be below 2\*\*64 bytes"):
        watcher.watch(0x1000, length=2**64, name="long")
    with pytest.raises(ValueError, match="runs past the end of the address space"):
        watcher.watch(2**64 - 8, length=16, name="wrap")


def test_a_sparse_tensor_cannot_be_described() -> None:
    sparse = torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (4,), check_invariants=True)
    with pytest.raises(ValueError, match=r"^describer: a torch.sparse_coo tensor has no single"):
        describer(sparse, owner="embedding")


def test_an_output_path_under_a_file_is_refused_at_config() -> None:
    before = msmemscope._native_runtime().current_config()
    with pytest.raises(
        ValueError,
        match=r'^invalid output_path "/dev/null/x": /dev/null is not a directory; accepted',
    ):
        msmemscope.config(output_path="/dev/null/x")
    assert msmemscope._native_runtime().current_config() == before


def test_watching_a_freed_tensors_address_is_refused(tmp_path: Path) -> None:
    proc, _ = run_under_cli(tmp_path, "--analysis=none", script=SCRIPTS / "watch_freed.py")
    first, second = proc.stdout.splitlines()
    ptr = int(first.removeprefix("ptr "), 16)
    assert second == (
        f"refused 0x{ptr + 16:x} lies in a tensor block msmemscope saw freed (4000 bytes at "
        f"0x{ptr:x} on cpu): what changes there is the allocator's reuse, not a tensor; watch a "
        "live tensor or an address inside one"
    )
