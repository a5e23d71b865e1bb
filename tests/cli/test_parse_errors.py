"""Malformed input files: each parse error is one line naming the file, the line (and column where it applies),
the problem and the fix — never a traceback, a message without a place, or a silent guess."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import one_line_error, warnings_shown

from crate_transformer import cli

# --------------------------------------------------------------------------- tables (crate finetune-text)
TABLES = {
    "unclosed_quote": ('text,label\n"abc,1\ndef,0\n', ":2: ", "never closed"),
    "no_label_column": ("text,note\nabc,x\ndef,y\n", ":1: ", "--label-column"),
    "jsonl": ('{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n', ":1: ", "JSON"),
    "nan_label": ("text,label\na,1\nb,nan\n", ":3: ", "not a finite number"),
    "inf_score": ("text,score\na,0.5\nb,inf\n", ":3: ", "not a finite number"),
    "mixed_labels": ("text,label\na,1\nb,pos\nc,0\n", ":3: ", "every label a number or every label a name"),
}


@pytest.mark.parametrize("case", list(TABLES))
def test_a_malformed_table_is_named_with_its_line(case: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text, where, fix = TABLES[case]
    table = tmp_path / f"{case}.csv"
    table.write_text(text)
    err = one_line_error(capsys, "finetune-text", "--data", table, "--out", tmp_path / "run")
    assert f"{table}{where}" in err and fix in err, err


def test_a_table_without_a_label_column_names_the_columns_found(tmp_path: Path) -> None:
    from crate_transformer.data.text import read_labelled_table

    table = tmp_path / "t.csv"
    table.write_text("text,note\nabc,x\n")
    with pytest.raises(ValueError, match=r"\['text', 'note'\]"):
        read_labelled_table(table)
    # the fix the message names works: the column is chosen and read
    assert read_labelled_table(table, label_column="note")[1] == ["x"]


# --------------------------------------------------------------------------- WebDataset shards
def _shard(root: Path, labels: list[bytes]) -> Path:
    import io

    import numpy as np
    import webdataset as wds
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, format="PNG")
    root.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(root / "a.tar")) as w:
        for i, label in enumerate(labels):
            w.write({"__key__": f"k{i}", "png": buf.getvalue(), "cls": label})
    return root


SHARD_CASES = {
    "non_utf8_cls": (None, None, "a.tar: member k2.cls is not UTF-8 text"),
    "not_a_tar": ("b.tar", b"hello, this is not a tar file\n" * 30, "b.tar is not a tar archive"),
    "classes_json_number": ("classes.json", b"3", "classes.json holds int 3, not a list of class names"),
    "classes_json_invalid": ("classes.json", b'["a",\n "b"', "classes.json:2:5: invalid JSON"),
}


@pytest.mark.parametrize("case", list(SHARD_CASES))
def test_a_malformed_shard_folder_is_named(case: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    name, content, expected = SHARD_CASES[case]
    labels = [b"0", b"1", b"\xff\xfe" if case == "non_utf8_cls" else b"0", b"1"]
    root = _shard(tmp_path / "shards", labels)
    if name:
        (root / name).write_bytes(content)
    err = one_line_error(capsys, "train", "--data", root, "--image-size", 8, "--max-steps", 1, "--out", tmp_path / "r")
    assert f"{root}/" + expected in err, err
    assert "write" in err or "remove" in err, err  # and says how to fix it


def test_classes_json_as_a_list_or_a_mapping_is_read(tmp_path: Path) -> None:
    from crate_transformer.data import open_source

    root = _shard(tmp_path / "shards", [b"0", b"1", b"0", b"1"])
    for text in ('["cat", "dog"]', '{"dog": 1, "cat": 0}'):
        (root / "classes.json").write_text(text)
        assert open_source(str(root), "train", image_size=8).classes == ["cat", "dog"]


# --------------------------------------------------------------------------- Hugging Face datasets
@pytest.mark.parametrize("bad", ["cat", None])
def test_an_hf_dataset_with_a_name_or_a_missing_label_names_the_row(
    bad: object, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import io

    import datasets
    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(buf, format="PNG")
    # a string column is refused at its first row; a missing label in an integer column at its own row
    labels, row = (["cat", "dog", "cat", "dog", "cat", "dog"], 0) if bad else ([0, 1, 0, None, 1, 0], 3)
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.Value("string" if bad else "int64")})
    images = [{"bytes": buf.getvalue(), "path": None}] * len(labels)
    datasets.Dataset.from_dict({"image": images, "label": labels}, features=feats).save_to_disk(tmp_path / "hf")
    err = one_line_error(capsys, "train", "--data", tmp_path / "hf", "--image-size", 8, "--out", tmp_path / "r")
    assert f"row {row} of the train split of {tmp_path / 'hf'}: 'label' is {bad!r}, not a class index" in err, err
    assert ("class_encode_column" if bad else "ds.filter") in err, err


# --------------------------------------------------------------------------- tokenizers
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (bytes(range(256)) * 4, "is not a tokenizer.json (a binary file: invalid UTF-8 at byte 128)"),
        (b'{"version": "1.0",\n  "model": }', ":2:12: invalid JSON"),
    ],
)
def test_a_binary_or_invalid_tokenizer_file_is_named(
    content: bytes, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    corpus, tok = tmp_path / "corpus.txt", tmp_path / "tok.json"
    corpus.write_text("some text to train on\n" * 50)
    tok.write_bytes(content)
    err = one_line_error(capsys, "train-lm", "--data", corpus, "--tokenizer", tok, "--out", tmp_path / "r")
    assert f"{tok}{expected}" in err or f"{tok} {expected}" in err, err
    assert "tokenizers JSON file" in err, err


def test_a_tokenizer_larger_than_the_models_vocabulary_names_both_sizes(tmp_path: Path) -> None:
    from crate_transformer.models.lm import LMConfig, build_lm
    from crate_transformer.models.tokenizer import Tokenizer

    model = build_lm(LMConfig(vocab_size=262, block_size=16, dim=16, depth=1, heads=2))
    big = Tokenizer.train("bpe", ["the quick brown fox jumps over the lazy dog " * 20], vocab_size=300)
    assert big.vocab_size > 262
    expected = rf"the tokenizer has {big.vocab_size} tokens but the model's embedding has 262 \(vocab_size\); use "
    with pytest.raises(ValueError, match=expected + "the tokenizer the model was trained with"):
        model.tokenizer = big
    assert model.tokenizer is None
    model.tokenizer = Tokenizer.byte_level()  # one that fits is attached
    assert model.tokenizer.vocab_size <= 262


# --------------------------------------------------------------------------- the token cache
@pytest.mark.parametrize("damage", ["truncated_bin", "invalid_meta", "meta_number", "id_outside_the_vocabulary"])
def test_a_damaged_token_cache_is_named_and_rebuilt(
    damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    from crate_transformer.data.text import load_tokens
    from crate_transformer.models.tokenizer import Tokenizer

    monkeypatch.setenv("CRATE_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("hello world, a small corpus\n" * 20)
    tok = Tokenizer.byte_level()
    expected = np.array(load_tokens(str(corpus), tok))
    assert expected.tolist() == tok.encode(corpus.read_text()) + [tok.eos_id]
    (bin_path,) = (tmp_path / "cache").glob("*.bin")
    meta_path = bin_path.with_suffix(".json")
    if damage == "truncated_bin":
        bin_path.write_bytes(bin_path.read_bytes()[:100])
    elif damage == "id_outside_the_vocabulary":  # a same-size flip of a high bit: an id no tokenizer gave
        data = bytearray(bin_path.read_bytes())
        data[11] ^= 0x80
        bin_path.write_bytes(bytes(data))
    else:
        meta_path.write_text('{"dtype": "uint16", "tok' if damage == "invalid_meta" else "3")
    with pytest.warns(UserWarning, match=rf"token cache {bin_path} is damaged \(.+\); rebuilding it from {corpus}"):
        again = load_tokens(str(corpus), tok)
    np.testing.assert_array_equal(np.array(again), expected)


# --------------------------------------------------------------------------- crate ablate
def test_an_incomplete_train_args_value_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = one_line_error(capsys, "ablate", "17", "--train-args", "batch_size=[", "--out", tmp_path / "a")
    assert "--train-args 'batch_size=[': '[' is not a valid value" in err and "at column 13" in err, err
    assert not (tmp_path / "a").exists()


GOOD = {
    "key": "k",
    "seed": 0,
    "row": "r",
    "acc": 0.5,
    "params": 10,
    "images_per_s": 1.0,
    "seconds": 2.0,
    "run_dir": "x",
}


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [("seed", "one", "'seed' is \"one\", not an integer"), ("acc", [1], "'acc' is [1], not a number"),
     ("params", 1.5, "'params' is 1.5, not an integer"), ("run_dir", None, "'run_dir' is null, not a path")],
)  # fmt: skip
def test_a_results_line_of_the_wrong_type_names_its_line(
    field: str, value: object, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    import json

    out = tmp_path / "sweep"
    out.mkdir()
    bad = {**GOOD, "seed": 1, field: value}
    (out / "results.jsonl").write_text(json.dumps(GOOD) + "\n" + json.dumps(bad) + "\n")
    err = one_line_error(capsys, "ablate", "17", "--report-only", "--out", out)
    assert f"{out / 'results.jsonl'}:2: {expected}; correct or delete the line" in err, err


def test_results_lines_of_the_right_types_are_read(tmp_path: Path) -> None:
    import json

    from crate_transformer.train.ablate import read_results

    (tmp_path / "results.jsonl").write_text(json.dumps(GOOD) + "\n" + '{"key": "k", "se')  # a line cut by a kill
    assert read_results(tmp_path) == {("k", 0): GOOD}


# --------------------------------------------------------------------------- text a WordPiece vocabulary lacks
def test_words_a_wordpiece_vocabulary_lacks_are_warned_once_and_shown_as_unk(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from crate_transformer.models.lm import LMConfig, build_lm
    from crate_transformer.models.tokenizer import Tokenizer

    tok = Tokenizer.train("wordpiece", ["the quick brown fox jumps over the lazy dog " * 50], vocab_size=300)
    with pytest.warns(UserWarning, match=r"^2 word\(s\) of the text are not in the wordpiece tokenizer's vocabulary "
                                         r"and become \[UNK\] \(the first: 'ñandú'\); .*tokenizer='bpe'"):  # fmt: skip
        ids = tok.encode("the ñandú fox 狐 dog")
    assert ids.count(tok.unk_id) == 2
    assert tok.decode(ids, skip_special_tokens=True) == "the [UNK] fox [UNK] dog"  # not "the fox dog"
    assert tok.decode([tok.cls_id, *ids, tok.eos_id], skip_special_tokens=True) == "the [UNK] fox [UNK] dog"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tok.encode_batch(["ñandú again"])  # warned once per tokenizer

    # crate generate: the unknown prompt word is shown as [UNK] in the output, not dropped
    model = build_lm(LMConfig(vocab_size=tok.vocab_size, block_size=16, dim=16, depth=1, heads=2))
    model.tokenizer = tok
    folder = model.save_pretrained(tmp_path / "m")
    capsys.readouterr()
    with warnings_shown():
        assert cli.main(["generate", str(folder), "--prompt", "the ñandú", "--max-new-tokens", "1"]) == 0
    shown = capsys.readouterr()
    assert shown.out.startswith("the [UNK]")
    warned = [line for line in shown.err.splitlines() if "warning" in line]
    assert len(warned) == 1 and warned[0].startswith("crate generate: warning: 1 word(s) of the text"), shown.err
    assert "--tokenizer bpe" in warned[0]  # the CLI words the fix as its flag
