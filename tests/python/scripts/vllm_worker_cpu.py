"""vLLM's real ``Worker.load_model`` and ``Worker.initialize_from_config`` on CPU, with a model
runner standing in for ``GPUModelRunner`` (which needs CUDA): it builds a small model in
``load_model`` and allocates a KV cache tensor in ``initialize_kv_cache``, inside the context
the worker hands it, as vLLM's own does.

Usage: vllm_worker_cpu.py decompose|snapshot. ``decompose`` relies on ``--analysis=decompose``
(automatic hooks); ``snapshot`` calls ``msmemscope.init_framework_hooks``. Prints ``KNOWN label
ptr nbytes`` for the weight and the KV cache and ``ACTIVE ...`` (the applied hooks).
Needs ``VLLM_TARGET_DEVICE=cpu`` (the CUDA wheel on a machine without GPU has no platform).
"""

import sys
from contextlib import nullcontext

import torch
from torch import nn

import msmemscope

mode = sys.argv[1]
if mode == "snapshot":
    msmemscope.init_framework_hooks("vllm", "0.10+", "worker", "snapshot")
elif mode != "decompose":
    raise SystemExit(f"unknown mode {mode!r}: decompose or snapshot")

from vllm.config import DeviceConfig, VllmConfig  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheConfig  # noqa: E402
from vllm.v1.worker.gpu_worker import Worker  # noqa: E402

KV_BLOCKS = 4
KV_BLOCK_BYTES = 4096


class CpuModelRunner:
    """Allocates what GPUModelRunner would, on the CPU."""

    def load_model(self, load_dummy_weights: bool = False) -> None:
        self.model = nn.Linear(64, 256, bias=False)

    def initialize_kv_cache(self, kv_cache_config, kv_cache_allocation_context=None) -> None:
        with kv_cache_allocation_context or nullcontext():
            self.kv_cache = torch.zeros(kv_cache_config.num_blocks, KV_BLOCK_BYTES // 4)

    def get_model(self):
        return self.model


config = VllmConfig(device_config=DeviceConfig(device="cpu"))
worker = object.__new__(Worker)  # the parts of Worker.__init__ these two methods use:
worker.vllm_config = config
worker.cache_config = config.cache_config
worker.model_runner = CpuModelRunner()

worker.load_model()
worker.initialize_from_config(
    KVCacheConfig(num_blocks=KV_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[])
)

from msmemscope.frameworks import hooks  # noqa: E402

for label, t in (
    ("weight", worker.model_runner.model.weight),
    ("kv_cache", worker.model_runner.kv_cache),
):
    print(f"KNOWN {label} {t.untyped_storage().data_ptr()} {t.untyped_storage().nbytes()}")
print("ACTIVE " + ";".join(",".join(h) for h in hooks.active_hooks()))
