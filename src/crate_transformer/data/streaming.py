"""Image folders too large for memory: files decoded per batch in ``DataLoader`` worker processes.

::

    train = StreamingImageFolder.open("/data/imagenet", "train", image_size=224, num_workers=4)
    for images, labels in train.batches(256, at=Position(seed=0, epoch=3, start=100, rank=1, world=8)):
        ...  # uint8 (32, 3, 224, 224): rank 1's share of global batches 100, 101, … of epoch 3

A streamed folder is listed exactly as the in-memory loader lists it (:func:`.memory.list_image_folder`:
classes, the every-fifth test rule, the stratified val split) and batched by the same rule
(:func:`.base.local_batches`), and each file is decoded and resized by the
same code (:func:`.memory.decode_image`, :func:`.memory.to_chw`).  So for the same seed a streamed run
sees the same uint8 batches as an in-memory one (when every file is readable), and a run resumed at
``(epoch, batch)`` starts decoding at that batch: the skipped batches are never read.

Unreadable files (``on_bad_image``):

* ``"error"`` — the worker raises a one-line ValueError naming the file.
* ``"skip"`` — the file cannot be dropped from the listing without decoding everything up front (the
  in-memory loader does that), so it is handled per batch, with a warning naming it.  In training
  batches (``shuffle=True``) it is **replaced** by a copy of another readable image of the same batch,
  so batch shapes, the step count of an epoch and every process's schedule stay fixed (DDP and exact
  resume depend on them); a batch without a single readable image is an error.  In evaluation batches
  it is **dropped**, so it counts nowhere.

Normalisation statistics (``mean``/``std``) are estimated from a seeded random sample of at most
:data:`STATS_SAMPLE` files of the training pool (all of them for a smaller folder, which then gives
exactly the in-memory statistics); callers that already know them (a model's :class:`DataSpec`, when
evaluating) pass ``stats=`` and skip the estimate.  The channel count is 1 if every sampled image is
greyscale, else 3.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

from ..config_utils import Range
from ..errors import OptionError, OptionWarning
from .base import ORIGIN, ImageSource, Position, local_batches
from .memory import (
    FolderListing,
    channel_stats,
    check_load_args,
    decode_image,
    list_image_folder,
    split_members,
    to_chw,
)

__all__ = [
    "STATS_SAMPLE",
    "MapStreamSource",
    "StreamingImageFolder",
    "resolve_workers",
    "collate_readable",
    "read_policy",
    "checked",
    "check_stream_args",
]

# the data-loading workers: -1 picks them per machine, 0 decodes in the main process
NUM_WORKERS = Range(-1, integer=True, note="-1 = auto, 0 = in the main process")
STATS_SAMPLE = 512  # files decoded to estimate mean/std and the channel count


def resolve_workers(num_workers: int) -> int:
    """``-1`` (auto) → the CPUs this process may use, shared by the training processes of the machine (torchrun's
    ``LOCAL_WORLD_SIZE``), one left to the process itself: between 1 and 16 (a GPU run that decodes images needs
    them all); otherwise the number given (0 decodes in the main process)."""
    NUM_WORKERS.check("num_workers", num_workers)
    if num_workers >= 0:
        return num_workers
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        cpus = os.cpu_count() or 1
    per_process = cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, min(16, per_process - 1))


def collate_readable(
    items: Sequence[tuple[Tensor | None, int, str]], policy: str
) -> tuple[Tensor, Tensor] | tuple[None, str]:
    """Stack ``(uint8 image or None, label, name)`` items into a batch; None marks an unreadable image.

    ``policy``: ``"replace"`` (training) fills each None with the nearest readable image of the batch (and
    its label), so the batch keeps its size; ``"drop"`` (evaluation) leaves it out; ``"error"`` returns
    ``(None, message)`` — the main process raises it, since an exception raised inside a DataLoader worker
    reaches the user wrapped in a multi-line traceback.  ``name`` is then the one-line message.
    """
    bad = [what for x, _, what in items if x is None]
    if bad and policy == "error":
        return None, bad[0]
    for what in bad:
        warnings.warn(
            OptionWarning(f"skipped unreadable image {what} (pass on_bad_image='error' to fail instead)"),
            stacklevel=2,
        )
    good = [i for i, (x, _, _) in enumerate(items) if x is not None]
    if not good:
        if policy == "drop":
            return torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.int64)
        raise ValueError(
            f"none of the {len(items)} images of a batch is readable (e.g. {bad[0]}); check the data files"
        )
    if policy == "replace":
        picks = [i if items[i][0] is not None else min(good, key=lambda g: (abs(g - i), g)) for i in range(len(items))]
    else:
        picks = good
    images = torch.stack([items[i][0] for i in picks])
    return images, torch.tensor([items[i][1] for i in picks], dtype=torch.int64)


def read_policy(on_bad_image: str, shuffle: bool) -> str:
    """The :func:`collate_readable` policy for ``on_bad_image`` in a training (shuffled) or evaluation pass."""
    return "error" if on_bad_image == "error" else ("replace" if shuffle else "drop")


def checked(batches: Iterator) -> Iterator[tuple[Tensor, Tensor]]:
    """Raise the one-line error a worker reported (see :func:`collate_readable`); skip empty batches."""
    for images, labels in batches:
        if images is None:  # the worker's message (its on_bad_image=... fix: the CLI names the flag)
            raise OptionError(labels)
        if len(labels):
            yield images, labels


def check_stream_args(what: str, split: str, val_fraction: float, on_bad_image: str, image_size: int | None) -> None:
    """A streamed source's constructor arguments: ``image_size`` is required (its images are decoded and resized
    per batch, never all at once), then :func:`.memory.check_load_args`; ``what`` names the source."""
    if image_size is None:
        raise OptionError(f"{what} needs image_size: its images are resized on read", option="image_size")
    check_load_args(split, val_fraction, on_bad_image, image_size)


def decode_or_message(data: object, what: str, on_bad_image: str) -> tuple[object | None, str]:
    """:func:`.memory.decode_image` that returns ``(None, one-line message)`` instead of raising under "error"."""
    try:
        return decode_image(data, what, on_bad_image), what
    except ValueError as e:
        return None, str(e)


class _BatchPlan:
    """A DataLoader ``batch_sampler`` whose batch size, position and ``drop_last`` are set before each
    ``iter(loader)``.

    It runs in the main process, so one persistent set of workers serves every epoch.
    """

    def __init__(self, num_samples: int) -> None:
        self.num_samples, self.batch_size, self.shuffle = num_samples, 1, True
        self.at, self.drop_last = ORIGIN, None

    def __iter__(self) -> Iterator[list[int]]:
        for mine in local_batches(
            self.num_samples, self.batch_size, shuffle=self.shuffle, at=self.at, drop_last=self.drop_last
        ):
            yield mine.tolist()


class _Reader(torch.utils.data.Dataset):
    """What a worker calls: ``source.read(i)`` → ``(uint8 C×H×W or None, label, name)``."""

    def __init__(self, source: MapStreamSource) -> None:
        self.source = source

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i: int) -> tuple[Tensor | None, int, str]:
        return self.source.read(i)


class MapStreamSource(ImageSource):
    """An :class:`ImageSource` with random access to encoded images, decoded in ``DataLoader`` workers.

    Subclasses set ``labels`` (int64, one per sample), ``classes``, ``name``, ``split`` and implement
    :meth:`raw` (the encoded image of sample ``i`` and a name for messages).  ``__init__`` of a
    subclass ends with :meth:`_finish`, which estimates channels and statistics.
    """

    labels: Tensor
    image_size: int
    num_workers: int
    on_bad_image: str

    def raw(self, i: int) -> tuple[object, str]:
        """The encoded image of sample ``i`` (path, bytes or PIL image) and its name for messages."""
        raise NotImplementedError

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def channels(self) -> int:
        return self._channels

    def _finish(self, pool: Callable[[int], object], pool_size: int, seed: int, stats: tuple | None) -> None:
        """Channels and mean/std from a seeded sample of the training pool (``pool(j)`` → encoded image)."""
        if pool_size == 0:
            raise ValueError(f"no training images in {self.name}; add images")
        k = min(pool_size, 16 if stats else STATS_SAMPLE)
        picks = torch.randperm(pool_size, generator=torch.Generator().manual_seed(seed))[:k].sort().values
        decoded = [decode_image(pool(j), f"#{j} of {self.name}", "skip") for j in picks.tolist()]
        decoded = [d for d in decoded if d is not None]
        if not decoded:
            raise ValueError(f"none of {k} sampled images of {self.name} is readable; check the data files")
        self._channels = 1 if all(g for _, g in decoded) else 3
        if stats:
            self.mean, self.std = tuple(stats[0]), tuple(stats[1])
        else:
            self.mean, self.std = channel_stats(
                torch.stack([to_chw(a, self._channels, self.image_size) for a, _ in decoded])
            )
        self._loaders: dict[bool, tuple[torch.utils.data.DataLoader, _BatchPlan]] = {}

    def read(self, i: int) -> tuple[Tensor | None, int, str]:
        """Decode sample ``i`` to uint8 ``C×H×W`` at ``image_size`` (None if unreadable under "skip")."""
        data, what = self.raw(i)
        decoded, what = decode_or_message(data, what, self.on_bad_image)
        image = None if decoded is None else to_chw(decoded[0], self._channels, self.image_size)
        return image, int(self.labels[i]), what

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        """``(float image in [0, 1], label)`` as :class:`ImageDataset` gives it (an unreadable image raises)."""
        image, label, what = self.read(i)
        if image is None:
            raise ValueError(what if self.on_bad_image == "error" else f"cannot read image {what}; fix or delete it")
        return image.float() / 255.0, label

    def _loader(self, shuffle: bool) -> tuple[torch.utils.data.DataLoader, _BatchPlan]:
        # one loader per role: training keeps its workers alive across epochs (persistent_workers),
        # evaluation (a few passes per run) starts them per pass and leaves no idle processes behind
        if shuffle not in self._loaders:
            plan = _BatchPlan(len(self))
            workers = resolve_workers(self.num_workers)
            loader = torch.utils.data.DataLoader(
                _Reader(self),
                batch_sampler=plan,
                num_workers=workers,
                collate_fn=functools.partial(collate_readable, policy=read_policy(self.on_bad_image, shuffle)),
                pin_memory=torch.cuda.is_available(),
                persistent_workers=workers > 0 and shuffle,
                prefetch_factor=4 if workers else None,
                generator=torch.Generator(),  # its own: iterating must not draw from the training RNG
            )
            self._loaders[shuffle] = (loader, plan)
        return self._loaders[shuffle]

    def batches(
        self, batch_size: int, *, shuffle: bool = True, at: Position = ORIGIN, drop_last: bool | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Decode this process's share of each global batch in workers (see :meth:`ImageSource.batches`)."""
        loader, plan = self._loader(shuffle)
        plan.batch_size, plan.shuffle, plan.at, plan.drop_last = batch_size, shuffle, at, drop_last
        yield from checked(loader)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_loaders": {}}  # workers get the listing, not the loaders

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, split={self.split!r}, n={len(self)}, {self.channels}×"
            f"{self.image_size}×{self.image_size}, {self.num_classes} classes, workers={self.num_workers})"
        )


