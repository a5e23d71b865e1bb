"""A new model family is one file plus its registry lines: ``tests/toy_family.py`` (not an ``ImageClassifier``,
defined outside the package) trains, is analysed, gives its sparse codes as features, loads back with
``from_pretrained`` and is listed — through the unchanged package and ``crate`` command.  And no module outside
a family's own asks for a family by its class or its ``arch`` name: consumers ask the capability contract."""

from __future__ import annotations

import ast
import importlib
import json
from pathlib import Path

import pytest
import torch
from clitools import crate

import crate_transformer as ct
from crate_transformer import _registry


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch):
    """The toy family registered for one test (the tables restored after it)."""
    for table in ("_ARCHS", "_MODELS"):
        monkeypatch.setattr(_registry, table, dict(getattr(_registry, table)))
    import toy_family

    return importlib.reload(toy_family)  # its register_* lines run against the copies


def test_a_family_from_one_file_trains_analyses_gives_features_and_loads(toy, tmp_path: Path, capsys) -> None:
    assert "toy_crate_digits" in ct.list_models("toy_*")
    assert crate("models", "toy_*") == 0
    assert "mssa+ista" in capsys.readouterr().out
    run = tmp_path / "run"
    args = ["--model", "toy_crate_digits", "--data", "digits", "--image-size", "8", "--threads", "1"]
    args += ["--no-progress", "--epochs", "1", "--max-steps", "3", "--eval-every", "0", "--measure-every", "0"]
    assert crate("train", *args, "--out", run) == 0
    model = ct.from_pretrained(run / "model")
    assert type(model) is toy.ToyCRATE and model.config.data.name == "digits"
    assert type(toy.ToyCRATE.from_pretrained(run / "model")) is toy.ToyCRATE  # the family's own loader: no registry
    x = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(model(x), ct.load_model(run)(x), rtol=0, atol=0)
    # the white-box report: compression and sparsity measured on the toy's CRATE layers
    assert crate("analyze", run, "--num-images", "8", "--num-vis", "2", "--masks", "1", "--no-progress",
                 "--threads", "1", "--out", tmp_path / "report") == 0  # fmt: skip
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    layers = next(iter(report["measure"].values()))["layers"]
    assert len(layers) == 2 and all(0 <= row["nonzero"] <= 1 for row in layers)
    # the sparse codes as features: the ISTA outputs the model says it has
    assert crate("features", run, "--top-k", "2", "--num-images", "20", "--threads", "1") == 0
    features = json.loads((run / "features.json").read_text())
    assert [layer["layer"] for layer in features["layers"]] == [1, 2]
    assert {layer["summary"]["kind"] for layer in features["layers"]} == {"ista"}


FAMILY_MODULES = {a.model_class.__module__.rpartition(".")[2] for a in _registry._ARCHS.values()}
REGISTRY_MODULES = {"_registry", "registry"}


def _family_names() -> set[str]:
    """The classes of the registered families and their configs (the package's own, not ``Model`` / ``Config``)."""
    names = set()
    for info in _registry._ARCHS.values():
        for cls in (*info.model_class.__mro__, *info.config_class.__mro__):
            if cls.__module__.split(".")[-1] in FAMILY_MODULES:
                names.add(cls.__name__)
    return names


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _type_dispatch(tree: ast.AST, names: set[str]) -> list[str]:
    """``isinstance(x, <family class>)`` and ``arch == "literal"`` (``!=``, ``in``) in one module."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            hit = [c for c in classes if (getattr(c, "id", None) or getattr(c, "attr", None)) in names]
            found += [f"line {node.lineno}: isinstance(..., {ast.unparse(c)})" for c in hit]
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            about_arch = any(getattr(s, "attr", None) == "arch" or getattr(s, "id", None) == "arch" for s in sides)
            literal = any(_is_str(s) or (isinstance(s, (ast.Tuple, ast.List, ast.Set)) and all(map(_is_str, s.elts)))
                          for s in sides)  # fmt: skip
            if about_arch and literal:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_checker_finds_type_dispatch() -> None:
    code = "isinstance(m, (LMConfig, int))\nif model.config.arch == 'vit': pass\nif arch in ('a', 'b'): pass\n"
    assert len(_type_dispatch(ast.parse(code), {"LMConfig"})) == 3
    fine = "isinstance(m, Model)\nif klass.arch == arch: pass\nif arch is None: pass\n"
    assert _type_dispatch(ast.parse(fine), {"LMConfig"}) == []


def test_no_consumer_dispatches_on_a_family_class_or_arch_name() -> None:
    names = _family_names()
    assert {"LMConfig", "MAEConfig", "ModelConfig", "CRATEMAE", "LanguageModel", "ImageClassifier"} <= names
    assert {"model", "mae", "lm", "bert", "alpha"} <= FAMILY_MODULES
    src = Path(ct.__file__).parent
    wrong = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        if len(rel.parts) == 1 and rel.stem in FAMILY_MODULES | REGISTRY_MODULES:
            continue
        hits = _type_dispatch(ast.parse(path.read_text(encoding="utf-8")), names)
        if hits:
            wrong[str(rel)] = hits
    assert not wrong, wrong
