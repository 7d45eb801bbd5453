"""The table of framework hooks (docs/python-api.md#framework-hooks): the original msMemScope's
"one-click hooks" (一键分析) table."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._versions import VersionKey, release

if TYPE_CHECKING:
    from ._patch import Patcher

DECOMPOSE = "decompose"
SNAPSHOT = "snapshot"
KINDS = (DECOMPOSE, SNAPSHOT)


@dataclass(frozen=True)
class HookSpec:
    framework: str  # as the user names it: "vllm", "pytorch", "megatron", "verl"
    version: str  # version key: "2.6+", "2.6-2.9", "2.10+"
    component: str  # "worker", "fsdp1", "fsdp2", "training", "TaskRunner"
    kind: str  # "decompose" or "snapshot"
    distribution: str  # the installed package whose version the key is about
    trigger: str  # the module whose import activates the hook
    module: str  # the hooks module (in this package) and its install function
    function: str
    # Automatic mode only: "module:Class.method" entry points whose first call activates the
    # hook, for frameworks that PyTorch itself imports whether or not the program uses them
    # (FSDP). Empty: the trigger's import activates it.
    first_use: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        """Hooks with one key patch the same functions: at most one is active."""
        return (self.framework, self.component.lower())

    def installer(self) -> Callable[[Patcher], None]:
        mod = importlib.import_module(f"{__package__}.{self.module}")
        install: Callable[[Patcher], None] = getattr(mod, self.function)
        return install

    def covers(self, version: str) -> bool:
        """Whether the user's ``version`` is this key itself or a release inside it."""
        if version.strip() == self.version:
            return True
        rel = release(version)
        return (
            rel is not None and _plain_release(version) and VersionKey(self.version).contains(rel)
        )

    def describe(self) -> str:
        return f"({self.framework!r}, {self.version!r}, {self.component!r}, {self.kind!r})"


def _plain_release(text: str) -> bool:
    """A concrete version (``2.7``, ``2.7.1``, ``0.33.0+cu129``), not some other key."""
    return not any(c in text for c in "-") and not text.strip().endswith("+")


_FSDP2_TRIGGER = "torch.distributed.fsdp._fully_shard"
_FSDP1_TRIGGER = "torch.distributed.fsdp.fully_sharded_data_parallel"
_VLLM_TRIGGER = "vllm.v1.worker.gpu_worker"
# torch imports FSDP on its own (e.g. through torch._dynamo), so its automatic hooks wait for a
# sharded module to be built: FSDP2 builds a parameter group per fully_shard'ed module, FSDP1
# builds its wrapper.
_FSDP2_FIRST_USE = (
    "torch.distributed.fsdp._fully_shard._fsdp_param_group:FSDPParamGroup.__init__",
)
_FSDP1_FIRST_USE = (
    "torch.distributed.fsdp.fully_sharded_data_parallel:FullyShardedDataParallel.__init__",
)

SPECS: tuple[HookSpec, ...] = (
    HookSpec(
        "vllm", "0.10+", "worker", DECOMPOSE, "vllm", _VLLM_TRIGGER, "vllm", "install_decompose"
    ),
    HookSpec(
        "vllm", "0.10+", "worker", SNAPSHOT, "vllm", _VLLM_TRIGGER, "vllm", "install_snapshot"
    ),
    HookSpec(
        "pytorch",
        "2.6+",
        "fsdp1",
        DECOMPOSE,
        "torch",
        _FSDP1_TRIGGER,
        "fsdp1",
        "install",
        _FSDP1_FIRST_USE,
    ),
    HookSpec(
        "pytorch",
        "2.6-2.9",
        "fsdp2",
        DECOMPOSE,
        "torch",
        _FSDP2_TRIGGER,
        "fsdp2",
        "install",
        _FSDP2_FIRST_USE,
    ),
    HookSpec(
        "pytorch",
        "2.10+",
        "fsdp2",
        DECOMPOSE,
        "torch",
        _FSDP2_TRIGGER,
        "fsdp2",
        "install",
        _FSDP2_FIRST_USE,
    ),
    HookSpec(
        "megatron",
        "0.12+",
        "training",
        SNAPSHOT,
        "megatron-core",
        "megatron.core",
        "megatron",
        "install_snapshot",
    ),
    HookSpec(
        "verl",
        "0.7+",
        "TaskRunner",
        SNAPSHOT,
        "verl",
        "verl.trainer.ppo.ray_trainer",
        "verl",
        "install_snapshot",
    ),
)

# The original msMemScope's Ascend framework names and what stands for them here.
EQUIVALENTS = {
    "vllm_ascend": "vllm",
    "vllm-ascend": "vllm",
    "mindspeed_llm": "megatron",
    "mindspeed-llm": "megatron",
}


def supported_text() -> str:
    return "; ".join(s.describe() for s in SPECS)


def installed_version(spec: HookSpec) -> str | None:
    """The installed version of the spec's framework package (``None`` if not installed)."""
    top = spec.trigger.partition(".")[0]
    mod = sys.modules.get(top)
    version = getattr(mod, "__version__", None) if mod is not None else None
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def lookup(framework: str, version: str, component: str, kind: str) -> HookSpec:
    """The spec for a user's ``init_framework_hooks`` arguments; ``TypeError``/``ValueError``
    naming what is wrong and what is supported otherwise."""
    for name, value in (
        ("framework", framework),
        ("version", version),
        ("component", component),
        ("type", kind),
    ):
        if not isinstance(value, str):
            raise TypeError(
                f"init_framework_hooks: {name} must be a str, not {type(value).__name__}"
            )
    fw = framework.strip().lower()
    if fw in EQUIVALENTS:
        raise ValueError(
            f"init_framework_hooks: framework {framework!r} is the Ascend build; on this platform "
            f"use framework={EQUIVALENTS[fw]!r}. Supported (framework, version, component, type): "
            f"{supported_text()}"
        )
    if kind not in KINDS:
        raise ValueError(
            f"init_framework_hooks: type {kind!r} is not supported; accepted: "
            f"{', '.join(KINDS)}. Supported (framework, version, component, type): "
            f"{supported_text()}"
        )
    for spec in SPECS:
        if (
            spec.framework == fw
            and spec.component.lower() == component.strip().lower()
            and spec.kind == kind
            and spec.covers(version)
        ):
            return spec
    raise ValueError(
        f"init_framework_hooks: ({framework!r}, {version!r}, {component!r}, {kind!r}) is not "
        f"supported. Supported (framework, version, component, type): {supported_text()}"
    )


def check_installed(spec: HookSpec) -> str:
    """The installed version, if its key covers it; ``ValueError`` otherwise."""
    version = installed_version(spec)
    if version is None:
        raise ValueError(
            f"init_framework_hooks: {spec.framework} ({spec.distribution}) is not installed"
        )
    rel = release(version)
    if rel is None or not VersionKey(spec.version).contains(rel):
        others = [
            s.version
            for s in SPECS
            if s.key == spec.key
            and s.kind == spec.kind
            and rel
            and VersionKey(s.version).contains(rel)
        ]
        hint = f"; use version {others[0]!r}" if others else ""
        raise ValueError(
            f"init_framework_hooks: {spec.distribution} {version} is installed, which version key "
            f"{spec.version!r} does not cover{hint}"
        )
    return version


def auto_specs() -> list[HookSpec]:
    """The decompose hooks that ``--analysis=decompose`` registers (all of them)."""
    return [s for s in SPECS if s.kind == DECOMPOSE]
