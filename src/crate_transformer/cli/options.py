"""Every option of the ``crate`` commands, generated from its one declaration (a
:func:`~crate_transformer.config_utils.option` field: help, choices, metavar, range, default), the values the user
gave (``--config`` file, flags, ``--model-args``); the commands that train a task are built from them in
:mod:`.training`.

What differs between commands is data: a training command has the training options whose ``applies`` can hold for
its task (:func:`training_options`; a task's own defaults are those its ``--help`` states); every other command
declares its own options class beside its code (a shared training option redeclared with :func:`like`);
``basic=True`` marks an option ``--help`` shows (``--help-all`` shows every one) and ``group`` names a report option's
help section.  One parse mode: argparse only splits the command line (a value stays the text typed; a flag not given
is absent) and the options class coerces and checks it as it does a config file or Python keywords, so ``--epochs x``
is that class's one-line error.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config import check_value, from_given
from ..config_utils import default_of, option_name, override
from ..errors import OptionError, short_repr
from ..io import load_yaml
from .messages import LISTING_CALLS, flag

# the training commands that start from a checkpoint (--from); the others train from scratch
FINETUNING = ("finetune", "finetune-text")
# the help sections of the report commands' own options (their fields' ``group``), named by what they do
DATA, MEASURED, SAMPLING = "data", "what is measured", "sampling"
REPORT, SYSTEM = "report folder", "system"
# a help section per TrainConfig group, named by what its options do where its name does not say it
SECTION_TITLES = {"optim": "optimisation", "logging": "run directory and logging"}


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                names: tuple[str, ...] | None = None, defaults: Mapping[str, Any] | None = None) -> None:  # fmt: skip
    """One ``--flag`` per field of dataclass ``cls`` (``names``: the option names to show; omitted: every declared
    field); ``defaults`` replace the field defaults in the help (a command's own recipe).  One without
    ``basic=True`` is shown by ``--help-all`` only."""
    defaults = dict(defaults or {})
    fields = {option_name(f): f for f in dataclasses.fields(cls) if "help" in f.metadata}
    for name in names if names is not None else fields:
        f, meta = fields[name], fields[name].metadata
        default = defaults.get(name, default_of(f))
        help_text = _help_text(meta, default, name in defaults)
        kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if "choices" in meta and not isinstance(default, list):  # a list's items: the config checks each
            kw["choices"] = meta["choices"]
        option = flag(name)  # as messages name it: batch_size → --batch-size, init_from → --from
        if isinstance(f.default, bool):
            action = parser.add_argument(option, action=argparse.BooleanOptionalAction, **kw)
        elif isinstance(default, dict) or meta.get("metavar") == "KEY=VALUE":  # pairs given twice are merged
            kw["metavar"] = meta.get("metavar", "KEY=VALUE")  # (parse_model_args refuses a clash)
            action = parser.add_argument(option, nargs="+", action="extend", **kw)
        elif isinstance(default, list):
            action = parser.add_argument(option, nargs="+", metavar=meta.get("metavar", "V"), **kw)
        else:
            if "choices" not in meta:
                kw["metavar"] = meta.get("metavar", name.split("_")[-1].upper())
            action = parser.add_argument(option, **kw)
        if not meta.get("basic"):  # shown by --help-all (add_help_all) only
            action.help_all, action.help = action.help, argparse.SUPPRESS


def _help_text(meta: Mapping[str, Any], default: Any, own_default: bool) -> str:
    """A field's help as a flag shows it: the text with its options named as flags, then its default (the
    command's own, ``own_default``, else the field's words for it, ``shown``) and its range."""
    plain = " ".join(map(str, default)) if isinstance(default, list) else default
    shown = plain if own_default else meta.get("shown", plain)
    # an option unset by default says nothing of its default ("(default: none)" is noise)
    notes = [f"default: {shown}"] if shown not in ({}, "", None, []) else []
    if "range" in meta:
        notes.append(meta["range"].words().strip() or "finite")
    text = meta["help"]
    for call, command in LISTING_CALLS.items():  # ct.list_models() → `crate models`
        text = text.replace(call, f"`{command}`")
    text = re.sub(r"`([a-z][a-z0-9_]*)`", lambda m: flag(m.group(1)), text)  # the library's `lr` is --lr here
    return text + (f" ({'; '.join(notes)})" if notes else "")


def like(cls: type, name: str, **meta: Any) -> Any:
    """Field ``name`` of options class ``cls`` declared again, with its own default, for a command's options class
    (:func:`~crate_transformer.config_utils.override`), ``meta`` replacing entries; in ``--help`` only where ``meta``
    says ``basic=True``: which options a command's people use first is the command's to say."""
    default = default_of(next(f for f in dataclasses.fields(cls) if f.name == name))
    return override(cls, name, default, **{"basic": False, **meta})


def training_options(command: str, task: str) -> dict[str, tuple[str, ...]]:
    """The :class:`TrainConfig` options of ``command``, which trains ``task``, by section (``"top"``: the model and
    checkpoint fields; then each group): every option whose ``applies`` can hold in a run of ``task``, from a
    checkpoint where ``command`` is one of :data:`FINETUNING`; a field its condition names holds its default unless
    the command has it too. What differs between commands is the declarations' ``applies``: no table says it."""
    from ..config_utils import applies_where
    from ..train.config import FIELDS, GROUP_OF, OWNERS

    fixed = {"task": task, "init_from": "CHECKPOINT" if command in FINETUNING else None}
    names = {n for n, f in FIELDS.items() if not f.metadata.get("by_command") and (n != "init_from" or fixed[n])}

    def can_hold(applies: Any) -> bool:  # an alternative whose every field is the command's to set or holds
        if applies is None or isinstance(applies, str):
            return True
        return any(
            all(k in names or applies_where({k: v}, {k: fixed.get(k, default_of(FIELDS[k]))}) for k, v in alt.items())
            for alt in ([applies] if isinstance(applies, Mapping) else applies)
        )

    while dropped := {n for n in names if not can_hold(FIELDS[n].metadata.get("applies"))}:
        names -= dropped  # an option whose condition needs one of them is dropped next
    sections: dict[str, tuple[str, ...]] = {}
    for n in OWNERS:  # in declaration order
        if n in names:
            section = GROUP_OF[n] or "top"
            sections[section] = (*sections.get(section, ()), option_name(FIELDS[n]))
    if fixed["init_from"]:  # a fine-tuning command's subject, --from, comes first
        sections["top"] = ("init_from", *(n for n in sections["top"] if n != "init_from"))
    return sections


