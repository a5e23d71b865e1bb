"""The ``crate`` command.

One module per subcommand (``cli/<name>.py`` with ``configure_<name>(parser)`` and ``run_<name>(args)``), but for
the commands that train a task, which are data (:data:`~.training.TRAINING`); library modules hold no argparse code.
Expected failures (bad input, missing or corrupt files) are a one-line message and exit code 2; set
``CRATE_DEBUG=1`` for the full traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from typing import Any

from .._version import __version__
from .messages import (  # noqa: F401  # noqa: F401
    TASK_COMMANDS,
    Flags,
    cli_message,
    command_flags,
    error_message,
    option_warnings,
    task_command,
    unrecognized,
)
from .options import resolve_options
from .training import TRAINING, configure_training, run_training

# name -> (module, help); the module provides configure_<name>(parser) and run_<name>(args) -> int | None, but for a
# command that trains a task (module None), which is data: its row of TRAINING
COMMANDS: dict[str, tuple[str | None, str]] = {
    "models": ("models", "list the registered models with their parameter counts"),
    "train": (None, "train a model (default: CRATE on the built-in MNIST digits)"),
    "finetune": ("finetune", "fine-tune a pretrained or official checkpoint on new data"),
    "pretrain": (None, "self-supervised pre-training: crate pretrain {mae,dino,simdino}"),
    "eval": ("evaluate", "evaluate a checkpoint: top-1/top-5, per-class accuracy, confusion matrix"),
    "train-lm": (None, "train a language model: CRATE-GPT (--objective clm) or CRATE-BERT (mlm) on text"),
    "finetune-text": (None, "fine-tune a language model on a labelled CSV/TSV (GLUE-style: accuracy, F1, Spearman)"),
    "generate": ("lm", "generate text from a causal language model (temperature, top-k, top-p, KV cache)"),
    "analyze": ("analyze", "white-box report: compression, sparsity, attention maps, segmentation"),
    "features": ("features", "sparse codes as features: per-unit statistics, top inputs, purity; features.html"),
    "ablate": ("ablate", "the paper's ablation tables (11, 12, 13, 15, 17) at laptop scale, several seeds each"),
    "theory": ("theory", "reproduce the paper's mathematical claims on synthetic data"),
    "segment-eval": ("segment_eval", "score MaskCut / attention masks on COCO or VOC ground truth: AP, AR, CorLoc"),
}


class _HelpAll(argparse.Action):
    """``--help-all``: the help with every option, then exit (``--help`` shows the ``basic`` ones)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        for action in parser._actions:
            if hasattr(action, "help_all"):
                action.help = action.help_all
        parser.epilog = None
        parser.print_help()
        parser.exit()


def add_help_all(parser: argparse.ArgumentParser) -> None:
    """``--help-all`` on ``parser`` and on each of its sub-commands (``crate pretrain dino --help-all``), and a
    last line of ``--help`` saying how many options it leaves to ``--help-all``."""
    for sub in _subcommands(parser).values():
        add_help_all(sub)
    kw = {"nargs": 0, "dest": argparse.SUPPRESS, "default": argparse.SUPPRESS}
    parser.add_argument("--help-all", action=_HelpAll, help="show every option, not only the ones used first", **kw)
    hidden = sum(hasattr(a, "help_all") for a in parser._actions)
    if hidden or len(parser.format_usage().splitlines()) > 1:  # a usage of every flag: the help lists them below
        positionals = [parser._get_formatter()._format_args(a, a.dest) for a in parser._get_positional_actions()]
        parser.usage = " ".join(["%(prog)s [options]", *positionals])
    if hidden:
        parser.epilog = f"{hidden} more options: {parser.prog} --help-all"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``crate`` parser; only ``command``'s module is imported and configured (fast start-up)."""
    parser = argparse.ArgumentParser(prog="crate", description="CRATE: white-box transformers")
    parser.add_argument("--version", action="version", version=f"crate_transformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == command and module_name is None:
            configure_training(p, name, TRAINING[name])
            p.set_defaults(_run=run_training)
        elif name == command:
            module = importlib.import_module(f"{__name__}.{module_name}")
            func = name.replace("-", "_")  # crate segment-eval → configure_segment_eval / run_segment_eval
            getattr(module, f"configure_{func}")(p)
            p.set_defaults(_run=getattr(module, f"run_{func}"))
        if name == command:
            add_help_all(p)  # --help shows the options used first, --help-all every one
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``parser``'s sub-commands by name (``{}``: none)."""
    return next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub-)command ``args`` chose, e.g. ``crate pretrain mae``'s; ``parser`` without one."""
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    name = getattr(args, sub.dest, None) if sub is not None else None
    return command_parser(sub.choices[name], args) if name in _subcommands(parser) else parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)  # the top level has no valued options
    parser = build_parser(command)
    args, unknown = parser.parse_known_args(argv)
    chosen = command_parser(parser, args)
    if unknown:  # the command's own usage, not the top level's ("usage: crate [-h] [--version] COMMAND ...")
        chosen.error(unrecognized(unknown, chosen))
    if not getattr(args, "_run", None):
        parser.print_help()
        return 1
    args._options = {a.dest for a in chosen._actions}  # what a --config file may set

    def flags() -> Flags:  # the command's flags (crate ablate sets its own table, with --train-args entries)
        return getattr(args, "_flags", None) or command_flags(chosen)

    try:
        resolve_options(args)  # a command's options coerced and checked, before it does anything
        with option_warnings(args.command, flags):  # the library's warnings name the command's flags
            return int(args._run(args) or 0)
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as e:
        if os.environ.get("CRATE_DEBUG"):
            raise
        takes_model = "--model" in chosen._option_string_actions
        print(f"crate {args.command}: error: {error_message(e, args, takes_model, flags())}", file=sys.stderr)
        return 2
    except OSError as e:
        if os.environ.get("CRATE_DEBUG") or e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        where = f" writing {e.filename}" if e.filename else ""
        print(f"crate {args.command}: error: {e.strerror}{where}; free space or write elsewhere", file=sys.stderr)
        return 2
