"""What several commands share: ``--model-args``, threads, report folders, the options the user gave.

The flags generated from option dataclasses, and which command shows which, are in :mod:`.options`."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config_utils import load_yaml, option_name, short_repr
from ..errors import OptionError
from ..io import make_folder
from .messages import flag

__all__ = [
    "parse_model_args",
    "given_options",
    "check_out_dir",
    "apply_threads",
    "held_out_corpus",
    "layer_number",
    "dataset_columns",
    "report_dir",
    "report_home",
    "refuse_given",
    "resolve_options",
]


def parse_model_args(items: Sequence[str]) -> dict[str, Any]:
    """``["dim=64", "eta=5e-2"]`` → ``{"dim": 64, "eta": 0.05}``, keys checked against the registered families'
    config classes (the model's own config class rejects the other's keys when the model is built).

    Values are read as YAML scalars (``true``, ``null``, numbers); the config class then coerces them by field
    type, so ``5e-2`` (a string to YAML 1.1) is a float and ``eta=abc`` is a one-line error.
    """
    import yaml

    from ..models.registry import config_classes

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--model-args expects KEY=VALUE pairs (e.g. dim=64 depth=4), got {item!r}")
        name = key.strip().replace("-", "_")
        try:
            parsed = load_yaml(value, f"--model-args {name}")
        except yaml.YAMLError:
            parsed = value
        if name in out and out[name] != parsed:
            raise ValueError(f"--model-args sets {name} twice ({out[name]!r} and {parsed!r}); keep one")
        out[name] = parsed
    # any config's field here; the model's own config class rejects the ones it does not have
    classes = config_classes()
    valid = {f.name for cls in classes for f in dataclasses.fields(cls)} - {"data", "extra"}
    bad = sorted(set(out) - valid)
    if bad:
        raise ValueError(f"unknown model argument(s) {bad}; valid: {sorted(valid)}")
    for key, value in out.items():  # ranges and finiteness now, not when the model is built inside a run
        cls = next(c for c in classes if key in {f.name for f in dataclasses.fields(c)})
        cls.check_field(key, value)
    return out


def resolve_options(args: argparse.Namespace) -> None:
    """A command with an options class (:func:`add_command_options`): the class built from the flags given —
    coerced and checked there, a bad value its one-line error naming the flag — and every option set on ``args``
    (the given value, else the declared default).  ``args._defaults`` keeps the defaults (``refuse_given``)."""
    cls = getattr(args, "_declared", None)
    if cls is None:
        return
    fields = {option_name(f): f for f in dataclasses.fields(cls)}
    values = cls(**{f.name: getattr(args, name) for name, f in fields.items() if hasattr(args, name)})
    defaults = cls()
    for name, f in fields.items():
        setattr(args, name, getattr(values, f.name))
    args._defaults = {name: getattr(defaults, f.name) for name, f in fields.items()}


def refuse_given(args: argparse.Namespace, names: Sequence[str], why: str) -> None:
    """A one-line error for the first option of ``names`` given with a non-default value: it cannot apply
    (``why``, e.g. "for a language model"), so it is refused rather than silently ignored.  The defaults are the
    command's declared ones (``args._defaults``, set by :func:`resolve_options`)."""
    defaults = getattr(args, "_defaults", {})
    for name in names:
        if name in defaults and getattr(args, name) != defaults[name]:
            raise ValueError(f"{flag(name)} does not apply {why}; drop it")


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
    from ..train.config import read_run_config

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


def apply_threads(args: argparse.Namespace) -> int:
    """Set torch's CPU threads from ``args.threads`` (absent = 0 = auto); returns the count used."""
    from ..train.threads import set_threads

    return set_threads(getattr(args, "threads", 0))


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The training options the user set: ``--config FILE`` first (nested or flat), then the flags by option name
    (``model_args`` merged, not replaced)."""
    from ..train.config import FLAT, GROUPS, TrainConfig, nest_options, read_options_file

    # the top-level options and the groups' options, as their flags name them (a task's --augmentation is its own)
    names = ({option_name(f) for f in dataclasses.fields(TrainConfig)} - set(GROUPS)) | set(FLAT)
    options = nest_options(read_options_file(args.config)) if getattr(args, "config", None) else {}  # typed first
    if options and hasattr(args, "_options"):  # every option of this command's parser, given or not (cli.main)
        _refuse_unread(options, args._options, args.config)
    flags = {k: v for k, v in vars(args).items() if k in names}
    if "model_args" in flags:
        flags["model_args"] = {**(options.get("model_args") or {}), **parse_model_args(flags["model_args"])}
    for name, value in flags.items():
        group, key = FLAT.get(name, (None, None))
        if isinstance(options.get(group), dict):  # the file nests this option's group: the flag goes inside
            options[group] = {**options[group], key: value}
        else:
            options[name] = value
    return options


def _refuse_unread(options: dict[str, Any], accepted: set[str], path: object) -> None:
    """A key of a ``--config`` file that this command has no option for, set away from its default, is refused in
    one line (the flag itself is refused by the parser): nothing in a file is recorded and left unread.  Keys at
    their defaults pass, so a run's whole config.yaml can serve as the file of another command."""
    from ..train.config import TrainConfig, flat_options

    defaults, given = TrainConfig().flat(), flat_options(options)
    unread = sorted(
        k for k, v in given.items() if k not in accepted and k not in ("task", "task_args") and v != defaults.get(k)
    )
    if unread:
        raise OptionError(
            f"{path} sets {', '.join(f'{k}: {short_repr(given[k])}' for k in unread)}, which this "
            "command does not read (it has no such option); remove it from the file"
        )
