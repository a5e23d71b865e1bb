"""``crate finetune-text``'s labels and texts: classes or scores by the rule ``regression`` states, numbers bounded
(one 1e308 in a 0/1 column is a damaged row, not a switch to regression with an infinite loss), and a row without
its text (a Parquet null, a CSV row short of fields) refused by row and column, never trained as ""
(docs/robustness.md, "Labels and texts of a table")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clitools import crate, one_line_error

from crate_transformer.data.text import LABEL_LIMIT, read_labelled, read_labelled_table
from crate_transformer.models.lm import LMConfig, build_lm
from crate_transformer.models.tokenizer import Tokenizer

COMMON = ["--threads", 1, "--no-progress", "--eval-every", 0, "--batch-size", 8, "--max-steps", 2]


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pretrained = build_lm(LMConfig(dim=16, depth=1, heads=2, block_size=32))
    pretrained.tokenizer = Tokenizer.byte_level()
    return pretrained.save_pretrained(tmp_path_factory.mktemp("lm") / "lm")


def _table(path: Path, labels: list[str]) -> Path:
    rows = "".join(f"row {i} was {'good' if i % 2 else 'bad'},{y}\n" for i, y in enumerate(labels))
    path.write_text("sentence,label\n" + rows)
    return path


def test_one_absurd_number_in_a_0_1_column_is_refused_naming_its_line(lm: Path, tmp_path: Path, capsys) -> None:
    labels = ["0", "1"] * 10
    labels[7] = "1e308"  # finite in float64, infinite in float32, and its square in any float
    table = _table(tmp_path / "t.csv", labels)
    err = one_line_error(capsys, "finetune-text", "--from", lm, "--data", table, *COMMON, "--out", tmp_path / "r")
    assert f"{table}:9: label '1e308' is beyond" in err and "fix the row" in err  # line 9: header + 7 rows
    assert not (tmp_path / "r").exists()  # refused before anything was written
    for bound in (f"{LABEL_LIMIT * 10:g}", f"-{LABEL_LIMIT * 10:g}"):
        labels[7] = bound
        with pytest.raises(ValueError, match=":9: label"):
            read_labelled_table(_table(tmp_path / "t.csv", labels))
    labels[7] = f"{LABEL_LIMIT:g}"  # the bound itself is a number a score may be
    assert read_labelled_table(_table(tmp_path / "t.csv", labels))[1][7] == labels[7]


def test_auto_reads_scores_only_by_its_rule_and_says_which_row_made_it(lm: Path, tmp_path: Path, capsys) -> None:
    classes = _table(tmp_path / "c.csv", ["0", "1"] * 10)
    assert crate("finetune-text", "--from", lm, "--data", classes, *COMMON, "--out", tmp_path / "c") == 0
    assert "read as scores" not in capsys.readouterr().err
    labels = ["0", "1"] * 10
    labels[4] = "0.5"
    scores = _table(tmp_path / "s.csv", labels)
    capsys.readouterr()
    assert crate("finetune-text", "--from", lm, "--data", scores, *COMMON, "--out", tmp_path / "s") == 0
    out = capsys.readouterr()
    said = [line for line in (out.out + out.err).splitlines() if "read as scores" in line]
    assert len(said) == 1 and "row 5 holds '0.5', not an integer" in said[0], out
    final = json.loads((tmp_path / "s" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "spearman" in final and "acc" not in final
    final = json.loads((tmp_path / "c" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "acc" in final and "spearman" not in final


def test_regression_yes_with_a_name_is_refused_naming_the_row(lm: Path, tmp_path: Path, capsys) -> None:
    table = _table(tmp_path / "n.csv", ["good", "bad"] * 5)
    err = one_line_error(
        capsys, "finetune-text", "--from", lm, "--data", table, *COMMON, "--regression", "yes", "--out", tmp_path / "r"
    )
    assert "row 1's label 'good' is not a number" in err


def test_a_csv_row_short_of_its_text_field_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "t.csv"
    table.write_text("label,sentence\n1,fine\n0\n")  # the second row has no sentence field at all
    with pytest.raises(ValueError, match=f"^{table}:3: no 'sentence' .*fewer fields"):
        read_labelled_table(table)
    table.write_text('label,sentence\n1,fine\n0,""\n')  # an empty text, written as one, is a text
    assert read_labelled_table(table)[0] == [("fine",), ("",)]


def test_a_parquet_row_with_a_null_sentence_is_refused_naming_row_and_column(tmp_path: Path) -> None:
    pytest.importorskip("datasets", reason="the optional 'hf' extra (datasets) is not installed")
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    sentences = ["a good film", "a bad film", None, "a good meal"]
    pq.write_table(pa.table({"sentence": sentences, "label": [1, 0, 0, 1]}), path)
    with pytest.raises(ValueError, match=r"^row 2 of .*: 'sentence' is null \(no text\); fill it in or drop"):
        read_labelled(str(path))
    sentences[2] = "a bad meal"
    pq.write_table(pa.table({"sentence": sentences, "label": [1, 0, 0, 1]}), path)
    texts, labels, cols, label = read_labelled(str(path))
    assert [t[0] for t in texts] == sentences and labels == ["1", "0", "0", "1"] and cols == ("sentence",)
