"""Every option of the ``crate`` commands, generated from its one declaration (a
:func:`~crate_transformer.config_utils.option` field: help, choices, metavar, range, default).

What differs between commands is data: :data:`COMMAND_OPTIONS` says which training options each training command
shows (a task's own defaults are those its ``--help`` states); every other command declares its own options class
beside its code (a shared training option redeclared with :func:`like`); ``basic=True`` marks an option ``--help``
shows (``--help-all`` shows every one) and ``group`` names a report option's help section.  One parse mode: argparse
only splits the command line (a value stays the text typed; a flag not given is absent) and the options class
coerces and checks it as it does a config file or Python keywords, so ``--epochs x`` is that class's one-line error.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Mapping
from typing import Any

from ..config_utils import default_of, option_name, override
from .messages import LISTING_CALLS, flag

__all__ = [
    "COMMAND_OPTIONS", "add_options", "like", "add_training_options", "add_command_options", "add_resume_option",
    "print_config"
]  # fmt: skip

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

# training command → {section: option names (or ALL)}; a section is "top" (the task, model and checkpoint
# fields) or a TrainConfig group
COMMAND_OPTIONS: dict[str, dict[str, Any]] = {
    "train": _SUPERVISED,
    "finetune": {**_SUPERVISED, "top": ("init_from", *_MODEL, "recipe", "keep_head")},
    "pretrain": _UNSUPERVISED,
    "train-lm": _LM,
    "finetune-text": {
        **_UNSUPERVISED,
        "top": ("init_from", *_MODEL),
        "data": ("data", "val_fraction", "text_columns", "label_column"),
    },
}
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


def add_training_options(
    parser: argparse.ArgumentParser, command: str, defaults: Mapping[str, Any] | None = None
) -> None:
    """``--config FILE``, ``--print-config`` and the :class:`TrainConfig` options :data:`COMMAND_OPTIONS` lists for
    ``command``, one help section per group (``defaults``: the command's own recipe, shown in ``--help``)."""
    from ..train.config import GROUPS, TrainConfig

    parser.add_argument(
        "--config", metavar="FILE", default=argparse.SUPPRESS, help="YAML or JSON file of options (flags override)"
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration (defaults < --config < flags) as YAML and exit without training",
    )
    for section, names in COMMAND_OPTIONS[command].items():
        cls = TrainConfig if section == "top" else GROUPS[section]
        target = (
            parser if section == "top" else parser.add_argument_group(f"{SECTION_TITLES.get(section, section)} options")
        )
        add_options(target, cls, None if names == ALL else tuple(names), defaults)  # None: every declared option
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # the help texts state their defaults


def add_command_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """The flags of a command that reads its options itself (``crate eval``, ``crate analyze``, ...): every field
    of its options class ``cls``, in help sections by the fields' ``group`` metadata (none: the command's own
    options).  :func:`.common.resolve_options` turns what was given into ``cls``'s values after parsing."""
    sections: dict[str, list[str]] = {}
    for f in dataclasses.fields(cls):
        sections.setdefault(f.metadata.get("group", ""), []).append(option_name(f))
    for title, names in sections.items():
        add_options(parser.add_argument_group(title) if title else parser, cls, tuple(names))
    parser.set_defaults(_declared=cls)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # the help texts state their defaults


def add_resume_option(parser: argparse.ArgumentParser, what: str = "run") -> None:
    """``--resume RUN_DIR`` of a training command (``what``: the run it continues, e.g. "interrupted mae run")."""
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        default=argparse.SUPPRESS,
        help=f"continue an interrupted {what} from RUN_DIR/checkpoints/last.pt (its configuration is reused; flags "
        "override it)",
    )


def print_config(args: argparse.Namespace, base: Any, options: Mapping[str, Any]) -> bool:
    """With ``--print-config``: print the configuration that ``base`` (a :class:`TrainConfig`: the command's
    defaults) updated with ``options`` (``--config`` file, then flags) resolves to, as YAML (what ``config.yaml``
    records and ``--config`` reads back); returns whether it did."""
    if not getattr(args, "print_config", False):
        return False
    import yaml

    if getattr(args, "resume", None):
        raise ValueError(
            f"--print-config shows a new run's configuration; the resumed run's is {args.resume}/config.yaml "
            "(drop --resume)"
        )
    cfg = type(base).from_dict(options, base)
    yaml.safe_dump(cfg.to_dict(), sys.stdout, sort_keys=False)
    return True
