"""The paper's ablations at laptop scale: ``crate ablate TABLE`` (JMLR §4.1 "Ablations", Tables 11-13, 15, 17).

A table is a list of rows; a row is a name, the :class:`~crate_transformer.models.classifier.ModelConfig` and
:class:`~crate_transformer.train.TrainConfig` changes that define it (relative to a base recipe), and
the paper's ImageNet-1K top-1 for that row.  :func:`run_ablation` trains every row of the requested
tables for several seeds with the one training engine (:func:`crate_transformer.train.train`), each
run a normal run directory, and appends one summary line per finished run to ``results.jsonl``.  A
run already in ``results.jsonl`` is never trained again; a run killed midway continues from its last
checkpoint (the engine's resume), and one killed before its first checkpoint starts again — its folder is
emptied only while holding its lock, so the folder of a run still alive elsewhere is never deleted.  A
sweep holds the lock of its ``--out`` folder while it runs, so a second sweep on the same folder stops
with a one-line error.  Rows that define the same run (e.g. the default row every table
starts with) are trained once.  At the end it writes ``ablate.md`` (mean ± std of held-out accuracy,
parameters, images/s, the paper's number) and ``layerwise-<table>.png`` (each row's layer-wise
compression and sparsity, :func:`crate_transformer.analysis.measure`, side by side).

The laptop recipe (:data:`RECIPE`) is ``crate_mnist`` on the built-in 4,000 MNIST training digits (held-out
accuracy on the fixed 1,000 test digits) with its training recipe (AdamW, lr 2e-3, weight decay 0.05, label
smoothing 0.1) shortened to 2 epochs of batch 64 (124 steps) with a half-epoch warm-up and one evaluation at
the end, so a table of four rows × three seeds takes minutes on an idle CPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config_utils import POSITIVE
from ..errors import OptionError
from ..io import DamagedFileError, make_folder, read_side_file, write_json

__all__ = ["Row", "Table", "TABLES", "RECIPE", "resolve_tables", "plan", "run_ablation", "write_report"]

RECIPE: dict[str, Any] = {
    "model": "crate_mnist",
    "data": "mnist",
    "epochs": 2,
    "batch_size": 64,
    "lr": 2e-3,  # crate_mnist's recipe, which the ablation tables were measured with (not today's train default)
    "weight_decay": 0.05,
    "label_smoothing": 0.1,
    "warmup_epochs": 0.5,
    "eval_every": 0,
    "measure_every": 0,
    "progress": False,
}
"""The base training options of every run (the classification task's defaults otherwise); flags override them."""

RESULTS_FILE = "results.jsonl"
SWEEPS_FILE = "sweeps.jsonl"  # one line per training invocation: its wall time and runs
REPORT_FILE = "ablate.md"


@dataclass(frozen=True)
class Row:
    """One row of an ablation table.

    ``model_args`` are ModelConfig overrides, ``train_args`` TrainConfig overrides, ``scale`` multiplies
    recipe values (Table 11's ×2 / ×0.1 learning rate and weight decay, relative to whatever recipe is
    used); ``paper`` is the paper's ImageNet-1K top-1 (%) for this row, None when it reports none.
    """

    name: str
    paper: float | None
    model_args: Mapping[str, Any] = field(default_factory=dict)
    train_args: Mapping[str, Any] = field(default_factory=dict)
    scale: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Table:
    """An ablation table of the paper: its rows (the first is the reference) and what the paper measured."""

    name: str
    title: str
    paper_setup: str
    rows: tuple[Row, ...]


_DEFAULT = Row("CRATE (default: MSSA + ISTA, ReLU)", 70.8)

TABLES: dict[str, Table] = {
    "17": Table(
        "17",
        "Table 17: CRATE hybrids (attention × nonlinearity)",
        "JMLR Table 17, p.101: S/8, ImageNet-21K pre-training, ImageNet-1K top-1 after fine-tuning",
        (
            Row("CRATE (MSSA + ISTA)", 74.2),
            Row("CRATE-MLP (MSSA + MLP)", 79.2, {"mlp": "mlp"}),
            Row("CRATE-MHSA (MHSA + ISTA)", 77.8, {"attention": "mhsa"}),
            Row("ViT (MHSA + MLP)", 80.9, {"arch": "vit"}),
            Row("CRATE-α (MSSA + overcomplete ISTA, residual)", None, {"mlp": "odl"}),
        ),
    ),
    "12": Table(
        "12",
        "Table 12: MSSA and ISTA forms",
        "JMLR Table 12, p.99: CRATE-B, ImageNet-1K top-1",
        (
            _DEFAULT,
            Row("MSSA without W: output β[U_1…U_K] (eqs. 35-36)", 63.3, {"tied_output": True}),
            Row("ISTA → MM step (eq. 123)", 68.6, {"ista_mode": "mm"}),
        ),
    ),
    "13": Table(
        "13",
        "Table 13: ISTA activation",
        "JMLR Table 13, p.100: CRATE-B, ImageNet-1K top-1",
        (_DEFAULT, Row("soft threshold S_ηλ instead of ReLU", 67.6, {"ista_mode": "soft"})),
    ),
    "15": Table(
        "15",
        "Table 15: without the ISTA block",
        "JMLR Table 15, p.101: CRATE-B, ImageNet-1K top-1",
        (_DEFAULT, Row("no ISTA block (MSSA only)", 61.9, {"ista_mode": "none"})),
    ),
    "11": Table(
        "11",
        "Table 11: η, λ, weight decay and learning rate",
        "JMLR Table 11, p.99: CRATE-B, 150 epochs, ImageNet-1K top-1 (default wd 0.5, lr 2.4e-4, η = λ = 0.1)",
        (
            _DEFAULT,
            Row("η = 0.02", 70.7, {"eta": 0.02}),
            Row("η = 0.5", 66.7, {"eta": 0.5}),
            Row("λ = 0.02", 70.8, {"lambd": 0.02}),
            Row("λ = 0.5", 70.5, {"lambd": 0.5}),
            Row("weight decay ×2 (paper 1.0)", 70.3, scale={"weight_decay": 2.0}),
            Row("weight decay ×0.1 (paper 0.05)", 70.2, scale={"weight_decay": 0.1}),
            Row("learning rate ×2 (paper 4.8e-4)", 70.2, scale={"lr": 2.0}),
            Row("learning rate ×0.5 (paper 1.2e-4)", 70.3, scale={"lr": 0.5}),
        ),
    ),
    "11e": Table(
        "11e",
        "Table 11 (epochs): training length",
        "JMLR Table 11, p.99: CRATE-B, 90 / 150 / 300 epochs, ImageNet-1K top-1",
        (
            _DEFAULT,
            Row("epochs ×0.6 (paper 90)", 69.5, scale={"epochs": 0.6}),
            Row("epochs ×2 (paper 300)", 70.9, scale={"epochs": 2.0}),
        ),
    ),
}
"""The paper's ablation tables by number (``"11e"``: Table 11's training-length rows, which cost 2.6 runs)."""


def resolve_tables(names: Sequence[str]) -> list[Table]:
    """``["17", "12"]`` (or ``["all"]``) → the tables, or a one-line ValueError naming the valid names."""
    names = [str(n).lower().removeprefix("table") for n in names]
    if not names:
        raise ValueError(f"name at least one table: {', '.join(TABLES)} or all")
    if "all" in names:
        return list(TABLES.values())
    bad = [n for n in names if n not in TABLES]
    if bad:
        raise ValueError(f"unknown ablation table(s) {bad}; choose from {', '.join(TABLES)} or all")
    return [TABLES[n] for n in dict.fromkeys(names)]


# --------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class Run:
    """One (row, seed) training run: its TrainConfig options and where it lives."""

    row: str
    key: str  # hash of the resolved options (without the seed): rows with equal keys share runs
    seed: int
    options: Mapping[str, Any]
    run_dir: Path


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower().replace("α", "alpha").replace("η", "eta").replace("λ", "lambda"))[
        :32
    ].strip("-")


