"""Tiny configurations the tests share (d ≤ 64, depth ≤ 2: each trains or runs in seconds on two CPU cores).

Tests that need a variant write ``{**tiny.X, "heads": 2}``, so what differs from the shared configuration is
visible at the use.
"""

from __future__ import annotations

from typing import Any


def kv(cfg: dict[str, Any]) -> list[str]:
    """``{"dim": 32}`` → ``["dim=32"]``: a configuration as ``--model-args`` KEY=VALUE items."""
    return [f"{k}={v}" for k, v in cfg.items()]


# A classifier on 32×32 RGB images: 16 patches.
IMAGE = dict(image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5)
# A classifier on the 8×8 grey digits: 16 patches, two layers.
DIGITS = dict(image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=2, heads=4)
# The smallest digits classifier: 4 patches, one layer.
DIGITS_ONE_LAYER = dict(image_size=8, patch_size=4, dim=16, depth=1, heads=2, num_classes=10, in_chans=1)
# A byte-level language model, one layer.
LM = dict(vocab_size=262, block_size=16, dim=16, depth=1, heads=2)

# ``crate train`` on the digits (the image size is given on the command line; --model-args last, so a test may
# append more KEY=VALUE items).
TRAIN_ARCH = {"dim": 32, "depth": 1, "heads": 2, "patch_size": 4}
TRAIN_CLI = ["--data", "digits", "--image-size", "8", "--threads", "1", "--no-progress", "--model-args",
             *kv(TRAIN_ARCH)]  # fmt: skip
# ``crate pretrain dino|mae`` on the digits: --model-args items.
SSL_ARCH = ["image_size=8", "patch_size=2", "dim=32", "depth=2", "heads=2"]
# One ``crate ablate`` row's base options (two steps on 64 images).
ABLATE = {"model_args": {"dim": 16, "depth": 1, "heads": 2}, "train_subset": 64, "batch_size": 32, "max_steps": 2,
          "eval_batch_size": 1000, "epochs": 1, "threads": 1}  # fmt: skip
