"""What the training and report commands share: ``--model-args``, threads, the options the user gave.

The flags generated from option dataclasses are in :mod:`.options`; the report commands' folders in :mod:`.reports`."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from ..config_utils import load_yaml, option_name, short_repr
from ..errors import OptionError
from .messages import flag

__all__ = ["parse_model_args", "given_options", "apply_threads", "refuse_given", "resolve_options"]


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
