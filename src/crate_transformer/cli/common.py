"""What the training and report commands share: ``--model-args``, threads, the options the user gave.

The flags generated from option dataclasses are in :mod:`.options`; the report commands' folders in :mod:`.reports`."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import from_given
from ..config_utils import coerce_fields, load_yaml, option_name, short_repr
from ..errors import OptionError
from .messages import flag

__all__ = ["parse_model_args", "given_options", "apply_threads", "refuse_given", "resolve_options"]


def parse_model_args(items: Sequence[str], model: str | None = None) -> dict[str, Any]:
    """``["dim=64", "eta=5e-2"]`` → ``{"dim": 64, "eta": 0.05}``, keys checked against the fields the registered
    ``model`` reads (any family's where the model is not known yet: its own config class rejects the others').

    Values are read as YAML scalars (``true``, ``null``, numbers); the config class then coerces them by field
    type, so ``5e-2`` (a string to YAML 1.1) is a float and ``eta=abc`` is a one-line error.
    """
    import yaml

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
    fields = _model_fields()  # any family's; the model's own config class rejects the ones it does not have
    _check_model_reads(out, model)
    bad = sorted(set(out) - set(fields))
    if bad:  # the model is not known yet (it is the command's default or the checkpoint's): any family's fields
        near = difflib.get_close_matches(bad[0], fields, n=1)
        hint = f"did you mean {near[0]}? " if near else f"valid: {', '.join(sorted(fields))}; "
        raise ValueError(f"unknown model argument(s) {bad}; {hint}pass --model NAME to list that model's fields")
    for key, value in out.items():  # ranges and finiteness now, not when the model is built inside a run
        fields[key].check_field(key, value)
    return out


def _check_model_reads(given: Mapping[str, Any], model: str | None) -> None:
    """An argument the registered ``model`` does not read: one line with the nearest of the fields it reads."""
    from ..models._registry import list_models, model_fields

    if not model or model not in list_models():
        return
    reads = model_fields(model)
    for name in sorted(set(given) - set(reads)):
        near = difflib.get_close_matches(name, reads, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ValueError(f"{model} has no model argument {name!r}{hint}; it reads: {', '.join(reads)}")


def _model_fields() -> dict[str, type]:
    """Every field a model argument may name → the first registered family's config class that has it."""
    from ..models.registry import config_classes

    fields = {f.name: cls for cls in reversed(config_classes()) for f in dataclasses.fields(cls)}  # the first wins
    return {k: v for k, v in fields.items() if k not in ("data", "extra")}


def resolve_options(args: argparse.Namespace) -> None:
    """A command with an options class (:func:`add_command_options`): the class built from the flags given —
    coerced and checked there, a bad value its one-line error naming the flag — and every option set on ``args``
    (the given value, else the declared default).  ``args._given`` keeps the names of those given (``refuse_given``)."""
    cls = getattr(args, "_declared", None)
    if cls is None:
        return
    fields = {option_name(f): f for f in dataclasses.fields(cls)}
    args._given = {name for name in fields if hasattr(args, name)}  # a flag not given is absent (argparse.SUPPRESS)
    values = from_given(cls, **{fields[name].name: getattr(args, name) for name in args._given})
    for name, f in fields.items():
        setattr(args, name, getattr(values, f.name))


def refuse_given(args: argparse.Namespace, names: Sequence[str], why: str) -> None:
    """A one-line error for the first option of ``names`` given (at any value, issue 48: ``args._given``, set by
    :func:`resolve_options`): it cannot apply (``why``, e.g. "for a language model"), so it is refused rather than
    silently ignored."""
    for name in names:
        if name in getattr(args, "_given", ()):
            raise ValueError(f"{flag(name)} does not apply {why}; drop it")


def apply_threads(args: argparse.Namespace) -> int:
    """Set torch's CPU threads from ``args.threads`` (absent = 0 = auto); returns the count used."""
    from ..train.threads import set_threads

    return set_threads(getattr(args, "threads", 0))


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The training options the user set, nested: ``--config FILE`` (any layout), then the flags over it
    (``model_args`` merged, not replaced; :meth:`~crate_transformer.train.TrainConfig.merge` places each flag)."""
    from ..train.config import TrainConfig

    names = set(TrainConfig().flat())  # every training option as its flag names it (a task's --augmentation is its own)
    options = _file_options(args.config) if getattr(args, "config", None) else {}  # typed first
    if options and hasattr(args, "_options"):  # every option of this command's parser, given or not (cli.main)
        _refuse_unread(options, args._options, args.config)
    flags = {k: v for k, v in vars(args).items() if k in names}
    if "model_args" in flags:
        model = flags.get("model") or options.get("model") or getattr(args, "model", None)
        flags["model_args"] = {**(options.get("model_args") or {}), **parse_model_args(flags["model_args"], model)}
    return TrainConfig.merge(options, flags)


def _file_options(path: str) -> dict[str, Any]:
    """A ``--config`` file's options, nested and typed; each value is first checked alone against its declaration
    (type, choices, range; a model argument by its family's config class), so a bad one is named as the file's key
    where it is fixed (``config.yaml: optim.lr must be ..., got 'fast' (str); e.g. 0.004``), not as its flag."""
    from ..config import check_option
    from ..train.config import GROUPS, TrainConfig, nest_options, read_options_file

    options = read_options_file(path)  # the nested layout (a flat file's keys placed in their groups), as written
    for key, value in options.items():
        if key in GROUPS:
            entries = [(GROUPS[key], name, v, f"{key}.{name}") for name, v in value.items()]
        elif key == "model_args" and isinstance(value, dict):
            entries = [(c, name, v, f"{key}.{name}") for name, v in value.items() if (c := _model_fields().get(name))]
        else:
            entries = [(TrainConfig, key, value, key)]
        for cls, name, v, where in entries:
            field = next((f for f in dataclasses.fields(cls) if f.name == name), None)
            try:
                if field is not None:  # an unknown key: nest_options names it with the valid ones
                    check_option(cls, name, coerce_fields(cls, {name: v})[name])
            except ValueError as e:
                raise ValueError(_keyed(str(e), option_name(field), where, path)) from None
    return nest_options(options)


def _keyed(message: str, said: str, where: str, path: str) -> str:
    """``message``, about the option the library names ``said``, about key ``where`` of the file ``path`` as the
    file writes it (a nested ``optim.lr``, a flat ``lr``): ``lr must be ..., got 'x' (str); e.g. lr=0.004`` →
    ``config.yaml: optim.lr must be ..., got 'x' (str); e.g. 0.004``."""
    from ..train.config import GROUPS

    if where.split(".")[0] in GROUPS and said not in GROUPS:  # a group's option may be written flat, at the top
        written = {str(k).replace("-", "_"): str(k) for k in load_yaml(Path(path).read_text()) or {}}
        where = written.get(said, where)
    message = message.replace(f"e.g. {said}=", "e.g. ")
    return f"{path}: {where}{message[len(said) :]}" if message.startswith(f"{said} ") else f"{path}: {where}: {message}"


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
