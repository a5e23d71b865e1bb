"""The tutorial notebooks (docs/notebooks/*.ipynb) run from top to bottom on CPU, and are stored without outputs.

Each notebook checks its own claims with ``assert`` (closed forms against autograd and scikit-learn, a trained
model above chance, sparsity of the ISTA outputs, ...), so executing it is the test.  What a reader sees is
checked too: the kernel runs with the backend Jupyter gives it (``MPLBACKEND`` removed, as in a notebook
server), and every cell that draws (a ``plot_*`` function or ``subplots``) must show as many PNG images as it
draws figures, never a bare ``<Figure ...>`` line.  The documentation site executes the same notebooks
(mkdocs-jupyter), with ``MPLBACKEND=Agg`` as CI sets it: :func:`test_figures_display_under_any_backend` covers
that the package's figures show there too.

The kernel runs offline with an empty Hugging Face cache, so the released-checkpoint notebook must print that it
skips the cells needing the weights (and run the rest on a random model of the same architecture); the test
checks that line rather than passing as if the released weights had been used.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# a call that makes a figure: the package's plot_* functions and its pyplot-free subplots()
DRAWS = re.compile(r"\b(?:plot_\w+|subplots)\(")
NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "docs" / "notebooks").glob("*.ipynb"))
# lines a notebook must print (offline, empty cache): what ran and what was skipped
EXPECTED_OUTPUT = {
    "03_released_checkpoint.ipynb": [
        "SKIPPING the released-checkpoint cells: the crate_alpha_base16 weights are not on this machine",
        "random initialisation (no released weights)",
        "skipped: classification needs the released weights",
        "skipped: whether the mask finds the cat needs the released weights",
    ],
}
# cells that must draw: notebook 1 plots the rates and ISTA's convergence, notebook 2 compression against
# initialisation, across training, the attention and the subspaces; notebook 5 the effects, the patching, the steering
FIGURES = {
    "01_coding_rates.ipynb": 2,
    "02_tiny_crate.ipynb": 4,
    "03_released_checkpoint.ipynb": 2,
    "05_reaching_inside.ipynb": 3,
}


def test_there_are_tutorial_notebooks() -> None:
    assert [p.name for p in NOTEBOOKS][:4] == [
        "01_coding_rates.ipynb",
        "02_tiny_crate.ipynb",
        "03_released_checkpoint.ipynb",
        "04_mae_dino_lm.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path: Path) -> None:
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            assert not cell["outputs"] and cell["execution_count"] is None, f"{path.name}: strip the outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    # the kernel inherits the environment: one thread each (the suite runs on 2 shared cores), and the
    # matplotlib backend a Jupyter kernel picks itself (CI exports MPLBACKEND=Agg, which would hide pyplot figures)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("MPLBACKEND", raising=False)
    # offline with an empty Hugging Face cache (released weights absent, as in CI); token caches in tmp_path
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    monkeypatch.setenv("CRATE_CACHE_DIR", str(tmp_path / "tokens"))
    src = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(Path(__file__).parents[1] / "src"), src) if p))
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert any(c.outputs for c in nb.cells if c.cell_type == "code")  # it ran and printed its checks
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    for line in EXPECTED_OUTPUT.get(path.name, []):
        assert line in printed, f"{path.name} did not print {line!r}"
    _check_figures_shown(path.name, nb)


def _check_figures_shown(name: str, nb: object) -> None:
    """Every figure a cell draws is shown as a PNG of a sensible size; no figure prints as text only."""
    import base64
    import io

    from PIL import Image

    drawing = 0
    for n, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        pngs = [o["data"]["image/png"] for o in cell.outputs if "image/png" in o.get("data", {})]
        texts = [o["data"] for o in cell.outputs if "image/png" not in o.get("data", {"image/png": 0})]
        bare = [t["text/plain"] for t in texts if t.get("text/plain", "").startswith("<Figure")]
        assert not bare, f"{name}, code cell {n + 1}: a figure printed as {bare[0]!r}"
        # a figure drawn by a helper function is one call per figure, whatever the loop around it
        calls = len([m for m in DRAWS.finditer(cell.source) if not cell.source[: m.start()].endswith("def ")])
        assert len(pngs) >= calls, f"{name}, code cell {n + 1}: draws {calls} figure(s), shows {len(pngs)}"
        for data in pngs:
            w, h = Image.open(io.BytesIO(base64.b64decode(data))).size
            assert w >= 200 and h >= 100, f"{name}, code cell {n + 1}: a {w}x{h} image"
        drawing += calls > 0
    if name in FIGURES:
        assert drawing >= FIGURES[name], f"{name}: {drawing} cells draw figures, expected {FIGURES[name]}"


def test_figures_display_under_any_backend() -> None:
    """A figure returned by a plotting function shows as a PNG in IPython, with MPLBACKEND=Agg (CI, the docs
    build) and without pyplot ever imported: the display path of a notebook cell's last value."""
    code = (
        "import sys, torch\n"
        "from IPython.core.formatters import DisplayFormatter\n"
        "from crate_transformer.analysis import measure, plot_layerwise\n"
        "import crate_transformer as ct\n"
        "torch.manual_seed(0)\n"
        "m = ct.create_model('crate_mnist', image_size=8, patch_size=2, dim=16, depth=2, heads=2).eval()\n"
        "fig = plot_layerwise(measure(m, torch.randn(4, 1, 8, 8), progress=False))\n"
        "data, _ = DisplayFormatter().format(fig)\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
        "print(sorted(data), data['image/png'][:8] if 'image/png' in data else None)\n"
    )
    env = {**os.environ, "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'image/png'" in out.stdout and "b'\\x89PNG" in out.stdout, out.stdout
