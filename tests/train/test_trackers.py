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
from crate_transformer.train.trackers import failure, flat_params, scalars

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


def _csv_rows(run: Path) -> list[tuple[int, str, str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return [(int(r["step"]), r["split"], r["layer"], r["metric"]) for r in csv.DictReader(f)]


def test_each_step_reaches_mlflow_and_the_csv_once_after_a_kill_and_after_resuming_a_finished_run(
    tmp_path: Path, offline: None
) -> None:
    import shutil

    import mlflow

    run = tmp_path / "run"
    train(small_cfg(run, max_steps=2, log_every=1, logger=["csv", "mlflow"], epochs=2))
    step2 = tmp_path / "step2.pt"
    shutil.copy(run / "checkpoints" / "last.pt", step2)
    assert crate("train", "--resume", run, "--no-progress", "--max-steps", 4) == 0
    shutil.copy(step2, run / "checkpoints" / "last.pt")  # killed after logging steps 3-4, before their checkpoint
    assert crate("train", "--resume", run, "--no-progress", "--max-steps", 4) == 0  # steps 3 and 4 are redone
    assert crate("train", "--resume", run, "--no-progress") == 0  # a finished run: its final evaluation again
    records = _records(run)
    train_steps = [r["step"] for r in records if r["split"] == "train"]
    assert train_steps == [1, 2, 3, 4]
    ids = json.loads((run / "trackers.json").read_text())
    client = mlflow.tracking.MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    assert sorted(m.step for m in client.get_metric_history(ids["mlflow"], "train.loss")) == train_steps
    (final,) = [r for r in records if r.get("final")]
    tested = sorted(m.step for m in client.get_metric_history(ids["mlflow"], f"{final['split']}.loss"))
    assert tested == [2, 4]  # the first run's end, then this one's: never a step twice (4 was logged three times)
    rows = _csv_rows(run)
    assert len(rows) == len(set(rows))  # no row twice (the final test rows were appended on every resume)
    expected = sorted((r["step"], r["split"], str(r.get("layer", "")), k.rsplit("/", 1)[-1])
                      for r in records for k in scalars(r))  # fmt: skip
    assert sorted(rows) == expected


def test_a_tracker_that_cannot_start_is_one_line_and_one_that_fails_mid_run_is_warned_about(
    tmp_path: Path, offline: None, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Answer500(BaseHTTPRequestHandler):
        def _500(self) -> None:
            self.send_response(500)
            self.end_headers()

        do_GET = do_POST = _500

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Answer500)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    argv = ["train", "--data", "digits", "--image-size", 8, "--threads", 1, "--no-progress", "--max-steps", 1,
            "--model-args", "dim=16", "depth=1", "heads=2", "patch_size=4", "--logger", "mlflow"]  # fmt: skip
    try:
        err = one_line_error(capsys, *argv, "--out", tmp_path / "a", after_output=True)
    finally:
        server.shutdown()
    assert "the mlflow logger cannot start: MlflowException: the server answered HTTP 500" in err, err
    assert f"check MLFLOW_TRACKING_URI={uri}, or train without the mlflow logger" in err
    assert not (tmp_path / "a").exists()
    # a file store named by its URI is a file store asked for (MLflow 3 refuses one unless told)
    store = tmp_path / "store"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri())
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    assert crate(*argv, "--out", tmp_path / "b") == 0 and any(store.rglob("meta.yaml"))
    # mid-run: the run goes on without the tracker, warned once; metrics.jsonl keeps every record
    from crate_transformer.train.trackers import CSVTracker

    def broken(self: CSVTracker, record: dict) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(CSVTracker, "log", broken)
    with pytest.warns(UserWarning, match=r"the csv logger failed at step 1 \(OSError: \[Errno 28\]") as seen:
        train(small_cfg(tmp_path / "c", max_steps=3, log_every=1, logger=["csv"]))
    assert sum("csv logger failed" in str(w.message) for w in seen) == 1
    assert [r["step"] for r in _records(tmp_path / "c") if r["split"] == "train"] == [1, 2, 3]


@pytest.mark.parametrize(
    "said",
    [
        "API request to endpoint /api/2.0/mlflow/runs/create failed with error code 500 != 200. Response body: ''",
        "API request to http://h/api failed: Max retries exceeded (too many 500 error responses)",
        "failed with status code: 503",
        "the proxy said HTTP 502 Bad Gateway",
    ],
)
def test_a_tracker_failure_names_the_http_status_however_the_backend_words_it(said: str) -> None:
    status = next(s for s in ("500", "503", "502") if s in said)
    line = failure(RuntimeError(said))
    assert line.startswith(f"RuntimeError: the server answered HTTP {status}; "), line
    assert "\n" not in line and len(line) < 260
