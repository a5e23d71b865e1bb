"""``--logger csv``: ``metrics.csv`` holds, in long form (one row per value), exactly the records of
``metrics.jsonl`` — also after a finished run is resumed again and again, where the final evaluation is redone and
its rows are written once, as its record is (the csv writer starts from the records ``metrics.jsonl`` keeps).  Needs
no tracker package, unlike tests/train/test_trackers.py."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from clitools import crate

from crate_transformer.train.trackers import scalars

TRAIN = ["--data", "digits", "--image-size", 8, "--threads", 1, "--no-progress", "--measure-every", 0,
         "--model-args", "dim=16", "depth=1", "heads=2", "patch_size=4"]  # fmt: skip


def _expected(run: Path) -> list[tuple[str, ...]]:
    """The rows of metrics.csv, computed from metrics.jsonl (what it must hold), in order, values included."""
    rows = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in scalars(record).items():
            layer, metric = str(record.get("layer", "")), key.rsplit("/", 1)[-1]
            rows.append((str(record["step"]), record["split"], layer, metric, repr(value)))
    return rows


def _rows(run: Path) -> list[tuple[str, ...]]:
    with open(run / "metrics.csv", newline="") as f:
        return [(r["step"], r["split"], r["layer"], r["metric"], r["value"]) for r in csv.DictReader(f)]


def test_metrics_csv_holds_each_record_once_after_resuming_a_finished_run_twice(tmp_path: Path) -> None:
    run = tmp_path / "R"
    assert crate("train", *TRAIN, "--epochs", 1, "--max-steps", 3, "--logger", "csv", "--out", run) == 0
    first = _rows(run)
    tests = [r for r in first if r[1] == "test"]
    assert first == _expected(run) and len(tests) == len({r[3] for r in tests}) >= 2  # one row per test metric
    for _ in range(2):
        assert crate("train", "--resume", run, "--no-progress") == 0
        assert _rows(run) == _expected(run) == first  # the final record redone: once in each file
    finals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(bool(r.get("final")) for r in finals) == 1
