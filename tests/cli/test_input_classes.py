"""Bad input by class: each rule here holds for every instance of its class, and each test tries several.

1. Sizes from data are bounded before anything is allocated from them (labels → classes, one-hot rows).
2. Expected failures are one line (exit code 2), never a traceback, and never print a huge value.
3. Messages point the right way: the fix they name is one the user can apply with the command they ran.
4. Inputs are never ignored or changed silently.
5. Outputs are never replaced without asking; histories never hold a step twice.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from clitools import crate, one_line_error
from PIL import Image

import crate_transformer as ct

HUGE = 10**6  # a label far above MAX_CLASSES: before the rule, 1e9 made a billion class names (23.9 GB, OOM)


def _png(value: int = 0, size: int = 8) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((size, size, 3), value, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _parquet(path: Path, labels: list[int]) -> Path:
    import pandas as pd

    rows = [{"image": {"bytes": _png(40 * (y % 5)), "path": None}, "label": y, "idx": i} for i, y in enumerate(labels)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


def _shards(root: Path, labels: list[bytes]) -> Path:
    import webdataset as wds

    root.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(root / "a.tar")) as w:
        for i, label in enumerate(labels):
            w.write({"__key__": f"k{i:03d}", "png": _png(40 * (i % 5)), "cls": label})
    return root


def _cifar_without_meta(root: Path, big: int) -> Path:
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        labels = [i % 2 for i in range(10)]
        if f == "data_batch_2":
            labels[3] = big
        data = {b"data": rng.integers(0, 256, (10, 3072), dtype=np.uint8), b"labels": labels}
        (d / f).write_bytes(pickle.dumps(data))
    return d


# --------------------------------------------------------------------------- 1. sizes from data
@pytest.mark.parametrize("kind", ["parquet", "shards", "cifar"])
def test_one_huge_label_is_refused_before_any_class_is_made(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture, offline_cache: Path
) -> None:
    labels = [i % 2 for i in range(20)]
    labels[3] = HUGE
    if kind == "parquet":
        data = _parquet(tmp_path / "pq" / "train.parquet", labels).parent
    elif kind == "shards":
        data = _shards(tmp_path / "wds", [str(y).encode() for y in labels])
    else:
        data = _cifar_without_meta(tmp_path, HUGE)
    out = tmp_path / "run"
    err = one_line_error(
        capsys,
        "train",
        "--data",
        data,
        "--image-size",
        8,
        "--max-steps",
        1,
        "--threads",
        1,
        "--no-progress",
        "--out",
        out,
        after_output=True,
    )  # fmt: skip (datasets' own progress)
    assert f"the label {HUGE:,} would make {HUGE + 1:,} classes for 3 distinct labels" in err, err
    fix = {"parquet": "class_encode_column", "shards": "classes.txt", "cifar": "batches.meta"}[kind]
    assert fix in err, err
    assert not out.exists()


def test_class_count_accepts_dense_labels_and_refuses_sparse_huge_or_negative_ones() -> None:
    from crate_transformer.data.base import MAX_CLASSES, class_count

    assert class_count([0, 2, 1, 2], "x", "fix") == 3
    assert class_count(torch.arange(MAX_CLASSES + 1), "x", "fix") == MAX_CLASSES + 1  # every class occurs
    with pytest.raises(ValueError, match=f"would make {MAX_CLASSES + 1:,} classes for 2 distinct"):
        class_count([0, MAX_CLASSES], "x", "fix")
    with pytest.raises(ValueError, match="the label -1 is not a class index"):
        class_count(np.array([0, -1]), "x", "fix")
    with pytest.raises(ValueError, match="would make"):  # beyond int64: Python ints, no overflow
        class_count([0, 10**30], "x", "fix")


def test_a_layer_count_read_from_key_names_is_bounded_by_the_keys(tmp_path: Path) -> None:
    """Depths an authors' file gives only by its key names: one key numbered 10**9 would build a billion layers
    before any weight is compared.  Every format that counts blocks by their keys refuses a numbering with gaps."""
    from crate_transformer.loading.official import index_count
    from crate_transformer.models.bert import bert_checkpoint_fields
    from crate_transformer.models.lm import lm_checkpoint_fields
    from crate_transformer.models.tost import tost_fields

    assert index_count({"h.0.a": 1, "h.1.a": 1, "h.1.b": 1, "x": 1}, r"h\.(\d+)\.") == 2
    assert index_count({"c.0.w": 1, "c.2.w": 1}, r"c\.(\d+)\.", step=2) == 3  # convolutions between activations
    with pytest.raises(ValueError, match=r"keys c.N.… number 2 blocks up to index 4, and block 2 is missing"):
        index_count({"c.0.w": 1, "c.4.w": 1}, r"c\.(\d+)\.", step=2)
    one = torch.ones(4)
    lm = {"wte.weight": torch.zeros(8, 4), "wpe.weight": torch.zeros(6, 4), "h.0.ista.weight": torch.eye(4)}
    cases = [
        (lm_checkpoint_fields, {"model": {**lm, f"h.{10**9}.ln_1.weight": one}}, "h.N."),
        (bert_checkpoint_fields, {"crate.encoder.layer.0.x": one, f"crate.encoder.layer.{10**9}.x": one},
         "crate.encoder.layer.N."),
        (tost_fields, {"cls_token": one, "blocks.0.attn.temp": one, f"blocks.{10**9}.x": one}, "blocks.N."),
    ]  # fmt: skip
    for fields, raw, keys in cases:
        with pytest.raises(ValueError, match=rf"keys {re.escape(keys)}… number 2 blocks up to index 1,000,000,000"):
            fields(raw)
    torch.save({"model": {**lm, f"h.{10**9}.ln_1.weight": one}, "model_args": {"n_head": 2}}, tmp_path / "huge.pt")
    with pytest.raises(ValueError, match="block 1 is missing; the file is damaged"):  # refused before a model is built
        ct.from_official(tmp_path / "huge.pt", "crate_gpt_mini")


def test_knn_votes_only_over_the_classes_that_occur_and_refuses_k_above_the_training_set() -> None:
    from crate_transformer.analysis.probe import knn_sweep, usable_ks

    g = torch.Generator().manual_seed(0)
    tx, qx = torch.randn(40, 6, generator=g), torch.randn(15, 6, generator=g)
    ty, qy = torch.arange(40) % 3, torch.arange(15) % 3
    expected = knn_sweep(tx, ty, qx, qy, ks=(1, 5, 40))
    relabel = torch.tensor([0, 7, 10**12])  # one-hot rows of 10**12 classes before: votes over 3 classes now
    assert knn_sweep(tx, relabel[ty], qx, relabel[qy], ks=(1, 5, 40)) == expected
    with pytest.raises(ValueError, match="k=41 is more than the 40 training samples"):
        knn_sweep(tx, ty, qx, qy, ks=(5, 41))
    with pytest.raises(ValueError, match="label 3 is not a class index 0..2"):
        knn_sweep(tx, ty, qx, qy + 1, ks=(5,), num_classes=3)
    assert usable_ks((10, 20, 100, 200), 50) == ([10, 20], [100, 200])


def test_membership_coding_rate_loops_over_the_labels_present() -> None:
    Z = torch.randn(2, 12, 4, dtype=torch.float64)
    labels = torch.arange(12).repeat(2, 1) % 3
    expected = ct.membership_coding_rate(Z, labels)
    torch.testing.assert_close(ct.membership_coding_rate(Z, labels * 10**9), expected)  # 1e9 loop steps before
    with pytest.raises(ValueError, match="label 2 is not a class index in \\[0, 2\\)"):
        ct.membership_coding_rate(Z, labels, num_classes=2)


def test_crate_eval_knn_runs_the_ks_the_training_set_allows_and_says_which_it_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = tmp_path / "imgs"
    for c in range(2):
        (folder / f"c{c}").mkdir(parents=True)
        for i in range(20):
            (folder / f"c{c}" / f"{i}.png").write_bytes(_png(100 * c + i))
    model = ct.create_model("crate_tiny", image_size=8, patch_size=4, dim=16, depth=1, heads=2, num_classes=2)
    model.save_pretrained(tmp_path / "m")
    out = tmp_path / "ev"
    capsys.readouterr()
    assert crate("eval", tmp_path / "m", "--data", folder, "--knn", "--threads", 1, "--out", out) == 0
    report = json.loads((out / "eval.json").read_text())
    assert set(report["knn"]) == {"10", "20"} and report["knn_not_run"] == [100, 200]
    assert "k=100, 200 not run: more than the 32 train images" in capsys.readouterr().out


def test_a_tampered_shard_index_is_warned_about_and_read_again_from_the_shards(tmp_path: Path) -> None:
    from crate_transformer.data import open_source
    from crate_transformer.data.shards import _MEMORY_INDEX, INDEX_FILE

    root = _shards(tmp_path / "wds", [str(i % 2).encode() for i in range(20)])
    first = open_source(root, "train", image_size=8, num_workers=0)
    index = json.loads((root / INDEX_FILE).read_text())
    index["a.tar"]["labels"] = ["1" if t == "0" else "0" for t in index["a.tar"]["labels"]]  # size, mtime kept
    (root / INDEX_FILE).write_text(json.dumps(index))
    _MEMORY_INDEX.clear()  # a new process
    with pytest.warns(UserWarning, match="the entry of a.tar does not match its checksum"):
        again = open_source(root, "train", image_size=8, num_workers=0)
    assert again.labels == first.labels  # the shards' labels, not the edited ones
    assert json.loads((root / INDEX_FILE).read_text())["a.tar"]["labels"][:2] == ["0", "1"]  # and rewritten


# --------------------------------------------------------------------------- 2. one line, never a traceback
def _lm_folder(path: Path) -> Path:
    from crate_transformer.models.lm import LMConfig, build_lm
    from crate_transformer.models.tokenizer import Tokenizer

    model = build_lm(LMConfig(dim=16, depth=1, heads=2, block_size=32))
    model.tokenizer = Tokenizer.byte_level()
    model.save_pretrained(path)
    return path


def _tables(root: Path) -> dict[str, Path]:
    """Text data files, each wrong in one way."""
    import pandas as pd

    root.mkdir(parents=True, exist_ok=True)
    rows = [(f"a {i}", f"b {i}", f"c {i}", i % 2) for i in range(40)]
    (root / "three.csv").write_text("a,b,c,label\n" + "".join(f"{a},{b},{c},{y}\n" for a, b, c, y in rows))
    (root / "twice.csv").write_text("text,label,label\n" + "".join(f"{a},{y},{1 - y}\n" for a, _, _, y in rows))
    (root / "twicedir").mkdir()  # the same table read by datasets (pandas renames the second column label.1)
    (root / "twicedir" / "train.csv").write_text((root / "twice.csv").read_text())
    pd.DataFrame({"text": [{"k": i} for i in range(40)], "s": [f"s {i}" for i in range(40)],
                  "label": [i % 2 for i in range(40)]}).to_parquet(root / "objects.parquet")  # fmt: skip
    (root / "empty.parquet").write_bytes(b"")
    no_rows = {"text": pd.Series([], dtype=str), "label": pd.Series([], dtype=int)}
    pd.DataFrame(no_rows).to_parquet(root / "none.parquet")
    (root / "header.csv").write_text("text,label\n")
    (root / "emptylist.json").write_text("[]")
    (root / "blank.jsonl").write_text("\n\n")
    (root / "bad.jsonl").write_text('{"text": "a", "label": 1}\n{"text": "b", "label": \n{"text": "c", "label": 0}\n')
    return {p.stem: p for p in root.iterdir()}


TEXT_CASES = {  # command, file, extra arguments, what the one line says
    "three_text_columns": ("finetune-text", "three", ["--text-columns", "a", "b", "c"],
                           r"text_columns names \['a', 'b', 'c'\]; a text classifier reads one text or a pair"),
    "label_as_text": ("finetune-text", "three", ["--text-columns", "a", "label"],
                      "'label' is the label column and cannot also be a text column"),
    "a_column_twice": ("finetune-text", "twice", [], r"the header names \['label'\] more than once"),
    "a_column_twice_dataset": ("finetune-text", "twicedir", [], r"names 'label' twice \(the second read as"),
    "object_column_table": ("finetune-text", "objects", ["--text-columns", "text"],
                            r"column 'text' holds dict, not text; .* \(string columns: \['s'\]\)"),
    "object_column_corpus": ("train-lm", "objects", ["--text-columns", "text"], "column 'text' holds dict, not text"),
    "empty_parquet_lm": ("train-lm", "empty", [], r"empty.parquet is empty \(0 bytes\)"),
    "empty_parquet_table": ("finetune-text", "empty", [], r"empty.parquet is empty \(0 bytes\)"),
    "no_rows": ("finetune-text", "none", [], "none.parquet holds no rows"),
    "no_rows_lm": ("train-lm", "none", [], "none.parquet holds no rows"),
    "header_only_lm": ("train-lm", "header", ["--text-columns", "text"], "header.csv holds no rows"),
    "empty_list_lm": ("train-lm", "emptylist", ["--text-columns", "text"], "emptylist.json holds no rows"),
    "blank_lines_lm": ("train-lm", "blank", ["--text-columns", "text"], "blank.jsonl holds no rows"),
    "malformed_json_table": ("finetune-text", "bad", [], r"bad.jsonl:2:\d+: invalid JSON \(Expecting value\)"),
    "malformed_json_corpus": ("train-lm", "bad", ["--text-columns", "text"], r"bad.jsonl:2:\d+: invalid JSON"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(TEXT_CASES))
def test_a_bad_text_table_or_corpus_is_one_line(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture, offline_cache: Path
) -> None:
    command, name, extra, expected = TEXT_CASES[case]
    data = _tables(tmp_path / "data")[name]
    start = ["--from", _lm_folder(tmp_path / "lm")] if command == "finetune-text" else []
    out = tmp_path / "run"
    err = one_line_error(capsys, command, *start, "--data", data, *extra, "--threads", 1, "--no-progress",
                         "--max-steps", 1, "--out", out, match=expected, after_output=True)  # fmt: skip
    assert len(err) < 400 and not out.exists(), err


@pytest.mark.parametrize(
    "name, content, expected",
    [
        ("header.csv", "image,label\n", "header.csv holds no rows"),
        ("empty.json", "[]", "empty.json holds no rows"),
        ("blank.jsonl", "\n \n", r"blank.jsonl holds no rows \(only blank lines\)"),
    ],
)
def test_an_image_data_file_without_rows_is_one_line(
    name: str, content: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture, offline_cache: Path
) -> None:
    (tmp_path / name).write_text(content)
    one_line_error(capsys, "train", "--data", tmp_path / name, "--image-size", 8, "--threads", 1, "--no-progress",
                   "--out", tmp_path / "r", match=expected, after_output=True)  # fmt: skip
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--label-column", "image"], r"column 'image' holds images, not class labels; name the label column"),
        (["--image-column", "idx"], r"column 'idx' holds int64, not images .* name the image column"),
        (["--image-column", "label"], r"column 'label' holds int64, not images"),
    ],
)
def test_image_and_label_columns_are_checked_by_what_they_hold(
    extra: list[str], expected: str, tmp_path: Path, capsys: pytest.CaptureFixture, offline_cache: Path
) -> None:
    data = _parquet(tmp_path / "d" / "one.parquet", [i % 2 for i in range(20)])
    err = one_line_error(capsys, "train", "--data", data, *extra, "--image-size", 8, "--threads", 1, "--no-progress",
                         "--max-steps", 1, "--out", tmp_path / "r", match=expected, after_output=True)  # fmt: skip
    assert "class_encode_column" not in err and "b'\\x89PNG" not in err  # no wrong fix, no image bytes printed


def test_a_config_whose_aliases_expand_to_1e8_strings_is_one_short_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    items, prev = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]'], "a"
    for name in "bcdefgh":
        items.append(f"&{name} [" + ",".join([f"*{prev}"] * 10) + "]")
        prev = name
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("lr: [" + ", ".join(items) + "]\n")  # 10**8 strings, 323 bytes: an 800 MB line before
    assert bomb.stat().st_size < 1024
    err = one_line_error(capsys, "train", "--config", bomb, "--out", tmp_path / "r", match="expands to more than")
    assert len(err) < 300
    (tmp_path / "self.yaml").write_text("lr: &x [*x]\n")
    one_line_error(capsys, "train", "--config", tmp_path / "self.yaml", match="refer to themselves")
    (tmp_path / "long.yaml").write_text(f"lr: {'x' * 100_000}\n")
    assert len(one_line_error(capsys, "train", "--config", tmp_path / "long.yaml", match="lr must be")) < 300


# --------------------------------------------------------------------------- 3. messages that point the right way
def test_a_single_parquet_image_file_trains_holding_out_every_fifth_row(tmp_path: Path, offline_cache: Path) -> None:
    from crate_transformer.data import open_source

    data = _parquet(tmp_path / "one.parquet", [i % 2 for i in range(40)])
    train, test = (open_source(data, s, image_size=8, num_workers=0) for s in ("train", "test"))
    assert (len(train), len(test)) == (32, 8) and sorted(test.labels.tolist()) == [0] * 4 + [1] * 4
    out = tmp_path / "run"
    argv = ["train", "--data", data, "--image-size", 8, "--threads", 1, "--no-progress", "--batch-size", 8,
            "--max-steps", 2, "--model-args", "dim=16", "depth=1", "heads=2", "patch_size=4", "--out", out]  # fmt: skip
    assert crate(*argv) == 0 and (out / "model" / "model.safetensors").is_file()


def test_a_folder_of_csv_tables_is_a_dataset_not_an_image_folder_without_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture, offline_cache: Path
) -> None:
    from crate_transformer.data import resolve_source

    folder = tmp_path / "tables"
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.csv").write_text("text,label\n" + "".join(f"row {i},{i % 2}\n" for i in range(10)))
    assert resolve_source(folder)[0] == "hf"
    err = one_line_error(capsys, "train", "--data", folder, "--image-size", 8, "--out", tmp_path / "r",
                         after_output=True)  # fmt: skip
    assert "no image column" in err and "class subfolders" not in err, err
    (folder / "c1").mkdir()  # an image folder with a stray table stays an image folder
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / "c1" / "0.png")
    assert resolve_source(folder)[0] == "folder"


def test_an_image_table_naming_its_label_column_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, offline_cache: Path
) -> None:
    """pandas reads the second ``label`` as ``label.1``; before, one of the two label columns was used silently."""
    for i in range(10):
        (tmp_path / f"{i}.png").write_bytes(_png(40 * (i % 5)))
    table = tmp_path / "images.csv"
    rows = "".join(f"{tmp_path / f'{i}.png'},{i % 2},{1 - i % 2}\n" for i in range(10))
    table.write_text("image,label,label\n" + rows)
    one_line_error(capsys, "train", "--data", table, "--image-size", 8, "--threads", 1, "--no-progress",
                   "--out", tmp_path / "r", match=r"names the column 'label' twice \(the second read as 'label.1'\)",
                   after_output=True)  # fmt: skip
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "text, expected",
    [
        ("optim: 5\n", r"optim is a group of options, not one value \(got 5\); write its options under it"),
        ("task: mae\n", r"the options set task 'mae', and this trains classification; train mae with crate "
                        r"pretrain mae, or drop task: mae"),
    ],
)  # fmt: skip
def test_a_config_file_mistake_names_the_fix(
    text: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "c.yaml").write_text(text)
    one_line_error(capsys, "train", "--config", tmp_path / "c.yaml", "--data", "digits", "--out", tmp_path / "r",
                   match=expected)  # fmt: skip
    assert not (tmp_path / "r").exists()


def _hub_error(status: int | None) -> Exception:
    """What huggingface_hub raises for a file it cannot fetch: a missing cache entry, raised while handling the
    HTTP error of a Hub that answered ``status`` (or a connection error when None)."""
    import httpx
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    request = httpx.Request("HEAD", "https://huggingface.co/o/r/resolve/main/f")
    try:
        if status is None:
            raise httpx.ConnectError("[Errno -2] Name or service not known", request=request)
        raise HfHubHTTPError(f"{status} error", response=httpx.Response(status, request=request))
    except Exception:  # noqa: BLE001 - the chain huggingface_hub builds
        try:
            raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub")
        except LocalEntryNotFoundError as e:
            return e


@pytest.mark.parametrize(
    "status, says",
    [
        (500, "the Hub answered HTTP 500, a server error (it is reachable but failing: try again later)"),
        (503, "the Hub answered HTTP 503, a server error"),
        (401, "the Hub answered 401 (401 error)"),
        (None, "the Hub cannot be reached ("),
    ],
)
def test_a_hub_that_answers_an_error_is_not_called_offline(
    status: int | None, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets
    import huggingface_hub

    from crate_transformer.data.hub import load_hub_dataset
    from crate_transformer.io import CheckpointError

    def failing(*args: object, **kwargs: object) -> None:
        raise _hub_error(status)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", failing)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
    with pytest.raises(CheckpointError) as zoo:
        ct.create_model("crate_alpha_base16", pretrained=True)
    with pytest.raises(CheckpointError) as pushed:
        ct.from_pretrained("hf-hub:my-org/crate-small")
    for e in (zoo.value, pushed.value):
        assert says in str(e) and ("cannot be reached" in str(e)) == (status is None), str(e)

    def dataset_failing(*args: object, **kwargs: object) -> None:
        try:
            raise _hub_error(status)
        except Exception as e:  # noqa: BLE001 - as datasets wraps it
            raise FileNotFoundError("Couldn't find 'o/r' on the Hugging Face Hub either") from e

    monkeypatch.setattr(datasets, "load_dataset", dataset_failing)
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # a machine with network: the Hub was asked
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError) as data:
        load_hub_dataset("o/r")
    assert says.split(" (")[0] in str(data.value) and ("cannot be reached" in str(data.value)) == (status is None)


def test_an_authors_file_without_its_architecture_names_the_fix_the_command_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    torch.save({"model": {"transformer.wte.weight": torch.zeros(8, 4)}, "model_args": {"n_layer": 1}},
               tmp_path / "ckpt.pt")  # fmt: skip
    err = one_line_error(capsys, "generate", tmp_path / "ckpt.pt", "--prompt", "hi")
    assert "crate generate takes no --model" in err and "ct.from_official(PATH, 'crate_gpt_12l_pile')" in err
    assert "save_pretrained(DIR)" in err
    err = one_line_error(capsys, "eval", tmp_path / "ckpt.pt", "--data", "digits")
    assert err.endswith("pass --model crate_gpt_12l_pile or --model gpt2_base"), err


def test_a_nanogpt_size_that_is_not_a_number_and_a_misspelt_arch_are_named(tmp_path: Path) -> None:
    from crate_transformer.models.lm import lm_checkpoint_fields

    state = {"wte.weight": torch.zeros(8, 4), "wpe.weight": torch.zeros(6, 4), "h.0.ln_1.weight": torch.ones(4)}
    with pytest.raises(ValueError, match="model_args hold n_layer='two', not a whole number"):
        lm_checkpoint_fields({"model": state, "model_args": {"n_layer": "two", "n_head": 2}})
    assert lm_checkpoint_fields({"model": state, "model_args": {"n_layer": "1", "n_head": 2}})["depth"] == 1
    from crate_transformer.models.registry import config_class

    with pytest.raises(ValueError, match=r"unknown arch 'crate_lmm' \(did you mean 'crate_lm'\?\); choose one of "):
        config_class("crate_lmm")
    model = ct.create_model("crate_gpt_mini", **tiny_lm())
    model.save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    from crate_transformer.loading.pipeline import config_from_dict

    with pytest.raises(ValueError, match="did you mean 'crate_lm'"):
        config_from_dict({**saved, "arch": "crate_lmm"})  # an older folder's config.json, edited by hand


def tiny_lm() -> dict:
    return {"dim": 16, "depth": 1, "heads": 2, "block_size": 16}


def test_the_context_hint_names_a_context_that_fits_not_the_one_given(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("a small corpus\n" * 8)  # 121 tokens (bytes + end of text)
    err = one_line_error(capsys, "train-lm", "--data", corpus, "--model-args", "dim=16", "depth=1", "heads=2",
                         "block_size=32", "--threads", 1, "--out", tmp_path / "r", after_output=True)  # fmt: skip
    assert "too few for a 32-token context with 10% held out (about 331 are needed)" in err, err
    assert "block_size=12" in err and "block_size=32" not in err  # the hint used to repeat the value given
    from crate_transformer.data.text import split_tokens

    split_tokens(121, 0.1, 12)  # the context it names fits
    with pytest.raises(ValueError):
        split_tokens(121, 0.1, 13)  # and is the largest that does


def test_a_resumed_fsdp_run_in_one_process_is_told_to_use_ddp_and_that_works(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from crate_transformer.train import RunDir, load_training_state

    run = tmp_path / "run"
    base = ["--data", "digits", "--image-size", 8, "--threads", 1, "--no-progress", "--model-args", "dim=16",
            "depth=1", "heads=2", "patch_size=4"]  # fmt: skip
    assert crate("train", *base, "--max-steps", 2, "--out", run) == 0
    state = load_training_state(run)  # what an FSDP run writes: the full weights, its strategy in the config
    state["train_config"]["system"]["strategy"] = "fsdp"
    RunDir(run, writer=True).save_state(state)
    err = one_line_error(capsys, "train", "--resume", run, "--max-steps", 3, after_output=True)
    assert "or use --strategy ddp (also to resume an FSDP run in one process" in err and "drop --strategy" not in err
    assert crate("train", "--resume", run, "--max-steps", 3, "--strategy", "ddp", "--no-progress") == 0
    assert load_training_state(run)["step"] == 3


# --------------------------------------------------------------------------- 4. nothing ignored or changed silently
def test_a_vocab_size_smaller_than_the_tokenizer_is_refused_and_a_larger_one_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from crate_transformer.loading.pipeline import load_model

    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\n" * 200)
    base = ["train-lm", "--data", corpus, "--threads", 1, "--no-progress", "--max-steps", 1, "--model-args",
            "dim=16", "depth=1", "heads=2", "block_size=16"]  # fmt: skip
    err = one_line_error(capsys, *base, "vocab_size=100", "--out", tmp_path / "a", after_output=True)
    assert "vocab_size=100 is smaller than the byte tokenizer's 262 tokens" in err and not (tmp_path / "a").exists()
    assert crate(*base, "vocab_size=320", "--out", tmp_path / "b") == 0
    assert load_model(tmp_path / "b").config.vocab_size == 320  # was replaced by 262 without a word


def test_drop_path_given_twice_with_two_values_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = ["train", "--data", "digits", "--image-size", 8, "--threads", 1, "--no-progress", "--max-steps", 1,
            "--model-args", "dim=16", "depth=2", "heads=2", "patch_size=4"]  # fmt: skip
    err = one_line_error(capsys, *base, "drop_path=0.2", "--drop-path", 0.1, "--out", tmp_path / "a",
                         after_output=True)  # fmt: skip
    assert "drop_path is given twice: --drop-path 0.1 and --model-args drop_path=0.2; keep one" in err
    assert crate(*base, "drop_path=0.1", "--drop-path", 0.1, "--out", tmp_path / "b") == 0  # the same value passes


@pytest.mark.parametrize(
    "command, extra, expected",
    [
        ("train", ["--image-size", 8, "--model-args", "image_size=16"],
         "image_size is given twice: --image-size 8 and --model-args image_size=16; keep one"),
        ("train", ["--image-size", 8, "--model-args", "num_classes=5"],
         "num_classes is given twice: the data's 10 classes and --model-args num_classes=5; keep one"),
        ("pretrain mae", ["--image-size", 8, "--model-args", "image_size=16"],
         "image_size is given twice: --image-size 8 and --model-args image_size=16; keep one"),
        ("pretrain mae", ["--image-size", 8, "--mask-ratio", 0.5, "--model-args", "mask_ratio=0.75"],
         "mask_ratio is given twice: --mask-ratio 0.5 and --model-args mask_ratio=0.75; keep one"),
        ("pretrain dino", ["--image-size", 8, "--pool", "avg", "--model-args", "pool=cls"],
         "pool is given twice: --pool avg and --model-args pool=cls; keep one"),
    ],
)  # fmt: skip
def test_a_model_field_set_by_an_option_or_the_data_and_in_model_args_is_refused(
    command: str, extra: list, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Before, the option (or the data) won and model_args' value was dropped without a word."""
    one_line_error(capsys, *command.split(), "--data", "digits", *extra, "--threads", 1, "--no-progress",
                   "--max-steps", 1, "--out", tmp_path / "r", match=re.escape(expected), after_output=True)  # fmt: skip
    assert not (tmp_path / "r").exists()


