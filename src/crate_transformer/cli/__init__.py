"""The ``crate`` command.

One module per subcommand (``cli/<name>.py`` with ``configure_<name>(parser)`` and ``run_<name>(args)``);
library modules hold no argparse code.  Expected failures (bad input, missing or corrupt files) are a
one-line message and exit code 2; set ``CRATE_DEBUG=1`` for the full traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import shlex
import sys
import warnings
from collections.abc import Iterator
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


# options whose flag is not their name with dashes
FLAGS: dict[str, str] = {"init_from": "--from"}
# what a finished run suggests doing next (an errors.Step action) → the command that does it
ACTIONS: dict[str, str] = {"analyze": "analyze", "evaluate": "eval", "fine-tune": "finetune", "generate": "generate"}
LISTINGS: dict[str, str] = {"models": "crate models", "pretrained": "crate models --pretrained"}
# the Python listings a library help text names → the commands that list the same
LISTING_CALLS: dict[str, str] = {"ct.list_models()": LISTINGS["models"], "ct.list_pretrained()": LISTINGS["pretrained"]}


def flag(name: str) -> str:
    """The flag of the option ``name`` (``batch_size`` → ``--batch-size``)."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def _option_words(name: str, value: object) -> str:
    if isinstance(value, bool):
        return flag(name) if value else "--no-" + flag(name)[2:]
    if isinstance(value, (list, tuple)):
        return " ".join([flag(name), *(shlex.quote(str(v)) for v in value)])
    return f"{flag(name)} {shlex.quote(str(value))}"


def cli_words(place: object) -> str:
    """The CLI's wording of a place in a library message (:mod:`crate_transformer.errors`): a task as the command
    that trains it, an option as its flag (with its value), a listing as its command, a next step as a command."""
    from ..errors import Opt, See, Step, Use

    if isinstance(place, Use):
        return f"crate {task_command(place.task, place.init_from)}"
    if isinstance(place, Opt) and place.within:  # an entry of a KEY=VALUE option: --model-args dim=384
        value = list(place.value) if isinstance(place.value, tuple) else place.value  # YAML reads [a, b]
        entry = f"{place.name}={value}" if place.has_value else place.name
        return f"{flag(place.within)} {shlex.quote(entry)}"
    if isinstance(place, Opt):
        return _option_words(place.name, place.value) if place.has_value else flag(place.name)
    if isinstance(place, See):
        return LISTINGS.get(place.what, place.what)
    if isinstance(place, Step):
        where = [flag("init_from"), place.run] if place.action == "fine-tune" else [place.run]
        return " ".join(["crate", ACTIONS.get(place.action, place.action), *where,
                         *(_option_words(k, v) for k, v in place.options)])  # fmt: skip
    return str(place)


def error_message(e: BaseException, args: argparse.Namespace | None = None, takes_model: bool = False) -> str:
    """``e`` as the CLI says it: a :class:`~crate_transformer.errors.Worded` error names commands and flags; a file
    that needs a model name says how the command at hand (``args``; ``takes_model``: it has ``--model``) takes
    one."""
    from ..checkpoint import ArchitectureNeeded  # the loaders, imported on this error path only
    from ..errors import Worded

    if args is not None and isinstance(e, ArchitectureNeeded):
        names = " or ".join(f"--model {n}" for n in e.examples)
        if takes_model:
            return f"{e.path} looks like {e.what}, which does not store its architecture; pass {names}"
        return (
            f"{e.path} looks like {e.what}, which does not store its architecture, and crate {args.command} takes "
            f"no --model; load it in Python with ct.from_official(PATH, {e.examples[0]!r}), attach the tokenizer "
            "it was trained with where it is a language model (model.tokenizer = ct.Tokenizer.from_file(...)), "
            f"save it with model.save_pretrained(DIR) and pass DIR"
        )
    return e.words(cli_words) if isinstance(e, Worded) else str(e)


@contextlib.contextmanager
def option_warnings(command: str) -> Iterator[None]:
    """Inside the block, an :class:`~crate_transformer.errors.OptionWarning` Python shows is one line
    (``crate train-lm: warning: ...``, worded by the current wording: flags inside the CLI) written above any
    progress bar; other warnings as Python shows them. Only the formatting changes, so a caller recording warnings
    (``warnings.catch_warnings(record=True)``, ``pytest.warns``) still gets every warning."""
    from ..errors import OptionWarning

    python_way = warnings.formatwarning

    def one_line(message: Warning | str, category: type, filename: str, lineno: int, *rest: Any) -> str:
        if not isinstance(message, OptionWarning):
            return python_way(message, category, filename, lineno, *rest)
        from tqdm import tqdm

        tqdm.write(f"crate {command}: warning: {message}", file=sys.stderr)  # above the bar, not through it
        return ""  # written already: Python adds nothing

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = python_way


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ``(default: X)`` only where it says something: not after a help text that states its default
    already, and not for an option that is unset by default (``None``, an off switch, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class _HelpAll(argparse.Action):
    """``--help-all``: the help with every option, then exit (``--help`` shows the ``basic`` ones)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kw: Any) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kw)

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
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                add_help_all(sub)
    parser.add_argument("--help-all", action=_HelpAll, help="show every option, not only the ones used first")
    hidden = sum(hasattr(a, "help_all") for a in parser._actions)
    if hidden:  # a usage line of every flag would fill a screen: the flags are listed below it
        positionals = [a.metavar or a.dest for a in parser._actions if not a.option_strings]
        parser.usage = " ".join(["%(prog)s [options]", *positionals])
        parser.epilog = f"{hidden} more options: {parser.prog} --help-all"


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
            add_help_all(p)  # --help shows the options used first, --help-all every one
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
    args._options = {a.dest for a in command_parser(parser, args)._actions}  # what a --config file may set
    try:
        from ..errors import wording
        from .common import resolve_options

        resolve_options(args)  # a report command's options coerced and checked, before it does anything
        with wording(cli_words), option_warnings(args.command):  # the library's messages name commands and flags
            return int(args._run(args) or 0)
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as e:
        if os.environ.get("CRATE_DEBUG"):
            raise
        takes_model = "--model" in command_parser(parser, args)._option_string_actions
        print(f"crate {args.command}: error: {error_message(e, args, takes_model)}", file=sys.stderr)
        return 2
    except OSError as e:
        if os.environ.get("CRATE_DEBUG") or e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise
        where = f" writing {e.filename}" if e.filename else ""
        print(f"crate {args.command}: error: {e.strerror}{where}; free space or write elsewhere", file=sys.stderr)
        return 2
