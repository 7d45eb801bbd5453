"""Leak findings on real programs under the real CLI (tests/fixtures/leak_programs/).

The classic bugs (logits kept in a list, a forward hook filling a dict, a cache keyed by batch
id, retain_graph with the losses kept, an evaluation loop summing losses as tensors) are each
one leaking site naming the line that allocated the kept tensors, the bytes they grow by per
step, and the variable that holds them. Clean programs (gradient accumulation with an LR
scheduler, a backbone unfrozen mid-run, a torch.compile'd model, generate() with a KV cache)
give no leak; their one-time growth is resident. Every leaks/findings.json is valid against the
package's schema.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
from pathlib import Path

import jsonschema
import pytest

REPO = Path(__file__).resolve().parents[2]
CLI = REPO / "bin" / "msmemscope"
PYTHON = REPO / ".venv" / "bin" / "python"
PROGRAMS = REPO / "tests" / "fixtures" / "leak_programs"
SCHEMA = json.loads((REPO / "python/msmemscope/schemas/leak_findings.schema.json").read_text())

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LD_PRELOAD", "PYTHONPATH") and not k.startswith("MSMEMSCOPE_")
    }
    if "MSMEMSCOPE_TORCH_CAPTURE" in os.environ:  # the fallback pass of the test command
        env["MSMEMSCOPE_TORCH_CAPTURE"] = os.environ["MSMEMSCOPE_TORCH_CAPTURE"]
    env["TRANSFORMERS_VERBOSITY"] = "error"
    env["HF_HUB_OFFLINE"] = "1"
    return env


def _launch(tmp_path: Path, program: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`msmemscope [options] python program` in the programs' folder; exit 0 asserted."""
    proc = subprocess.run(
        [str(CLI), *options, "-o", str(tmp_path / "out"), str(PYTHON), str(program)],
        cwd=PROGRAMS,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


def _run(tmp_path: Path, program: str, *options: str) -> tuple[str, dict]:
    proc = _launch(tmp_path, PROGRAMS / f"{program}.py", *options)
    (findings,) = glob.glob(str(tmp_path / "out" / "*" / "leaks" / "findings.json"))
    doc = json.loads(Path(findings).read_text())
    jsonschema.validate(doc, SCHEMA)
    return proc.stderr, doc


BUGS = [
    # program, line that allocates the kept tensors, bytes per step, start of the holder chain
    (
        "logits_list",
        12,
        4 * 16 * 1000 * 4,
        "all_logits (global of logits_list.py) -> list[",
    ),
    ("hook_dict", 13, None, "activations (global of hook_dict.py) -> dict['layer0/"),
    (
        "cache_dict",
        16,
        64 * 512 * 4,
        "model (global of cache_dict.py) -> .cache of Model -> dict[",
    ),
    # The saved activations of each step's graph: tanh's output 64x512 (saved by the second
    # addmm), the 64x10 output saved by pow, and the loss itself.
    (
        "retain_graph",
        14,
        64 * 512 * 4 + 64 * 10 * 4 + 4,
        "loss_history (global of retain_graph.py)",
    ),
    # tanh's output (saved by addmm), log_softmax's (saved by nll_loss) and the loss.
    ("eval_no_grad", 15, 64 * 512 * 4 + 64 * 10 * 4 + 4, "total_loss (global of eval_no_grad.py)"),
]


@pytest.mark.parametrize(("program", "line", "per_step", "holder"), BUGS, ids=[b[0] for b in BUGS])
def test_classic_leak_is_one_site_with_its_line_bytes_and_holder(
    tmp_path, program, line, per_step, holder
):
    stderr, doc = _run(tmp_path, program)
    leaks = doc["leaks"]
    assert leaks, stderr
    top = leaks[0]
    assert top["file"] == str(PROGRAMS / f"{program}.py"), top
    assert top["line"] == line, top
    assert top["source"] == (PROGRAMS / f"{program}.py").read_text().splitlines()[line - 1].strip()
    if per_step is None:
        # The hook keeps block 0's output as the hook sees it: the clone's bytes per step
        # are the first leaked block's size.
        assert top["bytes_per_step"] == top["leaked_bytes"] // top["leaked_blocks"]
    else:
        assert top["bytes_per_step"] == per_step, top
    assert top["first_step"] == 3 and top["last_step"] == 7, top
    # Steps 2..6 grew at the ends of steps 3..7; step 7's blocks outlive the last step only
    # when the interpreter's teardown does not free them first.
    assert top["steps"][:5] == [2, 3, 4, 5, 6], top
    assert top["holders"], top
    assert any(h["chain"].startswith(holder) for h in top["holders"]), top["holders"]
    # The console: the seed's lines, then the site with its source line and holder.
    assert "====== ERROR: Detected memory leaks on device cpu ======" in stderr
    assert f"[1] {top['site']}: +" in stderr, stderr
    assert f"      {top['source']}\n" in stderr
    assert f"    held by: {holder}" in stderr, stderr


CLEAN = [
    ("grad_accum", True),
    ("unfreeze", True),
    ("compiled", False),
    ("generate_kv", False),
]


@pytest.mark.parametrize(("program", "has_resident"), CLEAN, ids=[c[0] for c in CLEAN])
def test_clean_training_has_no_leak(tmp_path, program, has_resident):
    stderr, doc = _run(tmp_path, program)
    assert doc["leaks"] == [], doc["leaks"]
    assert "Direct PTA leak" not in stderr, stderr
    assert "Detected memory leaks" not in stderr, stderr
    if has_resident:
        # The one-time growth (Adam's state, the gradients kept) is listed apart.
        assert doc["resident"], doc
        assert "made once and kept (not leaks)" in stderr
        files = {r["file"] for r in doc["resident"]}
        assert files == {str(PROGRAMS / f"{program}.py")}, doc["resident"]


def test_offline_check_leaks_over_the_dumps_steps_names_the_site(tmp_path):
    """check_leaks on the run's dump with its steps as marks: the blocks of step 3 not freed
    by step 5 are step 3's cache entry, reported at the line the online findings name."""
    _, doc = _run(tmp_path, "cache_dict")
    (dump,) = glob.glob(str(tmp_path / "out" / "*" / "device_cpu" / "dump" / "*.csv"))
    code = (
        "import json, msmemscope, sys\n"
        "r = msmemscope.check_leaks(sys.argv[1], 'step', 2)\n"
        "print(json.dumps([(b['site'], b['op'], b['size']) for b in r]))\n"
    )
    proc = subprocess.run(
        [str(PYTHON), "-c", code, dump], capture_output=True, text=True, env=_env(), timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    _, _, blocks = proc.stdout.rpartition("====== By site ======\n")
    leaked = json.loads(blocks.strip().splitlines()[-1])
    # relu's kernel: the native capture names the op that allocated (clamp_min, inside relu),
    # the dispatch-mode fallback the op it saw return the tensor.
    op = (
        "aten::relu"
        if os.environ.get("MSMEMSCOPE_TORCH_CAPTURE") == "python"
        else "aten::clamp_min"
    )
    assert leaked == [[doc["leaks"][0]["site"], op, 64 * 512 * 4]], proc.stdout
    assert f"  {doc['leaks'][0]['site']}: 128 KiB (131072 bytes) in 1 block(s)" in blocks


def test_a_program_without_steps_is_stepped_by_its_optimizer(tmp_path):
    stderr, doc = _run(tmp_path, "unmarked")
    assert doc["steps_source"] == "optimizer.step" and doc["steps_marked"] == 7, doc
    (leak,) = doc["leaks"]
    assert (leak["line"], leak["bytes_per_step"]) == (11, 32 * 10 * 4), leak
    assert leak["holders"][0]["chain"].startswith("seen (global of unmarked.py) -> list[")
    assert (
        "msmemscope: the program marks no steps, so each optimizer.step() call ended one "
        "(7 steps); msmemscope.step() marks them yourself\n"
    ) in stderr


def test_a_program_without_steps_or_optimizer_is_told_how_to_mark_them(tmp_path):
    program = tmp_path / "plain.py"
    program.write_text("import torch\nkept = [torch.ones(256) for _ in range(4)]\n")
    out = _launch(tmp_path, program)
    assert (
        "msmemscope: the leaks analysis saw no steps, so it judged nothing: call "
        "msmemscope.step() once per training step"
    ) in out.stderr


def test_leak_holders_on_demand_names_the_global(tmp_path):
    proc = _launch(tmp_path, PROGRAMS / "on_demand.py")
    lines = proc.stdout.splitlines()
    # The newest three live blocks of the one leaking site, each held by the global list.
    assert len(lines) == 3, proc.stdout
    for line in lines:
        size, holder = line.split(" ", 1)
        assert size == "4000"
        assert holder.startswith("kept (global of on_demand.py) -> list["), holder
        assert holder.endswith("] -> Tensor 1000 float32"), holder
