"""WebDataset shards: ``.tar`` files of ``<key>.jpg`` + ``<key>.cls`` samples, read sequentially.

::

    train = WebDatasetShards("/data/in1k-shards", "train", image_size=224, num_workers=4)
    for images, labels in train.batches(256, at=Position(seed=0, epoch=3, rank=1, world=8)):
        ...

Layout: a folder of shards (``root/*.tar``), or ``root/train/*.tar`` + ``root/test/*.tar`` (or
``val/``), or a glob / brace pattern (``/data/in1k-{000000..001023}.tar``).  Each sample needs an image
(``jpg``/``jpeg``/``png``/``webp``) and a label: ``cls`` / ``cls.txt`` / ``label`` (an integer or a class
name) or ``json`` with a ``label``/``cls`` entry.  Class names come from ``classes.txt`` (one per line)
or ``classes.json`` (a list) beside the shards (or beside their split folders); without one, integer
labels name the classes ``0..max`` and text labels are sorted.

Splits: the shards of ``test/`` (or ``val/``) when present; otherwise every fifth sample of each class
(in shard order) is the test split, as for image folders, and ``val_fraction`` carves the same
stratified, seeded val split out of the rest.  This needs every label up front: the first open reads
each shard once and writes an index (sample count and labels per shard, keyed by size and mtime) to
``.crate-index.json`` beside the shards (kept in memory when the folder is not writable).

Order of an epoch (``shuffle=True``): the shards are permuted by :func:`.base.epoch_permutation`
(seed, epoch); process ``rank`` of ``world`` takes every ``world``-th shard; its shards are dealt to
``V = min(workers, its shards)`` streams (one per DataLoader worker); stream ``s`` reads its shards in
turn, through a shuffle buffer (``shuffle_buffer`` samples, seeded by seed, epoch, rank and ``s``), and
forms local batches of ``batch_size / world``; local batch ``b`` is batch ``b // V`` of stream ``b % V``.
Every process yields exactly ``len(self) // batch_size`` batches per epoch (DDP steps together); a
stream that runs out before its share of them starts its shards again.

What is exact and what is approximate:

* **Resume** at ``(epoch, batch)`` is exact — the same remaining batches — for the same number of
  processes and workers: each stream skips the samples of its batches before ``start`` without
  decoding them (the tar bytes are read again, the images are not decoded).
* An epoch visits each sample **once when the shards hold equal numbers of samples** (divisible by
  the local batch times the streams); with uneven shards a stream repeats some of its samples or
  leaves some for the next epoch.  Shuffling is local (buffer + shard order), not a global
  permutation, so a shard run and an in-memory run of the same data see different batches.
* Evaluation (``shuffle=False``) reads every sample of the split exactly once.

Unreadable images: as for streamed folders (:mod:`.streaming`): ``"error"`` raises naming the shard
and key; ``"skip"`` replaces the image by another of its training batch, or drops it when evaluating.
Damaged shards: a tar that ends inside a member (a cut-short copy or download), lacks its end-of-archive
blocks or has a corrupt header is found when the shard is indexed (a walk over its 512-byte headers).
``"error"`` raises naming the shard; ``"skip"`` warns naming it and reads the samples before the damage,
dropping the last of them, which may have lost some of its files.  Every open of the split reports it.
Statistics: estimated from the first :data:`.streaming.STATS_SAMPLE` training samples of the
seeded shard order (or given as ``stats=``).
"""

from __future__ import annotations

import glob
import json
import os
import random
import tarfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

from ..errors import OptionError, OptionWarning
from ..io import DamagedFileError, read_side_file
from .base import ORIGIN, ImageSource, Position, class_count, epoch_permutation, rank_slice
from .memory import (
    SPLITS,
    channel_stats,
    decode_image,
    holdout_every_fifth,
    split_members,
    to_chw,
)
from .streaming import (
    STATS_SAMPLE,
    check_stream_args,
    checked,
    collate_readable,
    decode_or_message,
    read_policy,
    resolve_workers,
)

__all__ = ["WebDatasetShards", "INDEX_FILE", "IMAGE_KEYS", "LABEL_KEYS"]

