"""Named training recipes (``--recipe NAME``): the hyperparameters of published recipes as TrainConfig values.

A recipe sits between the defaults and the user: defaults < recipe < ``--config`` file < command-line flags
(:meth:`TrainConfig.from_dict` puts the recipe's values under the options given with it).  A recipe may have
other values for fine-tuning (``crate finetune``, i.e. ``init_from`` set) than for training from scratch.

Learning rates are the absolute ones at the recipe's batch size (the sources state a base lr per 256 or 512
images and scale it linearly); change ``--batch-size`` and scale ``--lr`` yourself.  RandAugment magnitudes
of timm / big_vision (``m9`` on a 0-10 scale) are given on kornia's 0-30 scale (m = 27).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Recipe", "RECIPES", "recipe_options"]


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
}


def recipe_options(name: str, finetune: bool = False) -> dict[str, Any]:
    """The TrainConfig values of recipe ``name`` (its fine-tuning values when ``finetune``)."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose one of {tuple(RECIPES)}")
    r = RECIPES[name]
    values = r.finetune if finetune and r.finetune is not None else r.train
    return {k: list(v) if isinstance(v, list) else v for k, v in values.items()}