def add_training_options(
    parser: argparse.ArgumentParser, command: str, task: str, run: str, defaults: Mapping[str, Any]
) -> None:
    """``--resume RUN_DIR`` (``run``: the run it continues, e.g. "mae run"), ``--config FILE``, ``--print-config``
    and the :class:`TrainConfig` options of ``command`` training ``task`` (:func:`training_options`), one help
    section per group (``defaults``: the command's own recipe, shown in ``--help``)."""
    from ..train.config import GROUPS, TrainConfig

    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=argparse.SUPPRESS,
        help=f"continue an interrupted {run} from RUN_DIR/checkpoints/last.pt (its configuration is reused; flags "
        "override it)",
    )
    parser.add_argument(
        "--config", metavar="FILE", default=argparse.SUPPRESS, help="YAML or JSON file of options (flags override)"
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration (defaults < --config < flags) as YAML and exit without training",
    )
    for section, names in training_options(command, task).items():
        cls = TrainConfig if section == "top" else GROUPS[section]
        target = (
            parser if section == "top" else parser.add_argument_group(f"{SECTION_TITLES.get(section, section)} options")
        )
        add_options(target, cls, names, defaults)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # the help texts state their defaults


def add_command_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """The flags of a command that reads its options itself (``crate eval``, ``crate analyze``, ...): every field
    of its options class ``cls``, in help sections by the fields' ``group`` metadata (none: the command's own
    options).  :func:`resolve_options` turns what was given into ``cls``'s values after parsing."""
    sections: dict[str, list[str]] = {}
    for f in dataclasses.fields(cls):
        sections.setdefault(f.metadata.get("group", ""), []).append(option_name(f))
    for title, names in sections.items():
        add_options(parser.add_argument_group(title) if title else parser, cls, tuple(names))
    parser.set_defaults(_declared=cls)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # the help texts state their defaults


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
        check_value(fields[key], key, value)
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
                    check_value(cls, name, v)
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
