"""Malformed input files: each parse error is one line naming the file, the line (and column where it applies),
the problem and the fix — never a traceback, a message without a place, or a silent guess."""

from __future__ import annotations

from pathlib import Path

import pytest

from crate_transformer import cli


def one_line_error(capsys: pytest.CaptureFixture, *argv: object) -> str:
    capsys.readouterr()
    assert cli.main([str(a) for a in argv]) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


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
