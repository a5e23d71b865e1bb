"""``crate features RUN [--layer L] [--top-k K] [--out DIR]``: the units of every layer as features.

Per unit (an atom of CRATE's ISTA dictionary, eq. (44), or a hidden unit of a baseline's MLP): activation
frequency, mean and max, its top-activating patches or tokens and the purity score; writes ``features.json``
and the self-contained dashboard ``features.html`` and prints the per-layer table.
"""

from __future__ import annotations

import argparse
import datetime
from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from ..config_utils import NON_NEGATIVE, POSITIVE, option
from ..train.config import SystemOptions
from .evaluate import OUT_HELP, OVERWRITE_HELP
from .options import REPORT, SYSTEM, add_command_options, apply_threads, like, refuse_given
from .reports import dataset_columns, held_out_corpus, layer_number, report_dir, report_home

OWNED = ("features.json", "features.html")  # what --overwrite replaces in a named --out


@dataclass
class FeaturesOptions(Config):
    """The options of ``crate features`` (the run is its positional argument)."""

    data: str | None = option(
        None,
        "image models: a dataset whose test split is measured, if not the one the model was trained on; language "
        "models: a text corpus whose held-out tail is measured, if not the run's",
        metavar="NAME|DIR",
        basic=True,
    )
    layer: int | None = option(None, "only this layer (1-based; -1 = last)", shown="all layers", basic=True)
    top_k: int = option(16, "top-activating inputs kept (and scored) per unit", range=POSITIVE, basic=True)
    num_images: int = option(1000, "image models: images measured (test split)", range=POSITIVE, basic=True)
    num_blocks: int = option(64, "language models: held-out token blocks measured", range=POSITIVE, basic=True)
    context: int = option(12, "language models: tokens shown either side", range=NON_NEGATIVE)
    batch_size: int = option(64, "batch size of the measurement", range=POSITIVE)
    effects: bool = option(
        False,
        "also the causal effect of every unit: the change of the loss and of the predictions when it is ablated "
        "(zeroed), with bootstrap intervals over the examples, beside its purity",
        basic=True,
    )
    effects_samples: int = option(
        256, "--effects: the measured images or blocks it ablates on (the first ones)", range=POSITIVE
    )
    out: str | None = option(
        None, OUT_HELP, shown="features inside the model's folder, or features-2, -3, ... when that one is in use",
        basic=True, group=REPORT
    )  # fmt: skip
    overwrite: bool = option(False, OVERWRITE_HELP, group=REPORT)
    seed: int = option(0, "seed of the image subset and of the chance purity", group=SYSTEM)
    device: str = like(SystemOptions, "device", basic=True, group=SYSTEM)
    threads: int = like(SystemOptions, "threads", basic=True, group=SYSTEM)


def configure_features(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run", help="a crate train / crate train-lm run directory, a save_pretrained model directory or hf-hub:ORG/NAME"
    )
    add_command_options(parser, FeaturesOptions)


IMAGE_ONLY = ("num_images",)  # what a language model's features cannot use, and the reverse
TEXT_ONLY = ("num_blocks", "context")


def _check_run(path: Path) -> None:
    """A one-line error, before anything is loaded, for a path that holds no model."""
    if str(path).startswith("hf-hub:"):
        return  # a pushed model: the loader names what is wrong with it
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; pass a run directory written by crate train or crate train-lm")
    found = [p for p in ("config.json", "model/config.json", "checkpoints/last.pt") if (path / p).is_file()]
    if path.is_dir() and not found:
        raise ValueError(
            f"{path} is not a run directory (no model/ nor checkpoints/last.pt inside); pass the folder that "
            "crate train or crate train-lm wrote (its --out)"
        )


def _layers(model: object, layer: int | None) -> list[int] | None:
    """``--layer`` (1-based, negative from the end) → 0-based indices (None: every layer)."""
    return None if layer is None else [layer_number(model, layer, "--layer")]


def _image_inputs(model: object, args: argparse.Namespace) -> tuple:
    """The measured test images ((N, C, H, W) in [0, 1]), labels, class names, normalisation and a description."""
    from ..data import match_channels, open_source, resolve_normalization
    from ..data.transforms import resize_tensor

    c = model.config
    data = args.data or (c.data.source if c.data else None)
    if not data:
        raise ValueError("the model config records no dataset; pass --data NAME (e.g. --data mnist)")
    columns = dataset_columns(args, model, str(data))  # features has no column flags: the recorded ones
    try:
        ds = open_source(str(data), "test", image_size=c.image_size, **columns)
    except ValueError:
        ds = open_source(str(data), "train", image_size=c.image_size, **columns)
    x, y = ds.first(args.num_images, shuffle=len(ds) > args.num_images, seed=args.seed)
    x = match_channels(resize_tensor(x, c.image_size).float() / 255.0, c.in_chans)
    norm = resolve_normalization(model, ds)
    return x, y, list(ds.classes), norm, f"{data} ({ds.split} split, {len(x)} images)"


