"""A new model family is one file plus its registry lines: ``tests/toy_family.py`` (not an ``ImageClassifier``,
defined outside the package) trains, is analysed, gives its sparse codes as features, loads back with
``from_pretrained`` and is listed — through the unchanged package and ``crate`` command.  And no module outside
a family's own asks for a family by its class or its ``arch`` name: consumers ask the capability contract."""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest
import torch
from clitools import crate

import crate_transformer as ct
from crate_transformer.models import _registry


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
    features = json.loads((run / "features" / "features.json").read_text())
    assert [layer["layer"] for layer in features["layers"]] == [1, 2]
    assert {layer["summary"]["kind"] for layer in features["layers"]} == {"ista"}


def _module(cls: type) -> str:
    """A class's module below the package (``crate_transformer.models.lm`` → ``models.lm``)."""
    return cls.__module__.removeprefix("crate_transformer.")


FAMILY_MODULES = {_module(a.model_class) for a in _registry._ARCHS.values()}
REGISTRY_MODULES = {"models._registry", "models.registry"}


def _owners() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Which modules may name each family class (the classes of a registered family and of its config, with their
    package bases that live in a family module) and each ``arch``: the modules of the families that use it."""
    classes: dict[str, set[str]] = {}
    archs: dict[str, set[str]] = {}
    for arch, info in _registry._ARCHS.items():
        own = {_module(info.model_class), _module(info.config_class)}
        archs[arch] = own | REGISTRY_MODULES
        for cls in (*info.model_class.__mro__, *info.config_class.__mro__):
            if _module(cls) in FAMILY_MODULES:
                classes.setdefault(cls.__name__, set(REGISTRY_MODULES)).update(own | {_module(cls)})
    return classes, archs


def _names(node: ast.AST) -> list[str]:
    """The class names in ``isinstance``'s second argument: a name, ``a.Name``, a tuple or an ``A | B`` union."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [n for e in node.elts for n in _names(e)]
    if isinstance(node, ast.BinOp):
        return _names(node.left) + _names(node.right)
    return []


