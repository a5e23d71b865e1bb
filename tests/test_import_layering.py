"""The package imports only downward: no import cycle among its modules (imports inside functions and under
``TYPE_CHECKING`` count), and the model stack keeps its layers — core → base → families → the registry's tables
→ the loaders and the zoo (the hub layer) → the factory, as timm keeps ``_registry``, ``_hub`` and ``_factory``."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import crate_transformer as ct
from crate_transformer import _registry

SRC = Path(ct.__file__).parent
PKG = "crate_transformer"


def _modules() -> dict[str, Path]:
    mods = {}
    for f in SRC.rglob("*.py"):
        rel = f.relative_to(SRC.parent).with_suffix("")
        mods[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = f
    return mods


def _targets(mods: dict[str, Path], module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The package modules one import statement reaches (``from . import x`` → the submodule ``x``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif node.level:
        parts = module.split(".") if mods[module].name == "__init__.py" else module.split(".")[:-1]
        base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
    else:
        names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module for a in node.names]
    out = []
    for name in names:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        if name and name != module and name.startswith(PKG):
            out.append(name)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module → the package modules it imports anywhere in its file (``ast``, so lazy imports count)."""
    mods = _modules()
    graph = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[m].update(_targets(mods, m, node))
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively: the components of two or more modules (the cycles)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle_and_a_self_contained_chain_has_none():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b"], ["c", "d"]]


def test_a_lazy_import_inside_a_function_is_an_edge(tmp_path, monkeypatch):
    pkg = tmp_path / PKG
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from .high import g\n")
    (pkg / "high.py").write_text("from . import low\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", pkg)
    assert strongly_connected(import_graph()) == [[f"{PKG}.high", f"{PKG}.low"]]


def test_no_module_of_the_package_is_on_an_import_cycle():
    cycles = strongly_connected(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


# the family modules: where the registered architectures' classes live (a new family is one more, with no edit here)
FAMILY_MODULES = {a.model_class.__module__.rpartition(".")[2] for a in _registry._ARCHS.values()}
# every registered family's module (a new family joins the layer by registering itself)
FAMILIES = {a.model_class.__module__.split(".")[-1] for a in _registry._ARCHS.values()
            if a.model_class.__module__.startswith(PKG + ".")}  # fmt: skip
LAYERS = [  # lowest first; a module may import its own layer and the ones before it
    {
        "_version",
        "errors",
        "config_utils",
        "config",
        "io",
        "objectives",
        "layers",
        "layers.reference",
        "layers.config",
        "layers.inference",
        "layers.attention",
        "layers._tssa_functions",  # TSSA's memory-saving backward (its operator imports it)
        "layers.tssa",
        "layers.sparse",
        "layers.block",
        "static_cache",  # compiled decoding's cache (the attention layers write into it)
        "generation",  # generation and sampling (a language model's generate calls it)
        "token_prior",  # a language model's mixin
        "official",
        "spec",
        "tokenizer",
        "runfiles",
        "loading",
        "loading.values",
        "loading.weights",
    },
    {"_hub", "loading.folder"},
    {"base"},
    {"_registry"},
    FAMILY_MODULES,
    {"loading.pipeline", "checkpoint"},
    {"pretrained"},
    {"registry"},
]


def test_the_model_stack_imports_only_downward():
    graph = import_graph()
    layer_of = {f"{PKG}.{m}": i for i, layer in enumerate(LAYERS) for m in layer}
    wrong = [
        f"{m} (layer {layer_of[m]}) imports {t} (layer {layer_of.get(t, 'above the stack')})"
        for m in layer_of
        for t in graph[m]
        if layer_of.get(t, len(LAYERS)) > layer_of[m]
    ]
    assert not wrong, wrong
    # the tables and the families know no loader, zoo download or factory
    assert not graph[f"{PKG}._registry"] - {f"{PKG}.config", f"{PKG}.official", f"{PKG}.base"}