def _text_inputs(model: object, args: argparse.Namespace, run: Path) -> tuple:
    """Held-out token blocks ((N, n + 1) ids) of the run's corpus and a description."""
    import torch

    from ..data.text import TokenBlocks, load_tokens, split_tokens

    if model.tokenizer is None:
        raise ValueError(f"{run} has no tokenizer.json beside its weights; save the model with its tokenizer")
    data, val_fraction, columns = held_out_corpus(run, args.data)
    block = model.config.block_size
    tokens = load_tokens(str(data), model.tokenizer, columns)
    held_out = TokenBlocks(tokens, block, split_tokens(len(tokens), val_fraction, block), len(tokens), str(data), "")
    n = min(args.num_blocks, len(held_out))
    if n == 0:
        raise ValueError(f"{data}: its held-out tail holds no block of {block + 1} tokens; pass a longer --data")
    desc = f"{data}: the held-out last {val_fraction:.0%} of the tokens, {n} blocks of {block}"
    return held_out.get(torch.arange(n)), desc


def _effects(model: object, args: argparse.Namespace, report: dict, data: tuple, layers: list[int] | None) -> dict:
    """``report`` with every unit's causal effect (:mod:`..analysis.effects`) on the first ``--effects-samples``
    of the measured images (``data = (x, y, norm)``) or blocks (``data = (blocks,)``)."""
    from ..analysis import effects as E

    n, kw = args.effects_samples, dict(layers=layers, seed=args.seed, batch_size=args.batch_size)
    if len(data) == 1:
        found = E.text_effects(model, data[0][:n], **kw)
    else:
        found = E.image_effects(model, data[0][:n], data[1][:n], normalization=data[2], **kw)
    return E.attach_effects(report, found, min(n, len(data[0])), n_boot=1000)


def run_features(args: argparse.Namespace) -> int:
    from ..analysis import features as F
    from ..io import atomic_write, write_json
    from ..loading.pipeline import load_model
    from ..models.contract import LANGUAGE_MODEL
    from ..train.runtime import resolve_device

    run = Path(args.run)  # hf-hub:ORG/NAME is no folder: report_home names one
    _check_run(run)
    apply_threads(args)
    model = load_model(args.run).to(resolve_device(args.device)).eval()
    language = model.kind == LANGUAGE_MODEL
    if language:
        refuse_given(args, IMAGE_ONLY, f"to a language model ({args.run}); it measures --num-blocks of text")
    else:
        refuse_given(args, TEXT_ONLY, f"to an image model ({args.run}); it is for language models")
    F.code_sites(model)  # a model without codes or MLP units fails here, before any data is read
    layers = _layers(model, args.layer)
    out = report_dir(args.out, report_home(args.run) / "features", args.overwrite, "features", OWNED)
    common = dict(k=args.top_k, batch_size=args.batch_size, layers=layers, seed=args.seed)
    if language:
        blocks, desc = _text_inputs(model, args, run)
        report, assets = F.text_features(model, blocks, tokenizer=model.tokenizer, context=args.context, **common)
    else:
        x, y, classes, norm, desc = _image_inputs(model, args)
        report, assets = F.image_features(model, x, y, classes=classes, normalization=norm, **common)
    if args.effects:
        report = _effects(model, args, report, (blocks,) if language else (x, y, norm), layers)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report["source"] = {"run": args.run, "data": desc, "date": when}
    write_json(out / "features.json", report)
    title = f"{model.config.arch} features: {run.name}"
    description = f"{desc}; top {args.top_k} inputs per unit; {when}"
    page = F.render_dashboard({**report, **assets, "description": description}, title)
    atomic_write(out / "features.html", lambda tmp: Path(tmp).write_text(page))
    print(f"features of {args.run} ({model.config.arch}) on {desc}, top-{args.top_k}:")
    print(F.summary_table(report))
    print(f"wrote {out / 'features.html'} and {out / 'features.json'}")
    return 0
