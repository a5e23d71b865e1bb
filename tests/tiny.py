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


# One small model of every family (and of CRATE's operator variants), built on demand; what tests that cover every
# family iterate over (device hygiene, compilation, the device under test).
def family_builders() -> dict[str, Any]:
    import crate_transformer as ct
    from crate_transformer.models.dino import DINOHead, DINOModel

    img = dict(image_size=16, patch_size=4, in_chans=1, dim=32, depth=2, heads=4)
    lm = dict(dim=32, depth=2, heads=4, block_size=8, vocab_size=50)
    return {
        "crate": lambda: ct.create_model("crate_mnist", **img, num_classes=5),
        "crate_mhsa": lambda: ct.create_model("crate_mhsa_mnist", **img, num_classes=5),
        "crate_alpha_ops": lambda: ct.create_model("crate_alpha_mnist", **img, num_classes=5),
        "crate_alpha": lambda: ct.create_model("crate_alpha_base16", **img, num_classes=5),
        "vit": lambda: ct.create_model("vit_mnist", **img, num_classes=5),
        "crate_mae": lambda: ct.create_model("crate_mae_mnist", **img),
        "crate_gpt": lambda: ct.create_model("crate_gpt_mini", **lm),
        "gpt": lambda: ct.create_model("gpt_mini", **lm),
        "crate_lm_bidirectional": lambda: ct.create_model("crate_bert_mini", **lm),
        "crate_bert": lambda: ct.create_model("crate_bert_base", **lm, dropout=0.0),
        "tost": lambda: ct.create_model("tost_mnist", **img, num_classes=5),
        "tost_lm": lambda: ct.create_model("tost_gpt_mini", **lm),
        "dino": lambda: DINOModel(
            ct.create_model("crate_mnist", **img, num_classes=5), DINOHead(32, 16, hidden_dim=16, bottleneck_dim=8)
        ),
    }


def family_inputs(model: Any, device: Any = "cpu") -> Any:
    """A batch for a model of :func:`family_builders`: token ids, a 16 px grey image batch, or DINO's two views."""
    import torch

    import crate_transformer as ct
    from crate_transformer.models.dino import DINOModel

    if isinstance(model, ct.LanguageModel):
        return torch.randint(0, model.config.vocab_size, (2, 8)).to(device)
    x = torch.randn(2, 1, 16, 16).to(device)
    return [x, torch.randn(2, 1, 8, 8).to(device)] if isinstance(model, DINOModel) else x


def family_loss(out: Any) -> Any:
    """A scalar of a family's output to differentiate: CRATE-MAE's own loss, else the mean square of the output."""
    import torch

    loss = getattr(out, "loss", None)
    if loss is not None:
        return loss
    return (out.float() if out.dtype in (torch.float16, torch.bfloat16) else out).square().mean()
