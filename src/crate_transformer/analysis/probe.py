"""Frozen-feature evaluation of any encoder: weighted k-NN and a linear probe.

The protocols of the self-supervised evaluations (JMLR §4.1.2-4.1.3, Tables 3-4): features of a
frozen encoder on the training split and the held-out split, then

* a weighted k-NN classifier on l2-normalised features, each of the k nearest training samples voting
  for its class with weight ``exp(cos / T)``, T = 0.07 (Wu et al. 2018; DINO's ``eval_knn.py``);
* a linear probe: multinomial logistic regression (scikit-learn) on standardised features, or
  (:func:`sgd_linear_probe`) MAE / DINO's protocol: a BatchNorm1d without affine parameters before a linear
  head, trained with LARS (or SGD with momentum) on a warm-up + cosine schedule (MAE ``main_linprobe.py``).

Any model with ``forward_features(x) -> (b, 1 + N, d)`` tokens works: classifiers, the MAE encoder,
a DINO teacher backbone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers.inference import evaluating
from ..models.base import POOLS, pool_tokens

__all__ = [
    "POOLS",
    "pool_tokens",
    "extract_features",
    "knn_classify",
    "knn_sweep",
    "usable_ks",
    "linear_probe",
    "sgd_linear_probe",
    "ProbeResult",
    "POOL_WORDS",
    "pool_words",
    "default_probe_pool",
    "frozen_probe",
    "fit_probe",
]

KNN_KS = (10, 20, 100, 200)
# what each pooling of POOLS feeds a probe or a k-NN, as every printed figure names it
POOL_WORDS = {
    "cls": "class token",
    "avg": "mean of the patch tokens",
    "mean": "mean of all tokens, class token included",
}


def pool_words(pool: str) -> str:
    """``"mean of the patch tokens (pool=avg)"``: the features a probe or k-NN figure was computed on."""
    return f"{POOL_WORDS[pool]} (pool={pool})"


def default_probe_pool(model: nn.Module, run: str | None = None) -> str:
    """The pooling a frozen-feature evaluation of ``model`` uses unless told: the one the run's own summary probe
    used (``probe.json``'s ``pool`` in the run directory ``run``: MAE pre-training), else the model config's
    ``pool`` (a classifier's head, a DINO run's feature), else the mean of the patch tokens (the paper's global
    average pooling, eq. (72), p.40), so that ``crate eval`` on a pre-trained run reports the number its summary
    printed."""
    import json
    from pathlib import Path

    if run is not None:
        for folder in (Path(run), Path(run).parent, Path(run).parent.parent):
            if (folder / "probe.json").is_file() and (folder / "config.yaml").is_file():
                pool = json.loads((folder / "probe.json").read_text()).get("pool")
                if pool in POOLS:
                    return pool
    return getattr(model.config, "pool", None) or "avg"


def frozen_probe(
    model: nn.Module,
    train: object,
    test: object,
    *,
    pool: str,
    protocol: str = "logistic",
    C: float = 1.0,
    **features: object,
) -> tuple[ProbeResult, dict]:
    """The one linear probe of frozen features (MAE's and DINO's summaries, ``crate eval --linear-probe``):
    ``pool``-ed features of ``train`` and ``test`` (:func:`extract_features` with ``features``), then
    :func:`linear_probe` (``protocol="logistic"``, inverse L2 strength ``C``) or :func:`sgd_linear_probe`
    (``"lars"`` / ``"sgd"``).  Returns the result and its record, which names the pooling (``pool``, ``features``)."""
    tx, ty = extract_features(model, train, pool=pool, **features)
    ex, ey = extract_features(model, test, pool=pool, **features)
    result = fit_probe(tx, ty, ex, ey, protocol, C)
    return result, {**result.to_dict(), "pool": pool, "features": pool_words(pool), "dim": int(tx.shape[1])}


def fit_probe(
    train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, protocol: str = "logistic", C: float = 1.0
) -> ProbeResult:
    """The probe of :func:`frozen_probe` on features already extracted: logistic regression (``C``), or MAE's LARS /
    DINO's SGD protocol (:func:`sgd_linear_probe`, batches of at most 256)."""
    if protocol == "logistic":
        return linear_probe(train_x, train_y, test_x, test_y, C=C)
    return sgd_linear_probe(train_x, train_y, test_x, test_y, optimizer=protocol, batch_size=min(256, len(train_y)))


@torch.no_grad()
def extract_features(
    model: nn.Module,
    source: object,
    *,
    pool: str = "cls",
    batch_size: int = 256,
    device: str | torch.device | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    image_size: int | None = None,
    channels: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Pooled encoder features ``(n, d)`` (float32, CPU) and labels ``(n,)`` of every image of ``source``.

    ``source`` is an :class:`~crate_transformer.data.ImageSource` (uint8 batches); images are prepared as
    in evaluation (to [0, 1], channels matched, resized to ``image_size``, normalised by ``mean``/``std``,
    which default to the model's recorded data normalisation, else the source's statistics).
    """
    from ..data import resolve_normalization
    from ..train.evaluation import prepare_batch

    if pool not in POOLS:
        raise ValueError(f"unknown pooling {pool!r}; choose one of {POOLS}")
    config = model.config
    if mean is None or std is None:
        norm = resolve_normalization(model, source)
        if norm is None:
            raise ValueError("no normalisation known for this model or data; pass mean= and std=")
        mean, std = norm
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device)
    feats, labels = [], []
    with evaluating(model):
        for images, y in source.batches(batch_size, shuffle=False):
            x = prepare_batch(
                images,
                device=device,
                image_size=image_size or config.image_size,
                channels=channels or config.in_chans,
                mean=mean,
                std=std,
            )
            feats.append(pool_tokens(model.forward_features(x), pool, model.num_prefix_tokens).float().cpu())
            labels.append(y.cpu())
    if not feats:
        raise ValueError(f"{getattr(source, 'name', 'the data')} has no images to extract features from")
    return torch.cat(feats), torch.cat(labels).long()


@torch.no_grad()
def knn_sweep(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    ks: Sequence[int] = KNN_KS,
    temperature: float = 0.07,
    num_classes: int | None = None,
    chunk: int = 1024,
) -> dict[int, float]:
    """Weighted k-NN top-1 accuracy for each k of ``ks`` (one similarity search for all of them).

    Cosine similarities ``s`` of l2-normalised features; the k nearest training samples vote for their
    class with weight ``exp(s / temperature)``; ties go to the lower class index.  A k larger than the
    training set is refused (every sample would vote: not a k-NN score); :func:`usable_ks` keeps the others.
    Votes are counted over the classes that occur in ``train_y`` only, so no label sizes an allocation.
    """
    _check_features(train_x, train_y, test_x, test_y)
    if not ks or min(ks) < 1:
        raise ValueError(f"k must be positive integers, got {list(ks)}")
    if max(ks) > len(train_x):
        raise ValueError(f"k={max(ks)} is more than the {len(train_x)} training samples; use k <= {len(train_x)}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    _check_labels(train_y, test_y, num_classes)
    classes, train_c = torch.unique(train_y, return_inverse=True)  # sorted: ties still go to the lower label
    train_n, test_n = F.normalize(train_x.float(), dim=1), F.normalize(test_x.float(), dim=1)
    correct = {k: 0 for k in ks}
    for start in range(0, len(test_n), chunk):
        sim, idx = (test_n[start : start + chunk] @ train_n.T).topk(max(ks), dim=1)  # sorted, nearest first
        votes = F.one_hot(train_c[idx], len(classes)).float() * (sim / temperature).exp().unsqueeze(-1)
        truth = test_y[start : start + chunk]
        for k in ks:
            pred = classes[votes[:, :k].sum(dim=1).argmax(dim=1)]
            correct[k] += int((pred == truth).sum())
    return {k: correct[k] / len(test_n) for k in ks}


def usable_ks(ks: Sequence[int], num_train: int) -> tuple[list[int], list[int]]:
    """``(ks that a k-NN over num_train samples can use, the ks above num_train)``."""
    return [k for k in ks if k <= num_train], [k for k in ks if k > num_train]


def _check_labels(train_y: Tensor, test_y: Tensor, num_classes: int | None) -> None:
    """Class labels are indices ``0..num_classes-1`` (``num_classes`` when given)."""
    lo = int(min(train_y.min(), test_y.min()))
    hi = int(max(train_y.max(), test_y.max()))
    if lo < 0 or (num_classes is not None and hi >= num_classes):
        bad = lo if lo < 0 else hi
        within = f"0..{num_classes - 1}" if num_classes is not None else "0, 1, 2, ..."
        raise ValueError(f"label {bad} is not a class index {within}; check the labels")


def knn_classify(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    k: int = 20,
    temperature: float = 0.07,
    num_classes: int | None = None,
) -> float:
    """Weighted k-NN top-1 accuracy for one ``k`` (see :func:`knn_sweep`; ``k`` at most the training samples)."""
    return knn_sweep(train_x, train_y, test_x, test_y, ks=(k,), temperature=temperature, num_classes=num_classes)[k]


@dataclass
class ProbeResult:
    """A fitted linear probe: accuracies and the classifier in the original feature space."""

    acc: float
    train_acc: float
    C: float
    num_train: int
    num_test: int
    weight: Tensor  # (classes, d): logits = features @ weight.T + bias
    bias: Tensor
    protocol: str = "logistic"  # logistic (scikit-learn; C its inverse L2 strength) | lars | sgd (C = 0)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("weight"), d.pop("bias")
        return d


def linear_probe(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    C: float = 1.0,
    max_iter: int = 2000,
) -> ProbeResult:
    """Multinomial logistic regression (L2, inverse strength ``C``) on standardised features.

    The returned ``weight``/``bias`` act on the raw features (the standardisation folded in), so the
    probe can initialise a linear head.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    _check_features(train_x, train_y, test_x, test_y)
    if C <= 0:
        raise ValueError(f"C must be positive, got {C}")
    xtr, xte = train_x.double().numpy(), test_x.double().numpy()
    ytr, yte = train_y.numpy(), test_y.numpy()
    if len(np.unique(ytr)) < 2:
        raise ValueError("a linear probe needs training features of at least two classes")
    scaler = StandardScaler().fit(xtr)
    clf = LogisticRegression(C=C, max_iter=max_iter).fit(scaler.transform(xtr), ytr)
    w = clf.coef_ / scaler.scale_  # fold the standardisation into the weights
    b = clf.intercept_ - w @ scaler.mean_
    if w.shape[0] == 1:  # sklearn's binary form: one row for class 1
        w, b = np.concatenate([-w, w]) / 2, np.concatenate([-b, b]) / 2
    return ProbeResult(
        acc=float(clf.score(scaler.transform(xte), yte)),
        train_acc=float(clf.score(scaler.transform(xtr), ytr)),
        C=C,
        num_train=len(ytr),
        num_test=len(yte),
        weight=torch.from_numpy(w).float(),
        bias=torch.from_numpy(b).float(),
    )


def sgd_linear_probe(
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    optimizer: str = "lars",
    epochs: int = 90,
    batch_size: int = 256,
    blr: float = 0.1,
    warmup_epochs: int = 10,
    weight_decay: float = 0.0,
    momentum: float = 0.9,
    seed: int = 0,
) -> ProbeResult:
    """MAE's linear probe (``main_linprobe.py``, DINO's likewise) on frozen features: ``BatchNorm1d(d,
    affine=False, eps=1e-6)`` then ``Linear(d, classes)`` (weight ~ trunc. normal, std 0.01; bias 0), trained by
    LARS (``optimizer="lars"``, MAE) or SGD with momentum (``"sgd"``, DINO) on shuffled mini-batches, lr =
    ``blr · batch_size / 256`` per iteration with a linear warm-up over ``warmup_epochs`` then a half-cycle
    cosine to 0.  MAE's ImageNet values: 90 epochs, batch 16384, blr 0.1, 10 warm-up epochs, no weight decay.

    The returned ``weight``/``bias`` act on the raw features: the BatchNorm's running statistics are folded in.
    """
    from ..train.optim import LARS

    _check_features(train_x, train_y, test_x, test_y)
    if optimizer not in ("lars", "sgd") or epochs < 1 or batch_size < 1:
        raise ValueError(
            f"need optimizer lars | sgd, epochs >= 1, batch_size >= 1; got {optimizer!r}, {epochs}, {batch_size}"
        )
    gen = torch.Generator().manual_seed(seed)
    classes = int(max(train_y.max(), test_y.max())) + 1
    bn = nn.BatchNorm1d(train_x.shape[1], affine=False, eps=1e-6)
    head = nn.Linear(train_x.shape[1], classes)
    with torch.no_grad():
        head.weight.copy_(nn.init.trunc_normal_(torch.empty_like(head.weight), std=0.01, generator=gen))
        head.bias.zero_()
    lr = blr * batch_size / 256
    opt_cls = LARS if optimizer == "lars" else torch.optim.SGD
    opt = opt_cls(head.parameters(), lr=lr, weight_decay=weight_decay, momentum=momentum)
    x, y = train_x.float(), train_y.long()
    steps = max(1, len(x) // batch_size)  # MAE's loader drops the last incomplete batch
    for epoch in range(epochs):
        order = torch.randperm(len(x), generator=gen)
        for i in range(steps):
            for g in opt.param_groups:
                g["lr"] = _warmup_cosine(lr, epoch + i / steps, warmup_epochs, epochs)
            idx = order[i * batch_size : (i + 1) * batch_size]
            loss = F.cross_entropy(head(bn(x[idx])), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return _folded_result(bn, head, train_x, train_y, test_x, test_y, optimizer)


def _folded_result(
    bn: nn.BatchNorm1d, head: nn.Linear, train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, protocol: str
) -> ProbeResult:
    """The probe's result with the BatchNorm's running statistics folded into the linear head."""
    with torch.no_grad():
        scale = (bn.running_var + bn.eps).rsqrt()
        w = head.weight * scale
        b = head.bias - w @ bn.running_mean
    acc = lambda fx, fy: float(((fx.float() @ w.T + b).argmax(1) == fy).float().mean())  # noqa: E731
    return ProbeResult(
        acc=acc(test_x, test_y),
        train_acc=acc(train_x, train_y),
        C=0.0,
        num_train=len(train_y),
        num_test=len(test_y),
        weight=w.detach(),
        bias=b.detach(),
        protocol=protocol,
    )


def _warmup_cosine(lr: float, epoch: float, warmup: int, epochs: int) -> float:
    """MAE's ``util/lr_sched.adjust_learning_rate`` at a fractional ``epoch`` (min_lr 0)."""
    if epoch < warmup:
        return lr * epoch / warmup
    return lr * 0.5 * (1.0 + math.cos(math.pi * (epoch - warmup) / max(epochs - warmup, 1)))


def _check_features(train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor) -> None:
    for name, x, y in (("train", train_x, train_y), ("test", test_x, test_y)):
        if x.ndim != 2 or y.ndim != 1 or len(x) != len(y) or len(x) == 0:
            raise ValueError(
                f"{name} features must be (n, d) with n >= 1 labels (n,), got {tuple(x.shape)} and {tuple(y.shape)}"
            )
        if not torch.isfinite(x).all():
            raise ValueError(f"{name} features contain NaN or inf; check the encoder's weights and inputs")
    if train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"train and test features differ in width: {train_x.shape[1]} vs {test_x.shape[1]}")
