"""``crate ablate TABLE ...``: the paper's ablation tables at laptop scale (:mod:`crate_transformer.train.ablate`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ..config import Config
from ..config_utils import NON_NEGATIVE, POSITIVE, option
from ..train.ablate import RECIPE
from .messages import Flags, command_flags, flag
from .options import add_command_options, parse_model_args

FLAGS = ("epochs", "data", "model", "threads")  # the training options ablate takes as flags; the rest: --train-args


@dataclass
class AblateOptions(Config):
    """The options of ``crate ablate`` (the tables are its positional arguments)."""

    seeds: int = option(3, "seeds per row, 0..N-1", range=POSITIVE, basic=True)
    epochs: int | None = option(None, "epochs per run", shown=RECIPE["epochs"], range=POSITIVE, basic=True)
    data: str | None = option(None, "dataset name or folder", shown=RECIPE["data"], basic=True)
    model: str | None = option(None, "base registered model", shown=RECIPE["model"], basic=True)
    model_args: list[str] = option([], "base model overrides, e.g. dim=64 depth=4", metavar="KEY=VALUE", basic=True)
    train_args: list[str] = option(
        [], "any other `crate train` option for every run, e.g. batch_size=64 max_steps=100 device=cuda",
        metavar="KEY=VALUE", basic=True,
    )  # fmt: skip
    threads: int | None = option(None, "torch CPU threads per run", shown="auto", range=NON_NEGATIVE, basic=True)
    out: str = option("runs/ablate", "sweep folder", basic=True)
    measure_images: int = option(256, "held-out images for the layer-wise figure", range=POSITIVE, basic=True)
    report_only: bool = option(False, "only rewrite the report from stored results", basic=True)
    progress: bool = option(True, "show the progress bar", basic=True)


def configure_ablate(parser: argparse.ArgumentParser) -> None:
    from ..train.ablate import TABLES

    parser.description = (
        "Train every row of the paper's ablation tables (JMLR Tables 11, 12, 13, 15, 17) for several seeds with "
        "the `crate train` engine, then write OUT/ablate.md (held-out accuracy mean ± std, parameters, images/s, "
        "the paper's ImageNet number) and OUT/layerwise-<table>.png. Finished runs (OUT/results.jsonl) are not "
        "trained again; a killed run continues from its checkpoint.\n\ntables: "
        + "; ".join(f"{k}: {t.title.split(': ', 1)[1]}" for k, t in TABLES.items())
    )
    parser.add_argument("tables", nargs="+", metavar="TABLE", help=f"{' | '.join(TABLES)} | all")
    add_command_options(parser, AblateOptions)
    parser.set_defaults(_own_flags=command_flags(parser))  # run_ablate's table of how library messages name options


def _train_args(items: list[str]) -> dict:
    import yaml

    from ..io import load_yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--train-args expects KEY=VALUE pairs (e.g. batch_size=64), got {item!r}")
        try:
            out[key.strip().replace("-", "_")] = load_yaml(value, f"--train-args {key.strip()}")
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            at = f" at column {len(key) + 2 + mark.column}" if mark is not None else ""
            problem = getattr(e, "problem", None) or str(e).splitlines()[0]
            raise ValueError(
                f"--train-args {item!r}: {value!r} is not a valid value ({problem}{at}); complete it or quote it, "
                "e.g. batch_size=64 or betas=[0.9,0.95]"
            ) from None
    return out


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this sweep (recorded in the report)."""
    parts = ["crate", "ablate", *args.tables, "--seeds", str(args.seeds)]
    for name in FLAGS:
        if getattr(args, name) is not None:
            parts += [flag(name), str(getattr(args, name))]
    for name in ("model_args", "train_args"):
        if getattr(args, name):
            parts += [flag(name), *getattr(args, name)]
    parts += ["--out", args.out]
    return " ".join(shlex.quote(p) for p in parts)


def run_ablate(args: argparse.Namespace) -> int:
    overrides = _train_args(args.train_args)
    args._flags = _flags(args._own_flags.actions, set(overrides))  # main words the library's messages with them
    for name in FLAGS:
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.model_args:
        overrides["model_args"] = parse_model_args(args.model_args)
    try:
        written = _run(args, overrides)
    except KeyboardInterrupt as e:
        print(f"crate ablate: {e or 'interrupted'}; run the same command again to resume", file=sys.stderr)
        return 130
    print("\n".join(f"{k}: {v}" for k, v in written.items()))
    return 0


def _flags(actions: Mapping[str, argparse.Action], train_args: Collection[str]) -> Flags:
    """How ``crate ablate`` takes options: its own flags (``--epochs``, ``--model-args``, ``--seeds``, ...), but a
    training option given in ``--train-args``, or without a flag of ablate's, as its ``--train-args`` entry
    (``--train-args batch_size=64``)."""
    from ..train.config import TrainConfig

    own = {name: a for name, a in actions.items() if name not in train_args and name != "train_args"}
    return Flags(own, "--train-args", frozenset(TrainConfig().flat()) - set(own))


def _run(args: argparse.Namespace, overrides: dict) -> dict:
    from ..train.ablate import run_ablation

    return run_ablation(
        args.tables,
        out=args.out,
        seeds=args.seeds,
        overrides=overrides,
        report_only=args.report_only,
        measure_images=args.measure_images,
        progress=args.progress,
        command=_command(args),
    )
