"""The ``crate`` command.

Each subcommand lives with the code it drives; this module only wires them together and turns
expected failures (bad input, missing or corrupt files) into a one-line message and exit code 2.
Set ``CRATE_DEBUG=1`` to see full tracebacks.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__

# name -> (module, help); the module provides configure_<name>(parser) and run_<name>(args) -> int | None
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("crate_transformer.cli", "list the registered models with their parameter counts"),
    "train": ("crate_transformer.train", "train a model (default: CRATE on the built-in MNIST digits)"),
    "finetune": ("crate_transformer.train", "fine-tune a pretrained or official checkpoint on new data"),
    "eval": ("crate_transformer.train", "evaluate a checkpoint: top-1/top-5, per-class accuracy, confusion matrix"),
    "analyze": ("crate_transformer.analysis", "white-box report: compression, sparsity, attention maps, segmentation"),
    "theory": ("crate_transformer.theory", "reproduce the paper's mathematical claims on synthetic data"),
}


def configure_models(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'crate_*'")


def run_models(args: argparse.Namespace) -> int:
    from .model import build_model
    from .registry import list_models, model_config

    names = list_models(args.pattern)
    if not names:
        raise ValueError(f"no registered model matches {args.pattern!r}; run `crate models` to list them all")
    rows = []
    for name in names:
        c = model_config(name)
        params = build_model(c).num_params()
        rows.append((name, c.arch, c.dim, c.depth, c.heads, f"{c.image_size}/{c.patch_size}", f"{params:,}"))
    header = ("name", "arch", "dim", "depth", "heads", "img/patch", "params")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``crate`` parser; only ``command``'s module is imported and configured (fast start-up)."""
    parser = argparse.ArgumentParser(prog="crate", description="CRATE: white-box transformers")
    parser.add_argument("--version", action="version", version=f"crate_transformer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(
            name, help=help_text, description=help_text, formatter_class=argparse.ArgumentDefaultsHelpFormatter
        )
        if name == command:
            module = importlib.import_module(module_name)
            getattr(module, f"configure_{name}")(p)
            p.set_defaults(_run=getattr(module, f"run_{name}"))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)  # the top level has no valued options
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 1
    try:
        return int(args._run(args) or 0)
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as e:
        if os.environ.get("CRATE_DEBUG"):
            raise
        print(f"crate {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