def _resolve(row: Row, base: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainConfig options of ``row`` on top of ``base`` (recipe + user overrides), validated."""
    from ..models.registry import model_config
    from . import TrainConfig

    opts = dict(base)
    opts["model_args"] = {**dict(base.get("model_args") or {}), **row.model_args}
    opts.update(row.train_args)
    defaults = TrainConfig().flat()
    for name, factor in row.scale.items():
        value = opts.get(name, defaults[name]) * factor
        opts[name] = max(1, round(value)) if name == "epochs" else value
    cfg = TrainConfig.from_dict(opts)  # one-line errors for a bad option or model value, before any run
    if cfg.model is not None:
        model_config(cfg.model, **cfg.model_args)
    return opts


# options that do not change what is trained: a sweep re-run with other values reuses the finished runs
_NOT_IDENTITY = frozenset(
    {"threads", "progress", "log_every", "eval_batch_size", "tensorboard", "logger", "workers", "seed", "out"}
)


def _key(opts: Mapping[str, Any]) -> str:
    """A short hash of what a run trains (its options without seed, run dir, threads, logging): equal key, same run."""
    what = {k: v for k, v in opts.items() if k not in _NOT_IDENTITY}
    return hashlib.sha1(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:8]


def plan(tables: Sequence[Table], seeds: int, out: str | Path, base: Mapping[str, Any]) -> list[Run]:
    """Every run the tables need, in table order, with shared rows (equal options) listed once."""
    if seeds < 1:
        raise OptionError(f"seeds{POSITIVE.requirement(seeds)}", option="seeds")
    runs: dict[tuple[str, int], Run] = {}
    for table in tables:
        for row in table.rows:
            opts = _resolve(row, base)
            key = _key(opts)
            for seed in range(seeds):
                if (key, seed) not in runs:
                    run_dir = Path(out) / "runs" / f"{_slug(row.name)}-{key}-s{seed}"
                    runs[key, seed] = Run(row.name, key, seed, {**opts, "seed": seed, "out": str(run_dir)}, run_dir)
    return list(runs.values())


def _row_keys(tables: Sequence[Table], base: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """``{table: {row name: key}}``."""
    return {t.name: {row.name: _key(_resolve(row, base)) for row in t.rows} for t in tables}


def _read_jsonl(path: Path) -> list[dict]:
    """The records of a sweep's JSON-lines file (``results.jsonl``, ``sweeps.jsonl``); [] when absent."""
    fix = "correct or delete the damaged line (a deleted run is trained again), or delete the file to start over"
    return read_side_file(path, fix, form="jsonl", missing=[])


def read_results(out: str | Path) -> dict[tuple[str, int], dict]:
    """The finished runs of a sweep: ``{(key, seed): summary}`` from ``results.jsonl`` (last line wins).

    The key is recomputed from the options stored with each run, so results stay found when the key's
    definition changes (e.g. an option declared not to change what is trained).
    """
    path, results = Path(out) / RESULTS_FILE, {}
    for number, r in enumerate(_read_jsonl(path), start=1):
        if "seed" in r and ("options" in r or "key" in r):
            _check_result(r, f"{path}:{number}")
            results[_key(r["options"]) if "options" in r else r["key"], r["seed"]] = r
    return results


_RESULT_FIELDS = {  # field: (accepted types, what it must be)
    "seed": ((int,), "an integer"),
    "acc": ((int, float), "a number"),
    "params": ((int,), "an integer"),
    "images_per_s": ((int, float), "a number"),
    "seconds": ((int, float), "a number"),
    "run_dir": ((str,), "a path"),
    "options": ((dict,), "a mapping of options"),
    "key": ((str,), "a string"),
}


def _check_result(r: dict, where: str) -> None:
    """One ``results.jsonl`` record: every field the report reads is present and of its type."""
    for name, (types, what) in _RESULT_FIELDS.items():
        if name not in r:
            if name in ("options", "key"):
                continue  # one of the two identifies the run
            problem = "is missing"
        elif isinstance(r[name], bool) or not isinstance(r[name], types):
            problem = f"is {json.dumps(r[name])[:40]}, not {what}"
        else:
            continue
        raise ValueError(f"{where}: {name!r} {problem}; correct or delete the line (a deleted run is trained again)")


def _images_per_s(run_dir: Path) -> float:
    """Median training throughput (images/s) over the run's logged windows, the first (warm-up) dropped."""
    from . import read_metrics

    rates = [r["samples_per_s"] for r in read_metrics(run_dir / "metrics.jsonl") if r.get("split") == "train"]
    rates = [r for r in (rates[1:] if len(rates) > 1 else rates) if isinstance(r, (int, float))]
    return float(statistics.median(rates)) if rates else float("nan")


def _train_one(run: Run, log_path: Path) -> dict:
    """Train (or continue) one run with the engine; stdout/stderr go to ``log_path``."""
    from . import TrainConfig, train
    from .rundir import CHECKPOINT, RunDir

    if (run.run_dir / CHECKPOINT).is_file():
        return _logged(log_path, lambda: train(resume=run.run_dir, expect_task="classification"))
    if run.run_dir.exists():  # killed before its first checkpoint: nothing to keep, unless it is still running
        RunDir.reset(run.run_dir)
    return _logged(log_path, lambda: train(TrainConfig.from_dict(dict(run.options)), expect_task="classification"))


def _logged(log_path: Path, fn: Callable[[], dict]) -> dict:
    """``fn()`` with its stdout and stderr appended to ``log_path``."""
    make_folder(log_path.parent, "log folder")
    with open(log_path, "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        return fn()


def run_ablation(
    tables: Sequence[str],
    *,
    out: str | Path = "runs/ablate",
    seeds: int = 3,
    overrides: Mapping[str, Any] | None = None,
    report_only: bool = False,
    measure_images: int = 256,
    progress: bool = True,
    command: str | None = None,
    trainer: Callable[[Run, Path], dict] | None = None,
) -> dict[str, Path]:
    """Train every (row, seed) of ``tables`` not yet in ``out/results.jsonl``, then write the report.

    ``overrides`` are TrainConfig options over :data:`RECIPE` (e.g. ``{"epochs": 5, "data": "digits",
    "model_args": {"dim": 64}}``).  With ``report_only`` nothing is trained: the report is refreshed from
    the stored results (rows without results are marked as missing).  ``trainer`` replaces the call
    of the engine (tests).  Returns the paths written (``report``, ``figure:<table>``).
    """
    from .rundir import FolderLock

    resolved = resolve_tables(tables)
    out = Path(out)
    base = {**RECIPE, **dict(overrides or {})}
    runs = plan(resolved, seeds, out, base)
    with FolderLock(out, "sweep folder"):  # one sweep per folder: a second would retrain and delete live runs
        return _sweep(resolved, runs, out, seeds, base, report_only, measure_images, progress, command, trainer)


def _sweep(
    resolved: list[Table],
    runs: list[Run],
    out: Path,
    seeds: int,
    base: dict[str, Any],
    report_only: bool,
    measure_images: int,
    progress: bool,
    command: str | None,
    trainer: Callable[[Run, Path], dict] | None,
) -> dict[str, Path]:
    """The body of :func:`run_ablation`, run while holding the sweep folder's lock."""
    from ..progress import progress_bar

    done = read_results(out)
    todo = [r for r in runs if (r.key, r.seed) not in done]
    t0 = time.time()
    if todo and not report_only:
        bar = progress_bar(total=len(runs), initial=len(runs) - len(todo), desc="ablate", unit="run", enabled=progress)
        for run in todo:
            bar.set_postfix_str(f"{run.row} seed {run.seed}")
            summary = (trainer or _train_one)(run, out / "logs" / f"{run.run_dir.name}.log")
            if summary.get("interrupted"):
                bar.close()
                raise KeyboardInterrupt(f"interrupted during {run.run_dir} (checkpoint saved)")
            record = {
                "key": run.key,
                "seed": run.seed,
                "row": run.row,
                "acc": float(summary["test_acc"]),
                "params": int(summary["params"]),
                "images_per_s": _images_per_s(run.run_dir),
                "seconds": float(summary.get("seconds", float("nan"))),
                "run_dir": str(run.run_dir),
                "options": {k: v for k, v in run.options.items() if k not in ("seed", "out")},
            }
            with open(out / RESULTS_FILE, "a") as f:
                f.write(json.dumps(record, default=str) + "\n")
            bar.update(1)
        bar.close()
        with open(out / SWEEPS_FILE, "a") as f:
            sweep = {"command": command, "tables": [t.name for t in resolved], "runs": len(todo)}
            f.write(json.dumps({**sweep, "wall_seconds": time.time() - t0, "finished": time.time()}) + "\n")
    return write_report(resolved, out, seeds=seeds, base=base, measure_images=measure_images, command=command)


# --------------------------------------------------------------------------- report
def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1; 0 for one value)."""
    mean = math.fsum(values) / len(values)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, std


def row_stats(results: Mapping[tuple[str, int], dict], key: str, seeds: int) -> dict | None:
    """Accuracy mean ± std (%) over the finished seeds of one row, its parameters and images/s."""
    rs = [results[key, s] for s in range(seeds) if (key, s) in results]
    if not rs:
        return None
    mean, std = _mean_std([100 * r["acc"] for r in rs])
    ips = [r["images_per_s"] for r in rs if math.isfinite(r["images_per_s"])]
    return {
        "mean": mean,
        "std": std,
        "n": len(rs),
        "params": rs[0]["params"],
        "images_per_s": statistics.median(ips) if ips else float("nan"),
        "seconds": math.fsum(r["seconds"] for r in rs),
        "run_dir": rs[0]["run_dir"],
    }


def _fmt_delta(x: float | None, ref: float | None) -> str:
    return "" if x is None or ref is None else f"{x - ref:+.1f}"


def _layerwise(run_dir: Path, images: int) -> list[dict] | None:
    """The layer-wise measurement records of a run's final model on held-out images (cached in the run dir)."""
    cache = run_dir / "layerwise.json"
    try:
        d = read_side_file(cache, "it is rebuilt", missing={})
    except DamagedFileError as e:  # a cache: measured again
        warnings.warn(str(e), stacklevel=2)
        d = {}
    if d.get("images") == images and isinstance(d.get("layers"), list):
        return d["layers"]
    if not (run_dir / "model").is_dir():
        return None
    from ..analysis import measure
    from ..analysis._common import dataset_images01, normalize_images
    from ..data import load_dataset, match_channels, resolve_normalization, resolve_source
    from ..loading.pipeline import load_model

    model = load_model(run_dir)
    c = model.config
    data = c.data.source if c.data and c.data.source else "mnist"
    ds = load_dataset(data, "test", image_size=c.image_size if resolve_source(data)[0] == "folder" else None)
    x = dataset_images01(ds, range(min(images, len(ds))))
    x = normalize_images(match_channels(x, c.in_chans), resolve_normalization(model, ds))
    if x.shape[-1] != c.image_size:
        import torch.nn.functional as F

        x = F.interpolate(x, size=(c.image_size, c.image_size), mode="bilinear", align_corners=False)
    table = measure(model, x, normalize=None, progress=False)
    records = table.to_records()
    write_json(cache, {"images": images, "meta": table.meta, "layers": records}, indent=None)
    return records


def write_report(
    tables: Sequence[Table],
    out: str | Path,
    *,
    seeds: int,
    base: Mapping[str, Any],
    measure_images: int = 256,
    command: str | None = None,
) -> dict[str, Path]:
    """Write ``ablate.md`` and one ``layerwise-<table>.png`` per table from ``results.jsonl``."""
    out = Path(out)
    results = read_results(out)
    keys = _row_keys(tables, base)
    written: dict[str, Path] = {}
    lines = _report_header(results, out, seeds=seeds, base=base, command=command)
    for table in tables:
        stats = {row.name: row_stats(results, keys[table.name][row.name], seeds) for row in table.rows}
        lines += _table_lines(table, stats)
        png = _layerwise_figure(table, stats, out, measure_images)
        if png is not None:
            written[f"figure:{table.name}"] = png
            lines += ["", f"Layer-wise compression and sparsity (seed 0): `{png.name}`"]
        lines.append("")
    report = out / REPORT_FILE
    report.write_text("\n".join(lines))
    written["report"] = report
    return written


def _report_header(
    results: Mapping[tuple[str, int], dict], out: Path, *, seeds: int, base: Mapping[str, Any], command: str | None
) -> list[str]:
    """Title, command, recipe and the time the stored runs took."""
    recipe = ", ".join(f"{k}={v}" for k, v in base.items() if k not in ("progress",))
    total = math.fsum(r["seconds"] for r in results.values() if math.isfinite(r.get("seconds", float("nan"))))
    wall = math.fsum(s.get("wall_seconds", 0.0) for s in _read_jsonl(out / SWEEPS_FILE))
    lines = ["# Ablations at laptop scale", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    return lines + [
        f"Recipe: {recipe}; seeds 0..{seeds - 1}. Accuracy: held-out test split, mean ± sample std (ddof 1) over "
        "seeds. images/s: median training throughput. Paper: ImageNet-1K top-1 of the same row (JMLR).",
        "",
        (f"Wall time of the sweeps that trained these runs: {wall / 60:.1f} min; " if wall else "")
        + f"training time of the stored runs (sum over runs): {total / 60:.1f} min.",
        "",
    ]


def _table_lines(table: Table, stats: Mapping[str, dict[str, Any] | None]) -> list[str]:
    """One table's Markdown: accuracy over seeds, Δ to the first row, parameters, throughput, the paper's numbers."""
    ref, ref_paper = stats[table.rows[0].name], table.rows[0].paper
    lines = [f"## {table.title}", "", f"Paper: {table.paper_setup}.", ""]
    lines += ["| row | accuracy % (mean ± std, n) | Δ | params | images/s | paper % | paper Δ |"]
    lines += ["|---|---|---|---|---|---|---|"]
    for row in table.rows:
        s = stats[row.name]
        paper = "—" if row.paper is None else f"{row.paper:.1f}"
        if s is None:
            lines.append(f"| {row.name} | (not run) |  |  |  | {paper} | {_fmt_delta(row.paper, ref_paper)} |")
            continue
        delta = "" if ref is None or row is table.rows[0] else _fmt_delta(s["mean"], ref["mean"])
        pdelta = "" if row is table.rows[0] else _fmt_delta(row.paper, ref_paper)
        lines.append(
            f"| {row.name} | {s['mean']:.2f} ± {s['std']:.2f} (n={s['n']}) | {delta} | {s['params']:,} | "
            f"{s['images_per_s']:,.0f} | {paper} | {pdelta} |"
        )
    return lines


def _layerwise_figure(
    table: Table, stats: Mapping[str, dict[str, Any] | None], out: Path, measure_images: int
) -> Path | None:
    """``layerwise-<table>.png`` of the seed-0 models of the rows that were run (None when none was)."""
    from ..analysis.plots import plot_layerwise

    layerwise = {}
    for row in table.rows:
        s = stats[row.name]
        recs = _layerwise(Path(s["run_dir"]), measure_images) if s else None
        if recs:
            layerwise[row.name] = recs
    if not layerwise:
        return None
    png = out / f"layerwise-{table.name}.png"
    plot_layerwise(
        layerwise, png, metrics=("rc_in", "nonzero"), band=False,
        title=f"{table.title} — seed-0 models, {measure_images} held-out images",
    )  # fmt: skip
    return png