class StreamingImageFolder(MapStreamSource):
    """A class-per-subfolder image folder read lazily: PIL decode + resize in ``DataLoader`` workers.

    Build it with :meth:`open`; ``files`` are ``(path, label)`` of this split.
    """

    kind = "folder"

    def __init__(
        self,
        files: Sequence[tuple[Path, int]],
        classes: Sequence[str],
        *,
        image_size: int,
        name: str,
        split: str,
        pool: Sequence[tuple[Path, int]],
        seed: int = 0,
        on_bad_image: str = "skip",
        num_workers: int = -1,
        stats: tuple[Sequence[float], Sequence[float]] | None = None,
    ) -> None:
        self.files = [Path(f) for f, _ in files]
        self.labels = torch.tensor([int(y) for _, y in files], dtype=torch.int64)
        self.classes, self.name, self.split = list(classes), name, split
        self.image_size, self.on_bad_image, self.num_workers = image_size, on_bad_image, num_workers
        self._finish(lambda j: pool[j][0], len(pool), seed, stats)

    @classmethod
    def open(
        cls,
        root: str | os.PathLike,
        split: str = "train",
        *,
        image_size: int,
        val_fraction: float = 0.0,
        seed: int = 0,
        on_bad_image: str = "skip",
        num_workers: int = -1,
        stats: tuple[Sequence[float], Sequence[float]] | None = None,
        listing: FolderListing | None = None,
    ) -> StreamingImageFolder:
        """List ``root`` as :func:`.memory.load_dataset` does and stream ``split`` (train | val | test).

        ``listing``: a :func:`.memory.list_image_folder` result already made for ``root`` (saves a second scan).
        """
        check_stream_args("a streamed image folder", split, val_fraction, on_bad_image, image_size)
        listing = listing or list_image_folder(Path(root).expanduser().resolve())
        if split == "test":
            files = listing.test
        else:
            pool_labels = torch.tensor([y for _, y in listing.train], dtype=torch.int64)
            files = [listing.train[i] for i in split_members(pool_labels, split, val_fraction, seed).tolist()]
        if not files:
            raise ValueError(f"the {split} split of {root} is empty; use a larger val_fraction or add images")
        return cls(
            files, listing.classes, image_size=image_size, name=str(Path(root).expanduser().resolve()), split=split,
            pool=listing.train, seed=seed, on_bad_image=on_bad_image, num_workers=num_workers, stats=stats,
        )  # fmt: skip

    def raw(self, i: int) -> tuple[object, str]:
        return self.files[i], str(self.files[i])
