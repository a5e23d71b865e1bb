"""Which command shows which option, and the one helper that turns dataclass fields into ``--flags``.

The library's option dataclasses (:class:`~crate_transformer.train.TrainConfig` and its groups, a task's
``Options`` such as DINO's or MAE's) describe each option once — help text, choices, metavar, range — and say
nothing about commands.  :data:`COMMAND_OPTIONS` is the command line's single table of which command shows
which of the training options; :func:`add_options` generates the flags, named as the options are
(``--lr``, ``--threads``, ``--data``).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "COMMAND_OPTIONS",
    "add_options",
    "add_training_options",
    "add_report_options",
    "add_config_file_options",
    "print_config",
]

ALL = "*"  # every option of the group, including any added later
_MODEL = ("model", "model_args")
_IMAGE_DATA = ("data", "data_mode", "workers", "image_size", "val_fraction", "train_subset", "on_bad_image",
               "image_column", "label_column")  # fmt: skip
_OPTIM = ("optimizer", "momentum", "lr", "min_lr", "weight_decay", "betas", "batch_size", "accum_steps", "epochs",
          "warmup_epochs", "warmup_fraction", "grad_clip", "max_steps")  # fmt: skip
_LOGGING = ("out", "checkpoint_every", "log_every", "eval_every", "eval_batch_size", "logger", "tensorboard",
            "progress")  # fmt: skip
# image pre-training (MAE, DINO) has no labels: no augmentation policy, label smoothing, eval split or R^c hook
_UNSUPERVISED = {"top": _MODEL, "data": _IMAGE_DATA, "optim": _OPTIM, "system": ALL, "logging": _LOGGING}
_SUPERVISED = {
    "top": (*_MODEL, "recipe"),
    "data": (*_IMAGE_DATA, "eval_split"),
    "augmentation": ALL,
    "optim": ALL,
    "system": ALL,
    "logging": ALL,
}
_LM = {**_UNSUPERVISED, "data": ("data", "val_fraction", "text_columns")}
_TEXT_TABLE = {**_UNSUPERVISED, "data": ("data", "val_fraction", "text_columns", "label_column")}
_OFFICIAL = {  # a report command's --model / --model-args describe an official checkpoint's architecture
    "model": "registered model name for an official .pth (e.g. crate_small)",
    "model_args": "architecture overrides for an official .pth, e.g. --model-args num_classes=10 image_size=32",
}

# command → {section: option names (or ALL)}; a section is "top" (the task, model and checkpoint fields) or a
# TrainConfig group.  Names may map to the command's own help text for the option (None: the option's).
COMMAND_OPTIONS: dict[str, dict[str, Any]] = {
    "train": _SUPERVISED,
    "finetune": {**_SUPERVISED, "top": (*_MODEL, "recipe", "keep_head")},
    "pretrain": _UNSUPERVISED,
    "train-lm": _LM,
    "finetune-text": _TEXT_TABLE,
    "eval": {
        "top": _OFFICIAL,
        "data": {
            "val_fraction": "as in training, for --split val",
            "on_bad_image": None,
            "data_mode": None,
            "workers": None,
            "image_column": None,
            "label_column": None,
        },
        "system": {"seed": "seed of the val split, as in training", "device": None, "threads": None},
    },
    "analyze": {
        "top": _OFFICIAL,
        "data": {
            "image_size": "resize images to this square size",
            "on_bad_image": None,
            "image_column": None,
            "label_column": None,
        },
        "system": {"seed": "seed of the measured image subset", "device": None, "threads": None},
    },
    "generate": {
        "system": {
            "seed": "random seed: the same seed gives the same text",
            "device": None,
            "threads": None,
            "compile": "decode with one compiled step per token on a fixed-size cache (a CUDA graph on a GPU): the "
            "same text, faster once compiled; prompt + new tokens must fit the context",
        }
    },
    "features": {
        "system": {"seed": "seed of the image subset and of the chance purity", "device": None, "threads": None}
    },
}
# the options of the report commands (eval, analyze, generate) whose default is not the training default
REPORT_DEFAULTS: dict[str, Any] = {"model": None}
# options a report command hands on as given, absent when not given: set_threads reads --threads itself (0 or
# absent = auto) and refuses a bad value in its own words, as it does for the training commands
PASSED_ON = ("threads",)
SECTION_TITLES = {
    "data": "data",
    "augmentation": "augmentation",
    "optim": "optimisation",
    "system": "system",
    "logging": "run directory and logging",
}


def add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    names: Mapping[str, str | None] | None = None,
    defaults: Mapping[str, Any] | None = None,
    *,
    typed: bool = False,
    passed_on: tuple[str, ...] = (),
) -> None:
    """One ``--flag`` per field of dataclass ``cls`` (``names``: option name → the command's own help, or None
    for the field's; omitted: every field), named by the field's option name with dashes.

    The field metadata carries ``help`` (and optionally ``choices``, ``metavar``, ``shown``, ``range``).
    ``typed=False`` (the training commands): flags not given stay absent (``given_options`` collects the rest)
    and values stay strings, coerced and checked by the dataclass itself.  ``typed=True`` (a command that reads
    ``args`` directly): every flag has its default, values are coerced to the field's type, and a ranged value is
    checked before the command runs, except the options in ``passed_on`` (as with ``typed=False``).  ``defaults``
    replace field defaults (a command's own recipe).
    """
    from ..config_utils import field_types, option_name
    from .common import register_range

    defaults, types = dict(defaults or {}), field_types(cls)
    fields = {option_name(f): f for f in dataclasses.fields(cls) if "help" in f.metadata}
    for name in names if names is not None else fields:
        f, meta = fields[name], fields[name].metadata
        default = defaults.get(name, f.default if f.default is not dataclasses.MISSING else f.default_factory())
        plain = " ".join(map(str, default)) if isinstance(default, list) else default
        shown = plain if name in defaults else meta.get("shown", plain)  # a command's own default wins
        help_text = help_flags((names or {}).get(name) or meta["help"])
        typed_here = typed and name not in passed_on
        if typed_here and "shown" not in meta and name not in defaults and not isinstance(default, (dict, list)):
            shown = "%(default)s"  # argparse's own words (and no second "(default: ...)" from its formatters)
        # an option unset by default says nothing of its default ("(default: none)" is noise)
        notes = [f"default: {shown}"] if shown not in ({}, "", None, []) else []
        if "range" in meta:
            notes.append(meta["range"].words().strip() or "finite")
        kw: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        kw["help"] += f" ({'; '.join(notes)})" if notes else ""
        if "choices" in meta and not isinstance(default, list):  # a list's items: the config checks each
            kw["choices"] = meta["choices"]
        flag = "--" + name.replace("_", "-")
        if typed_here:  # the command reads args.<name>: a real default and a value of the field's type
            kw["default"] = [] if isinstance(default, dict) else default
            if not isinstance(default, (bool, dict, list)):
                kw["type"] = _converter(types[f.name])
            if "range" in meta:
                register_range(parser, name, flag, meta["range"])
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif isinstance(default, dict):  # given twice, the pairs are merged (parse_model_args refuses a clash)
            parser.add_argument(flag, nargs="+", action="extend", metavar=meta.get("metavar", "KEY=VALUE"), **kw)
        elif isinstance(default, list):
            parser.add_argument(flag, nargs="+", metavar=meta.get("metavar", "V"), **kw)
        else:
            if "choices" not in meta:
                kw["metavar"] = meta.get("metavar", name.split("_")[-1].upper())
            parser.add_argument(flag, **kw)


def help_flags(text: str) -> str:
    """A library help text with its options named as flags: the library writes ```lr``` (backticked option
    names), the command line shows ``--lr``."""
    from . import LISTING_CALLS, flag

    for call, command in LISTING_CALLS.items():
        text = text.replace(call, f"`{command}`")
    return re.sub(r"`([a-z][a-z0-9_]*)`", lambda m: flag(m.group(1)), text)


def _converter(annotation: Any) -> Any:
    """An argparse ``type``: the text coerced to ``annotation`` as config files are (a usage error if it cannot)."""
    from ..config_utils import coerce_value

    def convert(text: str) -> Any:
        try:
            return coerce_value(text, annotation)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def add_training_options(
    parser: argparse.ArgumentParser, command: str, defaults: Mapping[str, Any] | None = None
) -> None:
    """``--config FILE``, ``--print-config`` and the :class:`TrainConfig` options :data:`COMMAND_OPTIONS` lists for
    ``command``, one help section per group (``defaults``: the command's own recipe, shown in ``--help``)."""
    from ..train.config import GROUPS, TrainConfig

    add_config_file_options(parser)
    for section, names in COMMAND_OPTIONS[command].items():
        target = parser if section == "top" else parser.add_argument_group(f"{SECTION_TITLES[section]} options")
        add_options(target, TrainConfig if section == "top" else GROUPS[section], _names(section, names), defaults)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # the help texts state their defaults


def add_report_options(parser: argparse.ArgumentParser, command: str, section: str) -> None:
    """The :data:`COMMAND_OPTIONS` of ``section`` for a command that reads its options itself (typed, with
    defaults): ``crate eval``, ``crate analyze``, ``crate generate``."""
    from ..train.config import GROUPS, TrainConfig

    cls = TrainConfig if section == "top" else GROUPS[section]
    names = _names(section, COMMAND_OPTIONS[command][section])
    add_options(parser, cls, names, REPORT_DEFAULTS, typed=True, passed_on=PASSED_ON)


def _names(section: str, names: Any) -> dict[str, str | None]:
    from ..train.config import GROUPS, option_name

    if names == ALL:
        return {option_name(f): None for f in dataclasses.fields(GROUPS[section])}
    return dict(names) if isinstance(names, Mapping) else dict.fromkeys(names)


def add_config_file_options(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` (nested or flat options; flags override) and ``--print-config``."""
    parser.add_argument(
        "--config", metavar="FILE", default=argparse.SUPPRESS, help="YAML or JSON file of options (flags override)"
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration (defaults < --config < flags) as YAML and exit without training",
    )


def print_config(args: argparse.Namespace, base: Any, options: Mapping[str, Any]) -> bool:
    """With ``--print-config``: print the configuration that ``base`` (a :class:`TrainConfig`: the command's
    defaults) updated with ``options`` (``--config`` file, then flags) resolves to, as YAML; returns whether it did.

    The YAML is what ``config.yaml`` records and what ``--config`` reads back.
    """
    if not getattr(args, "print_config", False):
        return False
    import sys

    import yaml

    if getattr(args, "resume", None):
        raise ValueError(
            f"--print-config shows a new run's configuration; the resumed run's is {args.resume}/config.yaml "
            "(drop --resume)"
        )
    cfg = type(base).from_dict(options, base)
    yaml.safe_dump(cfg.to_dict(), sys.stdout, sort_keys=False)
    return True
