"""``crate finetune``: fine-tuning an image classifier from a checkpoint, its recipe chosen by the data's size."""

from __future__ import annotations

import argparse

from .options import add_training_options, given_options
from .training import finished, print_config

# what --help shows for the defaults `crate finetune` chooses by the data's size (run_finetune)
FINETUNE_CHOSEN = {
    "recipe": "small-data below 20,000 training images, else none (the transfer protocol)",
    "lr": "0.001 below 20,000 training images (small-data), else 5e-05",
    "augment": "auto: translate for grey-scale images, crop-flip for colour ones, + randaugment from 20,000",
}


def configure_finetune(parser: argparse.ArgumentParser) -> None:
    from ..train import FINETUNE_DEFAULTS

    parser.description = (
        "Fine-tune all weights from a checkpoint on new data: a fresh head for the new classes, position embeddings "
        "interpolated to the new image size. The recipe follows the data's size, said in the run's header: below "
        "20,000 training images --recipe small-data (AdamW lr 1e-3, no RandAugment), else the paper's transfer "
        "protocol (JMLR Table 1: AdamW lr 5e-5, wd 0.01, RandAugment(2, 14) on colour images).\n\n"
        "--from takes a save_pretrained dir or hf-hub:ORG/NAME, a crate train run dir, a training-state .pt, or an "
        "official .pth (then also --model NAME and --model-args for its architecture)."
    )
    shown = {"data": "(required)", "model": "(from checkpoint)", **FINETUNE_CHOSEN}
    add_training_options(parser, "finetune", "classification", "fine-tuning run", {**FINETUNE_DEFAULTS, **shown})


def run_finetune(args: argparse.Namespace) -> int:
    from ..train import FINETUNE_DEFAULTS, TrainConfig, train
    from ..train.config import flat_options

    resume = getattr(args, "resume", None)
    options = given_options(args)
    given = flat_options(options)
    # the checkpoint defines the architecture; --model only names an official checkpoint's
    base = TrainConfig.from_dict({**FINETUNE_DEFAULTS, "init_from": getattr(args, "init_from", None), "model": None})
    if given.get("data") and not given.get("recipe") and not resume:
        from ..train.recipes import finetune_recipe

        chosen = finetune_recipe(count_training_images(given["data"])).value  # the run's header says why
        base = TrainConfig.from_dict({"recipe": chosen}, base) if chosen else base
    if print_config(args, base, options):
        return 0
    if resume:
        result = train(resume=resume, overrides=options, expect_task="classification")
    else:
        if not getattr(args, "init_from", None):
            raise ValueError("crate finetune needs --from CHECKPOINT (a model dir, run dir or official .pth)")
        if not given.get("data"):
            raise ValueError("crate finetune needs --data (a dataset name or folder)")
        result = train(base, overrides=options, expect_task="classification")
    return finished(result)


def count_training_images(data: str) -> int | None:
    """The images of ``data``'s training pool, counted without decoding them (None for a streamed dataset whose
    size shows only once it is read, or data that does not open: the run then says why)."""
    from ..data import open_source
    from ..data.memory import list_image_folder, resolve_source

    try:
        kind, source = resolve_source(data)
        if kind == "folder":
            return len(list_image_folder(source).train)
        # built-in and CIFAR tensors: read once, kept for the run (the loader's cache)
        return len(open_source(data, "train")) if kind in ("mnist", "digits", "cifar10", "cifar100") else None
    except (ValueError, OSError):
        return None