def test_features_refuses_options_that_cannot_apply_and_takes_hub_models(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from crate_transformer.models.lm import LMConfig, build_lm

    lm = build_lm(LMConfig(dim=16, depth=1, heads=2, block_size=16))
    from crate_transformer.models.tokenizer import Tokenizer

    lm.tokenizer = Tokenizer.byte_level()
    lm.save_pretrained(tmp_path / "lm")
    err = one_line_error(capsys, "features", tmp_path / "lm", "--num-images", 10)
    assert "--num-images does not apply to a language model" in err
    image = ct.create_model("crate_mnist", image_size=8, patch_size=4, dim=16, depth=1, heads=2)
    image.save_pretrained(tmp_path / "img")
    err = one_line_error(capsys, "features", tmp_path / "img", "--context", 3, "--data", "digits")
    assert "--context does not apply to an image model" in err
    import crate_transformer.loading.pipeline as load

    seen = []
    real = load.resolve_hub
    monkeypatch.setattr(load, "resolve_hub", lambda p: seen.append(p) or real(str(tmp_path / "img")))
    out = tmp_path / "hubfeatures"
    assert crate("features", "hf-hub:my-org/img", "--data", "digits", "--num-images", 20, "--out", out) == 0
    assert seen == ["hf-hub:my-org/img"] and (out / "features.json").is_file()


def test_features_never_replaces_earlier_outputs_without_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    image = ct.create_model("crate_mnist", image_size=8, patch_size=4, dim=16, depth=1, heads=2)
    image.save_pretrained(tmp_path / "m")
    argv = ["features", tmp_path / "m", "--data", "digits", "--num-images", 20, "--threads", 1]
    assert crate(*argv) == 0 and crate(*argv) == 0  # the default folder: RUN/features, then RUN/features-2
    assert (tmp_path / "m" / "features" / "features.json").is_file()
    assert (tmp_path / "m" / "features-2" / "features.json").is_file()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    err = one_line_error(capsys, *argv, "--out", mine)
    assert f"--out {mine} is not empty; pass --overwrite" in err
    err = one_line_error(capsys, *argv, "--out", mine, "--overwrite")
    assert "holds no earlier crate features report (features.json)" in err
    out = tmp_path / "o"
    assert crate(*argv, "--out", out) == 0
    first = (out / "features.json").read_text()
    assert crate(*argv, "--out", out, "--overwrite", "--top-k", 3) == 0
    assert (out / "features.json").read_text() != first and (mine / "notes.txt").read_text() == "mine"


def test_finetune_text_counts_the_rows_it_cuts_to_the_context(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    table = tmp_path / "t.csv"
    rows = [("short" if i % 4 else "a long row " * 10, i % 2) for i in range(40)]  # 10 long rows
    table.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    run = tmp_path / "run"
    capsys.readouterr()
    assert crate("finetune-text", "--from", _lm_folder(tmp_path / "lm"), "--data", table, "--threads", 1,
                 "--no-progress", "--max-steps", 1, "--batch-size", 8, "--out", run) == 0  # fmt: skip
    assert "notice: 10 of the 40 rows of t.csv are longer than the model's 32-token context" in capsys.readouterr().err
    import yaml

    assert yaml.safe_load((run / "config.yaml").read_text())["derived"]["truncated_rows"] == {"train": 10}


# --------------------------------------------------------------------------- 6. also
def test_threads_above_the_cpus_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    import crate_transformer.train.threads as th

    monkeypatch.setattr(th, "_affinity", lambda: 2)
    monkeypatch.setattr(th, "cgroup_cpu_quota", lambda: None)
    with pytest.warns(UserWarning, match="threads=8 is more than the 2 CPUs this process may use"):
        assert th.resolve_threads(8) == 8
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert th.resolve_threads(2) == 2  # no warning at the CPU count
    monkeypatch.setattr(th, "cgroup_cpu_quota", lambda: 1.5)  # a quota of 1.5 CPUs: one usable
    with pytest.warns(UserWarning, match="threads=2 is more than the 1 CPUs"):
        th.resolve_threads(2)


def test_mixup_on_one_image_per_process_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = one_line_error(capsys, "train", "--data", "digits", "--image-size", 8, "--threads", 1, "--no-progress",
                         "--batch-size", 1, "--mixup", 0.8, "--max-steps", 1, "--out", tmp_path / "r",
                         "--model-args", "dim=16", "depth=1", "heads=2", "patch_size=4", after_output=True)  # fmt: skip
    assert "each process's batch holds 1 image (batch_size 1 over 1 process(es)): nothing would be mixed" in err


def test_a_run_removed_after_its_run_directory_line_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = tmp_path / "imgs"
    for c in range(2):
        (folder / f"c{c}").mkdir(parents=True)
        for i in range(6):
            (folder / f"c{c}" / f"{i}.png").write_bytes(_png(100 * c + i))
    (folder / "c1" / "5.png").write_bytes(b"not a png")  # read when its batch is streamed, after the start line
    run = tmp_path / "run"
    capsys.readouterr()
    assert crate("train", "--data", folder, "--data-mode", "stream", "--workers", 0, "--on-bad-image", "error",
                 "--image-size", 8, "--threads", 1, "--no-progress", "--batch-size", 8, "--epochs", 1,
                 "--model-args", "dim=16", "depth=1", "heads=2", "patch_size=4", "--out", run) == 2  # fmt: skip
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "Traceback" not in err and f"run directory: {run}" in lines and not run.exists()
    assert lines[-2] == f"removed {run}: the run stopped before its first checkpoint, so it holds nothing"
    assert lines[-1].startswith("crate train: error: cannot read image"), lines[-1]


@pytest.mark.parametrize("content", ["[1, 2]", '"crate"', "3", "null"])
def test_a_config_json_that_is_not_an_object_is_named_not_ignored(content: str, tmp_path: Path) -> None:
    """An authors' folder's config.json (read for the sizes the tensors do not give) and a save_pretrained folder's:
    a JSON value that is no object of settings is named, never skipped for the registered sizes."""
    from crate_transformer.io import CheckpointError
    from crate_transformer.models.bert import bert_native_to_official

    model = ct.create_model("crate_bert_base", dim=32, depth=1, heads=4, vocab_size=50, block_size=18)
    port = tmp_path / "port"
    port.mkdir()
    torch.save(bert_native_to_official(model.state_dict()), port / "pytorch_model.bin")
    (port / "config.json").write_text(content)
    kind = {"[": "list", '"': "string", "3": "number", "n": "null"}[content[0]]
    with pytest.raises(CheckpointError, match=rf"config.json holds a JSON {kind}, not an object"):
        ct.from_official(port, "crate_bert_base")
    model.save_pretrained(tmp_path / "own")
    (tmp_path / "own" / "config.json").write_text(content)
    with pytest.raises(CheckpointError, match=rf"config.json holds a JSON {kind}, not an object"):
        ct.from_pretrained(tmp_path / "own")