INDEX_FILE = ".crate-index.json"
IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
LABEL_KEYS = ("cls", "cls.txt", "label", "label.txt")
_JSON_LABEL_KEYS = ("label", "cls", "class", "target")
_MEMORY_INDEX: dict[tuple[str, int, int], dict] = {}  # (shard, size, mtime) → index entry, when no file can be written


def _expand(pattern: str) -> list[Path]:
    """Shard files of a glob / brace pattern (``a-{000..009}.tar``), sorted."""
    from braceexpand import braceexpand

    return sorted({Path(p) for part in braceexpand(pattern) for p in glob.glob(os.path.expanduser(part))})


def _find_shards(source: str) -> tuple[list[Path], list[Path], Path]:
    """(training-pool shards, test shards or [], folder holding classes.txt)."""
    path = Path(source).expanduser()
    if not path.is_dir():
        shards = _expand(source)
        if not shards:
            raise ValueError(f"no .tar shards match {source}; check the pattern (e.g. /data/shards-{{000..009}}.tar)")
        return shards, [], shards[0].parent
    split_dirs = {s: path / s for s in SPLITS if (path / s).is_dir() and any((path / s).glob("*.tar"))}
    if "train" in split_dirs:
        test_dir = split_dirs.get("test", split_dirs.get("val"))
        return sorted(split_dirs["train"].glob("*.tar")), sorted(test_dir.glob("*.tar")) if test_dir else [], path
    shards = sorted(path.glob("*.tar"))
    if not shards:
        raise ValueError(f"no .tar shards in {path}; expected {path}/*.tar or {path}/train/*.tar")
    return shards, [], path


def _stop_at_damage(exn: Exception) -> bool:
    """webdataset's error handler: a damaged tar ends the shard (:func:`_tar_damage` reports it); others raise."""
    if isinstance(exn, tarfile.TarError):
        return False
    raise exn


def _samples(path: Path) -> Iterator[dict]:
    """The samples of one shard, in tar order (``{"__key__": …, "jpg": bytes, "cls": bytes, …}``), up to
    any damage (the index, written with :func:`_tar_damage`, says which of them are complete)."""
    from webdataset import tariterators

    with open(path, "rb") as stream:
        files = tariterators.tar_file_expander([{"url": str(path), "stream": stream}], handler=_stop_at_damage)
        yield from tariterators.group_by_keys(files)


_BLOCK = 512
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"\x28\xb5\x2f\xfd")  # gzip, bzip2, xz, zstd


def _tar_damage(path: Path) -> tuple[str | None, str | None]:
    """How a tar file is damaged (``"it ends inside member 'x.jpg'"``, ...; None when it is whole), and the
    name of the member whose data is cut (None when the damage is elsewhere, e.g. inside a header).

    Walks the 512-byte headers (checksum, size) without reading the members, so a shard cut short on a
    header boundary — which tar readers take for a normal end — is found as well.  Compressed tars are not
    walked (their decompressor reports a cut-short stream itself).
    """
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size == 0:
            return "the file is empty", None
        if any(f.read(6).startswith(magic) for magic in _COMPRESSED):
            return None, None
        offset = 0
        while True:
            f.seek(offset)
            header = f.read(_BLOCK)
            if not header:
                return f"it ends after {offset:,} bytes without the end-of-archive blocks (it was cut short)", None
            if len(header) < _BLOCK:
                return f"it ends inside a header at byte {offset:,} (it was cut short)", None
            if header.count(0) == _BLOCK:
                return None, None  # the end-of-archive marker: everything before it is whole
            if not _header_checksum_ok(header):
                if offset == 0:  # no member at all: another kind of file under a .tar name, not a damaged shard
                    raise ValueError(
                        f"{path} is not a tar archive (no tar header at byte 0); remove it from the shards or "
                        "re-create it (tar cf, or webdataset's TarWriter)"
                    )
                return f"the header at byte {offset:,} is corrupt", None
            end = offset + _BLOCK + -(-_member_size(header) // _BLOCK) * _BLOCK
            if end > size:
                meta = header[156:157] in (b"x", b"g", b"L", b"K")  # pax / GNU long-name data: a header's part
                name = header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
                return f"it ends inside {'a header' if meta else f'member {name!r}'} (it was cut short)", (
                    None if meta else name
                )
            offset = end


def _header_checksum_ok(header: bytes) -> bool:
    """POSIX: the sum of the header's bytes with the checksum field read as spaces (unsigned, or signed as
    some old writers computed it)."""
    try:
        stored = int(header[148:156].split(b"\0", 1)[0].strip(), 8)
    except ValueError:
        return False
    rest = header[:148] + b" " * 8 + header[156:]
    return stored in (sum(rest), sum(b - 256 if b > 127 else b for b in rest))


def _member_size(header: bytes) -> int:
    """The size field of a tar header: octal text, or base-256 (GNU) for members of 8 GiB and more."""
    field = header[124:136]
    if field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)


