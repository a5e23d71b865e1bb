"""What the report commands (``crate eval``, ``analyze``, ``features``, ``segment-eval``) share: where their
outputs go (:func:`report_home`, :func:`report_dir`) and what they read of a run (its held-out corpus, its
dataset's columns, a layer as the command line numbers it)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..io import make_folder

__all__ = ["check_out_dir", "report_home", "report_dir", "held_out_corpus", "dataset_columns", "layer_number"]


def check_out_dir(path: str | Path) -> Path:
    """Create ``path`` (a folder for outputs) now, so a bad --out fails before any work is done."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {path} is a file; pass a folder for the outputs")
    make_folder(path, "--out folder")
    try:
        probe = path / ".crate-write-test"
        probe.write_text("")
        probe.unlink()
    except PermissionError:
        raise ValueError(f"cannot write to {path} (permission denied); choose another --out") from None
    except OSError as e:
        raise ValueError(f"cannot write to {path} ({e.strerror}); choose another --out") from None
    return path


def report_home(checkpoint: str | Path) -> Path:
    """The folder where the reports of ``checkpoint`` go unless ``--out`` says otherwise: the one rule of
    ``crate eval``, ``crate analyze`` and ``crate features`` (docs/analysis.md, "Where the outputs go").

    * a folder (a run, a ``save_pretrained`` model) → the folder itself; its ``config.json`` /
      ``model.safetensors`` → their folder;
    * a training state inside a run (``RUN/checkpoints/last.pt``) → the run;
    * any other file (an official ``.pth``) → a folder beside it named after it (``crate_small.pth`` →
      ``crate_small/``);
    * ``hf-hub:ORG/NAME`` → ``ORG--NAME/`` in the current folder (never inside the Hugging Face cache).
    """
    from ..io import CONFIG_NAME, WEIGHTS_NAME
    from ..loading.hub import is_hub_spec
    from ..train.rundir import CHECKPOINT, CONFIG_FILE

    if is_hub_spec(checkpoint):
        return Path(str(checkpoint).split(":", 1)[1].replace("/", "--"))
    path = Path(checkpoint)
    if path.is_dir():
        return path
    if path.name in (CONFIG_NAME, WEIGHTS_NAME):
        return path.parent
    run = path.parent.parent
    if path.parent.name == CHECKPOINT.parent.name and (run / CONFIG_FILE).is_file():
        return run
    return path.with_suffix("")


def report_dir(out: str | Path | None, default: Path, overwrite: bool, command: str, owned: Sequence[str]) -> Path:
    """The folder a report command writes, created now: earlier outputs are never replaced without asking.

    Without ``--out``: ``default``, or the first of ``default-2``, ``default-3``, ... that is new or empty.  A
    named ``--out`` must be new or empty; with ``overwrite`` it may instead hold an earlier report of
    ``command`` (its first ``owned`` file), whose files (``owned``: names or glob patterns) are removed here so
    that nothing stale (a confusion matrix of an earlier top-1 evaluation) is left beside the new report.
    """
    import shutil

    def used(p: Path) -> bool:
        return p.exists() and (not p.is_dir() or any(p.iterdir()))

    if out is None:
        path, n = default, 1
        while used(path):
            n += 1
            path = default.with_name(f"{default.name}-{n}")
        return check_out_dir(path)
    path = Path(out)
    if path.is_dir() and used(path):
        if not overwrite:
            raise ValueError(
                f"--out {path} is not empty; pass --overwrite to replace the earlier crate {command} report in it, "
                "or choose a new --out"
            )
        if not (path / owned[0]).is_file():
            raise ValueError(
                f"--out {path} holds no earlier crate {command} report ({owned[0]}), and --overwrite replaces only "
                "that; choose a new or empty --out"
            )
        for pattern in owned:
            for p in path.glob(pattern):
                if p.is_dir():
                    shutil.rmtree(p)
                else:
                    p.unlink()
    return check_out_dir(path)


def held_out_corpus(run: Path, data: str | None) -> tuple[str, float, list[str]]:
    """The corpus a language-model report measures, the fraction held out at its end and its text columns:
    ``data`` if given, else the one a ``crate train-lm`` run directory ``run`` trained on (its config.yaml, of any
    release), else python-docs; the held-out tail is the run's ``--val-fraction``, or 0.1; the columns are the
    run's ``--text-columns`` when the corpus is its own."""
    from ..train.rundir import read_run_config

    val_fraction, columns = 0.1, []
    if (Path(run) / "config.yaml").is_file():
        saved = read_run_config(Path(run) / "config.yaml").data
        if not data or data == saved.source:
            columns = list(saved.text_columns)
        data, val_fraction = data or saved.source, saved.val_fraction or val_fraction
    return str(data or "python-docs"), val_fraction, columns


def dataset_columns(args: argparse.Namespace, model: Any, data: str) -> dict[str, str]:
    """``open_source``'s ``image_column`` / ``label_column`` for a report on ``data``: those the model recorded
    for its own dataset, overridden by ``--image-column`` / ``--label-column`` where the command has them."""
    spec = getattr(model.config, "data", None)
    out = spec.columns_for(data) if spec is not None else {}
    out.update({k: v for k in ("image_column", "label_column") if (v := getattr(args, k, ""))})
    return out


def layer_number(model: Any, layer: int, flag: str) -> int:
    """A layer as the command line numbers it (1..L, or negative from the end: -1 the last) → its 0-based index,
    or a one-line error naming ``flag`` and the valid range."""
    depth = len(model.layers)
    if isinstance(layer, bool) or not isinstance(layer, int) or layer == 0 or not -depth <= layer <= depth:
        raise ValueError(
            f"{flag} {layer} does not exist: the model has {depth} layers; pass 1..{depth} (or -1 for the last)"
        )
    return layer - 1 if layer > 0 else depth + layer
