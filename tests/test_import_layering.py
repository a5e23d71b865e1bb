"""The package imports only downward: no import cycle among its modules (imports inside functions and under
``TYPE_CHECKING`` count), and the model stack keeps its layers — core → base → families → the registry's tables
→ the loaders and the zoo (the hub layer) → the factory, as timm keeps ``_registry``, ``_hub`` and ``_factory``;
and the folders show it: the core at the root, ``layers/`` below ``models/`` and ``loading/``, the library below the
lab (``train/``, ``data/``, ``analysis/``, ``theory/``, ``cli/``)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import crate_transformer as ct
from crate_transformer.models import _registry

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
FAMILY_MODULES = {a.model_class.__module__.removeprefix(PKG + ".") for a in _registry._ARCHS.values()}
# the file helpers' package, lowest first: each module imports only the ones before it (the package re-exports them)
IO_MODULES = [
    "io.errors",
    "io.paths",
    "io.writes",
    "io.digests",
    "io.pickles",
    "io.tensors",
    "io.sidecars",
    "io.model_folder",
]
LAYERS = [  # lowest first; a module may import its own layer and the ones before it
    {
        "_version",
        "errors",
        "config_utils",
        "config",
        "_reads",  # which fields a model build reads (applies=OBSERVED)
        *IO_MODULES,
        "io",
        "objectives",
        "layers",
        "layers.reference",
        "layers.config",
        "layers.inference",
        "layers._hook_state",  # the hook key compiled graphs are guarded on
        "layers.hooks",  # the hook sites the layers declare
        "layers.attention",
        "layers._tssa_functions",  # TSSA's memory-saving backward (its operator imports it)
        "layers.tssa",
        "layers.sparse",
        "layers.block",
        "layers.static_cache",  # compiled decoding's cache (the attention layers write into it)
        "models",
        "models.contract",  # the config half of the capability contract: FamilyConfig, KINDS
        "models.generation",  # generation and sampling (a language model's generate calls it)
        "models.token_prior",  # a language model's mixin
        "models.spec",
        "models.tokenizer",
        "models.hooks",  # hook_names / run_with_cache / intervene: the base model's mixin
        "models.interop",  # the GPT baseline in TransformerLens (transformers' GPT-2)
        "loading",
        "loading.official",  # the authors' key maps and formats: what a family declares it reads
        "loading.runfiles",
        "loading.values",
        "loading.weights",
    },
    {"loading.hub", "loading.folder"},
    {"models.base", "models.image_input"},  # the model contract; what every image encoder shares
    {"models._registry"},
    FAMILY_MODULES | {"models.dino", "models.classifier_zoo"},  # the families, DINO's heads, the classifiers' zoo
    {"loading.pipeline"},
    {"loading.pretrained"},
    {"models.registry"},
    {"loading.transformers_hf"},  # the transformers integration (the hf extra): wraps what the loaders load
]
# the folders: the core (the package's root modules) and the layers below the models and the loaders, and the
# library (core, layers, models, loading) below the lab
LIBRARY = ("layers", "models", "loading")
LAB = ("train", "data", "analysis", "theory", "cli")


def _folder(module: str) -> str:
    """The top folder of a package module (``crate_transformer.models.lm`` → ``models``); ``""`` for the package
    root's own modules (the core)."""
    rest = module.removeprefix(PKG).removeprefix(".")
    top = rest.partition(".")[0]
    return top if top in LIBRARY + LAB else ""


def test_the_root_holds_the_core_and_folders_say_what_they_hold():
    """At most eight modules at the package root (the core: configs, errors, objectives, progress, the read
    recorder) and the file helpers' package ``io/`` beside them, every registered family in ``models/``, and the
    lab's packages each a folder."""
    root = sorted(p.stem for p in SRC.glob("*.py"))
    assert len(root) <= 8, root
    assert set(root) == {"__init__", "_version", "_reads", "config", "config_utils", "errors", "objectives", "progress"}
    assert (SRC / "io" / "__init__.py").is_file() and _folder(f"{PKG}.io.paths") == ""  # io/ is of the core
    assert FAMILY_MODULES and all(m.startswith("models.") for m in FAMILY_MODULES), FAMILY_MODULES
    assert all((SRC / d / "__init__.py").is_file() for d in LIBRARY + LAB)


def test_the_folders_import_only_downward():
    """The core imports no folder; the layers only the core; the library (core, layers, models, loading) nothing
    of the lab (train, data, analysis, theory, cli), anywhere in a file (lazy imports count)."""
    graph = import_graph()
    assert _folder(f"{PKG}.io") == "" and _folder(f"{PKG}.models.lm") == "models" and _folder(f"{PKG}.cli") == "cli"
    allowed = {"": {""}, "layers": {"", "layers"}}
    allowed.update({d: {"", *LIBRARY} for d in ("models", "loading")})
    wrong = [
        f"{m} imports {t}"
        for m in graph
        if m != PKG and _folder(m) in allowed
        for t in graph[m]
        if t != PKG and _folder(t) not in allowed[_folder(m)]
    ]
    assert not wrong, wrong


def test_the_file_helpers_import_only_downward():
    """Each module of ``io/`` imports only the ``io`` modules before it in :data:`IO_MODULES` (and the core's root
    modules), never the package itself, whose ``__init__`` re-exports them; every module of ``io/`` is listed."""
    graph = import_graph()
    on_disk = {f"io.{p.stem}" for p in (SRC / "io").glob("*.py") if p.stem != "__init__"}
    assert on_disk == set(IO_MODULES), on_disk ^ set(IO_MODULES)
    for i, m in enumerate(IO_MODULES):
        inside = {t.removeprefix(PKG + ".") for t in graph[f"{PKG}.{m}"] if t.startswith(f"{PKG}.io")}
        assert inside <= set(IO_MODULES[:i]), (m, sorted(inside - set(IO_MODULES[:i])))
    assert {t.removeprefix(PKG + ".") for t in graph[f"{PKG}.io"]} == set(IO_MODULES)


def test_the_model_stack_imports_only_downward():
    graph = import_graph()
    layer_of = {f"{PKG}.{m}": i for i, layer in enumerate(LAYERS) for m in layer}
    unplaced = sorted(m for m in graph if _folder(m) in LIBRARY and m not in layer_of)
    assert not unplaced, f"library modules missing from LAYERS: {unplaced}"
    wrong = [
        f"{m} (layer {layer_of[m]}) imports {t} (layer {layer_of.get(t, 'above the stack')})"
        for m in layer_of
        for t in graph[m]
        if layer_of.get(t, len(LAYERS)) > layer_of[m]
    ]
    assert not wrong, wrong
    # the tables and the families know no loader, zoo download or factory
    tables = {
        f"{PKG}.{m}"
        for m in ("config", "_reads", "config_utils", "errors", "loading.official", "models.base", "models.contract")
    }
    assert not graph[f"{PKG}.models._registry"] - tables