def _label_text(sample: dict, shard: Path) -> str | None:
    for key in LABEL_KEYS:
        if key in sample:
            try:
                return bytes(sample[key]).decode("utf-8").strip()
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{shard}: member {sample['__key__']}.{key} is not UTF-8 text (invalid byte at position "
                    f"{e.start}); write the class index or name as UTF-8 text"
                ) from None
    if "json" in sample:
        try:
            meta = json.loads(sample["json"])
        except ValueError:
            return None
        if isinstance(meta, dict):
            for key in _JSON_LABEL_KEYS:
                if key in meta:
                    return str(meta[key]).strip()
    return None


def _image_bytes(sample: dict) -> bytes | None:
    return next((sample[k] for k in IMAGE_KEYS if k in sample), None)


def _index(shards: Sequence[Path]) -> dict[str, dict]:
    """Per shard ``{"labels": label text of every complete sample, "damage": None or how the tar is damaged}``,
    from ``.crate-index.json`` when current, else by reading the shards."""
    out: dict[str, dict] = {}
    by_dir: dict[Path, list[Path]] = {}
    for s in shards:
        by_dir.setdefault(s.parent, []).append(s)
    for folder, files in by_dir.items():
        cache_path = folder / INDEX_FILE
        try:  # a cache: a damaged one is counted again (and rewritten when the folder is writable)
            cache = read_side_file(cache_path, "it is rebuilt") if cache_path.is_file() else {}
        except DamagedFileError:
            cache = {}
        changed = False
        for f in files:
            st = f.stat()
            entry = cache.get(f.name) or _MEMORY_INDEX.get((str(f), st.st_size, st.st_mtime_ns))
            if not _index_entry_current(entry, st, cache_path, f.name):
                entry = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, **_read_labels(f)}
                entry = cache[f.name] = {**entry, "sha256": _entry_sha256(entry)}
                _MEMORY_INDEX[(str(f), st.st_size, st.st_mtime_ns)] = entry  # read-only folders: count once per process
                changed = True
            out[str(f)] = entry
        if changed:
            try:  # a cache, so a read-only folder just means counting again next time
                from ..io import atomic_write

                atomic_write(cache_path, lambda tmp, c=cache: Path(tmp).write_text(json.dumps(c)))
            except Exception:  # noqa: BLE001 - WriteError or anything else: the index stays in memory
                pass
    return out


