"""Train, fine-tune and evaluate image classifiers: the ``crate train|finetune|eval`` commands.

A plain PyTorch loop in the style of nanoGPT / DINO ``main_dino.py``: one :class:`TrainConfig`
dataclass (defaults < ``--config`` YAML/JSON file < command-line flags), in-memory data indexed per
step and augmented on the device with kornia, a per-iteration warm-up + cosine schedule, optional
AMP / ``torch.compile`` / DistributedDataParallel, atomic checkpoints holding everything needed to
continue bit-for-bit, and a JSONL metrics log (one record per line with ``step``/``epoch``/``split``).

The paper's ImageNet recipe (JMLR App. C.1): Lion, lr 2.4e-4, weight decay 0.5, batch 2048,
5 warm-up epochs then cosine, label smoothing 0.1, random crop + flip.  Fine-tuning (C.1,
Table 1): new head, AdamW lr 5e-5, weight decay 0.01, crop + flip + RandAugment(2, 14).  The
defaults of ``crate train`` are instead tuned for the built-in MNIST digits on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import signal
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoint import atomic_write, load_model, load_pickle
from .data import (
    AUGMENTATIONS,
    BUILTIN_DATASETS,
    ImageDataset,
    build_augmentation,
    default_augmentation,
    epoch_permutation,
    fit_normalization,
    load_dataset,
    match_channels,
)
from .data import normalize as normalize_images
from .model import ImageClassifier, ModelConfig, build_model
from .registry import model_config

__all__ = [
    "TrainConfig",
    "FINETUNE_DEFAULTS",
    "WarmupCosine",
    "EvalResult",
    "StepContext",
    "load_config",
    "train",
    "evaluate",
    "prepare_batch",
    "epoch_permutation",
    "plot_curves",
    "plot_confusion_matrix",
    "configure_train",
    "run_train",
    "configure_finetune",
    "run_finetune",
    "configure_eval",
    "run_eval",
]

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
MEASURE_FILE = "measure.png"
CHECKPOINT = Path("checkpoints") / "last.pt"
OPTIMIZERS = ("adamw", "lion")
AMP_MODES = ("auto", "none", "bf16", "fp16")


def _opt(default: Any, help: str, commands: tuple[str, ...] = ("train", "finetune"), **kw: Any) -> Any:
    """A config field carrying its ``--help`` text (the CLI is generated from the dataclass)."""
    meta = {"help": help, "commands": commands, **kw}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class TrainConfig:
    """Everything that defines a training run; saved as ``config.yaml`` in the run directory."""

    # model
    model: str | None = _opt("crate_mnist", "registered model name (see `crate models`)")
    model_args: dict = _opt({}, "model overrides as KEY=VALUE, e.g. dim=64 depth=4 patch_size=4", metavar="KEY=VALUE")
    # data
    data: str = _opt("mnist", "'mnist' | 'digits' | a CIFAR folder | a class-per-subfolder image folder")
    image_size: int | None = _opt(None, "train at this image size; batches are resized", shown="the model's")
    val_fraction: float = _opt(0.0, "hold out this stratified fraction of the training pool as a 'val' split")
    eval_split: str = _opt(
        "test", "split evaluated after every --eval-every epochs: test | val", choices=("test", "val")
    )
    train_subset: int = _opt(0, "train on a seeded random subset of this many images (0 = all)")
    on_bad_image: str = _opt(
        "skip", "unreadable image files: skip (with a warning count) | error", choices=("skip", "error")
    )
    # augmentation (kornia, batched on the device)
    augment: str = _opt(
        "auto",
        "augmentation: auto (translate for digits, crop-flip otherwise, + randaugment when fine-tuning) | "
        + " | ".join(AUGMENTATIONS),
        choices=("auto", *AUGMENTATIONS),
    )
    translate: float = _opt(0.07, "max shift of --augment translate, as a fraction of the side (0.07: 2 px at 28 px)")
    crop_scale: float = _opt(0.08, "minimum area fraction of RandomResizedCrop (crop-flip, randaugment)")
    hflip: bool = _opt(True, "random horizontal flips in crop-flip / randaugment")
    randaugment_n: int = _opt(2, "RandAugment: number of ops per image")
    randaugment_m: int = _opt(14, "RandAugment: magnitude (0-30)")
    # optimisation (per-iteration linear warm-up, then cosine decay to --min-lr)
    optimizer: str = _opt("adamw", "optimizer: adamw | lion (the paper pre-trains with Lion)", choices=OPTIMIZERS)
    lr: float = _opt(2e-3, "peak learning rate")
    min_lr: float = _opt(1e-5, "learning rate at the end of the cosine decay")
    weight_decay: float = _opt(0.05, "decoupled weight decay (matrices only; norms, biases, embeddings excluded)")
    betas: list = _opt([], "optimizer betas", shown="0.9 0.999 for AdamW, 0.9 0.99 for Lion")
    batch_size: int = _opt(128, "global batch size (split evenly over distributed processes)")
    epochs: int = _opt(40, "training epochs")
    warmup_epochs: float = _opt(2.0, "linear warm-up length in epochs (fractions allowed)")
    label_smoothing: float = _opt(0.1, "label smoothing of the cross-entropy")
    grad_clip: float = _opt(1.0, "clip the global gradient norm to this value (0 = off)")
    max_steps: int = _opt(0, "stop after this many optimizer steps (0 = all epochs; the schedule is unchanged)")
    # system
    device: str = _opt("auto", "auto | cpu | cuda | cuda:N (under torchrun: cuda:LOCAL_RANK)")
    amp: str = _opt(
        "auto", "mixed precision: auto (bf16 or fp16 on GPU, none on CPU) | none | bf16 | fp16", choices=AMP_MODES
    )
    compile: bool = _opt(False, "torch.compile the model (first steps are slow while it compiles)")
    seed: int = _opt(0, "random seed (model init, data order, augmentation)")
    deterministic: bool = _opt(False, "deterministic algorithms (bitwise reproducible on CPU; slower on GPU)")
    threads: int = _opt(0, "torch CPU threads per process (0 = torch's default)")
    # run directory and logging
    out: str | None = _opt(None, "run directory", shown="runs/<model>-<data>-<date-time>")
    checkpoint_every: int = _opt(0, "also checkpoint every N steps (always at epoch ends, the end and on Ctrl-C)")
    log_every: int = _opt(10, "write a train record to metrics.jsonl every N steps")
    eval_every: int = _opt(1, "evaluate every N epochs (0 = only at the end)")
    eval_batch_size: int = _opt(500, "batch size for evaluation")
    measure_every: int = _opt(
        100,
        "every N steps (and before the first), record each layer's compression R^c and sparsity on a fixed "
        "batch (JMLR Fig. 15) in metrics.jsonl and plot them as measure.png (0 = off)",
    )
    progress: bool = _opt(True, "show a tqdm progress bar")
    # fine-tuning (set by `crate finetune`)
    init_from: str | None = _opt(None, "checkpoint to fine-tune from", commands=())
    keep_head: bool = _opt(False, "keep the pretrained head when the class count matches", commands=("finetune",))

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise a one-line ValueError for any inconsistent setting."""
        positive = ("batch_size", "epochs", "log_every", "eval_batch_size")
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        nonneg = ("max_steps", "checkpoint_every", "eval_every", "train_subset", "threads", "measure_every")
        for name in nonneg:
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(f"need 0 <= min_lr <= lr and lr > 0, got lr={self.lr}, min_lr={self.min_lr}")
        if self.weight_decay < 0 or self.grad_clip < 0 or self.warmup_epochs < 0:
            raise ValueError("weight_decay, grad_clip and warmup_epochs must be >= 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if not 0.0 <= self.translate < 0.5:
            raise ValueError(f"translate is a fraction of the image side in [0, 0.5), got {self.translate}")
        if not 0.0 < self.crop_scale <= 1.0:
            raise ValueError(f"crop_scale must be in (0, 1], got {self.crop_scale}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {OPTIMIZERS}")
        if self.amp not in AMP_MODES:
            raise ValueError(f"unknown amp mode {self.amp!r}; choose one of {AMP_MODES}")
        if self.augment not in ("auto", *AUGMENTATIONS):
            raise ValueError(f"unknown augmentation {self.augment!r}; choose one of {('auto', *AUGMENTATIONS)}")
        if self.betas and (len(self.betas) != 2 or not all(0.0 <= float(b) < 1.0 for b in self.betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas}")
        if self.eval_split == "val" and self.val_fraction <= 0:
            raise ValueError("eval_split 'val' needs a validation split; pass --val-fraction 0.1 (for example)")
        if not isinstance(self.model_args, dict):
            raise ValueError(f"model_args must be a mapping of ModelConfig fields, got {self.model_args!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, base: TrainConfig | None = None) -> TrainConfig:
        """``base`` (or the defaults) updated with ``d``; keys may use dashes or underscores."""
        known = {f.name for f in dataclasses.fields(cls)}
        d = {str(k).replace("-", "_"): v for k, v in d.items()}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown training option(s) {unknown}; valid options: {sorted(known)}")
        return dataclasses.replace(base, **d) if base is not None else cls(**d)


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


def load_config(path: str | os.PathLike, base: TrainConfig | None = None) -> TrainConfig:
    """Read a YAML or JSON file of :class:`TrainConfig` options on top of ``base`` (or the defaults)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file not found: {path}; pass a YAML or JSON file of training options")
    try:
        data = yaml.safe_load(path.read_text()) or {}  # YAML is a superset of JSON
    except yaml.YAMLError as e:
        raise ValueError(f"cannot parse config file {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of option: value, got {type(data).__name__}")
    return TrainConfig.from_dict(data, base)


# --------------------------------------------------------------------------- schedule
class WarmupCosine:
    """LR multiplier per iteration: linear warm-up from ~0 to 1, then cosine decay to ``min_ratio``.

    Stepped every iteration (paper: 5-epoch linear warm-up then cosine decay, JMLR App. C.1).  A
    class rather than a lambda so ``LambdaLR.state_dict()`` stores it.
    """

    def __init__(self, warmup_steps: int, total_steps: int, min_ratio: float) -> None:
        self.warmup_steps, self.total_steps, self.min_ratio = int(warmup_steps), int(total_steps), float(min_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        t = min(1.0, (step - self.warmup_steps) / span)
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


# --------------------------------------------------------------------------- distributed helpers
@dataclass
class _Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def _init_distributed(device_arg: str) -> tuple[_Dist, torch.device]:
    """Read torchrun's environment; start gloo (CPU) or nccl (GPU) when WORLD_SIZE > 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if device_arg == "auto":
        device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(device_arg)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda was requested but no CUDA GPU is available; use --device cpu")
        if device.type == "cuda" and world > 1:
            device = torch.device(f"cuda:{local}")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist = _Dist(rank, world, local)
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return dist, device


def _all_reduce_sum(values: Sequence[float], dist: _Dist, device: torch.device) -> list[float]:
    if not dist.enabled:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(t)
    return t.tolist()


def _broadcast_object(obj: Any, dist: _Dist) -> Any:
    if not dist.enabled:
        return obj
    box = [obj]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


# --------------------------------------------------------------------------- RNG state
def _rng_state() -> dict:
    """Torch/CUDA/numpy/python RNG states as tensors and plain lists (loadable with weights_only=True)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _set_deterministic(on: bool) -> None:
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(on)
    if on:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False


# --------------------------------------------------------------------------- batches
def prepare_batch(
    images: Tensor,
    *,
    device: torch.device,
    image_size: int,
    channels: int,
    mean: Sequence[float],
    std: Sequence[float],
    augment: nn.Module | None = None,
) -> Tensor:
    """uint8 ``(b, C, H, W)`` → float model input: to [0, 1], channels matched, augmented, resized, normalised."""
    x = images.to(device, non_blocking=True).float().div_(255.0)
    x = match_channels(x, channels)
    if augment is not None:
        x = augment(x)
    if x.shape[-2:] != (image_size, image_size):
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", antialias=True, align_corners=False)
    return normalize_images(x, mean, std)


# --------------------------------------------------------------------------- evaluation
@dataclass
class EvalResult:
    """Accuracy of a model on a labelled split."""

    top1: float
    top5: float
    loss: float
    num_samples: int
    per_class: list[float]
    confusion: list[list[int]]  # confusion[true][predicted]
    classes: list[str]
    k: int = 5  # top-k actually used (min(5, #classes))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: ImageDataset,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    image_size: int,
    channels: int,
    batch_size: int = 500,
    device: torch.device | str = "cpu",
    amp_dtype: torch.dtype | None = None,
    dist: _Dist | None = None,
) -> EvalResult:
    """Top-1 / top-k accuracy, mean loss, per-class accuracy and the confusion matrix on ``dataset``.

    Under torch.distributed each rank evaluates every ``world``-th sample and the counts are summed.
    """
    device = torch.device(device)
    dist = dist or _Dist()
    was_training = model.training
    model.eval()
    n_cls = len(dataset.classes)
    k = min(5, n_cls)
    idx = torch.arange(len(dataset))[dist.rank :: dist.world]
    confusion = torch.zeros(n_cls, n_cls, dtype=torch.float64)
    loss_sum = top_k = 0.0
    for chunk in idx.split(batch_size):
        x = prepare_batch(
            dataset.images[chunk], device=device, image_size=image_size, channels=channels, mean=mean, std=std
        )
        y = dataset.labels[chunk].to(device)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
            logits = model(x)
        logits = logits.float()
        if logits.shape[-1] != n_cls:
            raise ValueError(
                f"the model predicts {logits.shape[-1]} classes but the data has {n_cls}; "
                "fine-tune it on this data first (crate finetune --from ...)"
            )
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        top_k += (logits.topk(k, dim=-1).indices == y[:, None]).any(-1).sum().item()
        pred = logits.argmax(-1)
        confusion.index_put_((y.cpu(), pred.cpu()), torch.ones(len(y), dtype=torch.float64), accumulate=True)
    if dist.enabled:
        t = torch.cat([confusion.flatten(), torch.tensor([loss_sum, top_k], dtype=torch.float64)]).to(device)
        torch.distributed.all_reduce(t)
        t = t.cpu()
        confusion, (loss_sum, top_k) = t[:-2].view(n_cls, n_cls), t[-2:].tolist()
    model.train(was_training)
    n = int(confusion.sum().item())
    per_class_total = confusion.sum(1)
    per_class = (confusion.diagonal() / per_class_total.clamp_min(1)).tolist()
    return EvalResult(
        top1=float(confusion.diagonal().sum().item()) / max(n, 1),
        top5=float(top_k) / max(n, 1),
        loss=loss_sum / max(n, 1),
        num_samples=n,
        per_class=[float(v) for v in per_class],
        confusion=confusion.long().tolist(),
        classes=list(dataset.classes),
        k=k,
    )


# --------------------------------------------------------------------------- plots
def _read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill: ignore it
                continue
    return records


def plot_curves(metrics_path: str | os.PathLike, out_png: str | os.PathLike) -> Path:
    """Plot loss, accuracy and learning rate against the step from a ``metrics.jsonl`` log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = _read_metrics(Path(metrics_path))
    train_r = [r for r in records if r.get("split") == "train"]
    eval_splits = sorted({r["split"] for r in records if r.get("split") in ("val", "test")})
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    ax_loss, ax_acc, ax_lr = axes
    if train_r:
        steps = [r["step"] for r in train_r]
        ax_loss.plot(steps, [r["loss"] for r in train_r], label="train", lw=1)
        ax_acc.plot(steps, [100 * r["acc"] for r in train_r], label="train", lw=1)
        ax_lr.plot(steps, [r["lr"] for r in train_r], color="tab:gray")
    for split in eval_splits:
        rs = [r for r in records if r.get("split") == split]
        ax_loss.plot([r["step"] for r in rs], [r["loss"] for r in rs], "o-", label=split, ms=3)
        ax_acc.plot([r["step"] for r in rs], [100 * r["acc"] for r in rs], "o-", label=split, ms=3)
    ax_loss.set(title="loss", xlabel="step")
    ax_acc.set(title="accuracy (%)", xlabel="step")
    ax_lr.set(title="learning rate", xlabel="step")
    if eval_splits:
        accs = [100 * r["acc"] for r in records if r.get("split") in eval_splits]
        ax_acc.set_ylim(max(0, min(accs) - 5), 100.5)
    for ax in (ax_loss, ax_acc):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out_png = Path(out_png)
    atomic_write(out_png, lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
    plt.close(fig)
    return out_png


def plot_confusion_matrix(
    confusion: Sequence[Sequence[int]], classes: Sequence[str], out_png: str | os.PathLike, title: str = ""
) -> Path:
    """Save a confusion matrix (rows: true class, columns: predicted) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = np.asarray(confusion, dtype=np.float64)
    n = len(classes)
    size = min(14.0, 3.0 + 0.4 * n)
    fig, ax = plt.subplots(figsize=(size, size))
    rows = m / np.maximum(m.sum(1, keepdims=True), 1)
    ax.imshow(rows, cmap="Blues", vmin=0, vmax=1)
    if n <= 30:
        ax.set_xticks(range(n), classes, rotation=90 if max(map(len, classes)) > 2 else 0)
        ax.set_yticks(range(n), classes)
    if n <= 15:
        for i in range(n):
            for j in range(n):
                if m[i, j]:
                    ax.text(
                        j,
                        i,
                        int(m[i, j]),
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if rows[i, j] > 0.5 else "black",
                    )
    ax.set(xlabel="predicted", ylabel="true", title=title or "confusion matrix")
    fig.tight_layout()
    out_png = Path(out_png)
    atomic_write(out_png, lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
    plt.close(fig)
    return out_png


# --------------------------------------------------------------------------- training
@dataclass
class StepContext:
    """What a per-step hook sees: the raw (unwrapped) model, the step, a fixed evaluation batch, the run dir.

    Hooks are ``(ctx) -> list[dict] | None`` callables run on every rank after each optimizer step;
    the records they return (rank 0) are appended to ``metrics.jsonl`` (add ``split``/``step`` keys).
    """

    model: ImageClassifier
    step: int
    epoch: float  # step / steps_per_epoch, as in the train and eval records
    fixed_batch: tuple[Tensor, Tensor]
    run_dir: Path
    is_main: bool


Hook = Callable[[StepContext], "list[dict] | None"]


class _Interrupt:
    """SIGINT/SIGTERM → finish the current step, checkpoint, exit.  A second Ctrl-C aborts at once."""

    def __init__(self) -> None:
        self.flag = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Interrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.flag and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.flag = True

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or name in ("pos_embed", "cls_token") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    groups = _param_groups(model, cfg.weight_decay)
    if cfg.optimizer == "lion":
        from lion_pytorch import Lion

        return Lion(groups, lr=cfg.lr, betas=tuple(cfg.betas) if cfg.betas else (0.9, 0.99))
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas) if cfg.betas else (0.9, 0.999))


def _amp_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    mode = cfg.amp
    if mode == "auto":
        if device.type != "cuda":
            return None
        mode = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if mode == "none":
        return None
    if mode == "fp16" and device.type != "cuda":
        raise ValueError("--amp fp16 needs a CUDA GPU; use --amp bf16 or --amp none on CPU")
    return torch.bfloat16 if mode == "bf16" else torch.float16


def _default_run_dir(cfg: TrainConfig) -> Path:
    data = Path(cfg.data).name or "data"
    what = cfg.model or ("finetune" if cfg.init_from else "model")
    return Path("runs") / f"{what}-{data}-{time.strftime('%Y%m%d-%H%M%S')}"


def _data_normalization(dataset: ImageDataset, channels: int) -> tuple[list[float], list[float]]:
    """Training-pool statistics of ``dataset``, converted when the images are converted to ``channels``."""
    return fit_normalization(dataset.mean, dataset.std, channels)


def _normalization(model: ImageClassifier, dataset: ImageDataset) -> tuple[list[float], list[float]]:
    """The normalisation recorded with the model (``config.extra``) if it fits, else the dataset's."""
    norm = model.config.extra.get("normalization") or {}
    c = model.config.in_chans
    if len(norm.get("mean", ())) == c and len(norm.get("std", ())) == c:
        return list(norm["mean"]), list(norm["std"])
    return _data_normalization(dataset, c)


def _load_data(cfg: TrainConfig, image_size: int) -> tuple[ImageDataset, ImageDataset, ImageDataset]:
    """(train, per-epoch eval, test) splits; image folders are resized to ``image_size`` at load time."""
    kw = dict(val_fraction=cfg.val_fraction, seed=cfg.seed, on_bad_image=cfg.on_bad_image)
    kw["image_size"] = image_size if _is_image_folder(cfg.data) else None  # tensors are resized per batch
    train_set = load_dataset(cfg.data, "train", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a skipped-images warning was already shown for the train split
        test_set = load_dataset(cfg.data, "test", **kw)
        eval_set = test_set if cfg.eval_split == "test" else load_dataset(cfg.data, cfg.eval_split, **kw)
    if cfg.train_subset and cfg.train_subset < len(train_set):
        g = torch.Generator().manual_seed(cfg.seed)
        keep = torch.randperm(len(train_set), generator=g)[: cfg.train_subset].sort().values
        t = train_set
        train_set = ImageDataset(t.images[keep], t.labels[keep], t.classes, t.mean, t.std, t.name, "train")
    return train_set, eval_set, test_set


def _is_image_folder(data: str) -> bool:
    p = Path(data)
    if data.lower() in BUILTIN_DATASETS or not p.is_dir():
        return False
    cifar = (p, p / "cifar-10-batches-py", p / "cifar-100-python")
    return not any((q / "data_batch_1").is_file() or (q / "meta").is_file() for q in cifar)


def _plot_run(cfg: TrainConfig, metrics_path: Path, run_dir: Path) -> None:
    """The run's figures: training curves, and layer-wise measurements across training if recorded."""
    plot_curves(metrics_path, run_dir / CURVES_FILE)
    if cfg.measure_every:
        from .analysis import load_measure_records, plot_measure_history

        records = load_measure_records(metrics_path)
        if records:
            plot_measure_history(records, run_dir / MEASURE_FILE, step_key="epoch")


def _log(msg: str, dist: _Dist) -> None:
    if dist.main:
        print(msg, file=sys.stderr, flush=True)


def train(cfg: TrainConfig, *, resume: str | os.PathLike | None = None, hooks: Sequence[Hook] = ()) -> dict:
    """Run (or continue) a training / fine-tuning job; returns a summary with the final test metrics.

    Writes ``<run_dir>/{config.yaml, metrics.jsonl, curves.png, checkpoints/last.pt, model/}``.  With
    ``resume`` the configuration, weights, optimizer, schedule, scaler, RNG states and data position
    are restored from ``<resume>/checkpoints/last.pt`` and training continues exactly where it stopped.
    """
    dist, device = _init_distributed(cfg.device)
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    try:
        result = _train(cfg, dist, device, resume, hooks)
        if dist.enabled:
            torch.distributed.barrier()  # leave together: a rank tearing down gloo early can abort its peers
        return result
    finally:  # leave the calling process as it was (in-process callers, tests)
        if torch.get_num_threads() != threads:  # set_num_threads costs speed even when it changes nothing
            torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
        if dist.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _train(cfg: TrainConfig, dist: _Dist, device: torch.device, resume: Any, hooks: Sequence[Hook]) -> dict:
    t_start = time.time()
    if cfg.threads and cfg.threads != torch.get_num_threads():
        torch.set_num_threads(cfg.threads)
    _set_deterministic(cfg.deterministic)
    state: dict | None = None
    if resume is not None:
        run_dir = Path(resume)
        ckpt_path = run_dir / CHECKPOINT
        if not ckpt_path.is_file():
            raise ValueError(
                f"nothing to resume in {run_dir}: no {CHECKPOINT}; pass the run directory of a crate train run"
            )
        state = load_pickle(ckpt_path)
        if not isinstance(state, dict) or "train_config" not in state:
            raise ValueError(f"{ckpt_path} is not a crate training checkpoint")
    else:
        run_dir = Path(cfg.out) if cfg.out else _default_run_dir(cfg)
        run_dir = Path(_broadcast_object(str(run_dir), dist))
        if (run_dir / CHECKPOINT).exists():
            raise ValueError(
                f"run directory {run_dir} already holds a run; continue it with --resume {run_dir} or use another --out"
            )

    # ---- model and data (in memory; every rank holds the arrays and indexes its share of each global batch)
    _seed_everything(cfg.seed)  # identical initialisation on every rank
    if state is not None:  # resuming: the checkpoint holds the exact architecture (weights are loaded below)
        model = build_model(ModelConfig.from_dict(dict(state["model_config"])))
        image_size = model.config.image_size
    elif cfg.init_from is not None:  # fine-tuning: the checkpoint fixes the architecture
        model = load_model(cfg.init_from, name=cfg.model, **cfg.model_args)
        image_size = cfg.image_size or model.config.image_size
    else:
        if cfg.model is None:
            raise ValueError("no model given; pass --model NAME (see `crate models`)")
        image_size = cfg.image_size or int(cfg.model_args.get("image_size") or model_config(cfg.model).image_size)
    train_set, eval_set, test_set = _load_data(cfg, image_size)
    if state is not None:
        pass
    elif cfg.init_from is not None:
        if not (cfg.keep_head and model.config.num_classes == train_set.num_classes):
            model.reset_head(train_set.num_classes)  # the transfer protocol: a fresh head for the new classes
        if model.config.image_size != image_size:
            model.resize_pos_embed(image_size)  # bicubic interpolation of the learned position grid
    else:
        overrides = {"in_chans": train_set.channels, **cfg.model_args}
        overrides.update(num_classes=train_set.num_classes, image_size=image_size)
        model = build_model(model_config(cfg.model, **overrides))
    mean, std = _data_normalization(train_set, model.config.in_chans)
    model.config.extra = {
        **model.config.extra,
        "normalization": {"mean": mean, "std": std},
        "classes": list(train_set.classes),
        "dataset": train_set.name,
        "data": cfg.data if cfg.data.lower() in BUILTIN_DATASETS else str(Path(cfg.data).resolve()),
    }
    local_batch, rem = divmod(cfg.batch_size, dist.world)
    if rem:
        raise ValueError(
            f"batch_size {cfg.batch_size} is not divisible by {dist.world} processes; use a multiple of {dist.world}"
        )
    steps_per_epoch = len(train_set) // cfg.batch_size
    if steps_per_epoch == 0:
        raise ValueError(
            f"batch_size {cfg.batch_size} is larger than the {len(train_set)} training images; lower --batch-size"
        )
    total_steps = steps_per_epoch * cfg.epochs
    model.to(device)
    optimizer = _build_optimizer(model, cfg)
    warmup = round(cfg.warmup_epochs * steps_per_epoch)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(warmup, total_steps, cfg.min_lr / cfg.lr))
    amp_dtype = _amp_dtype(cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    step, epoch, batch_in_epoch = 0, 0, 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        scheduler.lr_lambdas[0] = WarmupCosine(warmup, total_steps, cfg.min_lr / cfg.lr)  # follows --epochs changes
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        step, epoch, batch_in_epoch = state["step"], state["data"]["epoch"], state["data"]["batch"]
        if state["data"]["num_samples"] != len(train_set) or state["data"]["global_batch"] != cfg.batch_size:
            raise ValueError("the training data or batch size changed since the checkpoint; resume with the same data")
    _seed_everything(cfg.seed + dist.rank)  # per-rank augmentation / dropout streams
    if state is not None:
        rngs = state["rng"]
        if len(rngs) == dist.world:
            _set_rng_state(rngs[dist.rank])
        else:
            _log(f"note: checkpoint has RNG states for {len(rngs)} process(es), running {dist.world}; reseeding", dist)

    raw_model = model
    if dist.enabled:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if cfg.compile:
        model = torch.compile(model)

    kind = (
        cfg.augment
        if cfg.augment != "auto"
        else default_augmentation(train_set.name, finetune=cfg.init_from is not None)
    )
    augment = build_augmentation(
        kind,
        image_size,
        translate=round(cfg.translate * train_set.image_size),  # applied at the data's native size
        crop_scale=(cfg.crop_scale, 1.0),
        hflip=cfg.hflip,
        randaugment_n=cfg.randaugment_n,
        randaugment_m=cfg.randaugment_m,
    ).to(device)
    channels = raw_model.config.in_chans
    batch_kw = dict(device=device, image_size=image_size, channels=channels, mean=mean, std=std)
    eval_kw = dict(
        mean=mean,
        std=std,
        image_size=image_size,
        channels=channels,
        batch_size=cfg.eval_batch_size,
        device=device,
        amp_dtype=amp_dtype,
        dist=dist,
    )
    fixed_n = min(len(eval_set), 64)
    fixed_batch = (prepare_batch(eval_set.images[:fixed_n], **batch_kw), eval_set.labels[:fixed_n].to(device))

    # ---- run directory (rank 0 writes)
    metrics_path = run_dir / METRICS_FILE
    ckpt_path = run_dir / CHECKPOINT
    if dist.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved = {**cfg.to_dict(), "model_config": raw_model.config.to_dict()}
        resolved["derived"] = {
            "world_size": dist.world,
            "local_batch": local_batch,
            "steps_per_epoch": steps_per_epoch,
            "total_steps": total_steps,
            "augment": kind,
            "image_size": image_size,
            "train_images": len(train_set),
            "eval_split": cfg.eval_split,
            "eval_images": len(eval_set),
            "parameters": raw_model.num_params(),
        }
        _write_yaml(run_dir / CONFIG_FILE, resolved)
        if state is not None:  # drop records of steps that were redone after the checkpoint
            kept = [r for r in _read_metrics(metrics_path) if r.get("step", 0) <= step and not r.get("final")]
            atomic_write(metrics_path, lambda tmp: Path(tmp).write_text("".join(json.dumps(r) + "\n" for r in kept)))
        elif metrics_path.exists():
            metrics_path.unlink()

    def log_records(records: Sequence[dict]) -> None:
        if dist.main and records:
            with open(metrics_path, "a") as f:
                f.write("".join(json.dumps(r) + "\n" for r in records))

    def save_checkpoint(reason: str) -> None:
        rngs = [_rng_state()]
        if dist.enabled:
            rngs = [None] * dist.world
            torch.distributed.all_gather_object(rngs, _rng_state())
        if not dist.main:
            return
        payload = {
            "model_config": raw_model.config.to_dict(),
            "model": {k: v.detach().cpu() for k, v in raw_model.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rngs,
            "data": {
                "epoch": epoch,
                "batch": batch_in_epoch,
                "seed": cfg.seed,
                "num_samples": len(train_set),
                "global_batch": cfg.batch_size,
            },
            "step": step,
            "epoch": epoch,
            "reason": reason,
            "train_config": cfg.to_dict(),
        }
        atomic_write(ckpt_path, lambda tmp: torch.save(payload, tmp))

    if dist.main:
        what = "fine-tuning" if cfg.init_from else "training"
        name = cfg.model or Path(str(cfg.init_from)).name
        procs = f" ({dist.world} processes x {local_batch})" if dist.enabled else ""
        _log(
            f"{what} {name} ({raw_model.num_params():,} params, {raw_model.config.arch}) on {train_set.name}: "
            f"{len(train_set)} train / {len(eval_set)} {cfg.eval_split} images, {image_size}px, augment={kind}, "
            f"{cfg.epochs} epochs x {steps_per_epoch} steps, batch {cfg.batch_size}{procs}, device {device}"
            + (f", resuming at step {step}" if state else "")
            + f"\nrun directory: {run_dir}",
            dist,
        )

    # ---- the loop
    pbar = None
    if dist.main and cfg.progress:
        from tqdm.auto import tqdm

        pbar = tqdm(total=total_steps, initial=step, desc="train", unit="step", dynamic_ncols=True, file=sys.stderr)
    last_step = min(total_steps, cfg.max_steps) if cfg.max_steps else total_steps
    # running sums since the last log, kept on the device: no host sync per step (loss·n, correct, n)
    window = torch.zeros(3, dtype=torch.float64, device=device)
    t_window = time.time()
    interrupted = False
    if cfg.measure_every:
        from .analysis import measure_hook

        hooks = [*hooks, measure_hook(every=cfg.measure_every)]

    def run_hooks() -> None:
        ctx = StepContext(raw_model, step, round(step / steps_per_epoch, 4), fixed_batch, run_dir, dist.main)
        for hook in hooks:
            records = hook(ctx)
            if records:
                log_records(records)

    if hooks and step == 0:  # the untrained model: the "random init" curve of Fig. 15
        run_hooks()
    model.train()
    with _Interrupt() as stop:
        while step < last_step and not interrupted:
            perm = epoch_permutation(len(train_set), cfg.seed, epoch)
            while batch_in_epoch < steps_per_epoch and step < last_step:
                lo = batch_in_epoch * cfg.batch_size + dist.rank * local_batch
                idx = perm[lo : lo + local_batch]
                x = prepare_batch(train_set.images[idx], augment=augment, **batch_kw)
                y = train_set.labels[idx].to(device, non_blocking=True)
                with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                    logits = model(x)
                    loss = F.cross_entropy(logits.float(), y, label_smoothing=cfg.label_smoothing)
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                if cfg.grad_clip > 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                step += 1
                batch_in_epoch += 1
                with torch.no_grad():
                    window[0] += loss.detach().double() * len(y)
                    window[1] += (logits.detach().argmax(-1) == y).sum()
                    window[2] += len(y)
                if pbar is not None:
                    pbar.update(1)

                if step % cfg.log_every == 0 or step == last_step:
                    if dist.enabled:
                        torch.distributed.all_reduce(window)
                    s_loss, s_correct, s_n = window.tolist()
                    if not math.isfinite(s_loss):
                        raise FloatingPointError(
                            f"the loss became {s_loss / s_n} by step {step}; lower --lr or keep --grad-clip on"
                        )
                    ips = s_n / max(time.time() - t_window, 1e-9)
                    record = {
                        "step": step,
                        "epoch": round(step / steps_per_epoch, 4),
                        "split": "train",
                        "loss": s_loss / s_n,
                        "acc": s_correct / s_n,
                        "lr": optimizer.param_groups[0]["lr"],
                        "images_per_s": ips,
                        "time": time.time() - t_start,
                    }
                    log_records([record])
                    if pbar is not None:
                        pbar.set_postfix_str(
                            f"ep {epoch + 1}/{cfg.epochs} loss {record['loss']:.3f} "
                            f"acc {100 * record['acc']:.1f}% {ips:,.0f} img/s"
                        )
                    window.zero_()
                    t_window = time.time()

                # Periodic hooks on a fixed batch (e.g. layer-wise measurements) run here.
                if hooks:
                    run_hooks()

                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    save_checkpoint("periodic")
                flag = stop.flag
                if dist.enabled:  # every rank must agree to stop at the same step
                    flag = _all_reduce_sum([float(flag)], dist, device)[0] > 0
                if flag:
                    interrupted = True
                    break
            if interrupted:
                break
            if batch_in_epoch >= steps_per_epoch:  # epoch finished
                epoch, batch_in_epoch = epoch + 1, 0
                if cfg.eval_every and epoch % cfg.eval_every == 0 and step < last_step:
                    r = evaluate(raw_model, eval_set, **eval_kw)
                    log_records(
                        [
                            {
                                "step": step,
                                "epoch": round(step / steps_per_epoch, 4),
                                "split": cfg.eval_split,
                                "loss": r.loss,
                                "acc": r.top1,
                                "top5": r.top5,
                                "time": time.time() - t_start,
                            }
                        ]
                    )
                    if pbar is not None:
                        pbar.write(f"epoch {epoch}: {cfg.eval_split} acc {100 * r.top1:.2f}%  loss {r.loss:.4f}")
                save_checkpoint("epoch")
    if pbar is not None:
        pbar.close()

    if interrupted:
        save_checkpoint("interrupted")
        if dist.main:
            _plot_run(cfg, metrics_path, run_dir)
        _log(
            f"interrupted at step {step}/{total_steps}: checkpoint saved to {ckpt_path}\n"
            f"continue with: crate {'finetune' if cfg.init_from else 'train'} --resume {run_dir}",
            dist,
        )
        return {"run_dir": str(run_dir), "step": step, "interrupted": True}

    # ---- final evaluation and artefacts
    final = evaluate(raw_model, test_set, **eval_kw)
    log_records(
        [
            {
                "step": step,
                "epoch": round(step / steps_per_epoch, 4),
                "split": "test",
                "loss": final.loss,
                "acc": final.top1,
                "top5": final.top5,
                "time": time.time() - t_start,
                "final": True,
            }
        ]
    )
    save_checkpoint("end")
    if dist.main:
        raw_model.save_pretrained(run_dir / "model")
        _plot_run(cfg, metrics_path, run_dir)
        elapsed = time.time() - t_start
        print(
            f"final test accuracy: {100 * final.top1:.2f}% "
            f"({round(final.top1 * final.num_samples)}/{final.num_samples}), "
            f"top-{final.k} {100 * final.top5:.2f}%, {raw_model.num_params():,} params, {elapsed:.0f} s, step {step}\n"
            f"run directory: {run_dir}  (config, metrics.jsonl, {CURVES_FILE}, {CHECKPOINT}, model/)\n"
            f"next: crate analyze {run_dir}    |    crate eval {run_dir}",
            flush=True,
        )
    return {
        "run_dir": str(run_dir),
        "step": step,
        "interrupted": False,
        "test_acc": final.top1,
        "test_top5": final.top5,
        "params": raw_model.num_params(),
        "seconds": time.time() - t_start,
    }


def _write_yaml(path: Path, data: dict) -> None:
    import yaml

    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))


# --------------------------------------------------------------------------- CLI
def _parse_model_args(items: Sequence[str]) -> dict:
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--model-args expects KEY=VALUE pairs (e.g. dim=64 depth=4), got {item!r}")
        out[key.strip().replace("-", "_")] = yaml.safe_load(value)
    valid = {f.name for f in dataclasses.fields(ModelConfig)}
    bad = sorted(set(out) - valid)
    if bad:
        raise ValueError(f"unknown model argument(s) {bad}; valid: {sorted(valid)}")
    return out


def _add_config_arguments(parser: argparse.ArgumentParser, command: str, defaults: dict | None = None) -> None:
    """Generate one ``--flag`` per TrainConfig field; unset flags stay absent so files/resume can fill them."""
    defaults = defaults or {}
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="YAML or JSON file of options (command-line flags override it)",
    )
    for f in dataclasses.fields(TrainConfig):
        meta = f.metadata
        if command not in meta.get("commands", ()):
            continue
        default = defaults.get(f.name, f.default if f.default is not dataclasses.MISSING else f.default_factory())
        flag = "--" + f.name.replace("_", "-")
        shown = meta.get("shown", " ".join(map(str, default)) if isinstance(default, list) else default)
        help_text = f"{meta['help']} (default: {shown if shown not in ({}, '', None) else 'none'})"
        kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": help_text}
        if "choices" in meta:
            kw["choices"] = meta["choices"]
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif f.name == "model_args":
            parser.add_argument(flag, nargs="+", metavar=meta["metavar"], **kw)
        elif f.name == "betas":
            parser.add_argument(flag, nargs=2, type=float, metavar=("B1", "B2"), **kw)
        else:
            typ = {"int": int, "float": float}.get(str(f.type).replace(" | None", ""), str)
            if "choices" not in meta:
                kw["metavar"] = meta.get("metavar", f.name.split("_")[-1].upper())
            parser.add_argument(flag, type=typ, **kw)
    # the help text above prints the defaults itself
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def _config_from_args(args: argparse.Namespace, base: TrainConfig) -> TrainConfig:
    cfg = base
    if getattr(args, "config", None):
        cfg = load_config(args.config, cfg)
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    given = {k: v for k, v in vars(args).items() if k in names}
    if "model_args" in given:
        given["model_args"] = {**cfg.model_args, **_parse_model_args(given["model_args"])}
    if "betas" in given:
        given["betas"] = list(given["betas"])
    return TrainConfig.from_dict(given, cfg)


def configure_train(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``crate train``."""
    parser.description = (
        "Train a classifier. With no arguments: CRATE (crate_mnist) on the 4,000 built-in MNIST training digits, "
        "evaluated on the fixed 1,000 held-out digits. Works unchanged under torchrun --nproc_per_node=N."
    )
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=argparse.SUPPRESS,
        help="continue a run from RUN_DIR/checkpoints/last.pt (its config.yaml is reused)",
    )
    _add_config_arguments(parser, "train")


def _resume_config(run_dir: str | os.PathLike) -> TrainConfig:
    ckpt = Path(run_dir) / CHECKPOINT
    if not ckpt.is_file():
        raise ValueError(f"nothing to resume in {run_dir}: no {CHECKPOINT}; pass the directory of a crate train run")
    state = load_pickle(ckpt)
    if not isinstance(state, dict) or "train_config" not in state:
        raise ValueError(f"{ckpt} is not a crate training checkpoint (no train_config)")
    return TrainConfig.from_dict(dict(state["train_config"]))


def run_train(args: argparse.Namespace) -> int:
    """``crate train``: returns 0 on completion, 130 when interrupted (checkpoint saved)."""
    resume = getattr(args, "resume", None)
    base = _resume_config(resume) if resume else TrainConfig()
    cfg = _config_from_args(args, base)
    result = train(cfg, resume=resume)
    return 130 if result["interrupted"] else 0


def configure_finetune(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``crate finetune``."""
    parser.description = (
        "Fine-tune all weights from a checkpoint on new data (JMLR Table 1 transfer protocol): a fresh head for the "
        "new classes, position embeddings interpolated to the new image size, AdamW lr 5e-5, wd 0.01, RandAugment."
    )
    parser.add_argument(
        "--from",
        dest="init_from",
        metavar="CHECKPOINT",
        default=argparse.SUPPRESS,
        help="a save_pretrained dir, a crate train run dir, a training-state .pt, or an official "
        ".pth (then also --model NAME and --model-args for its architecture)",
    )
    parser.add_argument(
        "--resume", metavar="RUN_DIR", default=argparse.SUPPRESS, help="continue an interrupted fine-tuning run"
    )
    _add_config_arguments(parser, "finetune", {**FINETUNE_DEFAULTS, "data": "(required)", "model": "(from checkpoint)"})


def run_finetune(args: argparse.Namespace) -> int:
    """``crate finetune``."""
    resume = getattr(args, "resume", None)
    if resume:
        cfg = _config_from_args(args, _resume_config(resume))
    else:
        if not getattr(args, "init_from", None):
            raise ValueError("crate finetune needs --from CHECKPOINT (a model dir, run dir or official .pth)")
        if not getattr(args, "data", None) and not getattr(args, "config", None):
            raise ValueError("crate finetune needs --data (a dataset name or folder)")
        # the checkpoint defines the architecture; --model only names an official checkpoint's
        base = TrainConfig.from_dict({**FINETUNE_DEFAULTS, "init_from": args.init_from, "model": None})
        cfg = _config_from_args(args, base)
    result = train(cfg, resume=resume)
    return 130 if result["interrupted"] else 0


def configure_eval(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``crate eval``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # the help texts state their defaults
    parser.add_argument("checkpoint", help="a run dir, save_pretrained dir, training-state .pt or official .pth")
    parser.add_argument("--data", default=None, help="dataset name or folder (default: the one it was trained on)")
    parser.add_argument("--split", default="test", choices=("train", "val", "test"), help="split (default: test)")
    parser.add_argument("--val-fraction", type=float, default=0.0, help="as in training, for --split val (default: 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the val split, as in training (default: 0)")
    parser.add_argument("--model", default=None, help="architecture of an official checkpoint, e.g. crate_tiny")
    parser.add_argument("--model-args", nargs="+", default=[], metavar="KEY=VALUE", help="architecture overrides")
    parser.add_argument("--batch-size", type=int, default=500, help="evaluation batch size (default: 500)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (default: auto)")
    parser.add_argument(
        "--on-bad-image",
        default="skip",
        choices=("skip", "error"),
        help="unreadable image files: skip (with a warning count) | error (default: skip)",
    )
    parser.add_argument("--out", default=None, help="output folder (default: <checkpoint dir>/eval-<data>-<split>)")


def run_eval(args: argparse.Namespace) -> int:
    """``crate eval``: top-1/top-5, per-class accuracy, ``confusion.png`` and ``eval.json``."""
    model = load_model(args.checkpoint, name=args.model, **_parse_model_args(args.model_args))
    if args.batch_size <= 0:
        raise ValueError(f"--batch-size must be positive, got {args.batch_size}")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    c = model.config
    data = args.data or c.extra.get("data")
    if not data:
        raise ValueError("this checkpoint does not record its training data; pass --data (e.g. --data mnist)")
    image_size = c.image_size
    data_size = image_size if _is_image_folder(data) else None
    ds = load_dataset(
        data,
        args.split,
        image_size=data_size,
        val_fraction=args.val_fraction,
        seed=args.seed,
        on_bad_image=args.on_bad_image,
    )
    mean, std = _normalization(model, ds)
    model.to(device)
    r = evaluate(
        model,
        ds,
        mean=mean,
        std=std,
        image_size=image_size,
        channels=c.in_chans,
        batch_size=args.batch_size,
        device=device,
    )
    src = Path(args.checkpoint)
    out = Path(args.out) if args.out else (src if src.is_dir() else src.parent) / f"eval-{Path(data).name}-{args.split}"
    out.mkdir(parents=True, exist_ok=True)
    png = plot_confusion_matrix(
        r.confusion,
        r.classes,
        out / "confusion.png",
        title=f"{Path(data).name} {args.split}: top-1 {100 * r.top1:.2f}%",
    )
    report = {"checkpoint": str(src), "data": data, "split": args.split, **r.to_dict()}
    atomic_write(out / "eval.json", lambda tmp: Path(tmp).write_text(json.dumps(report, indent=1) + "\n"))
    print(
        f"{ds.name} {args.split}: {r.num_samples} images, top-1 {100 * r.top1:.2f}%, top-{r.k} {100 * r.top5:.2f}%, "
        f"loss {r.loss:.4f}"
    )
    width = max(len(n) for n in r.classes)
    for name, acc, row in zip(r.classes, r.per_class, r.confusion):
        print(f"  {name:<{width}}  {100 * acc:6.2f}%  (n={sum(row)})")
    print(f"confusion matrix: {png}\nreport: {out / 'eval.json'}")
    return 0