def _arch_values(node: ast.AST, constants: dict[str, str]) -> list[str]:
    """The arch names a comparison side spells: a string, a module constant (``MAE_ARCH``), or a tuple of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in constants:
        return [constants[node.id]]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [v for e in node.elts for v in _arch_values(e, constants)]
    return []


def _type_dispatch(tree: ast.AST, module: str, classes: dict[str, set[str]], archs: dict[str, set[str]],
                   constants: dict[str, str] | None = None) -> list[str]:  # fmt: skip
    """``isinstance``/``issubclass(x, <family class>)``, ``type(x) is <family class>`` and ``arch == <name>``
    (``!=``, ``in``; a literal or an ``*_ARCH`` constant) in ``module`` where it is not that family's module."""
    constants = constants or {}
    found = []
    for node in ast.walk(tree):
        named: list[str] = []
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
            named = _names(node.args[1]) if len(node.args) == 2 else []
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Call) and getattr(s.func, "id", None) == "type" for s in sides):
                named = [n for s in sides if not isinstance(s, ast.Call) for n in _names(s)]
            if any(getattr(s, "attr", None) == "arch" or getattr(s, "id", None) == "arch" for s in sides):
                values = [v for s in sides for v in _arch_values(s, constants)]
                if any(module not in archs.get(v, REGISTRY_MODULES) for v in values):
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if any(module not in classes.get(n, {module}) for n in named):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _arch_constants() -> dict[str, str]:
    """The package's ``*_ARCH`` constants (``MAE_ARCH = "crate_mae"``), so a comparison with one is seen."""
    import crate_transformer

    out = {}
    for path in Path(crate_transformer.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id.endswith("_ARCH") and isinstance(node.value.value, str):
                    out[target.id] = node.value.value
    return out


def test_the_checker_finds_type_dispatch() -> None:
    classes = {"LMConfig": {"lm", "bert"}, "CRATEMAE": {"mae"}}
    archs = {"vit": {"model"}, "crate_mae": {"mae"}, "a": {"x"}, "b": {"x"}}
    code = (
        "isinstance(m, (LMConfig, int))\nif model.config.arch == 'vit': pass\nif arch in ('a', 'b'): pass\n"
        "isinstance(m, LMConfig | MAEConfig)\nissubclass(k, mae.CRATEMAE)\nif type(m) is CRATEMAE: pass\n"
        "if c.arch != MAE_ARCH: pass\n"
    )
    hits = _type_dispatch(ast.parse(code), "analysis", classes, archs, {"MAE_ARCH": "crate_mae"})
    assert [h.split(":")[0] for h in hits] == [f"line {i}" for i in range(1, 8)], hits
    fine = "isinstance(m, Model)\nif klass.arch == arch: pass\nif arch is None: pass\nisinstance(x, (int, str))\n"
    assert _type_dispatch(ast.parse(fine), "analysis", classes, archs) == []
    # a family's own module may ask about its own classes and archs, not another family's
    assert _type_dispatch(ast.parse("isinstance(c, LMConfig)\nc.arch == 'vit'"), "bert", classes, archs) == [
        "line 2: c.arch == 'vit'"
    ]
    assert len(_type_dispatch(ast.parse("isinstance(m, CRATEMAE)"), "lm", classes, archs)) == 1


def test_no_consumer_dispatches_on_a_family_class_or_arch_name() -> None:
    classes, archs = _owners()
    assert {"LMConfig", "MAEConfig", "ModelConfig", "CRATEMAE", "LanguageModel", "ImageClassifier"} <= set(classes)
    assert {f"models.{m}" for m in ("classifier", "mae", "lm", "bert", "alpha", "tost")} <= FAMILY_MODULES
    constants = _arch_constants()
    assert constants["MAE_ARCH"] == "crate_mae"
    src = Path(ct.__file__).parent
    wrong = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src)
        module = ".".join(rel.with_suffix("").parts)
        hits = _type_dispatch(ast.parse(path.read_text(encoding="utf-8")), module, classes, archs, constants)
        if hits:
            wrong[str(rel)] = hits
    assert not wrong, wrong


def _names_mentioning(path: Path, pattern: str) -> list[str]:
    """The identifiers of a module's code (not its strings or comments) that match ``pattern``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {getattr(n, "id", None) or getattr(n, "attr", None) or getattr(n, "name", None) for n in ast.walk(tree)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom | ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    return sorted(n for n in names if isinstance(n, str) and re.search(pattern, n, re.IGNORECASE))


def test_the_tost_family_is_one_module_on_the_contract() -> None:
    """ToST was the test of the model contract: outside its module only its operator (TSSA, beside MSSA, and its
    entry in the layer's attention table), the registry's import and the package's exports name it in code; every
    consumer reaches it through the contract."""
    src = Path(ct.__file__).parent
    assert "ToSTBlock" in _names_mentioning(src / "models" / "tost.py", "tost")  # the scan sees a module's identifiers
    named = {str(p.relative_to(src)) for p in src.rglob("*.py") if _names_mentioning(p, "tost|tssa")}
    # the operator, its private memory-saving backward, its equations, the exports and the attention table
    layers = {"layers/tssa.py", "layers/_tssa_functions.py", "layers/reference.py", "layers/__init__.py"}
    layers |= {"layers/block.py"}
    assert named == {"models/tost.py", "models/registry.py", "__init__.py"} | layers, named
    # the layer names TSSA in its attention table only (attention="tssa"), where every compression step is named
    assert _names_mentioning(src / "layers" / "block.py", "tost|tssa") == ["TSSA", "tssa"]
    assert _names_mentioning(src / "layers" / "reference.py", "tost|tssa") == [
        "_TSSA_ENERGY_FLOOR", "_TSSA_MASS_EPS", "tssa_reference"
    ]  # fmt: skip
