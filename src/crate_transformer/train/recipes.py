"""Named training recipes (``--recipe NAME``): the hyperparameters of published recipes as TrainConfig values.

A recipe sits between the defaults and the user: defaults < recipe < ``--config`` file < command-line flags
(:meth:`TrainConfig.from_dict` puts the recipe's values under the options given with it).  A recipe may have
other values for fine-tuning (``crate finetune``, i.e. ``init_from`` set) than for training from scratch.

Learning rates are the absolute ones at the recipe's batch size (the sources state a base lr per 256 or 512
images and scale it linearly); change ``--batch-size`` and scale ``--lr`` yourself.  RandAugment magnitudes
of timm / big_vision (``m9`` on a 0-10 scale) are given on kornia's 0-30 scale (m = 27).

What a run does when the user names no recipe or augmentation is decided here too, from the data, and said in the
run's header (:func:`recipe_note`, :func:`choose_augmentation`): ``crate finetune`` on fewer than
:data:`SMALL_DATA` training images uses ``small-data`` rather than the paper's ImageNet transfer recipe, and
1-channel images (digits, text, documents) are shifted, never flipped or cropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FINETUNE_DEFAULTS",
    "Recipe",
    "RECIPES",
    "SMALL_DATA",
    "Choice",
    "recipe_options",
    "finetune_recipe",
    "choose_augmentation",
    "choose_mae_augmentation",
    "changed_settings",
    "reading_augmentation",
    "recipe_note",
    "chance_level",
    "near_chance",
]

# training images below which `crate finetune` chooses the small-data recipe: the paper's transfer recipe (lr 5e-5,
# RandAugment(2, 14)) fine-tunes ImageNet checkpoints on 2k-50k images for 100s of epochs, and on 1,437 digits for 3
# epochs it reached 22% where lr 1e-3 with translations reached 93% (docs/finetuning.md)
SMALL_DATA = 20_000


@dataclass(frozen=True)
class Recipe:
    """A named recipe: ``train`` values, ``finetune`` values (None: the same), and where they come from."""

    name: str
    source: str
    train: dict[str, Any]
    finetune: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


_TIMM_RANDAUG = {"augment": "randaugment", "randaugment_n": 2, "randaugment_m": 27}  # rand-m9 (0-10) = 27/30
_MIX = {"mixup": 0.8, "cutmix": 1.0, "mixup_prob": 1.0, "mixup_switch_prob": 0.5}

# Fine-tuning recipe (JMLR App. C.1, transfer protocol of Table 1): new head, AdamW lr 5e-5, wd 0.01,
# crop + flip + RandAugment(2, 14), plain cross-entropy.
FINETUNE_DEFAULTS: dict[str, Any] = {
    "optimizer": "adamw",
    "lr": 5e-5,
    "min_lr": 1e-6,
    "weight_decay": 0.01,
    "label_smoothing": 0.0,
    "epochs": 10,
    "warmup_epochs": 1.0,
    "batch_size": 64,
}


RECIPES: dict[str, Recipe] = {
    "crate-paper": Recipe(
        "crate-paper",
        "Yu et al., JMLR 2024, App. C.1 (pre-training on ImageNet-1K; fine-tuning on image classification tasks)",
        train=dict(
            optimizer="lion",
            lr=2.4e-4,
            weight_decay=0.5,
            batch_size=2048,
            epochs=150,
            warmup_epochs=5.0,
            label_smoothing=0.1,
            augment="crop-flip",
        ),
        finetune=dict(
            optimizer="adamw",
            lr=5e-5,
            weight_decay=0.01,
            batch_size=512,
            augment="randaugment",
            randaugment_n=2,
            randaugment_m=14,
        ),
    ),
    "crate-alpha-finetune": Recipe(
        "crate-alpha-finetune",
        "UCSC-VLAA/CRATE-alpha configs/crate/classification/fine_tuning_in1k.py "
        "(commit edbd624b5957246f5767ec9db6206b7be9475f59)",
        train=dict(
            optimizer="adamw",
            betas=[0.9, 0.95],
            lr=1.6e-4,
            min_lr=1e-6,
            weight_decay=0.1,
            batch_size=4096,
            epochs=91,
            warmup_epochs=10.0,
            grad_clip=1.0,
            label_smoothing=0.1,
            crop_scale=0.08,
            **_TIMM_RANDAUG,
            **_MIX,
            drop_path=0.0,
        ),
        notes=["lr = base_lr 1e-5 x batch 4096 // 256", "big_vision mixup p=0.8 is the Beta concentration"],
    ),
    "mae-finetune": Recipe(
        "mae-finetune",
        "facebookresearch/mae FINETUNE.md and main_finetune.py (commit efb2a8062c206524e35e47d04501ed4f544c0ae8), "
        "ViT-Base row",
        train=dict(
            optimizer="adamw",
            lr=2e-3,
            min_lr=1e-6,
            weight_decay=0.05,
            batch_size=1024,
            epochs=100,
            warmup_epochs=5.0,
            layer_decay=0.65,
            drop_path=0.1,
            label_smoothing=0.1,
            random_erasing=0.25,
            grad_clip=0.0,
            **_TIMM_RANDAUG,
            **_MIX,
        ),
        notes=["lr = blr 5e-4 x batch 1024 / 256", "ViT-L/H: layer_decay 0.75, drop_path 0.2/0.3, epochs 50"],
    ),
    "deit": Recipe(
        "deit",
        "facebookresearch/deit main.py defaults (commit 7e160fe43f0252d17191b71cbb5826254114ea5b), batch 1024",
        train=dict(
            optimizer="adamw",
            lr=1e-3,
            min_lr=1e-5,
            weight_decay=0.05,
            batch_size=1024,
            epochs=300,
            warmup_epochs=5.0,
            drop_path=0.1,
            label_smoothing=0.1,
            random_erasing=0.25,
            grad_clip=0.0,
            ema=0.99996,
            **_TIMM_RANDAUG,
            **_MIX,
        ),
        notes=["lr = 5e-4 x batch 1024 / 512", "repeated augmentation and colour jitter are not reproduced"],
    ),
    "small-data": Recipe(
        "small-data",
        "this package, for a few thousand small images on a CPU (docs/finetuning.md: measured on scikit-learn's "
        "digits and patches of photographs): the training defaults; fine-tuning at lr 1e-3 without RandAugment",
        train=dict(optimizer="adamw", lr=4e-3, weight_decay=0.01, epochs=40, warmup_epochs=2.0, label_smoothing=0.05),
        finetune=dict(
            optimizer="adamw",
            lr=1e-3,
            min_lr=1e-5,
            weight_decay=0.01,
            epochs=10,
            warmup_epochs=1.0,
            label_smoothing=0.0,
        ),
        notes=["fine-tuning chooses it for fewer than SMALL_DATA (20,000) training images"],
    ),
}


def recipe_options(name: str, finetune: bool = False) -> dict[str, Any]:
    """The TrainConfig values of recipe ``name`` (its fine-tuning values when ``finetune``)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {tuple(RECIPES)}")
    r = RECIPES[name]
    values = r.finetune if finetune and r.finetune is not None else r.train
    return {k: list(v) if isinstance(v, list) else v for k, v in values.items()}


