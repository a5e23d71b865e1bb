"""Classification accuracy and the figures of a run: training curves and the confusion matrix."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..analysis.figures import subplots
from ..data import ImageSource, match_channels, normalize, to_device
from ..errors import OptionError
from ..io import atomic_write
from ..layers.inference import evaluating
from .rundir import read_metrics
from .runtime import Runtime

__all__ = [
    "EvalResult",
    "evaluate",
    "require_evaluated",
    "prepare_batch",
    "plot_curves",
    "plot_confusion_matrix",
    "plot_knn",
    "subplots",
    "save_figure",
]


def require_evaluated(n: float, unit: str, data: object) -> None:
    """Refuse an evaluation that saw nothing (``n`` = 0 samples, summed over processes).

    Every evaluator of every task calls it: an evaluation over nothing has no score, and reporting one
    (a loss of 0, perplexity 1, accuracy 0/0) would read as a result.
    """
    if n <= 0:
        split, name = getattr(data, "split", ""), getattr(data, "name", "")
        where = f"the {split} split of {name}" if split and name else (name or "the evaluation data")
        raise ValueError(
            f"nothing to evaluate: {where} gave no {unit} (it is empty, or every one of them was unreadable and "
            "skipped); an evaluation over nothing has no score — check the data and the split options"
        )


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
    x = to_device(images, device).float().div_(255.0)
    x = match_channels(x, channels)
    if augment is not None:
        x = augment(x)
    if x.shape[-2:] != (image_size, image_size):
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", antialias=True, align_corners=False)
    return normalize(x, mean, std)


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

    @property
    def has_top_k(self) -> bool:
        """Whether top-k says anything: with k = the number of classes it is 100% whatever the model does."""
        return self.k < len(self.classes)

    def top_k_text(self) -> str:
        """``", top-5 97.30%"`` for the printed lines, or nothing when :attr:`has_top_k` is false."""
        return f", top-{self.k} {100 * self.top5:.2f}%" if self.has_top_k else ""


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset: ImageSource,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    image_size: int,
    channels: int,
    batch_size: int = 500,
    device: torch.device | str = "cpu",
    runtime: Runtime | None = None,
) -> EvalResult:
    """Top-1 / top-k accuracy, mean loss, per-class accuracy and the confusion matrix on ``dataset``.

    Under torch.distributed each process evaluates its share of every batch and the counts are summed.
    """
    rt = runtime or Runtime(device=torch.device(device))
    with evaluating(model):
        return _evaluate(model, dataset, rt, batch_size, image_size, channels, mean, std)


def _evaluate(
    model: nn.Module,
    dataset: ImageSource,
    rt: Runtime,
    batch_size: int,
    image_size: int,
    channels: int,
    mean: Sequence[float],
    std: Sequence[float],
) -> EvalResult:
    n_cls = len(dataset.classes)
    k = min(5, n_cls)
    confusion = torch.zeros(n_cls, n_cls, dtype=torch.float64, device=rt.device)
    sums = torch.zeros(2, dtype=torch.float64, device=rt.device)  # loss sum, top-k hits
    for images, labels in dataset.batches(batch_size, shuffle=False, at=rt.position()):
        x = prepare_batch(images, device=rt.device, image_size=image_size, channels=channels, mean=mean, std=std)
        y = to_device(labels, rt.device)
        with rt.autocast():
            logits = model(x)
        logits = logits.float()
        if logits.shape[-1] != n_cls:
            raise OptionError(
                f"the model predicts {logits.shape[-1]} classes but the data has {n_cls}; fine-tune it on this data "
                "first (task='classification' with init_from)"
            )
        sums[0] += F.cross_entropy(logits, y, reduction="sum")
        sums[1] += (logits.topk(k, dim=-1).indices == y[:, None]).any(-1).sum()
        confusion.view(-1).index_add_(0, y * n_cls + logits.argmax(-1), torch.ones_like(y, dtype=torch.float64))
    rt.all_reduce(confusion)
    rt.all_reduce(sums)
    confusion, (loss_sum, top_k) = confusion.cpu(), sums.tolist()
    n = int(confusion.sum().item())
    require_evaluated(n, "images", dataset)
    per_class = (confusion.diagonal() / confusion.sum(1).clamp_min(1)).tolist()
    return EvalResult(
        top1=float(confusion.diagonal().sum().item()) / n,
        top5=float(top_k) / n,
        loss=loss_sum / n,
        num_samples=n,
        per_class=[float(v) for v in per_class],
        confusion=confusion.long().tolist(),
        classes=list(dataset.classes),
        k=k,
    )


def save_figure(fig: Any, out_png: str | os.PathLike) -> Path:
    """Write ``fig`` as a PNG (dpi 90), atomically."""
    out_png = Path(out_png)
    atomic_write(out_png, lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
    return out_png


def plot_curves(metrics_path: str | os.PathLike, out_png: str | os.PathLike, metric: str = "acc") -> Path:
    """Loss, ``metric`` (accuracy by default; skipped if never recorded) and learning rate against the step."""
    records = read_metrics(metrics_path)
    train_r = [r for r in records if r.get("split") == "train"]
    eval_splits = sorted({r["split"] for r in records if r.get("split") in ("val", "test")})
    has_metric = any(metric in r for r in records)
    fig, axes = subplots(1, 3 if has_metric else 2, figsize=(13 if has_metric else 9, 3.6))
    ax_loss, ax_lr = axes[0], axes[-1]
    ax_m = axes[1] if has_metric else None
    scale = 100 if metric == "acc" else 1
    if train_r:
        steps = [r["step"] for r in train_r]
        ax_loss.plot(steps, [r["loss"] for r in train_r], label="train", lw=1)
        ax_lr.plot(steps, [r["lr"] for r in train_r], color="tab:gray")
        if ax_m is not None:
            ax_m.plot(steps, [scale * r.get(metric, np.nan) for r in train_r], label="train", lw=1)
    for split in eval_splits:
        rs = [r for r in records if r.get("split") == split]
        ax_loss.plot([r["step"] for r in rs], [r.get("loss", np.nan) for r in rs], "o-", label=split, ms=3)
        if ax_m is not None:
            ax_m.plot([r["step"] for r in rs], [scale * r.get(metric, np.nan) for r in rs], "o-", label=split, ms=3)
    ax_loss.set(title="loss", xlabel="step")
    ax_lr.set(title="learning rate", xlabel="step")
    for ax in (ax_loss, ax_m):
        if ax is not None:
            ax.legend()
            ax.grid(alpha=0.3)
    if ax_m is not None:
        ax_m.set(title="accuracy (%)" if metric == "acc" else metric, xlabel="step")
        accs = [scale * r[metric] for r in records if r.get("split") in eval_splits and metric in r]
        if accs and metric == "acc":
            ax_m.set_ylim(max(0, min(accs) - 5), 100.5)
    fig.tight_layout()
    return save_figure(fig, out_png)


def plot_confusion_matrix(
    confusion: Sequence[Sequence[int]], classes: Sequence[str], out_png: str | os.PathLike, title: str = ""
) -> Path:
    """Save a confusion matrix (rows: true class, columns: predicted; colour: row-normalised) as a PNG."""
    from sklearn.metrics import ConfusionMatrixDisplay

    m = np.asarray(confusion, dtype=np.int64)
    n = len(classes)
    size = min(14.0, 3.0 + 0.4 * n)
    fig, ax = subplots(figsize=(size, size))
    disp = ConfusionMatrixDisplay(m, display_labels=list(classes) if n <= 30 else None)
    disp.plot(ax=ax, cmap="Blues", colorbar=False, include_values=n <= 15, values_format="d")
    disp.im_.set_data(m / np.maximum(m.sum(1, keepdims=True), 1))  # colour by recall, numbers stay counts
    disp.im_.set_clim(0, 1)
    if n <= 30 and max(map(len, classes)) > 2:
        ax.tick_params(axis="x", labelrotation=90)
    ax.set(xlabel="predicted", ylabel="true", title=title or "confusion matrix")
    fig.tight_layout()
    return save_figure(fig, out_png)


def plot_knn(accuracy: Mapping[int, float], out_png: str | os.PathLike, title: str = "") -> Path:
    """Save weighted k-NN top-1 accuracy against k (log axis) as a PNG."""
    ks = sorted(accuracy)
    fig, ax = subplots(figsize=(4.5, 3.2))
    ax.plot(ks, [100 * accuracy[k] for k in ks], "o-")
    for k in ks:
        ax.annotate(
            f"{100 * accuracy[k]:.1f}",
            (k, 100 * accuracy[k]),
            textcoords="offset points",
            xytext=(0, 5),
            ha="center",
            fontsize=8,
        )
    ax.set(xscale="log", xlabel="k", ylabel="top-1 accuracy (%)", title=title or "weighted k-NN")
    ax.set_xticks(ks, [str(k) for k in ks])
    fig.tight_layout()
    return save_figure(fig, out_png)
