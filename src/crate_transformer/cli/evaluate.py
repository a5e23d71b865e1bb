"""``crate eval``: top-1/top-5, per-class accuracy and the confusion matrix of a checkpoint, or its frozen features'
k-NN and linear-probe accuracy."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from ..config_utils import POSITIVE, option
from ..models.base import POOLS
from ..models.contract import LANGUAGE_MODEL, MASKED_AUTOENCODER
from ..train.config import DataOptions, SystemOptions
from .options import DATA, REPORT, SYSTEM, add_command_options, apply_threads, like, parse_model_args
from .reports import report_dir, report_home

EVAL_FILES = ("eval.json", "confusion.png", "knn.png")  # what crate eval writes (--overwrite removes them)


FROZEN = "frozen-feature evaluation (any encoder: classifier, MAE, DINO); replaces the classifier's top-1"
OUT_HELP = "output folder; must be new or empty unless `overwrite`"
OVERWRITE_HELP = "replace the earlier report of this command in a non-empty `out` (its files only; others stay)"


@dataclass
class EvalOptions(Config):
    """The options of ``crate eval`` (the checkpoint is its positional argument)."""

    data: str | None = option(None, "dataset name or folder", shown="the one it was trained on", basic=True, group=DATA)
    split: str = option("test", "split", choices=("train", "val", "test"), basic=True, group=DATA)
    model: str | None = option(None, "registered model name for an official .pth (e.g. crate_small)", basic=True)
    model_args: list[str] = option(
        [], "architecture overrides for an official .pth, e.g. `model_args` num_classes=10 image_size=32",
        metavar="KEY=VALUE", basic=True,
    )  # fmt: skip
    batch_size: int = option(500, "evaluation batch size", range=POSITIVE, basic=True)
    seed: int = option(0, "seed of the val split, as in training", group=SYSTEM)
    device: str = like(SystemOptions, "device", basic=True, group=SYSTEM)
    threads: int = like(SystemOptions, "threads", basic=True, group=SYSTEM)
    val_fraction: float = like(DataOptions, "val_fraction", help="as in training, for `split` val", group=DATA)
    on_bad_image: str = like(DataOptions, "on_bad_image", group=DATA)
    data_mode: str = like(DataOptions, "data_mode", group=DATA)
    workers: int = like(DataOptions, "workers", group=DATA)
    image_column: str = like(DataOptions, "image_column", group=DATA)
    label_column: str = like(DataOptions, "label_column", group=DATA)
    out: str | None = option(
        None, OUT_HELP, basic=True,
        shown="eval-<data>-<split> inside the checkpoint's folder, or eval-<data>-<split>-2, -3, ... when that one is "
        "in use", group=REPORT
    )  # fmt: skip
    overwrite: bool = option(False, OVERWRITE_HELP, group=REPORT)
    knn: bool = option(
        False, "weighted k-NN (k = 10, 20, 100, 200; T = 0.07) on train-split features", group=FROZEN, basic=True
    )
    linear_probe: bool = option(False, "a linear probe on train-split features", group=FROZEN, basic=True)
    probe: str = option(
        "logistic",
        "`linear_probe` protocol: logistic regression (scikit-learn; the paper) | lars (MAE main_linprobe.py: "
        "BatchNorm without affine + linear head, LARS, 90 epochs, warm-up + cosine) | sgd (the same with SGD + "
        "momentum, DINO-style)",
        choices=("logistic", "lars", "sgd"),
        group=FROZEN,
    )
    pool: str | None = option(
        None,
        "feature: class token | avg of the patch tokens | mean of all tokens",
        choices=POOLS,
        shown="the model's pool, e.g. avg for a digits DINO run",
        group=FROZEN,
    )


def configure_eval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", help="a run dir, save_pretrained dir, hf-hub:ORG/NAME, training-state .pt or official .pth"
    )
    add_command_options(parser, EvalOptions)


def _eval_model(args: argparse.Namespace) -> object:
    """The checkpoint's image model, refused with a one-line error when ``crate eval`` cannot score it."""
    from ..loading.pipeline import load_model

    model = load_model(args.checkpoint, name=args.model, **parse_model_args(args.model_args, args.model))
    if model.kind == LANGUAGE_MODEL:
        raise ValueError(f"{args.checkpoint} is a language model; see its held-out perplexity in metrics.jsonl")
    if model.kind == MASKED_AUTOENCODER and not (args.knn or args.linear_probe):
        raise ValueError(
            f"{args.checkpoint} is a CRATE-MAE (no classifier head); evaluate its encoder with --linear-probe or "
            f"--knn, or fine-tune it first: crate finetune --from {args.checkpoint} --data DATA"
        )
    return model


def _eval_split(args: argparse.Namespace, model: object, data: str, split: str, stats: object) -> object:
    from ..data import open_source
    from .reports import dataset_columns

    return open_source(
        data,
        split,
        image_size=model.config.image_size,
        val_fraction=args.val_fraction,
        seed=args.seed,
        on_bad_image=args.on_bad_image,
        mode=args.data_mode,
        num_workers=args.workers,
        stats=stats,
        **dataset_columns(args, model, data),
    )


