"""The ``crate`` command.

One module per subcommand (``cli/<name>.py`` with ``configure_<name>(parser)`` and ``run_<name>(args)``);
library modules hold no argparse code.  Expected failures (bad input, missing or corrupt files) are a
one-line message and exit code 2; set ``CRATE_DEBUG=1`` for the full traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from .._version import __version__

# name -> (module, help); the module provides configure_<name>(parser) and run_<name>(args) -> int | None
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("models", "list the registered models with their parameter counts"),
    "train": ("train", "train a model (default: CRATE on the built-in MNIST digits)"),
    "finetune": ("train", "fine-tune a pretrained or official checkpoint on new data"),
    "pretrain": ("pretrain", "self-supervised pre-training: crate pretrain {mae,dino} (masked autoencoding, DINO)"),
    "eval": ("train", "evaluate a checkpoint: top-1/top-5, per-class accuracy, confusion matrix"),
    "train-lm": ("lm", "train a language model: CRATE-GPT (--objective clm) or CRATE-BERT (mlm) on text"),
    "finetune-text": ("lm", "fine-tune a language model on a labelled CSV/TSV (GLUE-style: accuracy, F1, Spearman)"),
    "generate": ("lm", "generate text from a causal language model (temperature, top-k, top-p, KV cache)"),
    "analyze": ("analyze", "white-box report: compression, sparsity, attention maps, segmentation"),
    "features": ("features", "sparse codes as features: per-unit statistics, top inputs, purity; features.html"),
    "ablate": ("ablate", "the paper's ablation tables (11, 12, 13, 15, 17) at laptop scale, several seeds each"),
    "theory": ("theory", "reproduce the paper's mathematical claims on synthetic data"),
}


# the commands that train each task (with `crate finetune` for classification from a checkpoint); any other
# registered task is pre-trained by `crate pretrain TASK`.  The library names tasks only: the CLI words them here.
TASK_COMMANDS: dict[str, str] = {"classification": "train", "lm": "train-lm", "text-classification": "finetune-text"}


def task_command(task: str, init_from: bool = False) -> str:
    """The ``crate`` command (without ``crate``) that trains ``task``, e.g. ``pretrain mae``."""
    if task == "classification" and init_from:
        return "finetune"
    return TASK_COMMANDS.get(task, f"pretrain {task}")


def error_message(e: BaseException) -> str:
    """``e`` as the CLI says it: a :class:`~crate_transformer.errors.TaskError` names commands, not tasks."""
    from ..errors import TaskError

    if isinstance(e, TaskError):
        return e.words(lambda use: f"crate {task_command(use.task, use.init_from)}")
    return str(e)


def option_warnings(command: str) -> Callable[..., None]:
    """A ``warnings.showwarning`` that writes an :class:`~crate_transformer.errors.OptionsWarning` as one line
    naming flags (``--warmup-fraction`` for the option ``warmup_fraction``), above any progress bar; other
    warnings as Python shows them."""
    from ..errors import OptionsWarning

    python_way = warnings.showwarning

    def show(message: Warning | str, category: type, filename: str, lineno: int, *rest: Any) -> None:
        if not isinstance(message, OptionsWarning):
            return python_way(message, category, filename, lineno, *rest)
        from tqdm import tqdm

        text = message.words(lambda option: "--" + option.name.replace("_", "-"))
        tqdm.write(f"crate {command}: warning: {text}", file=sys.stderr)

    return show


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ``(default: X)`` only where it says something: not after a help text that states its default
    already, and not for an option that is unset by default (``None``, an off switch, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``crate`` parser; only ``command``'s module is imported and configured (fast start-up)."""
    parser = argparse.ArgumentParser(prog="crate", description="CRATE: white-box transformers")
    parser.add_argument("--version", action="version", version=f"crate_transformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        if name == command:
            module = importlib.import_module(f"{__name__}.{module_name}")
            func = name.replace("-", "_")  # crate train-lm → configure_train_lm / run_train_lm
            getattr(module, f"configure_{func}")(p)
            p.set_defaults(_run=getattr(module, f"run_{func}"))
    return parser


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub-)command ``args`` chose, e.g. ``crate pretrain mae``'s; ``parser`` without one."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, sub.dest, None) if sub is not None else None
        if name not in (sub.choices if sub is not None else {}):
            return parser
        parser = sub.choices[name]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)  # the top level has no valued options
    parser = build_parser(command)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own usage, not the top level's ("usage: crate [-h] [--version] COMMAND ...")
        command_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 1
    try:
        from .common import check_argument_ranges

        check_argument_ranges(args)  # every numeric option, before the command does anything
        with warnings.catch_warnings():
            warnings.showwarning = option_warnings(args.command)
            return int(args._run(args) or 0)
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as e:
        if os.environ.get("CRATE_DEBUG"):
            raise
        print(f"crate {args.command}: error: {error_message(e)}", file=sys.stderr)
        return 2
    except OSError as e:
        if os.environ.get("CRATE_DEBUG") or e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        where = f" writing {e.filename}" if e.filename else ""
        print(f"crate {args.command}: error: {e.strerror}{where}; free space or write elsewhere", file=sys.stderr)
        return 2
