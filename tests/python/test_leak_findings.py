"""Leak findings on real programs under the real CLI (tests/fixtures/leak_programs/).

The classic bugs (logits kept in a list, a forward hook filling a dict, a cache keyed by batch
id, retain_graph with the losses kept, an evaluation loop summing losses as tensors) are each
one leaking site naming the line that allocated the kept tensors, the bytes they grow by per
step, and the variable that holds them. Clean programs (gradient accumulation with an LR
scheduler, a backbone unfrozen mid-run, a torch.compile'd model, generate() with a KV cache)
give no leak; their one-time growth is resident. Every leaks/findings.json is valid against the
package's schema. Tensors kept inside containers written in C (an ``lru_cache``, an
``itertools.cycle``) are found through them, each hop named.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import textwrap
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
    # The console: the original msMemScope's lines, then the site with its source line and holder.
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
        assert "kept but not growing (not leaks)" in stderr
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


# Programs whose leaked tensors only a C container keeps: site, line, bytes per step, and the
# holder chain of most blocks with the step-numbered index or key as \d+.
C_HOLDERS = [
    (
        "lru_mask",
        "dropout_mask",
        14,
        32 * 128,
        (
            r"dropout_mask \(global of lru_mask\.py\) -> cache\[\d+\] of dropout_mask "
            r"\(lru_cache of lru_mask\.py:11\) -> Tensor 32x128 bool"
        ),
    ),
    (
        "cycle_batches",
        "loader",
        14,
        32 * 64 * 4,
        (
            r"data \(global of cycle_batches\.py\) -> itertools\.cycle item -> "
            r"list\[\d+\] -> tuple\[0\] -> Tensor 32x64 float32"
        ),
    ),
]


@pytest.mark.parametrize(
    ("program", "function", "line", "per_step", "chain"), C_HOLDERS, ids=[c[0] for c in C_HOLDERS]
)
def test_a_leak_kept_by_a_c_container_names_the_container(
    tmp_path, program, function, line, per_step, chain
):
    stderr, doc = _run(tmp_path, program)
    assert doc["steps_source"] == "optimizer.step", doc
    top = doc["leaks"][0]
    path = PROGRAMS / f"{program}.py"
    assert top["site"] == f"{path}:{line} ({function})", top
    assert (top["line"], top["bytes_per_step"]) == (line, per_step), top
    assert top["source"] == path.read_text().splitlines()[line - 1].strip()
    held = max(top["holders"], key=lambda h: h["blocks"])
    assert re.fullmatch(chain, held["chain"]), top["holders"]
    assert re.search(rf"^    held by: {chain}", stderr, re.MULTILINE), stderr
    assert "not reachable" not in stderr, stderr


# Each case builds one holder of one tensor and nothing else that reaches it; the search's
# chains for all of them are printed as JSON. "# line:NAME" marks a line the chains name.
HOLDER_CASES = """
import collections
import functools
import gc
import itertools
import json
import weakref

import torch

from msmemscope import holders

gc.disable()  # the unreachable cycle below lives until the search has run
targets = {}


def ptr(t):
    return t.untyped_storage().data_ptr()


@functools.lru_cache(maxsize=None)  # line:causal_mask
def causal_mask(n):
    return torch.ones(n, n).tril_()


@functools.lru_cache(maxsize=8)  # line:scaled
def scaled(n, scale=1.0):
    return torch.full((n,), scale)


class Model:
    @functools.lru_cache(maxsize=None)  # line:positions
    def positions(self, length):
        return torch.arange(length)


class Registry:
    kept = {}


def record(store, value):
    store.append(value)


def loader():
    buffer = [torch.zeros(12)]
    yield buffer[0]  # line:yield
    yield buffer[0]


class LazyMapping(dict):
    def items(self):
        raise AssertionError("the search ran a subclass's items()")


class Key:
    pass


targets["lru_cache"] = ptr(causal_mask(7))
targets["bounded lru_cache"] = ptr(scaled(3, scale=2.0))
model = Model()
targets["method's lru_cache"] = ptr(model.positions(4))
Registry.kept["w"] = torch.zeros(5)
targets["class attribute"] = ptr(Registry.kept["w"])
on_step = functools.partial(record, [])
on_step(torch.zeros(6))
targets["partial"] = ptr(on_step.args[0][0])
stream = itertools.chain([torch.zeros(1)], [torch.zeros(7)])
next(stream)
targets["itertools.chain"] = ptr(next(stream))
batches = loader()
targets["generator"] = ptr(next(batches))
callbacks = [[].append]
callbacks[0](torch.zeros(8))
targets["bound builtin method"] = ptr(callbacks[0].__self__[0])
key = Key()
per_key = weakref.WeakKeyDictionary()
per_key[key] = torch.zeros(9)
targets["WeakKeyDictionary"] = ptr(per_key[key])
by_name = weakref.WeakValueDictionary()
cycle = [torch.zeros(10)]
cycle.append(cycle)
by_name["t"] = cycle[0]
targets["WeakValueDictionary"] = ptr(cycle[0])
del cycle
lazy = LazyMapping(t=torch.zeros(11))
targets["dict subclass"] = ptr(dict.__getitem__(lazy, "t"))

