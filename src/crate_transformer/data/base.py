"""The contract between data sources and the training engine.

A labelled image source (in memory, a streamed image folder, WebDataset shards, a Hugging Face
dataset on disk) is an :class:`ImageSource`: it knows its length, classes, channel count and
training-pool statistics, and yields uint8 batches through :meth:`ImageSource.batches`.

The order of an epoch is a function of ``(seed, epoch)`` only (:func:`epoch_permutation`), identical
on every process and after a resume, so a run killed at ``(epoch, batch)`` continues with exactly the
batches it would have seen.  Under DDP every process takes its own contiguous slice of each *global*
batch, so one global batch is the same set of samples whatever the number of processes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "MAX_CLASSES",
    "ORIGIN",
    "ImageSource",
    "Position",
    "class_count",
    "epoch_generator",
    "epoch_permutation",
    "global_batches",
    "local_batches",
    "rank_slice",
]


MAX_CLASSES = 100_000  # integer labels 0..max name at most this many classes unless every one of them occurs


def class_count(labels: Sequence[int] | Tensor, where: str, fix: str) -> int:
    """The number of classes ``0..max`` that integer ``labels`` imply, checked before anything is sized by it.

    A label is a class index: negative labels are refused, and so is a maximum that would make more than
    :data:`MAX_CLASSES` classes while most of them never occur (one label of 10**9 would otherwise make a
    billion class names, one-hot rows and classifier outputs).  ``where`` names the data, ``fix`` the remedy.
    """
    values = labels.tolist() if hasattr(labels, "tolist") else list(labels)
    if not values:
        return 0
    lo, hi = min(values), max(values)
    if lo < 0:
        raise ValueError(f"{where}: the label {lo} is not a class index (0, 1, 2, ...); {fix}")
    distinct = len(set(values))
    if hi >= MAX_CLASSES and distinct < hi + 1:
        raise ValueError(
            f"{where}: the label {hi:,} would make {hi + 1:,} classes for {distinct:,} distinct labels "
            f"(more than {MAX_CLASSES:,} classes are accepted only when every index 0..max occurs); {fix}"
        )
    return hi + 1


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A generator seeded by (seed, epoch) only: every draw from it is the same on every rank and on resume."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> Tensor:
    """The training order of ``epoch``: a function of (seed, epoch) only, identical on every rank and on resume."""
    return torch.randperm(num_samples, generator=epoch_generator(seed, epoch))


def rank_slice(batch: Tensor, rank: int, world: int) -> Tensor:
    """This process's contiguous share of one global batch (shares differ by at most one sample)."""
    return torch.tensor_split(batch, world)[rank] if world > 1 else batch


@dataclass(frozen=True)
class Position:
    """Where one process is in the data: which epoch order, which batch of it, and which share of each batch.

    * ``seed``, ``epoch`` — the epoch's order is a function of these two only (:func:`epoch_permutation`), so
      global batch ``i`` of epoch ``e`` holds the same samples on every process, for any ``world`` and after a
      resume.
    * ``start`` — global batches already consumed this epoch: iteration begins at global batch ``start`` (the
      resume position; a checkpoint's ``TrainState.batch``).
    * ``rank``, ``world`` — this process is ``rank`` of ``world`` and takes its contiguous share of each global
      batch (:func:`rank_slice`); ``world=1`` is a single process.
    """

    seed: int = 0
    epoch: int = 0
    start: int = 0
    rank: int = 0
    world: int = 1

    def __post_init__(self) -> None:
        for name in ("epoch", "start", "rank"):
            if getattr(self, name) < 0:
                raise ValueError(f"Position({name}={getattr(self, name)}) is negative; pass {name} >= 0")
        if self.world < 1:
            raise ValueError(f"Position(world={self.world}) has no process; pass world >= 1")
        if self.rank >= self.world:
            raise ValueError(f"Position(rank={self.rank}) is not one of {self.world} processes; pass rank < world")


ORIGIN = Position()  # seed 0, epoch 0, from its first batch, a single process: every batches()'s default


def global_batches(
    num_samples: int, batch_size: int, *, shuffle: bool, at: Position = ORIGIN, drop_last: bool = True
) -> Iterator[Tensor]:
    """Index tensors of the global batches of epoch ``at.epoch``, from global batch ``at.start`` on
    (``at.rank`` / ``at.world`` are not read: a global batch is the same for every world).

    Training (``shuffle=True, drop_last=True``) visits ``num_samples // batch_size`` full batches in the
    order of :func:`epoch_permutation`; evaluation (``shuffle=False, drop_last=False``) visits every
    sample once, in order.
    """
    order = epoch_permutation(num_samples, at.seed, at.epoch) if shuffle else torch.arange(num_samples)
    n_batches = num_samples // batch_size if drop_last else -(-num_samples // batch_size)
    for b in range(at.start, n_batches):
        yield order[b * batch_size : (b + 1) * batch_size]


def local_batches(
    num_samples: int, batch_size: int, *, shuffle: bool, at: Position = ORIGIN, drop_last: bool | None = None
) -> Iterator[Tensor]:
    """This process's indices of each global batch (:func:`global_batches`, then :func:`rank_slice` by
    ``at.rank`` of ``at.world``); ``drop_last`` defaults to ``shuffle``, and a process with an empty share of a
    batch skips it."""
    drop_last = shuffle if drop_last is None else drop_last
    for idx in global_batches(num_samples, batch_size, shuffle=shuffle, at=at, drop_last=drop_last):
        mine = rank_slice(idx, at.rank, at.world)
        if len(mine):
            yield mine


class ImageSource:
    """A labelled image split that the engine can iterate in global batches.

    Subclasses set ``name`` (display), ``split``, ``classes``, ``mean``/``std`` (per channel, [0, 1]
    scale, statistics of the *training* pool), ``channels``, ``image_size`` (side of the uint8
    images yielded, or None when they keep their native size) and implement ``__len__`` and
    :meth:`batches`.
    """

    name: str = ""
    split: str = ""
    classes: list[str]
    mean: Sequence[float]
    std: Sequence[float]

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def channels(self) -> int:
        raise NotImplementedError

    def steps_per_epoch(self, batch_size: int) -> int:
        """Full global batches of ``batch_size`` in one epoch (the last partial batch is dropped)."""
        return len(self) // batch_size

    def batches(
        self, batch_size: int, *, shuffle: bool = True, at: Position = ORIGIN, drop_last: bool | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield this process's ``(uint8 images (b, C, H, W), int64 labels (b,))`` of each global batch.

        ``batch_size`` is the global batch; ``at`` (:class:`Position`) is the epoch, the global batch iteration
        begins at and this process's share: global batch ``i`` of epoch ``e`` holds the same samples for every
        ``world`` (see :func:`global_batches`).
        ``drop_last`` defaults to ``shuffle`` (training drops the partial batch, evaluation keeps it).
        A process whose share of the last partial batch is empty gets no batch for it.
        """
        raise NotImplementedError

    def first(self, k: int, *, shuffle: bool = False, seed: int = 0) -> tuple[Tensor, Tensor]:
        """The first ``k`` samples (all if fewer) in order, or of the seeded epoch-0 order with ``shuffle``:
        ``(uint8 images, labels)``.  Works for every source, including those without random access."""
        images, labels, n = [], [], 0
        for x, y in self.batches(max(1, min(k, len(self))), shuffle=shuffle, at=Position(seed=seed), drop_last=False):
            images.append(x[: k - n])
            labels.append(y[: k - n])
            n += len(labels[-1])
            if n >= k:
                break
        return torch.cat(images), torch.cat(labels)