def _entry_sha256(entry: dict) -> str:
    """The checksum of an index entry's content (everything but the checksum itself)."""
    import hashlib

    content = {k: v for k, v in entry.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _index_entry_current(entry: object, st: os.stat_result, index: Path, name: str) -> bool:
    """Whether an index entry describes the shard as it is: same size and mtime, and content that matches
    its checksum.  An entry edited by hand (labels that disagree with the shard) is warned about and
    re-read; entries of older versions (no checksum, never checked for damage) are re-read silently."""
    if not isinstance(entry, dict) or (entry.get("size"), entry.get("mtime_ns")) != (st.st_size, st.st_mtime_ns):
        return False
    if "sha256" not in entry or "damage" not in entry:
        return False
    if entry["sha256"] != _entry_sha256(entry):
        warnings.warn(
            f"{index}: the entry of {name} does not match its checksum (edited or damaged); "
            "reading the labels from the shard again",
            stacklevel=4,
        )
        return False
    return True


def _read_labels(f: Path) -> dict:
    """Read one shard: the label text of each complete sample and how the tar is damaged (None if whole)."""
    from webdataset.tariterators import base_plus_ext

    damage, cut = _tar_damage(f)
    rows = [(sample["__key__"], _image_bytes(sample) is not None, _label_text(sample, f)) for sample in _samples(f)]
    if damage and rows and (cut is None or base_plus_ext(cut)[0] == rows[-1][0]):
        rows.pop()  # the sample at the damage lost some of its files (or may have: a cut header hides whose it was)
    for key, has_image, label in rows:
        if not has_image:
            raise ValueError(
                f"sample {key!r} of shard {f} has no image ({'/'.join(IMAGE_KEYS)}); "
                "write each image under one of these extensions"
            )
        if label is None:
            raise ValueError(
                f"sample {key!r} of shard {f} has no label ({'/'.join(LABEL_KEYS)} or "
                "json with 'label'); write a .cls file with the class index for every sample"
            )
    return {"labels": [label for _, _, label in rows], "damage": damage}


def _report_damage(index: dict[str, dict], on_bad_image: str) -> None:
    """A damaged shard: one-line error under ``on_bad_image="error"``, else a warning naming it."""
    for shard, entry in index.items():
        if entry["damage"]:
            n = len(entry["labels"])
            what = f"shard {shard} is truncated or corrupt: {entry['damage']}"
            if on_bad_image == "error":
                raise OptionError(
                    f"{what}; re-create or re-download it, or pass on_bad_image='skip' to use its {n} complete samples"
                )
            warnings.warn(
                OptionWarning(
                    f"{what}; only its first {n} complete samples are read (pass on_bad_image='error' to fail instead)"
                ),
                stacklevel=3,
            )


def _class_names(folder: Path, texts: Sequence[str]) -> list[str]:
    """Class names: ``classes.txt`` / ``classes.json`` beside the shards, else from the labels themselves."""
    for f in (folder / "classes.txt", folder / "classes.json"):
        if f.is_file():
            if f.suffix == ".json":
                names = _read_classes_json(f)
            else:
                names = [line.strip() for line in f.read_text().splitlines() if line.strip()]
            if not names:
                raise ValueError(f"{f} lists no class names; write one class name per line")
            return [str(n) for n in names]
    if all(t.lstrip("-").isdigit() for t in texts):
        fix = f"number the classes 0..K-1, or list the class names in {folder / 'classes.txt'} (one per line)"
        return [str(i) for i in range(class_count([int(t) for t in texts], f"the shards in {folder}", fix))]
    return sorted(set(texts))


def _read_classes_json(f: Path) -> list:
    """The class names of ``classes.json``: a list of names, or ``{name: index}``; errors name file:line:col."""
    try:
        names = json.loads(f.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{f} is not UTF-8 text (invalid byte at position {e.start}); convert it to UTF-8") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f'{f}:{e.lineno}:{e.colno}: invalid JSON ({e.msg}); write a list of class names, e.g. ["cat", "dog"]'
        ) from None
    if isinstance(names, dict) and all(isinstance(v, int) and not isinstance(v, bool) for v in names.values()):
        return sorted(names, key=names.get)
    if not isinstance(names, list) or any(isinstance(n, (dict, list)) for n in names):
        raise ValueError(
            f"{f} holds {type(names).__name__} {json.dumps(names)[:40]}, not a list of class names; "
            'write e.g. ["cat", "dog"] (or {"cat": 0, "dog": 1})'
        )
    return names


def _label_ids(texts: Sequence[str], classes: list[str], where: str) -> list[int]:
    ids = {c: i for i, c in enumerate(classes)}
    out = []
    for t in texts:
        y = ids.get(t)
        if y is None and t.lstrip("-").isdigit():
            y = int(t)
        if y is None or not 0 <= y < len(classes):
            raise ValueError(
                f"label {t!r} in {where} is not one of the {len(classes)} classes; fix the label or classes.txt"
            )
        out.append(y)
    return out


class WebDatasetShards(ImageSource):
    """A split of WebDataset shards, streamed by ``DataLoader`` workers (see the module docstring)."""

    kind = "shards"

    def __init__(
        self,
        source: str | os.PathLike,
        split: str = "train",
        *,
        image_size: int,
        val_fraction: float = 0.0,
        seed: int = 0,
        on_bad_image: str = "skip",
        num_workers: int = -1,
        shuffle_buffer: int = 1000,
        stats: tuple[Sequence[float], Sequence[float]] | None = None,
    ) -> None:
        check_stream_args("a split of WebDataset shards", split, val_fraction, on_bad_image, image_size)
        pool_shards, test_shards, folder = _find_shards(os.fspath(source))
        index = _index(pool_shards + test_shards)
        _report_damage(index, on_bad_image)  # every shard of the source, whichever split is opened
        texts = {s: entry["labels"] for s, entry in index.items()}
        all_texts = [t for s in pool_shards + test_shards for t in texts[str(s)]]
        if not all_texts:
            raise ValueError(f"the shards of {source} hold no samples; write samples into them")
        self.classes = _class_names(folder, all_texts)
        labels = {s: _label_ids(texts[s], self.classes, f"shard {s}") for s in texts}
        # membership: which samples of which shard belong to this split (by position in the shard)
        pool = [(s, i) for s in map(str, pool_shards) for i in range(len(labels[s]))]
        pool_y = [labels[s][i] for s, i in pool]
        if test_shards:
            test = [(s, i) for s in map(str, test_shards) for i in range(len(labels[s]))]
        else:
            flags = holdout_every_fifth(pool_y)
            test = [p for p, t in zip(pool, flags) if t]
            pool, pool_y = [p for p, t in zip(pool, flags) if not t], [y for y, t in zip(pool_y, flags) if not t]
        if split == "test":
            members = test
        else:
            keep = split_members(torch.tensor(pool_y, dtype=torch.int64), split, val_fraction, seed).tolist()
            members = [pool[j] for j in keep]
        if not members:
            raise ValueError(f"the {split} split of {source} is empty; use a larger val_fraction or add shards")
        self.keep: dict[str, list[int]] = {}
        for s, i in members:
            self.keep.setdefault(s, []).append(i)
        self.shards = [s for s in map(str, pool_shards + test_shards) if s in self.keep]
        self.labels = {s: labels[s] for s in self.shards}
        self.name, self.split = os.fspath(source), split
        self.image_size, self.on_bad_image = image_size, on_bad_image
        self.num_workers, self.shuffle_buffer = num_workers, shuffle_buffer
        self._n = len(members)
        self._stats(pool, seed, stats)

    def _stats(self, pool: list[tuple[str, int]], seed: int, stats: tuple | None) -> None:
        """Channels and mean/std from the first training-pool samples in a seeded shard order."""
        shards = sorted({s for s, _ in pool})
        wanted = {}
        for s, i in pool:
            wanted.setdefault(s, set()).add(i)
        need = 16 if stats else STATS_SAMPLE
        decoded = []
        for j in epoch_permutation(len(shards), seed, 0).tolist():
            for pos, sample in enumerate(_samples(Path(shards[j]))):
                if pos in wanted[shards[j]]:
                    d = decode_image(_image_bytes(sample), f"{shards[j]}:{sample['__key__']}", "skip")
                    if d is not None:
                        decoded.append(d)
                if len(decoded) >= need:
                    break
            if len(decoded) >= need:
                break
        if not decoded:
            raise ValueError(f"no readable training image in {self.name}; check the shards")
        self._channels = 1 if all(g for _, g in decoded) else 3
        if stats:
            self.mean, self.std = tuple(stats[0]), tuple(stats[1])
        else:
            self.mean, self.std = channel_stats(
                torch.stack([to_chw(a, self._channels, self.image_size) for a, _ in decoded])
            )

    def __len__(self) -> int:
        return self._n

    @property
    def channels(self) -> int:
        return self._channels

    def batches(
        self, batch_size: int, *, shuffle: bool = True, at: Position = ORIGIN, drop_last: bool | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Stream this process's local batches (see the module docstring for the order)."""
        n = len(self.shards)
        order = epoch_permutation(n, at.seed, at.epoch).tolist() if shuffle else range(n)
        mine = [self.shards[j] for j in order][at.rank :: at.world]
        training = shuffle if drop_last is None else drop_last
        if not mine and not training:
            return  # evaluation: the other processes hold every shard, and the counts are summed over processes
        if not mine:
            raise ValueError(
                f"{n} shard(s) of the {self.split} split cannot be split over {at.world} processes; "
                f"write at least {at.world} shards"
            )
        local = len(rank_slice(torch.arange(batch_size), at.rank, at.world))
        streams = max(1, min(resolve_workers(self.num_workers), len(mine)))
        total = self.steps_per_epoch(batch_size) if training else None
        plan = _ShardStreams(self, mine, streams, local, total, at, shuffle, self.shuffle_buffer)
        workers = streams if resolve_workers(self.num_workers) > 0 else 0
        loader = torch.utils.data.DataLoader(
            plan,
            batch_size=None,
            num_workers=workers,
            pin_memory=torch.cuda.is_available(),
            prefetch_factor=4 if workers else None,
            generator=torch.Generator(),  # its own: iterating must not draw from the training RNG
        )
        yield from checked(loader)

    def decode(self, sample: dict, shard: str) -> tuple[Tensor | None, int, str]:
        """One raw sample → ``(uint8 C×H×W or None, label, name)`` (label looked up by ``__pos__``)."""
        d, what = decode_or_message(_image_bytes(sample), f"{shard}:{sample['__key__']}", self.on_bad_image)
        image = None if d is None else to_chw(d[0], self._channels, self.image_size)
        return image, self.labels[shard][sample["__pos__"]], what

    def __repr__(self) -> str:
        return (
            f"WebDatasetShards({self.name!r}, split={self.split!r}, n={len(self)}, {len(self.shards)} shards, "
            f"{self.num_classes} classes, workers={self.num_workers})"
        )


class _ShardStreams(torch.utils.data.IterableDataset):
    """The ``V`` streams of one process for one epoch; DataLoader worker ``w`` runs stream ``(start + w) % V``.

    Local batch ``b`` is batch ``b // V`` of stream ``b % V``; the DataLoader visits its workers in turn,
    so starting worker ``w`` on stream ``(start + w) % V`` yields batches ``start, start + 1, …`` in order.
    """

    def __init__(
        self,
        source: WebDatasetShards,
        shards: list[str],
        streams: int,
        local: int,
        total: int | None,
        at: Position,
        shuffle: bool,
        buffer: int,
    ) -> None:
        self.source, self.shards, self.streams, self.local = source, shards, streams, local
        self.total, self.at, self.shuffle, self.buffer = total, at, shuffle, buffer

    def _pass(self, shards: list[str]) -> Iterator[tuple[dict, str]]:
        """One pass over the split's samples in ``shards``, in turn."""
        for s in shards:
            keep = set(self.source.keep[s])
            for pos, sample in enumerate(_samples(Path(s))):
                if pos in keep:
                    sample["__pos__"] = pos
                    yield sample, s

    def _raw(self, shards: list[str], rng: random.Random) -> Iterator[tuple[dict, str]]:
        """Passes over ``shards``, each through its own shuffle buffer (so a pass never repeats a sample);
        forever when training (a stream that runs out before its share of batches starts again)."""
        while True:
            yield from self._shuffled(self._pass(shards), rng) if self.shuffle else self._pass(shards)
            if self.total is None:
                return

    def _shuffled(self, it: Iterator, rng: random.Random) -> Iterator:
        buf: list = []
        for item in it:
            if len(buf) < self.buffer:
                buf.append(item)
                continue
            j = rng.randrange(len(buf))
            yield buf[j]
            buf[j] = item
        rng.shuffle(buf)
        yield from buf

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        info = torch.utils.data.get_worker_info()
        if info is None:  # no workers: the main process interleaves the streams itself
            its = [self._stream(s) for s in range(self.streams)]
            b = self.at.start
            while its:
                s = b % self.streams
                batch = next(its[s], None) if its[s] is not None else None
                if batch is None:
                    its[s] = None
                    if all(i is None for i in its):
                        return
                else:
                    yield batch
                b += 1
            return
        yield from self._stream((self.at.start + info.id) % self.streams)

    def _stream(self, s: int) -> Iterator[tuple[Tensor, Tensor]]:
        at = self.at
        raw = self._raw(self.shards[s :: self.streams], random.Random(f"{at.seed}-{at.epoch}-{at.rank}-{s}"))
        skip = max(0, -(-(self.at.start - s) // self.streams))  # this stream's batches before start
        for _ in range(skip * self.local):  # read, not decoded
            if next(raw, None) is None:
                return
        k = skip
        while self.total is None or k * self.streams + s < self.total:
            items = [self.source.decode(sample, shard) for sample, shard in _take(raw, self.local)]
            if not items:
                return
            yield collate_readable(items, read_policy(self.source.on_bad_image, self.shuffle))
            k += 1


def _take(it: Iterator, n: int) -> list:
    out = []
    for item in it:
        out.append(item)
        if len(out) == n:
            break
    return out
