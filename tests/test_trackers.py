"""``--logger csv tensorboard wandb mlflow``: the records of ``metrics.jsonl``, the hyperparameters and the
figures reach each backend, read back with the backend's own reader; a resumed run continues the same runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from clitools import crate, one_line_error
from test_engine import small_cfg

from crate_transformer.train import train
from crate_transformer.train.trackers import flat_params, scalars

pytest.importorskip("wandb", reason="the optional 'trackers' extra is not installed")
pytest.importorskip("mlflow", reason="the optional 'trackers' extra is not installed")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_scalars_and_params_are_named_as_documented() -> None:
    rec = {"step": 3, "split": "train", "epoch": 0.5, "layer": 2, "loss": 1.5, "final": True, "note": "x"}
    assert scalars(rec) == {"train/layer2/loss": 1.5}
    assert flat_params({"lr": 0.1, "model_args": {"dim": 8}, "betas": [0.9]}) == {
        "lr": 0.1,
        "model_args.dim": 8,
        "betas": "[0.9]",
    }


def test_every_logger_gets_the_records_params_and_figures(tmp_path: Path, offline: None) -> None:
    import mlflow
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from wandb_log import read_run

    run = tmp_path / "run"
    cfg = small_cfg(run, max_steps=4, log_every=2, measure_every=2, logger=["csv", "tensorboard", "wandb", "mlflow"])
    train(cfg)
    records = _records(run)
    expected = {(r["step"], k): v for r in records for k, v in scalars(r).items()}
    assert any("/layer" in k for _, k in expected)  # the per-layer measurements are among them
    with open(run / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    got = {
        (int(r["step"]), "/".join(filter(None, (r["split"], r["layer"] and f"layer{r['layer']}", r["metric"])))): float(
            r["value"]
        )
        for r in rows
    }
    assert got == pytest.approx(expected)
    ev = EventAccumulator(str(run / "tensorboard"), size_guidance={"images": 0})
    ev.Reload()
    assert [e.value for e in ev.Scalars("train/loss")] == pytest.approx(
        [v for (s, k), v in expected.items() if k == "train/loss"]
    )
    assert "figures/curves" in ev.Tags()["images"]
    run_id, config, history = read_run(run / "wandb")
    assert config["lr"] == cfg.optim.lr and config["model_args.dim"] == cfg.model_args["dim"]
    logged = {(h["_step"], k): v for h in history for k, v in h.items() if not k.startswith("_") and "/" in k}
    assert {k: v for k, v in logged.items() if not k[1].startswith("figures/")} == pytest.approx(expected)
    assert any(k == "figures/curves/_type" for _, k in logged)
    client = mlflow.tracking.MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    ids = json.loads((run / "trackers.json").read_text())
    assert ids["wandb"] == run_id
    history = client.get_metric_history(ids["mlflow"], "train.loss")
    losses = {s: v for (s, k), v in expected.items() if k == "train/loss"}
    assert {m.step: m.value for m in history} == pytest.approx(losses) and len(history) == len(losses)
    assert client.get_run(ids["mlflow"]).data.params["lr"] == str(cfg.optim.lr)
    assert "figures/curves.png" in [a.path for a in client.list_artifacts(ids["mlflow"], "figures")]


def test_a_resumed_run_continues_the_same_tracker_runs(tmp_path: Path, offline: None) -> None:
    import mlflow

    run = tmp_path / "run"
    train(small_cfg(run, max_steps=2, log_every=1, logger=["csv", "mlflow"], epochs=2))
    first = json.loads((run / "trackers.json").read_text())
    assert crate("train", "--resume", run, "--no-progress", "--max-steps", 4) == 0
    assert json.loads((run / "trackers.json").read_text()) == first
    train_steps = [r["step"] for r in _records(run) if r["split"] == "train"]
    client = mlflow.tracking.MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    assert sorted(m.step for m in client.get_metric_history(first["mlflow"], "train.loss")) == train_steps
    with open(run / "metrics.csv", newline="") as f:
        csv_steps = sorted(
            {int(r["step"]) for r in csv.DictReader(f) if r["split"] == "train" and r["metric"] == "loss"}
        )
    assert csv_steps == train_steps


def test_an_unknown_logger_is_one_line(capsys: pytest.CaptureFixture) -> None:
    err = one_line_error(capsys, "train", "--logger", "neptune")
    assert "unknown logger 'neptune'; choose one of ('tensorboard', 'wandb', 'mlflow', 'csv')" in err
