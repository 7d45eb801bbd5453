"""``%load_ext msmemscope`` and ``%%msmemscope`` in a real notebook, run by nbclient on a
kernel of this interpreter (a kernel spec in a temporary directory, the user's own untouched)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402
from jupyter_client.manager import KernelManager  # noqa: E402

LEAKY = """%%msmemscope -o {out}
import torch
torch.manual_seed(0)
model = torch.nn.Linear(16, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
kept = []
for i in range(8):
    logits = model(torch.randn(32, 16))
    kept.append(logits)
    logits.sum().backward()
    opt.step()
    opt.zero_grad()
len(kept)"""

CLEAN = """%%msmemscope
for i in range(8):
    logits = model(torch.randn(32, 16))
    logits.sum().backward()
    opt.step()
    opt.zero_grad()"""

FAILING = """%%msmemscope
x = torch.ones(10)
1 / 0"""

AFTER = "from msmemscope._runtime import native\nnative().tracing()"


def _kernel_manager(tmp_path: Path) -> type[KernelManager]:
    """A kernel manager class that finds one kernel spec, ``msmemscope-test``: this
    interpreter running ipykernel. nbclient makes the manager and shuts the kernel down
    (gracefully: the kernel exits as a process does, its atexit handlers run)."""
    kernels = tmp_path / "kernels"
    spec = kernels / "msmemscope-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps({"argv": argv, "display_name": "msmemscope test", "language": "python"})
    )

    class _Manager(KernelManager):  # type: ignore[misc]
        def _kernel_spec_manager_default(self) -> KernelSpecManager:
            return KernelSpecManager(kernel_dirs=[str(kernels)])

    return _Manager


def _html(cell: Any) -> str:
    return "\n".join(
        o["data"]["text/html"] for o in cell.outputs if "text/html" in o.get("data", {})
    )


def test_cell_magic_in_a_notebook(tmp_path: Path) -> None:
    out = tmp_path / "out"
    nb = nbformat.v4.new_notebook()
    sources = ["%load_ext msmemscope", LEAKY.format(out=out), CLEAN, FAILING, AFTER]
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    client = nbclient.NotebookClient(
        nb,
        kernel_name="msmemscope-test",
        kernel_manager_class=_kernel_manager(tmp_path),
        timeout=60,
        allow_errors=True,
        resources={},
    )
    client.execute(cwd=str(tmp_path))
    load, leaky, clean, failing, after = nb.cells
    assert not [o for o in load.outputs if o["output_type"] == "error"], load.outputs

    # The leaking line: the cell's line 8 (counting the magic's line 1 out, line 7 of the code
    # run), in the kernel's pseudo-file for the cell, shown as IPython names it.
    page = _html(leaky)
    assert "Leak sites: 1" in page, page
    assert "Cell In[2], line 7 (&lt;module&gt;)" in page, page
    assert re.search(r'title="[^"]*ipykernel_\d+/\d+\.py:7"', page), page
    assert "<code>logits = model(torch.randn(32, 16))</code>" in page, page
    assert "+1.0 KiB" in page, page  # 32x8 float32 per step
    assert "kept (global of the notebook) -&gt; list[" in page, page
    assert "<svg" in page and "<polyline" in page, page
    assert f"Run directory: <code>{out}/msmemscope_" in page, page
    results = [o for o in leaky.outputs if o["output_type"] == "execute_result"]
    assert results and results[0]["data"]["text/plain"] == "8", leaky.outputs

    # The second traced cell: its own steps (numbering continued), no leak.
    page = _html(clean)
    assert "8 step(s) in this cell (steps 7&ndash;15 of the kernel)" in page, page
    assert "No leak" in page and "Leak sites" not in page, page
    assert "<svg" in page, page

    # An error in the cell is the cell's error; the report is still shown, tracing is stopped.
    errors = [o for o in failing.outputs if o["output_type"] == "error"]
    assert errors and errors[0]["ename"] == "ZeroDivisionError", failing.outputs
    assert "No step boundary in this cell" in _html(failing)
    assert [o["data"]["text/plain"] for o in after.outputs] == ["False"], after.outputs

    # The analyses' files are written when the kernel exits, and judge the kernel's whole
    # run: the second cell's 8 flat steps made cell 2's site a bounded one there.
    runs = list(out.glob("msmemscope_*"))
    assert len(runs) == 1, runs
    findings = json.loads((runs[0] / "leaks" / "findings.json").read_text())
    assert findings["steps_marked"] == 15, findings
    sites = findings["leaks"] + findings["resident"]
    assert [(Path(s["file"]).parent.name[:10], s["line"]) for s in sites] == [("ipykernel_", 7)], (
        sites
    )
    assert (runs[0] / "leaks" / "peak.json").is_file()


def test_options() -> None:
    from msmemscope.notebook import parse_options

    keys = ["analysis", "output_path", "call_stack"]
    opts = parse_options("--analysis=leaks,decompose -o 'my dir' --call-stack python:5", keys)
    assert opts.config == {
        "analysis": "leaks,decompose",
        "output_path": "my dir",
        "call_stack": "python:5",
    }
    assert opts.holders
    assert not parse_options("--no-holders --output-path=x", keys).holders
    with pytest.raises(ValueError, match="unknown option '--bogus=1'"):
        parse_options("--bogus=1", keys)
    with pytest.raises(ValueError, match="needs a value"):
        parse_options("--analysis", keys)


def test_import_does_not_load_ipython() -> None:
    code = "import sys, msmemscope; print('IPython' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
