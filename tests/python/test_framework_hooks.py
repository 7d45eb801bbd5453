"""Framework hooks (python/msmemscope/frameworks/hooks): the table and its errors, patches that
cleanup restores to the very same function objects, lazy automatic decompose hooks, and the
precedence of manual ones. Each scenario runs in a fresh interpreter (hooks patch modules)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, clean_env, ok, run_python

CLI = REPO / "target" / "release" / "msmemscope-cli"
SCRIPTS = REPO / "tests" / "python" / "scripts"

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")

# Python code shared by the restore checks: every module under the given prefixes and every
# class they define, as a copy of its namespace.
NAMESPACES = """
import inspect, sys
from msmemscope.frameworks import hooks
from msmemscope.frameworks.hooks import ORIGINAL_ATTR

def namespaces(prefixes):
    found = {}
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith(prefixes):
            continue
        found[name] = (mod, dict(vars(mod)))
        for value in list(vars(mod).values()):
            if inspect.isclass(value) and value.__module__ == name:
                found[name + ":" + value.__qualname__] = (value, dict(vars(value)))
    return found

def changed(before):
    out = {}
    for key, (owner, saved) in before.items():
        now = vars(owner)
        for attr in set(saved) | set(now):
            if saved.get(attr, None) is not now.get(attr, None):
                short = key.split(":")[-1].rpartition(".")[-1] + "." + attr
                out[short] = (saved.get(attr), now.get(attr))
    return out

def unwrap(value):
    return value.__func__ if isinstance(value, classmethod) else value

def check_wrappers(diff):
    # each changed attribute: a chain of msmemscope wrappers ending at what was there
    for name, (old, new) in diff.items():
        func = unwrap(new)
        assert getattr(func, ORIGINAL_ATTR, None) is not None, name
        while getattr(func, ORIGINAL_ATTR, None) is not None:
            func = getattr(func, ORIGINAL_ATTR)
        assert func is unwrap(old), name