search = holders._search(set(targets.values()), 30.0)
print(json.dumps({case: search.found.get(p) for case, p in targets.items()}))
"""


def test_holder_search_opens_c_containers_and_names_each_hop(tmp_path):
    """The search itself (no runtime needed) on the holders today's C containers make: each
    found, each hop named, weak references never taken for holders."""
    source = textwrap.dedent(HOLDER_CASES)
    lines = {
        m[1]: n
        for n, text in enumerate(source.splitlines(), 1)
        if (m := re.search(r"# line:(\w+)", text))
    }
    script = tmp_path / "cases.py"
    script.write_text(source)
    proc = subprocess.run(
        [str(PYTHON), str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    g = "(global of cases.py)"
    assert found == {
        "lru_cache": f"causal_mask {g} -> cache[7] of causal_mask "
        f"(lru_cache of cases.py:{lines['causal_mask']}) -> Tensor 7x7 float32",
        # A bounded cache keeps each result in a link of its own; the keywords are named.
        "bounded lru_cache": f"scaled {g} -> cache[3, scale=2.0] of scaled "
        f"(lru_cache of cases.py:{lines['scaled']}) -> Tensor 3 float32",
        # A method's cache lives in its class; its keys hold the instances (no address).
        "method's lru_cache": f"Model {g} -> .positions of class Model -> "
        f"cache[<__main__.Model object>, 4] of Model.positions "
        f"(lru_cache of cases.py:{lines['positions']}) -> Tensor 4 int64",
        "class attribute": f"Registry {g} -> .kept of class Registry -> dict['w'] -> "
        "Tensor 5 float32",
        "partial": f"on_step {g} -> args[0] of partial(record) -> list[0] -> Tensor 6 float32",
        # The chain is in its second list: the iterator over that list holds it.
        "itertools.chain": f"stream {g} -> itertools.chain item -> list_iterator item -> "
        "list[0] -> Tensor 7 float32",
        "generator": f"batches {g} -> buffer (local of loader, cases.py:{lines['yield']}) -> "
        "list[0] -> Tensor 12 float32",
        "bound builtin method": f"callbacks {g} -> list[0] -> self of list.append -> list[0] -> "
        "Tensor 8 float32",
        "WeakKeyDictionary": f"per_key {g} -> WeakKeyDictionary[<__main__.Key object>] -> "
        "Tensor 9 float32",
        # Its values are weak: the tensor only a garbage cycle keeps has no holder.
        "WeakValueDictionary": None,
        "dict subclass": f"lazy {g} -> LazyMapping['t'] -> Tensor 11 float32",
    }


def test_a_window_that_fills_and_stays_flat_is_bounded_not_a_leak(tmp_path):
    """`deque(maxlen=3)` of each step's hidden states: memory grows while the window fills, then
    stays flat for the rest of the run; resident, said bounded, and no leak."""
    stderr, doc = _run(tmp_path, "window_deque")
    assert doc["leaks"] == [], doc["leaks"]
    assert "Detected memory leaks" not in stderr, stderr
    (window,) = [r for r in doc["resident"] if r["bounded"]]
    assert window["line"] == 15 and window["file"] == str(PROGRAMS / "window_deque.py"), window
    # Two steps' 64x512 float32 outlive their next step end, the third is the current step's.
    assert window["bytes"] == 2 * 64 * 512 * 4, window
    assert window["stopped_at_step"] == window["since_step"] + 1, window
    assert f"bounded: stopped growing at step {window['stopped_at_step']}" in stderr, stderr


def test_one_tensor_grown_by_cat_each_step_is_a_leak(tmp_path):
    """`self.seen = torch.cat([self.seen, x])`: one live block, 8 KiB larger every step (each old
    one freed), is a leak at the cat's line, held by the module's attribute."""
    stderr, doc = _run(tmp_path, "grown_cat")
    (leak,) = doc["leaks"]
    assert leak["file"] == str(PROGRAMS / "grown_cat.py") and leak["line"] == 13, leak
    assert leak["growth"] == "replaced" and leak["bytes_per_step"] == 64 * 32 * 4, leak
    assert leak["leaked_blocks"] == 1, leak
    # Twelve batches of 64x32 float32 at the end, in one block.
    assert leak["leaked_bytes"] == 12 * 64 * 32 * 4, leak
    assert leak["holders"][0]["chain"].startswith("model (global of grown_cat.py) -> .seen"), leak
    assert "in one block replaced by a larger one per step" in stderr, stderr


def test_checkpointing_autocast_and_a_short_last_batch_are_clean(tmp_path):
    stderr, doc = _run(tmp_path, "ckpt_autocast")
    assert doc["leaks"] == [], doc["leaks"]
    assert "Detected memory leaks" not in stderr, stderr
