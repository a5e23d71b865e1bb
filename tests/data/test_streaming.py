"""Data that does not fit in memory: streamed image folders, WebDataset shards, HF datasets, open_source.

Everything runs on tiny generated data (3 classes x 20 JPEGs of 16x16) so the file stays around half a minute.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from crate_transformer import cli
from crate_transformer.data import Position, StreamingImageFolder, global_batches, load_dataset, open_source
from crate_transformer.train import TrainConfig, train

CLASSES, PER_CLASS, SIZE = 3, 20, 16
ARCH = ["dim=32", "depth=2", "heads=2", "patch_size=4"]


def _jpeg(rng: np.random.Generator, c: int) -> bytes:
    a = rng.integers(0, 80, (SIZE, SIZE, 3), dtype=np.uint8)
    a[:, :, c] += 150  # a learnable colour cue
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    for c in range(CLASSES):
        (root / f"c{c}").mkdir()
        for i in range(PER_CLASS):
            (root / f"c{c}" / f"{i:03d}.jpg").write_bytes(_jpeg(rng, c))
    return root


def _write_shards(root: Path, per_shard: list[list[tuple[bytes, str]]], label_key: str = "cls") -> None:
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    for s, samples in enumerate(per_shard):
        with wds.TarWriter(str(root / f"shard-{s:03d}.tar")) as w:
            for i, (jpg, label) in enumerate(samples):
                sample = {"__key__": f"s{s}-{i:04d}", "jpg": jpg}
                if label_key:
                    sample[label_key] = label.encode()
                w.write(sample)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train/ (4 shards x 12) + test/ (1 shard x 12), class names in classes.txt."""
    root = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(1)
    make = lambda n: [[(_jpeg(rng, k % CLASSES), str(k % CLASSES)) for k in range(12)] for _ in range(n)]  # noqa: E731
    _write_shards(root / "train", make(4))
    _write_shards(root / "test", make(1))
    (root / "classes.txt").write_text("red\ngreen\nblue\n")
    return root


