"""A dataset's columns named on the command line (``--image-column``, ``--label-column``, ``--text-columns``).

Every dataset here has columns the automatic choice gets wrong: a second image column, a class-index column that is
not the ClassLabel one, a text column that is not the first string column.  The datasets go into a real
``datasets`` cache (:mod:`hfcache`) and are read back by id, offline, by the real ``load_dataset``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

datasets = pytest.importorskip("datasets", reason="the optional 'hf' extra (datasets) is not installed")

from clitools import crate, one_line_error  # noqa: E402
from hfcache import put_in_datasets_cache  # noqa: E402

from crate_transformer.data import open_source  # noqa: E402
from crate_transformer.data.text import iter_documents, load_tokens  # noqa: E402
from crate_transformer.errors import OptionError  # noqa: E402
from crate_transformer.models.tokenizer import Tokenizer  # noqa: E402
from crate_transformer.train.config import TrainConfig  # noqa: E402
from crate_transformer.train.rundir import read_run_config  # noqa: E402

TINY = ["--threads", 1, "--no-progress", "--eval-every", 0]
MODEL = ["--model-args", "dim=16", "depth=1", "heads=2"]


def _two_views(n: int, seed: int) -> datasets.Dataset:
    """Rows with two images (``sketch``: noise, first; ``photo``: brightness encodes the digit), a two-class
    ClassLabel ``parity`` and the digit ``digit`` (0..3) as a plain integer."""
    rng = np.random.default_rng(seed)
    digit = [i % 4 for i in range(n)]
    photo = [(rng.random((28, 28)) * 40 + 60 * d).astype(np.uint8) for d in digit]
    sketch = [rng.integers(0, 256, (28, 28), dtype=np.uint8) for _ in digit]
    feats = datasets.Features(
        {
            "sketch": datasets.Image(),
            "photo": datasets.Image(),
            "parity": datasets.ClassLabel(names=["even", "odd"]),
            "digit": datasets.Value("int64"),
        }
    )
    rows = {"sketch": sketch, "photo": photo, "parity": [d % 2 for d in digit], "digit": digit}
    return datasets.Dataset.from_dict(rows, features=feats)


@pytest.fixture
def views(offline_cache: Path) -> dict[str, datasets.Dataset]:
    splits = {"train": _two_views(40, 0), "test": _two_views(12, 1)}
    put_in_datasets_cache(offline_cache, "lab/views", "default", splits)
    return splits


def _decoded(source: object, i: int) -> np.ndarray:
    return np.asarray(datasets.Image().decode_example({"bytes": source.raw(i)[0], "path": None}))


def test_named_image_and_label_columns_replace_the_automatic_choice(views: dict) -> None:
    auto = open_source("lab/views", "test", image_size=28, num_workers=0)
    assert auto.classes == ["even", "odd"] and np.array_equal(_decoded(auto, 0), np.asarray(views["test"][0]["sketch"]))
    named = open_source("lab/views", "test", image_size=28, num_workers=0, image_column="photo", label_column="digit")
    assert named.classes == ["0", "1", "2", "3"] and named.labels.tolist() == views["test"]["digit"]
    for i in (0, 5):
        assert np.array_equal(_decoded(named, i), np.asarray(views["test"][i]["photo"]))
    with pytest.raises(ValueError, match=r"no column 'picture' \(columns: \['sketch', 'photo', 'parity', 'digit'\]\)"):
        open_source("lab/views", "test", image_size=28, image_column="picture")
    with pytest.raises(ValueError, match="label_column names a Hugging Face dataset's column and mnist is not one"):
        open_source("mnist", "test", label_column="digit")


def test_train_records_the_columns_and_eval_reads_them_back(views: dict, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    argv = ["train", "--data", "lab/views", "--image-column", "photo", "--label-column", "digit", *MODEL]
    assert crate(*argv, *TINY, "--epochs", 2, "--batch-size", 20, "--out", out) == 0
    spec = json.loads((out / "model" / "config.json").read_text())["data"]
    assert (spec["image_column"], spec["label_column"], spec["classes"]) == ("photo", "digit", ["0", "1", "2", "3"])
    assert read_run_config(out).data.label_column == "digit"
    assert crate("eval", out, "--threads", 1, "--out", tmp_path / "eval") == 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["num_samples"] == 12 and report["classes"] == ["0", "1", "2", "3"]  # the digit, not the parity
    err = one_line_error(capsys, "eval", out, "--label-column", "kind", "--out", tmp_path / "eval2")
    assert "no column 'kind'" in err and "--label-column" in err


def test_a_model_without_named_columns_writes_the_config_it_always_wrote() -> None:
    from crate_transformer.models.spec import DataSpec

    assert "image_column" not in DataSpec(source="mnist").to_dict()
    assert DataSpec(source="lab/views", label_column="digit").columns_for("lab/views") == {"label_column": "digit"}
    assert DataSpec(source="lab/views", label_column="digit").columns_for("other/set") == {}


def test_text_columns_choose_what_a_language_model_reads(offline_cache: Path, tmp_path: Path, capsys) -> None:
    ids = [f"doc-{i}" for i in range(40)]
    body = ["the cat sat on the mat .", "a dog ran ."] * 20
    title = ["Cats", "Dogs"] * 20
    corpus = datasets.Dataset.from_dict({"id": ids, "title": title, "body": body})
    put_in_datasets_cache(offline_cache, "lab/stories", "default", {"train": corpus})
    assert ["".join(d) for d in iter_documents("lab/stories")] == ids  # the first string column, by default
    assert ["".join(d) for d in iter_documents("lab/stories", ["body"])] == body
    both = ["".join(d) for d in iter_documents("lab/stories", ["title", "body"])]
    assert both == [f"{t}\n{b}" for t, b in zip(title, body)]
    tok = Tokenizer.byte_level()
    assert load_tokens("lab/stories", tok, ["body"]).tolist() == [t for b in body for t in (*tok.encode(b), tok.eos_id)]
    with pytest.raises(ValueError, match=r"no column\(s\) \['text'\].*fix text_columns"):
        load_tokens("lab/stories", tok, ["text"])
    out = tmp_path / "lm"
    argv = ["train-lm", "--data", "lab/stories", "--text-columns", "body", *MODEL, "block_size=8"]
    assert crate(*argv, *TINY, "--max-steps", 2, "--batch-size", 4, "--out", out) == 0
    assert read_run_config(out).data.text_columns == ["body"]
    assert crate("analyze", out, "--threads", 1, "--num-blocks", 2, "--out", tmp_path / "report") == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert "lab/stories" in json.dumps(report)
    err = one_line_error(capsys, "train-lm", "--text-columns", "body", *TINY, "--out", tmp_path / "lm2")
    assert "--text-columns names a dataset's columns and python-docs is not a dataset; drop it" in err


def test_text_classification_columns_moved_to_the_data_group_and_old_configs_still_read() -> None:
    args = {"text_columns": ["q", "a"], "label_column": "y", "eval_data": ""}
    old = {"task": "text-classification", "task_args": args}
    cfg = TrainConfig.from_dict(old)
    assert cfg.data.text_columns == ["q", "a"] and cfg.data.label_column == "y"
    assert cfg.task_args == {"eval_data": ""}
    text = {"task": "text-classification", "text_columns": "q", "label_column": "y"}
    assert TrainConfig.from_dict(text).data.text_columns == ["q"]  # one column as a list
    with pytest.raises(OptionError, match="text_columns applies only when task is lm / text-classification"):
        TrainConfig.from_dict({"text_columns": "q", "label_column": "y"})  # an image task reads no text column
