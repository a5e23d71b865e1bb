"""Datasets by name (``--data ylecun/mnist``, ``glue:sst2``, ``wikitext:…``) through the real ``datasets`` code.

Each test populates a ``datasets`` cache the way a download leaves it (:mod:`hfcache`), turns the Hub off
(``HF_DATASETS_OFFLINE=1``), and runs the real commands: the package calls ``datasets.load_dataset`` by id.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

datasets = pytest.importorskip("datasets", reason="the optional 'hf' extra (datasets) is not installed")

from clitools import crate, one_line_error  # noqa: E402
from hfcache import put_in_datasets_cache  # noqa: E402

from crate_transformer.data import canonical_source, open_source, resolve_source  # noqa: E402
from crate_transformer.data.text import iter_documents, load_tokens, read_labelled  # noqa: E402
from crate_transformer.loading.pipeline import load_model  # noqa: E402
from crate_transformer.models.tokenizer import Tokenizer  # noqa: E402

TINY = ["--threads", 1, "--no-progress", "--eval-every", 0]


def _digits(n: int, seed: int) -> datasets.Dataset:
    """``n`` 28×28 grey images whose mean brightness encodes the class (so they are learnable)."""
    rng = np.random.default_rng(seed)
    labels = [i % 3 for i in range(n)]
    images = [(rng.random((28, 28)) * 60 + 60 * y).astype(np.uint8) for y in labels]
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])})
    return datasets.Dataset.from_dict({"image": images, "label": labels}, features=feats)


def test_a_dataset_id_is_a_source_and_is_recorded_as_given(tmp_path: Path) -> None:
    for name in ("ylecun/mnist", "uoft-cs/cifar10", "glue:sst2", "wikitext:wikitext-2-raw-v1"):
        assert resolve_source(name) == ("hf", name) and canonical_source(name) == name
    (tmp_path / "rows.parquet").write_bytes(b"")
    assert resolve_source(tmp_path / "rows.parquet") == ("hf", str((tmp_path / "rows.parquet").resolve()))
    with pytest.raises(ValueError, match="dataset id"):
        resolve_source(tmp_path / "no" / "such" / "folder")


def test_an_image_dataset_by_id_reads_its_own_train_and_test_splits(offline_cache: Path) -> None:
    train, test = _digits(30, 0), _digits(12, 1)
    put_in_datasets_cache(offline_cache, "ylecun/mnist", "mnist", {"train": train, "test": test})
    got = {s: open_source("ylecun/mnist", s, image_size=28, num_workers=0) for s in ("train", "test")}
    assert got["train"].classes == ["a", "b", "c"] and len(got["train"]) == 30 and len(got["test"]) == 12
    assert got["test"].labels.tolist() == test["label"]
    # the bytes the loader decodes are the rows of the split, in order
    first = np.asarray(datasets.Image().decode_example({"bytes": got["test"].raw(0)[0], "path": None}))
    assert np.array_equal(first, np.asarray(test[0]["image"]))


def test_crate_train_on_a_dataset_id_tests_on_its_test_split(offline_cache: Path, tmp_path: Path) -> None:
    put_in_datasets_cache(offline_cache, "ylecun/mnist", "mnist", {"train": _digits(60, 0), "test": _digits(15, 1)})
    out = tmp_path / "run"
    argv = ["train", "--data", "ylecun/mnist", "--model-args", "dim=16", "depth=1", "heads=2", "--epochs", 1]
    assert crate(*argv, *TINY, "--batch-size", 20, "--out", out) == 0
    final = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    model = load_model(out)
    assert model.config.data.source == "ylecun/mnist" and model.config.data.classes == ["a", "b", "c"]
    assert abs(final["acc"] * 15 - round(final["acc"] * 15)) < 1e-6  # scored on the 15 test images


def test_local_parquet_files_are_read_by_datasets(tmp_path: Path) -> None:
    folder = tmp_path / "repo" / "data"
    folder.mkdir(parents=True)
    _digits(20, 0).to_parquet(str(folder / "train-00000-of-00001.parquet"))
    _digits(9, 1).to_parquet(str(folder / "test-00000-of-00001.parquet"))
    assert resolve_source(tmp_path / "repo")[0] == "hf"
    assert [len(open_source(tmp_path / "repo", s, image_size=28, num_workers=0)) for s in ("train", "test")] == [20, 9]


def test_an_absent_dataset_is_one_line_naming_it_and_the_fix(offline_cache: Path, capsys) -> None:
    err = one_line_error(capsys, "train", "--data", "uoft-cs/cifar10", *TINY)
    assert "'uoft-cs/cifar10' is not in the local Hugging Face cache" in err
    assert "datasets.load_dataset('uoft-cs/cifar10')" in err


def test_train_lm_streams_the_text_column_of_a_corpus_by_id(offline_cache: Path, tmp_path: Path) -> None:
    rows = ["= Title =\n", "", "the cat sat on the mat .\n", "a dog ran .\n"] * 30
    corpus = datasets.Dataset.from_dict({"text": rows})
    put_in_datasets_cache(offline_cache, "wikitext", "wikitext-2-raw-v1", {"train": corpus})
    source = "wikitext:wikitext-2-raw-v1"
    assert ["".join(d) for d in iter_documents(source)] == [r for r in rows if r]  # empty rows hold no document
    tok = Tokenizer.byte_level()
    expected = [t for r in rows if r for t in (*tok.encode(r), tok.eos_id)]
    assert load_tokens(source, tok).tolist() == expected
    out = tmp_path / "lm"
    argv = ["train-lm", "--data", source, "--model-args", "dim=16", "depth=1", "heads=2", "block_size=16"]
    assert crate(*argv, *TINY, "--max-steps", 3, "--batch-size", 4, "--out", out) == 0
    assert load_model(out).config.vocab_size == tok.vocab_size


def test_finetune_text_on_glue_evaluates_on_the_validation_split(offline_cache: Path, tmp_path: Path) -> None:
    rng = random.Random(0)
    label = datasets.ClassLabel(names=["neg", "pos"])
    feats = datasets.Features({"sentence": datasets.Value("string"), "label": label})

    def rows(n: int, hidden: bool = False) -> datasets.Dataset:
        ys = [rng.randint(0, 1) for _ in range(n)]
        text = [f"it was {'good' if y else 'bad'}" for y in ys]
        return datasets.Dataset.from_dict({"sentence": text, "label": [-1] * n if hidden else ys}, features=feats)

    splits = {"train": rows(40), "validation": rows(11), "test": rows(7, hidden=True)}
    put_in_datasets_cache(offline_cache, "glue", "sst2", splits)
    texts, labels, cols, label = read_labelled("glue:sst2", "validation")
    assert cols == ("sentence",) and label == "label" and len(texts) == 11
    assert labels == [["neg", "pos"][y] for y in splits["validation"]["label"]]
    with pytest.raises(ValueError, match="rows without a label"):
        read_labelled("glue:sst2", "test")
    from crate_transformer.models.lm import LMConfig, build_lm

    lm = build_lm(LMConfig(dim=16, depth=1, heads=2, block_size=24))
    lm.tokenizer = Tokenizer.byte_level()
    lm.save_pretrained(tmp_path / "lm")
    out = tmp_path / "sst2"
    argv = ["finetune-text", "--from", tmp_path / "lm", "--data", "glue:sst2", "--epochs", 1]
    assert crate(*argv, *TINY, "--out", out) == 0
    final = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert abs(final["acc"] * 11 - round(final["acc"] * 11)) < 1e-6  # scored on the 11 validation rows
    assert load_model(out).config.num_labels == 2