# --------------------------------------------------------------------------- what a run chooses, and why
@dataclass(frozen=True)
class Choice:
    """A value chosen for the user (a recipe, an augmentation) and the reason, said in the run's header."""

    value: str
    reason: str


def finetune_recipe(num_images: int | None) -> Choice:
    """The recipe ``crate finetune`` uses when none is named: ``small-data`` below :data:`SMALL_DATA` training
    images, else ``""`` (its defaults: the paper's transfer protocol, JMLR Table 1).  ``num_images`` None (a
    streamed dataset whose size is not known before it is read) keeps the defaults."""
    if num_images is None:
        return Choice("", "the size of the data is not known before it is read")
    if num_images < SMALL_DATA:
        return Choice("small-data", f"{num_images:,} training images, fewer than {SMALL_DATA:,}")
    return Choice("", f"{num_images:,} training images, at least {SMALL_DATA:,}")


# the augmentations each setting is read by (a setting the user changed picks among them: translate, crop_scale, ...)
# the augmentation settings each kind reads (augment='auto' given one picks a kind that reads it)
READ_BY = {
    "translate": ("translate",),
    "crop_scale": ("crop-flip", "randaugment"),
    "hflip": ("crop-flip", "randaugment"),
    "randaugment_n": ("randaugment",),
    "randaugment_m": ("randaugment",),
}


def reading_augmentation(changed: tuple[str, ...]) -> tuple[str, list[str]]:
    """The augmentation that reads the most of the settings ``changed`` (given away from their defaults; the
    simplest of equals), with those it reads; ``("", [])`` where none is one that only some augmentations read.
    ``augment='auto'`` picks it, in the run (:func:`choose_augmentation`) and in the options' checks alike."""
    read = {
        kind: [n for n in changed if kind in READ_BY.get(n, ())] for kind in ("translate", "crop-flip", "randaugment")
    }
    best = max(read, key=lambda kind: len(read[kind]))
    return (best, read[best]) if read[best] else ("", [])