"""


def restore_check(trigger: str, prefixes: tuple[str, ...], calls: str) -> str:
    """Code that imports ``trigger``, runs ``calls`` (init_framework_hooks...), prints the
    patched attributes (``PATCHED owner.attr,...``), cleans up and prints ``RESTORED`` when
    every namespace holds the very objects it held before."""
    return textwrap.dedent(NAMESPACES) + textwrap.dedent(
        f"""
        import {trigger}
        import msmemscope
        before = namespaces({prefixes!r})
        {calls}
        diff = changed(before)
        check_wrappers(diff)
        print("PATCHED " + ",".join(sorted(diff)))
        msmemscope.cleanup_framework_hooks()
        assert not changed(before), sorted(changed(before))
        assert not hooks.active_hooks()
        print("RESTORED")
        """
    )


def patched(stdout: str) -> set[str]:
    for line in stdout.splitlines():
        if line.startswith("PATCHED "):
            return set(line[len("PATCHED ") :].split(","))
    raise AssertionError(stdout)


def import_failure(module: str) -> str | None:
    """Why ``module`` cannot be imported here (its last error line), or None."""
    res = run_python(f"import {module}", timeout=300)
    if res.returncode == 0:
        return None
    lines = [line for line in res.stderr.strip().splitlines() if line.strip()]
    return f"import {module} fails here: {lines[-1] if lines else res.returncode}"


def skip_unless_importable(module: str) -> None:
    """Skips when the framework is not installed at all (a checkout without
    scripts/setup_frameworks.sh); an installed framework that cannot be imported is a set-up bug
    (a missing dependency pin) and fails."""
    import importlib.util

    top = module.split(".")[0]
    if importlib.util.find_spec(top) is None:
        pytest.skip(f"{top} is not installed (scripts/setup_frameworks.sh)")
    reason = import_failure(module)
    assert reason is None, reason


# --- the table and its errors ---------------------------------------------------------------------
def test_the_original_framework_names_get_the_equivalent_here():
    import msmemscope

    with pytest.raises(ValueError, match=r"'vllm_ascend' is the Ascend build.*framework='vllm'"):
        msmemscope.init_framework_hooks("vllm_ascend", "11.0", "worker", "snapshot")
    with pytest.raises(ValueError, match=r"'mindspeed_llm'.*framework='megatron'"):
        msmemscope.init_framework_hooks("mindspeed_llm", "0.12.1", "training", "snapshot")


def test_unsupported_combinations_list_the_supported_ones():
    import msmemscope

    table = (
        "('vllm', '0.10+', 'worker', 'decompose'); ('vllm', '0.10+', 'worker', 'snapshot'); "
        "('pytorch', '2.6+', 'fsdp1', 'decompose'); ('pytorch', '2.6-2.9', 'fsdp2', 'decompose'); "
        "('pytorch', '2.10+', 'fsdp2', 'decompose'); ('megatron', '0.12+', 'training', "
        "'snapshot'); ('verl', '0.7+', 'TaskRunner', 'snapshot')"
    )
    for args in (
        ("pytorch", "2.6+", "fsdp1", "snapshot"),  # fsdp has no snapshot hooks
        ("pytorch", "2.5", "fsdp2", "decompose"),  # before FSDP2's home in torch.distributed.fsdp
        ("pytorch", "2.6+", "fsdp2", "decompose"),  # not one of fsdp2's keys
        ("megatron", "0.12+", "training", "decompose"),
        ("verl", "0.7+", "worker", "snapshot"),
        ("jax", "0.4", "worker", "snapshot"),
    ):
        with pytest.raises(ValueError) as err:
            msmemscope.init_framework_hooks(*args)
        assert str(err.value) == (
            f"init_framework_hooks: {args!r} is not supported. Supported (framework, version, "
            f"component, type): {table}"
        )
    with pytest.raises(ValueError, match="type 'leaks' is not supported; accepted: decompose, "):
        msmemscope.init_framework_hooks("pytorch", "2.6+", "fsdp1", "leaks")
    with pytest.raises(TypeError, match="version must be a str, not float"):
        msmemscope.init_framework_hooks("pytorch", 2.6, "fsdp1", "decompose")


@needs_torch
def test_a_version_key_must_cover_the_installed_framework():
    import torch

    import msmemscope

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 10):
        pytest.skip(f"needs torch 2.10 or later (torch {torch.__version__} is installed)")
    with pytest.raises(ValueError) as err:
        msmemscope.init_framework_hooks("pytorch", "2.6-2.9", "fsdp2", "decompose")
    assert str(err.value) == (
        f"init_framework_hooks: torch {torch.__version__} is installed, which version key "
        "'2.6-2.9' does not cover; use version '2.10+'"
    )
    # A concrete release inside a key selects that key.
    with pytest.raises(ValueError, match=r"version key '2\.6-2\.9' does not cover"):
        msmemscope.init_framework_hooks("pytorch", "2.7.1", "fsdp2", "decompose")


# --- patches and their exact restoration ----------------------------------------------------------
FSDP2_PATCHED = {
    "FSDPParam._init_sharded_param",
    "FSDPParam.reset_sharded_param",
    "FSDPParam.init_all_gather_outputs",
    "_fsdp_param.alloc_storage",
    "_fsdp_param.free_storage",
    "_fsdp_param_group.alloc_storage",
    "FSDPParamGroup.unshard",
    "FSDPParamGroup.wait_for_unshard",
    "FSDPParamGroup.pre_forward",
    "FSDPParamGroup.post_forward",
    "FSDPParamGroup.post_backward",
}
FSDP1_PATCHED = {
    "_flat_param._alloc_storage",
    "_flat_param._free_storage",
    "FlatParamHandle.shard",
    "FlatParamHandle.init_flat_param_attributes",
    "FlatParamHandle.unshard",
    "_runtime_utils._reduce_grad",
    "FullyShardedDataParallel.forward",
}


@needs_torch
def test_fsdp_hooks_patch_the_installed_torch_and_cleanup_restores_the_same_objects():
    code = restore_check(
        "torch.distributed.fsdp",
        ("torch.distributed.fsdp",),
        """
        msmemscope.init_framework_hooks("pytorch", "2.10+", "fsdp2", "decompose")
        msmemscope.init_framework_hooks("pytorch", "2.6+", "fsdp1", "decompose")
        # Applying a combination again replaces it (no double wrapping).
        msmemscope.init_framework_hooks("pytorch", "2.10+", "fsdp2", "decompose")
        assert [h[2] for h in hooks.active_hooks()] == ["fsdp1", "fsdp2"], hooks.active_hooks()
        """,
    )
    out = ok(run_python(code))
    assert patched(out) == FSDP2_PATCHED | FSDP1_PATCHED
    assert "RESTORED" in out


VLLM_WORKER = {
    "Worker.load_model",
    "Worker.determine_available_memory",
    "Worker.initialize_from_config",
    "Worker.execute_model",
}


def test_vllm_worker_hooks_patch_vllm_and_cleanup_restores_the_same_objects():
    skip_unless_importable("vllm.v1.worker.gpu_worker")
    code = restore_check(
        "vllm.v1.worker.gpu_worker",
        ("vllm.v1.worker",),
        """
        msmemscope.init_framework_hooks("vllm", "0.10+", "worker", "decompose")
        msmemscope.init_framework_hooks("vllm", "0.10+", "worker", "snapshot")
        from vllm.v1.worker.gpu_worker import Worker
        # Stacked in the order applied: snapshot outside, decompose inside, vLLM's own inside.
        inner = getattr(Worker.load_model, ORIGINAL_ATTR)
        assert Worker.load_model.__wrapped__ is inner
        real = before["vllm.v1.worker.gpu_worker:Worker"][1]["load_model"]
        assert getattr(inner, ORIGINAL_ATTR) is real
        """,
    )
    out = ok(run_python(code, timeout=600))
    assert patched(out) == VLLM_WORKER
    assert "RESTORED" in out


def test_megatron_training_hooks_patch_megatron_core_and_cleanup_restores_them():
    skip_unless_importable("megatron.core.pipeline_parallel.schedules")
    code = restore_check(
        "megatron.core.pipeline_parallel.schedules, megatron.core.optimizer",
        ("megatron.core.pipeline_parallel", "megatron.core.optimizer"),
        """
        msmemscope.init_framework_hooks("megatron", "0.12+", "training", "snapshot")
        """,
    )
    out = ok(run_python(code, timeout=600))
    assert patched(out) == {
        "schedules.forward_backward_no_pipelining",
        "schedules.forward_backward_pipelining_without_interleaving",
        "schedules.forward_backward_pipelining_with_interleaving",
        "MixedPrecisionOptimizer.step",
        "FP32Optimizer.step",
        "ChainedOptimizer.step",
    }
    assert "RESTORED" in out


def test_verl_taskrunner_hooks_patch_verl_and_cleanup_restores_them():
    skip_unless_importable("verl.trainer.ppo.ray_trainer")
    code = restore_check(
        "verl.trainer.ppo.ray_trainer",
        ("verl.trainer.ppo.ray_trainer",),
        """
        msmemscope.init_framework_hooks("verl", "0.9.1", "TaskRunner", "snapshot")
        """,
    )
    out = ok(run_python(code, timeout=600))
    assert patched(out) == {
        f"RayPPOTrainer.{m}"
        for m in (
            "init_workers",
            "fit",
            "_compute_old_log_prob",
            "_compute_ref_log_prob",
            "_compute_values",
            "_update_critic",
            "_update_actor",
        )
    }
    assert "RESTORED" in out


# --- automatic (lazy) decompose hooks ------------------------------------------------------------
@needs_torch
def test_automatic_hooks_activate_only_when_their_framework_is_used():
    code = textwrap.dedent(NAMESPACES) + textwrap.dedent(
        """
        import socket
        from msmemscope.frameworks.hooks import _post_import
        before_all = namespaces(("torch",))
        hooks.auto_register()
        hooks.auto_register()  # idempotent
        assert _post_import in sys.meta_path
        import torch
        import torch.distributed as dist
        from torch import nn
        assert "torch.distributed.fsdp" not in sys.modules
        print("WAITING", sorted(_post_import.callbacks))
        # PyTorch imports FSDP by itself (an optimizer step does): that only arms the hooks.
        model = nn.Linear(4, 4)
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        import torch.distributed.fsdp
        print("IMPORTED", hooks.activation_count(), hooks.active_hooks(), hooks.armed())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        from torch.distributed.fsdp import fully_shard
        fully_shard(nn.Linear(4, 4))
        active = sorted(h[2] + ":" + h[4] for h in hooks.active_hooks())
        print("USED", hooks.activation_count(), active, hooks.armed())
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        assert hasattr(FSDPParamGroup.unshard, ORIGINAL_ATTR)
        print("WAITING", sorted(_post_import.callbacks))
        hooks.auto_unregister()
        assert not hooks.active_hooks() and not hooks.armed()
        assert _post_import not in sys.meta_path
        assert not [k for k in changed(before_all) if "fsdp" in k.lower()], changed(before_all)
        assert not hasattr(FSDPParamGroup.unshard, ORIGINAL_ATTR)
        dist.destroy_process_group()
        print("UNREGISTERED")
        """
    )
    out = ok(run_python(code))
    assert (
        "WAITING ['torch.distributed.fsdp._fully_shard', "
        "'torch.distributed.fsdp.fully_sharded_data_parallel', 'vllm.v1.worker.gpu_worker']"
    ) in out
    assert "IMPORTED 0 [] ['fsdp1', 'fsdp2']" in out
    assert "USED 1 ['fsdp2:auto'] ['fsdp1']" in out
    assert "WAITING ['vllm.v1.worker.gpu_worker']" in out
    assert "UNREGISTERED" in out


@needs_torch
def test_a_framework_imported_before_registration_is_armed_at_once():
    out = ok(
        run_python(
            """
            import torch.distributed.fsdp
            from msmemscope.frameworks import hooks
            hooks.auto_register()
            print(hooks.activation_count(), hooks.armed())
            """
        )
    )
    assert out.strip() == "0 ['fsdp1', 'fsdp2']"


@needs_torch
def test_manual_decompose_takes_precedence_and_automatic_hooks_give_way():
    code = textwrap.dedent(NAMESPACES) + textwrap.dedent(
        """
        import torch.distributed.fsdp
        import msmemscope
        before = namespaces(("torch.distributed.fsdp",))
        hooks.auto_register()
        msmemscope.init_framework_hooks("pytorch", "2.10+", "fsdp2", "decompose")
        print("ACTIVE", sorted(h[2] + ":" + h[4] for h in hooks.active_hooks()), hooks.armed())
        # Re-registering does not bring the automatic FSDP2 hook back while the manual one is on.
        hooks.auto_unregister(); hooks.auto_register()
        print("AGAIN", sorted(h[2] + ":" + h[4] for h in hooks.active_hooks()), hooks.armed())
        check_wrappers(changed(before))
        msmemscope.cleanup_framework_hooks()
        assert not changed(before) and not hooks.auto_registered()
        print("RESTORED")
        """
    )
    out = ok(run_python(code))
    assert "ACTIVE ['fsdp2:manual'] ['fsdp1']" in out
    assert "AGAIN ['fsdp2:manual'] ['fsdp1']" in out
    assert "RESTORED" in out


@pytest.mark.skipif(not CLI.is_file(), reason=f"{CLI} is not built (scripts/setup.sh)")
@needs_torch
def test_no_framework_imported_no_hook_runs(tmp_path):
    """A plain PyTorch training loop under --analysis=decompose: the lazy hooks are registered,
    FSDP (which PyTorch imports by itself) is only armed, and no hook activates."""
    proc = subprocess.run(
        [
            str(CLI),
            "--analysis=decompose",
            "-o",
            str(tmp_path / "out"),
            sys.executable,
            str(SCRIPTS / "fw_no_framework.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(OMP_NUM_THREADS="1"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.partition(" ")[::2] for line in proc.stdout.splitlines())
    assert lines["WATCHING"] == "vllm.v1.worker.gpu_worker"
    assert lines["ARMED"] == "fsdp1,fsdp2"
    assert lines["ACTIVATIONS"] == "0"
    assert lines["LOADED"] == ""


# --- vLLM's worker on CPU: the real Worker methods, a CPU stand-in for the CUDA model runner ----
def run_vllm_worker(tmp_path, mode: str, *options: str):
    out = tmp_path / "out"
    script = str(SCRIPTS / "vllm_worker_cpu.py")
    proc = subprocess.run(
        [str(CLI), *options, "-o", str(out), sys.executable, script, mode],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(OMP_NUM_THREADS="1", VLLM_TARGET_DEVICE="cpu"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "hook error" not in proc.stderr and "tracker error" not in proc.stderr, proc.stderr
    (dump,) = out.glob("msmemscope_*/device_cpu/dump/memscope_dump_*.csv")
    with dump.open(newline="") as f:
        rows = list(csv.DictReader(f))
    known = {}
    for line in proc.stdout.splitlines():
        if line.startswith("KNOWN "):
            _, label, ptr, nbytes = line.split()
            known[label] = (int(ptr), int(nbytes))
    return proc.stdout, rows, known


@pytest.mark.skipif(not CLI.is_file(), reason=f"{CLI} is not built (scripts/setup.sh)")
def test_vllm_worker_memory_gets_its_phase_owner(tmp_path):
    skip_unless_importable("vllm.v1.worker.gpu_worker")
    stdout, rows, known = run_vllm_worker(tmp_path, "decompose", "--analysis=decompose")
    assert "ACTIVE vllm,0.10+,worker,decompose,auto" in stdout.splitlines()
    owners = {
        (int(r["Ptr"], 16), json.loads(r["Attr"])["size"]): json.loads(r["Attr"])["owner"]
        for r in rows
        if r["Event"] == "MALLOC"
    }
    assert known["weight"] == (known["weight"][0], 256 * 64 * 4)
    assert known["kv_cache"] == (known["kv_cache"][0], 4 * 4096)
    assert owners[known["weight"]] == "PTA@vllm@load_weight"
    assert owners[known["kv_cache"]] == "PTA@vllm@kv_cache"


@pytest.mark.skipif(not CLI.is_file(), reason=f"{CLI} is not built (scripts/setup.sh)")
def test_vllm_worker_snapshot_hooks_write_snapshot_rows_around_each_phase(tmp_path):
    skip_unless_importable("vllm.v1.worker.gpu_worker")
    stdout, rows, known = run_vllm_worker(tmp_path, "snapshot")
    assert "ACTIVE vllm,0.10+,worker,snapshot,manual" in stdout.splitlines()
    snaps = [(r["Name"], json.loads(r["Attr"])) for r in rows if r["Event"] == "SNAPSHOT"]
    assert [name for name, _ in snaps] == [
        "vllm@load_weight@before",
        "vllm@load_weight@after",
        "vllm@kv_cache@before",
        "vllm@kv_cache@after",
    ]
    allocated = [attr["allocated"] for _, attr in snaps]
    assert allocated[1] - allocated[0] == known["weight"][1]
    assert allocated[3] - allocated[2] == known["kv_cache"][1]
