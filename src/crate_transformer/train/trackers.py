"""Experiment trackers: where a run's records go besides ``metrics.jsonl``.

``--logger tensorboard wandb mlflow csv`` (any several at once) sends every record the run writes to
``metrics.jsonl`` — training loss and learning rate, evaluations, and the per-layer compression and
sparsity measurements (JMLR Fig. 15) — plus the run's hyperparameters at the start and its figures
(``*.png`` in the run directory) at the end.  Only the process that writes the run directory logs.

======================  ===============================================================================
logger                  where
======================  ===============================================================================
``csv``                 ``<run>/metrics.csv``: one row per value, ``step,split,layer,metric,value``
``tensorboard``         ``<run>/tensorboard`` (scalars, hyperparameters as text, figures as images)
``wandb``               Weights & Biases; ``WANDB_MODE=offline`` keeps it on disk (``<run>/wandb``),
                        ``WANDB_PROJECT`` names the project (default ``crate``)
``mlflow``              ``MLFLOW_TRACKING_URI``, else a local file store ``<run>/mlruns``
======================  ===============================================================================

A resumed run continues the same tracker runs (their ids are kept in ``<run>/trackers.json``), and the
records of steps that will be redone are dropped where the backend allows (CSV, TensorBoard).
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import os
import re
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import OptionError
from ..io import DamagedFileError, atomic_write, read_side_file
from ..loading.runfiles import IDS_FIX, METRICS_FIX

__all__ = ["read_metrics", "METRICS_FIX", "LOGGERS", "Tracker", "open_trackers", "flat_params", "scalars", "failure"]

LOGGERS = ("tensorboard", "wandb", "mlflow", "csv")
IDS_FILE = "trackers.json"
CSV_FILE = "metrics.csv"
CSV_COLUMNS = ("step", "split", "layer", "metric", "value")


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"optim": {"lr": 1e-3}}`` → ``{"optim.lr": 1e-3}``; lists and ``None`` as text (trackers take scalars)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a ``metrics.jsonl`` record, named ``split/metric`` or ``split/layerN/metric``."""
    split = record.get("split", "train")
    tag = f"{split}/layer{record['layer']}" if "layer" in record else split
    skip = ("step", "split", "epoch", "layer", "time", "final")
    return {
        f"{tag}/{k}": float(v)
        for k, v in record.items()
        if k not in skip and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def failure(e: BaseException) -> str:
    """A tracker's exception in one short line: its type, the HTTP status a server answered (where the message
    names one) and the first line of its message, cut."""
    first = (str(e).strip().splitlines() or [""])[0]
    status = re.search(r"\b([45]\d\d) error responses|(?:status|error) code:? ([45]\d\d)|\bHTTP ([45]\d\d)\b", first)
    said = f"the server answered HTTP {next(g for g in status.groups() if g)}; " if status else ""
    first = first if len(first) <= 160 else first[:159] + "…"
    return f"{type(e).__name__}: {said}{first}" if first else type(e).__name__


def _where(name: str) -> str:
    """Where the backend ``name`` was told to log, and how to log without it."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") if name == "mlflow" else None
    return (f"; check MLFLOW_TRACKING_URI={uri}" if uri else "") + f", or train without the {name} logger"


def _backend(name: str) -> Any:
    """The tracking package ``name``, or a one-line error saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise OptionError(
            f"logger={name!r} needs the {name} package: pip install crate-transformer[trackers]"
        ) from None


class Tracker:
    """One backend.  ``start`` once (``resume_step`` set when continuing), ``log`` each record, ``finish``."""

    name = ""

    def start(self, run_dir: Path, params: dict[str, Any], ids: dict[str, str], resume_step: int | None) -> None:
        raise NotImplementedError

    def log(self, record: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def log_figures(self, figures: Iterable[Path], step: int) -> None:
        """Figures are optional: a backend without them ignores them."""

    def finish(self) -> None:
        """Flush and close."""


class CSVTracker(Tracker):
    """``metrics.csv`` in long form, so records with different metrics share one header."""

    name = "csv"

    def start(self, run_dir: Path, params: dict[str, Any], ids: dict[str, str], resume_step: int | None) -> None:
        """A new file; on resume, the rows of the records ``metrics.jsonl`` keeps (written before the trackers
        start), so steps to be redone and the final rows of a finished run are not there twice."""
        self.path = run_dir / CSV_FILE
        kept = read_metrics(run_dir / "metrics.jsonl") if resume_step is not None else []
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for record in kept:
            writer.writerows(_csv_rows(record))
        text = buf.getvalue()
        atomic_write(self.path, lambda tmp: Path(tmp).write_text(text))

    def log(self, record: Mapping[str, Any]) -> None:
        with open(self.path, "a", newline="") as f:
            csv.writer(f).writerows(_csv_rows(record))


def _csv_rows(record: Mapping[str, Any]) -> list[list[Any]]:
    split, layer = record.get("split", "train"), record.get("layer", "")
    return [[record.get("step", 0), split, layer, k.rsplit("/", 1)[-1], repr(v)] for k, v in scalars(record).items()]


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a ``metrics.jsonl`` file (none when there is no file), read by
    :func:`~crate_transformer.io.read_side_file`: a damaged file is a one-line error naming it (a last line cut
    short by a kill is skipped with a warning)."""
    path = Path(path)
    return read_side_file(path, METRICS_FIX, form="jsonl", missing=[])  # a FIFO or a folder is named, not read


class TensorBoardTracker(Tracker):
    """TensorBoard event files under ``<run>/tensorboard`` (``purge_step`` drops redone steps on resume)."""

    name = "tensorboard"

    def start(self, run_dir: Path, params: dict[str, Any], ids: dict[str, str], resume_step: int | None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise OptionError("logger='tensorboard' needs the tensorboard package: pip install tensorboard") from None
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step)
        if resume_step is None:
            table = "\n".join(f"| {k} | {v} |" for k, v in params.items())
            self.writer.add_text("hparams", "| option | value |\n|---|---|\n" + table, 0)

    def log(self, record: Mapping[str, Any]) -> None:
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, record.get("step", 0))

    def log_figures(self, figures: Iterable[Path], step: int) -> None:
        import numpy as np
        from PIL import Image

        for path in figures:
            image = np.asarray(Image.open(path).convert("RGB"))
            self.writer.add_image(f"figures/{path.stem}", image, step, dataformats="HWC")

    def finish(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A Weights & Biases run; its id is kept so a resumed training run continues it."""

    name = "wandb"

    def start(self, run_dir: Path, params: dict[str, Any], ids: dict[str, str], resume_step: int | None) -> None:
        try:
            import wandb
        except ImportError:
            raise OptionError(
                "logger='wandb' needs the wandb package: pip install crate-transformer[trackers]"
            ) from None
        self.wandb = wandb
        ids.setdefault("wandb", secrets.token_hex(4))  # W&B run ids: short, lowercase, unique
        project = os.environ.get("WANDB_PROJECT", "crate")
        self.run = wandb.init(
            project=project, name=run_dir.name, id=ids["wandb"], resume="allow", dir=str(run_dir), config=params
        )

    def log(self, record: Mapping[str, Any]) -> None:
        self.run.log(scalars(record), step=record.get("step", 0))

    def log_figures(self, figures: Iterable[Path], step: int) -> None:
        images = {f"figures/{p.stem}": self.wandb.Image(str(p)) for p in figures}
        if images:
            self.run.log(images, step=step)

    def finish(self) -> None:
        self.run.finish()


class MLflowTracker(Tracker):
    """An MLflow run: ``MLFLOW_TRACKING_URI``, else a file store in the run directory."""

    name = "mlflow"

    def start(self, run_dir: Path, params: dict[str, Any], ids: dict[str, str], resume_step: int | None) -> None:
        self.mlflow = mlflow = _backend("mlflow")
        uri = os.environ.get("MLFLOW_TRACKING_URI", "")
        if not uri or uri.startswith("file:") or "://" not in uri:
            # MLflow 3 refuses a file store unless asked; the default one (the run directory) or one the user
            # named by its file URI or path is asked for
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        # always set: an earlier run of this process set its own store, which would otherwise win over the variable
        mlflow.set_tracking_uri(uri or (run_dir / "mlruns").resolve().as_uri())
        run = mlflow.start_run(run_id=ids.get("mlflow"), run_name=None if "mlflow" in ids else run_dir.name)
        ids["mlflow"] = run.info.run_id
        self.logged: dict[str, int] = {}  # metric → last step the run held before this process (a resume)
        if resume_step is None:
            mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        else:  # MLflow cannot delete a step: a step logged before a kill and redone now is not sent again
            client = mlflow.tracking.MlflowClient()
            for key in run.data.metrics:
                self.logged[key] = max((m.step for m in client.get_metric_history(run.info.run_id, key)), default=-1)

    def log(self, record: Mapping[str, Any]) -> None:
        step = int(record.get("step", 0))
        values = {k.replace("/", "."): v for k, v in scalars(record).items()}
        values = {k: v for k, v in values.items() if step > self.logged.get(k, -1)}
        if values:
            self.mlflow.log_metrics(values, step=step)

    def log_figures(self, figures: Iterable[Path], step: int) -> None:
        for path in figures:
            self.mlflow.log_artifact(str(path), "figures")

    def finish(self) -> None:
        self.mlflow.end_run()


TRACKERS: dict[str, type[Tracker]] = {
    "csv": CSVTracker,
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MLflowTracker,
}


def open_trackers(
    names: Iterable[str], run_dir: Path, config: Mapping[str, Any], resume_step: int | None
) -> list[Tracker]:
    """Start the trackers ``names`` for a run; their ids go to ``<run>/trackers.json`` for a later resume."""
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise OptionError(f"logger={unknown[0]!r} is unknown; choose from {', '.join(LOGGERS)}")
    ids_path = run_dir / IDS_FILE
    ids = read_side_file(ids_path, IDS_FIX, missing={}) if resume_step is not None else {}
    bad = next((k for k, v in ids.items() if not isinstance(v, str)), None)
    if bad is not None:
        raise DamagedFileError(f"{ids_path} is damaged: the id of {bad!r} is not a string; {IDS_FIX}")
    params = flat_params(config)
    trackers: list[Tracker] = []
    try:
        for name in names:
            tracker = TRACKERS[name]()
            try:
                tracker.start(run_dir, params, ids, resume_step)
            except ValueError:
                raise
            except Exception as e:  # noqa: BLE001 - MlflowException, wandb errors, refused connections, ...
                raise ValueError(f"the {name} logger cannot start: {failure(e)}{_where(name)}") from None
            trackers.append(tracker)
    except BaseException:
        for tracker in trackers:  # a backend that failed to start must not leave the others' writers running
            tracker.finish()
        raise
    if ids:
        text = json.dumps(ids, indent=1)
        atomic_write(ids_path, lambda tmp: Path(tmp).write_text(text))
    return trackers