def changed_settings(augmentation: Any) -> tuple[str, ...]:
    """The settings of an ``AugmentationOptions`` that only some augmentations read, given away from their
    defaults (what :func:`choose_augmentation` must respect)."""
    import dataclasses

    fields = dataclasses.fields(augmentation)
    return tuple(f.name for f in fields if f.name in READ_BY and getattr(augmentation, f.name) != f.default)


def choose_augmentation(
    *, channels: int, num_images: int, finetune: bool, recipe: str | None = None, changed: tuple[str, ...] = ()
) -> Choice:
    """``augment='auto'`` of a classification run, from its data: shifts for 1-channel images (digits, text,
    documents: a mirror image or a crop of a quarter of one is often another symbol), RandomResizedCrop + flip
    for colour images (JMLR App. C.1), plus RandAugment(2, 14) when fine-tuning on :data:`SMALL_DATA` images
    or more (the transfer protocol; not under ``recipe='small-data'``).  ``changed``: the augmentation settings
    given away from their defaults; the choice is one that reads them (``crop_scale`` given: a crop)."""
    n = f"{num_images:,} {'grey-scale' if channels == 1 else f'{channels}-channel'} training images"
    kind, read = reading_augmentation(changed)
    if kind:
        return Choice(kind, f"the augmentation that reads the {', '.join(read)} given")
    if channels == 1:
        return Choice(
            "translate",
            f"{n}: digits, letters and documents change under a flip or a tight crop, so shifts only; "
            "augment='crop-flip' for grey-scale photographs",
        )
    if finetune and num_images >= SMALL_DATA and recipe != "small-data":
        return Choice("randaugment", f"{n}: the paper's transfer augmentation (JMLR App. C.1, Table 1)")
    return Choice(
        "crop-flip",
        f"{n}: RandomResizedCrop + horizontal flip (JMLR App. C.1); augment='translate' for text-like or "
        "mirror-sensitive images",
    )


def choose_mae_augmentation(channels: int) -> Choice:
    """The MAE task's ``augmentation='auto'``: none for 1-channel images (as for the built-in digits: masking
    75% of the patches is the regulariser, and a flip changes a digit), crop + flip for colour ones (MAE)."""
    if channels == 1:
        return Choice("none", "grey-scale images: the masking is the regulariser, and a flip changes a digit")
    return Choice("crop-flip", f"{channels}-channel images: RandomResizedCrop(0.2, 1) + flip, as MAE pre-trains")


def _values(cfg: Any) -> str:
    o = cfg.optim
    epochs = f"{o.epochs} epoch" + ("s" if o.epochs != 1 else "")
    return f"{o.optimizer} lr {o.lr:g}, weight decay {o.weight_decay:g}, batch {o.batch_size}, {epochs}"


def recipe_note(cfg: Any, num_images: int, what: str = "the training defaults") -> str:
    """The header line saying which recipe a run of ``cfg`` (a TrainConfig) on ``num_images`` training images
    follows, its main values and why; ``what`` names the defaults of a run without a recipe."""
    values = _values(cfg)
    if cfg.recipe == "small-data" and cfg.init_from is not None:
        why = finetune_recipe(num_images).reason if num_images < SMALL_DATA else f"{num_images:,} training images"
        return (
            f"recipe small-data ({values}): {why}; the paper's transfer recipe (lr 5e-5 and RandAugment(2, 14), "
            "JMLR Table 1) is for ImageNet checkpoints fine-tuned for hundreds of epochs: recipe='crate-paper'"
        )
    if cfg.recipe:
        return f"recipe {cfg.recipe} ({values}): {RECIPES[cfg.recipe].source}"
    if cfg.init_from is not None:
        if num_images < SMALL_DATA:
            return (
                f"recipe: {values} on {num_images:,} training images; below {SMALL_DATA:,} recipe='small-data' "
                "(lr 1e-3, no RandAugment) learns faster"
            )
        return f"recipe: the transfer protocol (JMLR Table 1: {values}) for {num_images:,} training images"
    return f"recipe: {what} ({values}), for a few thousand small images on a CPU"


def chance_level(labels: Any) -> float:
    """The accuracy of always answering the most frequent class of ``labels`` (an integer tensor)."""
    import torch

    counts = torch.bincount(torch.as_tensor(labels).flatten())
    return float(counts.max()) / float(counts.sum())


def near_chance(acc: float, chance: float) -> bool:
    """Whether ``acc`` is within reach of ``chance``: below twice it and below a tenth of the way from it to 100%
    (10 classes: 19%; 2 classes: 55%; 1000 classes: 0.2%)."""
    return acc < min(2 * chance, chance + 0.1 * (1 - chance))