def _all(source: object, batch_size: int, shuffle: bool = True, **at: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every batch of one pass; ``at`` are the :class:`Position` fields."""
    return list(source.batches(batch_size, shuffle=shuffle, at=Position(**at)))


def _digest(images: torch.Tensor) -> list[str]:
    return [hashlib.sha1(x.numpy().tobytes()).hexdigest() for x in images]


# --------------------------------------------------------------------------- streamed image folders
@pytest.mark.parametrize("workers", [0, 2])
def test_stream_batches_equal_memory_batches(folder: Path, workers: int) -> None:
    for split in ("train", "val", "test"):
        mem = load_dataset(folder, split, image_size=SIZE, val_fraction=0.2, seed=3)
        stream = open_source(folder, split, image_size=SIZE, val_fraction=0.2, seed=3, mode="stream",
                             num_workers=workers)  # fmt: skip
        assert isinstance(stream, StreamingImageFolder) and len(stream) == len(mem)
        assert stream.classes == mem.classes and stream.channels == mem.channels == 3
        np.testing.assert_allclose(stream.mean, mem.mean, rtol=1e-12)  # small folder: the sample is every file
        np.testing.assert_allclose(stream.std, mem.std, rtol=1e-12)
        shuffle = split == "train"
        for epoch in (0, 1):
            a, b = (
                _all(mem, 8, shuffle=shuffle, seed=5, epoch=epoch),
                _all(stream, 8, shuffle=shuffle, seed=5, epoch=epoch),
            )
            assert len(a) == len(b) > 0
            for (xa, ya), (xb, yb) in zip(a, b):
                assert xb.dtype == torch.uint8 and torch.equal(xa, xb) and torch.equal(ya, yb)
    # auto mode keeps a small folder in memory
    assert not isinstance(open_source(folder, "train", image_size=SIZE), StreamingImageFolder)


def test_ddp_rank_slices_partition_the_global_batch_and_resume_is_exact(folder: Path) -> None:
    stream = open_source(folder, "train", image_size=SIZE, mode="stream", num_workers=0)
    whole = _all(stream, 12, seed=2, epoch=1)
    ranks = [_all(stream, 12, seed=2, epoch=1, rank=r, world=3) for r in range(3)]
    assert all(len(r) == len(whole) == len(stream) // 12 for r in ranks)
    for b, (x, y) in enumerate(whole):
        assert torch.equal(torch.cat([r[b][0] for r in ranks]), x)
        assert torch.equal(torch.cat([r[b][1] for r in ranks]), y)
    tail = _all(stream, 12, seed=2, epoch=1, start=2)
    assert len(tail) == len(whole) - 2
    assert all(torch.equal(t[0], w[0]) for t, w in zip(tail, whole[2:]))
    # the skipped batches are never decoded: exactly the files of the remaining batches are read
    decoded: list[int] = []
    read = stream.read
    stream.read = lambda i: decoded.append(i) or read(i)
    _all(stream, 12, seed=2, epoch=1, start=2)
    remaining = global_batches(len(stream), 12, shuffle=True, at=Position(seed=2, epoch=1, start=2))
    assert decoded == torch.cat(list(remaining)).tolist()


def test_corrupt_image_skip_replaces_in_training_drops_in_eval_and_error_names_it(folder: Path, tmp_path: Path) -> None:
    root = tmp_path / "bad"
    for c in range(CLASSES):
        (root / f"c{c}").mkdir(parents=True)
        for f in sorted((folder / f"c{c}").iterdir())[:10]:
            (root / f"c{c}" / f.name).write_bytes(f.read_bytes())
    broken = root / "c1" / "000.jpg"
    broken.write_bytes(b"not a jpeg at all")
    stream = open_source(root, "train", image_size=SIZE, mode="stream", num_workers=0)
    assert len(stream) == 24  # listed, not decoded: the broken file is still counted
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        batches = _all(stream, 8, seed=0)
    assert [len(y) for _, y in batches] == [8, 8, 8]  # replaced: the schedule and the shapes stay fixed
    seen = [d for x, _ in batches for d in _digest(x)]
    assert len(set(seen)) == 23  # 23 readable images, one of them twice (the replacement)
    test = open_source(root, "test", image_size=SIZE, mode="stream", num_workers=0)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        evaluated = sum(len(y) for _, y in test.batches(4, shuffle=False))
    assert evaluated == len(test) == 6  # the broken file is a training file: the test split is whole
    broken_test = root / "c2" / "004.jpg"  # the fifth file of c2 is a test file: dropped when evaluating
    broken_test.write_bytes(b"\x00" * 10)
    test = open_source(root, "test", image_size=SIZE, mode="stream", num_workers=0)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        evaluated = sum(len(y) for _, y in test.batches(4, shuffle=False))
    assert evaluated == 5
    strict = open_source(root, "train", image_size=SIZE, mode="stream", num_workers=1, on_bad_image="error")
    with pytest.raises(ValueError) as e:
        _all(strict, 8, seed=0)
    assert str(broken) in str(e.value) and "\n" not in str(e.value) and "on_bad_image='skip'" in str(e.value)


# --------------------------------------------------------------------------- WebDataset shards
@pytest.mark.parametrize("workers", [0, 2])
def test_shards_epoch_visits_each_sample_once_ranks_disjoint_resume_exact(shards: Path, workers: int) -> None:
    from crate_transformer.data import WebDatasetShards

    train = open_source(shards, "train", image_size=SIZE, num_workers=workers)
    assert isinstance(train, WebDatasetShards) and len(train) == 48 and train.classes == ["red", "green", "blue"]
    index = json.loads((shards / "train" / ".crate-index.json").read_text())
    assert sorted(index) == [f"shard-{s:03d}.tar" for s in range(4)] and all(
        len(v["labels"]) == 12 for v in index.values()
    )
    epoch = _all(train, 8, seed=4, epoch=2)
    assert len(epoch) == train.steps_per_epoch(8) == 6 and all(len(y) == 8 for _, y in epoch)
    every = _digest(torch.cat([x for x, _ in _all(train, 8, shuffle=False)]))
    assert sorted(_digest(torch.cat([x for x, _ in epoch]))) == sorted(every)  # each sample exactly once
    other = _all(train, 8, seed=4, epoch=3)
    assert [d for x, _ in other for d in _digest(x)] != [d for x, _ in epoch for d in _digest(x)]  # reshuffled
    resumed = _all(train, 8, seed=4, epoch=2, start=4)
    assert len(resumed) == 2 and all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(resumed, epoch[4:])
    )
    ranks = [_all(train, 8, seed=4, epoch=2, rank=r, world=2) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 6 and all(len(y) == 4 for r in ranks for _, y in r)
    d0, d1 = ({d for x, _ in r for d in _digest(x)} for r in ranks)
    assert not d0 & d1 and len(d0 | d1) == 48  # shards dealt to ranks: disjoint, together the whole split
    test = open_source(shards, "test", image_size=SIZE, num_workers=workers)
    assert sum(len(y) for _, y in test.batches(5, shuffle=False)) == len(test) == 12


def test_flat_shards_hold_out_every_fifth_and_val_like_memory(tmp_path: Path, folder: Path) -> None:
    # the same JPEGs as the folder, class by class in file order: the split rules must pick the same files
    files = [(f.read_bytes(), str(c)) for c in range(CLASSES) for f in sorted((folder / f"c{c}").iterdir())]
    _write_shards(tmp_path / "flat", [files[:30], files[30:]])
    for split in ("train", "val", "test"):
        mem = load_dataset(folder, split, image_size=SIZE, val_fraction=0.25, seed=7)
        sh = open_source(tmp_path / "flat", split, image_size=SIZE, val_fraction=0.25, seed=7, num_workers=0)
        assert len(sh) == len(mem) and sh.classes == ["0", "1", "2"]
        x = torch.cat([b for b, _ in sh.batches(100, shuffle=False)])
        assert sorted(_digest(x)) == sorted(_digest(mem.images))


def test_shard_index_is_kept_in_memory_when_the_folder_is_not_writable(
    tmp_path: Path, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import crate_transformer.io
    from crate_transformer.data import shards as shards_module

    files = [(f.read_bytes(), "1") for f in sorted((folder / "c1").iterdir())[:6]]
    files += [(f.read_bytes(), "0") for f in sorted((folder / "c0").iterdir())[:6]]
    _write_shards(tmp_path / "ro", [files])

    def refuse(path: object, write: object) -> None:
        raise crate_transformer.io.WriteError(f"cannot write {path}: read-only")

    read = []
    label_text = shards_module._label_text
    monkeypatch.setattr(crate_transformer.io, "atomic_write", refuse)
    monkeypatch.setattr(shards_module, "_label_text", lambda sample, *a: read.append(1) or label_text(sample, *a))
    first = open_source(tmp_path / "ro", "train", image_size=SIZE, num_workers=0)
    assert len(read) == 12 and not (tmp_path / "ro" / ".crate-index.json").exists()
    assert len(open_source(tmp_path / "ro", "test", image_size=SIZE, num_workers=0)) + len(first) == 12
    assert len(read) == 12  # counted once per process


# --------------------------------------------------------------------------- Hugging Face datasets
def test_hf_dataset_from_save_to_disk_matches_memory_batches(tmp_path: Path, folder: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="the optional 'hf' extra (datasets) is not installed")
    from crate_transformer.data import HFImageDataset

    images = [
        {"bytes": f.read_bytes(), "path": None} for c in range(CLASSES) for f in sorted((folder / f"c{c}").iterdir())
    ]
    labels = [c for c in range(CLASSES) for _ in range(PER_CLASS)]
    feats = datasets.Features({"img": datasets.Image(), "target": datasets.ClassLabel(names=["c0", "c1", "c2"])})
    datasets.Dataset.from_dict({"img": images, "target": labels}, features=feats).save_to_disk(tmp_path / "hf")
    for split in ("train", "test"):
        mem = load_dataset(folder, split, image_size=SIZE, val_fraction=0.2, seed=1)
        hf = open_source(tmp_path / "hf", split, image_size=SIZE, val_fraction=0.2, seed=1, num_workers=1)
        assert isinstance(hf, HFImageDataset) and hf.classes == ["c0", "c1", "c2"] and len(hf) == len(mem)
        for (xa, ya), (xb, yb) in zip(
            _all(mem, 8, seed=2, shuffle=split == "train"), _all(hf, 8, seed=2, shuffle=split == "train")
        ):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


# --------------------------------------------------------------------------- bad input
def test_bad_input_is_a_one_line_error(tmp_path: Path, folder: Path, shards: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "noclass").mkdir()
    (tmp_path / "noclass" / "a.jpg").write_bytes(next(folder.glob("c0/*.jpg")).read_bytes())
    _write_shards(tmp_path / "nolabels", [[(next(folder.glob("c0/*.jpg")).read_bytes(), "0")]], label_key="")
    cases = [
        ((tmp_path / "empty", "train"), {}, "has no class subfolders"),
        ((tmp_path / "noclass", "train"), {"mode": "stream"}, "has no class subfolders"),
        ((folder, "train"), {"mode": "fast"}, "unknown data mode 'fast'"),
        ((shards, "train"), {"mode": "memory"}, "always streamed; pass data_mode='stream'"),
        ((tmp_path / "nolabels", "train"), {}, "has no label"),
        ((folder, "val"), {"mode": "stream"}, "pass val_fraction=0.1"),
        (
            (folder, "train"),
            {"mode": "stream", "num_workers": -2},
            "num_workers must be an integer >= -1 (-1 = auto, 0 = in the main process), got -2",
        ),
        ((str(tmp_path / "none-{0..3}.tar"), "train"), {}, "no .tar shards match"),
    ]
    for args, kw, msg in cases:
        with pytest.raises(ValueError) as e:
            open_source(*args, **{"image_size": SIZE, **kw})
        assert msg in str(e.value) and "\n" not in str(e.value), (args, kw, str(e.value))
    with pytest.raises(ValueError, match="streamed, not loaded into memory"):
        load_dataset(shards, "train")
    cfg = TrainConfig(data=str(folder), data_mode="stream", train_subset=10, image_size=SIZE, out=str(tmp_path / "r"))
    with pytest.raises(ValueError, match="^train_subset works on in-memory data only"):
        train(cfg, overrides={"model_args": dict(a.split("=") for a in ARCH)})


# --------------------------------------------------------------------------- crate train on streamed data
def _run(folder: Path, out: Path, *extra: str) -> int:
    argv = ["train", "--data", folder, "--model", "crate_mnist", "--image-size", SIZE, "--epochs", "2",
            "--batch-size", "12", "--threads", "1", "--no-progress", "--measure-every", "0", "--out", out, *extra,
            "--model-args", *ARCH]  # fmt: skip
    return cli.main([str(a) for a in argv])


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run / "model" / "model.safetensors")


def test_crate_train_stream_equals_memory_resumes_accumulates_and_logs_to_tensorboard(
    folder: Path, tmp_path: Path
) -> None:
    assert _run(folder, tmp_path / "mem", "--data-mode", "memory") == 0
    tensorboard = ["--tensorboard"] if importlib.util.find_spec("tensorboard") else []
    assert _run(folder, tmp_path / "accum", "--data-mode", "stream", "--accum-steps", "3", *tensorboard) == 0
    # 48 training images, batch 12: 4 steps per epoch; stop mid-epoch 2, then finish
    assert _run(folder, tmp_path / "cut", "--data-mode", "stream", "--workers", "1", "--max-steps", "6") == 0
    assert cli.main(["train", "--resume", str(tmp_path / "cut"), "--max-steps", "0", "--threads", "1"]) == 0
    # the same batches as in memory, interrupted or not: bitwise the same weights
    mem, stream = _weights(tmp_path / "mem"), _weights(tmp_path / "cut")
    for k in mem:
        assert torch.equal(mem[k], stream[k]), k
    # 3 accumulated chunks of 4 reach the weights of one batch of 12 (to float rounding)
    accum = _weights(tmp_path / "accum")
    assert max((accum[k] - stream[k]).abs().max().item() for k in stream) < 1e-4
    if tensorboard:
        events = list((tmp_path / "accum" / "tensorboard").rglob("events.out.tfevents*"))
        assert events and events[0].stat().st_size > 0
    # crate eval on the streamed test split reproduces the run's own final evaluation
    argv = ["eval", tmp_path / "cut", "--data-mode", "stream", "--workers", "0", "--out", tmp_path / "ev"]
    assert cli.main([str(a) for a in argv]) == 0
    final = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()][-1]
    report = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert report["num_samples"] == 12 and report["top1"] == pytest.approx(final["acc"])
    records = [json.loads(line) for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r.get("split") == "train"]
    assert steps[-1] == 8 and steps == sorted(set(steps))


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="gloo torchrun test runs on Linux CI")
def test_torchrun_two_processes_on_shards(shards: Path, tmp_path: Path, torchrun) -> None:
    args = ["train", "--data", shards, "--model", "crate_mnist", "--image-size", SIZE, "--epochs", "1",
            "--batch-size", "8", "--workers", "0", "--threads", "1", "--no-progress", "--augment", "none",
            "--log-every", "1", "--out", tmp_path / "ddp", "--model-args", *ARCH]  # fmt: skip
    proc = torchrun(*args)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert out.count("final test accuracy") == 1
    records = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in records if r.get("split") == "train"]
    assert train_steps == list(range(1, 7))  # 48 samples / global batch 8, both ranks in step
    final = [r for r in records if r.get("final")]
    assert len(final) == 1 and 0.0 <= final[0]["acc"] <= 1.0


@pytest.mark.parametrize(
    "kind, what",
    [
        ("folder", "a streamed image folder"),
        ("shards", "a split of WebDataset shards"),
        ("hf", "a Hugging Face dataset"),
    ],
)
def test_a_streamed_source_without_image_size_is_refused_before_reading(tmp_path: Path, kind: str, what: str) -> None:
    from crate_transformer.data import HFImageDataset, WebDatasetShards
    from crate_transformer.errors import OptionError

    opened = {"folder": StreamingImageFolder.open, "shards": WebDatasetShards, "hf": HFImageDataset}[kind]
    with pytest.raises(OptionError) as e:
        opened(tmp_path / "absent", "train", image_size=None)  # nothing there: the check comes before any read
    assert str(e.value) == f"{what} needs image_size: its images are resized on read" and e.value.options == (
        "image_size",
    )
    with pytest.raises(ValueError, match="unknown split 'dev'"):  # then the arguments every loader shares
        opened(tmp_path / "absent", "dev", image_size=8)