def run_eval(args: argparse.Namespace) -> int:
    """``crate eval``: top-1/top-5, per-class accuracy, ``confusion.png`` and ``eval.json``."""
    from ..data import resolve_normalization
    from ..train import evaluate, resolve_device

    if args.probe != "logistic" and not args.linear_probe:
        raise ValueError(f"--probe {args.probe} chooses the protocol of --linear-probe; add --linear-probe")
    apply_threads(args)
    device = resolve_device(args.device)
    model = _eval_model(args)
    c = model.config
    data = args.data or (c.data.source if c.data else None)
    if not data:
        raise ValueError("this checkpoint does not record its training data; pass --data (e.g. --data mnist)")
    src = Path(args.checkpoint)
    default = report_home(args.checkpoint) / f"eval-{Path(data).name}-{args.split}"
    out = report_dir(args.out, default, args.overwrite, "eval", EVAL_FILES)  # before the evaluation: costs nothing
    # the model's own statistics: a streamed source need not estimate them
    ds = _eval_split(args, model, data, args.split, resolve_normalization(model))
    norm = resolve_normalization(model, ds)
    if args.knn or args.linear_probe:
        train_ds = ds if args.split == "train" else _eval_split(args, model, data, "train", norm)
        return _frozen_eval(args, model.to(device), train_ds, ds, norm, out, str(src), data)
    r = evaluate(
        model.to(device),
        ds,
        mean=norm[0],
        std=norm[1],
        image_size=c.image_size,
        channels=c.in_chans,
        batch_size=args.batch_size,
        device=device,
    )
    _write_eval(args, r, ds.name, data, str(src), out, norm)
    return 0


def _write_eval(args: argparse.Namespace, r: object, name: str, data: str, src: str, out: Path, norm: tuple) -> None:
    """``confusion.png``, ``eval.json`` and the printed summary of a classifier evaluation."""
    from ..io import atomic_write
    from ..train import plot_confusion_matrix

    png = plot_confusion_matrix(
        r.confusion,
        r.classes,
        out / "confusion.png",
        title=f"{Path(data).name} {args.split}: top-1 {100 * r.top1:.2f}%",
    )
    report = {"checkpoint": src, "data": data, "split": args.split, "normalization": norm, **r.to_dict()}
    atomic_write(out / "eval.json", lambda tmp: Path(tmp).write_text(json.dumps(report, indent=1) + "\n"))
    print(f"{name} {args.split}: {r.num_samples} images, top-1 {100 * r.top1:.2f}%{r.top_k_text()}, loss {r.loss:.4f}")
    width = max(len(n) for n in r.classes)
    for cls, acc, row in zip(r.classes, r.per_class, r.confusion):
        print(f"  {cls:<{width}}  {100 * acc:6.2f}%  (n={sum(row)})")
    print(f"confusion matrix: {png}\nreport: {out / 'eval.json'}")


def _frozen_eval(args: argparse.Namespace, model, train_ds, test_ds, norm, out: Path, src: str, data: str) -> int:
    """``crate eval --knn / --linear-probe``: frozen features of the train split classify the evaluated split."""
    from ..analysis.probe import (
        KNN_KS,
        default_probe_pool,
        extract_features,
        fit_probe,
        knn_sweep,
        pool_words,
        usable_ks,
    )
    from ..io import atomic_write
    from ..train.evaluation import plot_knn

    args.pool = args.pool or default_probe_pool(model, src)  # the features of the run's own summary probe
    kw = dict(pool=args.pool, batch_size=args.batch_size, mean=norm[0], std=norm[1])
    train_x, train_y = extract_features(model, train_ds, **kw)
    test_x, test_y = extract_features(model, test_ds, **kw)
    report: dict = {"checkpoint": src, "data": data, "split": args.split, "pool": args.pool}
    report["features"] = words = pool_words(args.pool)
    report.update(num_train=len(train_y), num_test=len(test_y), dim=train_x.shape[1])
    lines = [
        f"{test_ds.name} {args.split}: {len(test_y)} images, features: {words} ({train_x.shape[1]}-d) "
        f"of {len(train_y)} train images"
    ]
    if args.knn:
        ks, above = usable_ks(KNN_KS, len(train_y))
        if not ks:
            raise ValueError(
                f"--knn needs at least k={KNN_KS[0]} train images and {train_ds.name} has {len(train_y)}; "
                "evaluate with more training data or use --linear-probe"
            )
        accs = knn_sweep(train_x, train_y, test_x, test_y, ks=ks, num_classes=len(train_ds.classes))
        report["knn"] = {str(k): a for k, a in accs.items()}
        report["knn_temperature"] = 0.07
        skipped = f" (k={', '.join(map(str, above))} not run: more than the {len(train_y)} train images)"
        shown = ", ".join(f"k={k} {100 * a:.2f}%" for k, a in accs.items())
        lines.append(f"k-NN (T=0.07) on the {words}: {shown}" + (skipped if above else ""))
        if above:
            report["knn_not_run"] = above
        plot_knn(accs, out / "knn.png", title=f"{Path(data).name} {args.split}: weighted k-NN on the {words}")
    if args.linear_probe:
        probe = fit_probe(train_x, train_y, test_x, test_y, args.probe)  # the one probe of MAE's summary too
        report["linear_probe"] = probe.to_dict()
        acc = f"{100 * probe.acc:.2f}% (train {100 * probe.train_acc:.2f}%)"
        lines.append(f"linear probe ({args.probe}) on the {words}: {acc}")
    atomic_write(out / "eval.json", lambda tmp: Path(tmp).write_text(json.dumps(report, indent=1) + "\n"))
    print("\n".join(lines) + f"\nreport: {out / 'eval.json'}")
    return 0
