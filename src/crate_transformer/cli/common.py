"""What several commands share: ``--model-args``, the device, argument checks, options generated from a dataclass."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "parse_model_args",
    "add_model_arguments",
    "add_dataclass_arguments",
    "given_options",
    "check_out_dir",
    "add_threads_argument",
    "apply_threads",
]


def parse_model_args(items: Sequence[str]) -> dict[str, Any]:
    """``["dim=64", "eta=5e-2"]`` → ``{"dim": 64, "eta": 0.05}``, keys checked against ModelConfig and LMConfig
    (the model's own config class rejects the other's keys when the model is built).

    Values are read as YAML scalars (``true``, ``null``, numbers); :class:`ModelConfig` then coerces them
    by field type, so ``5e-2`` (a string to YAML 1.1) is a float and ``eta=abc`` is a one-line error.
    """
    import yaml

    from ..lm import LMConfig
    from ..mae import MAEConfig
    from ..model import ModelConfig

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--model-args expects KEY=VALUE pairs (e.g. dim=64 depth=4), got {item!r}")
        try:
            out[key.strip().replace("-", "_")] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip().replace("-", "_")] = value
    # any config's field here; the model's own config class rejects the ones it does not have
    valid = {f.name for cls in (ModelConfig, MAEConfig, LMConfig) for f in dataclasses.fields(cls)} - {"data", "extra"}
    bad = sorted(set(out) - valid)
    if bad:
        raise ValueError(f"unknown model argument(s) {bad}; valid: {sorted(valid)}")
    return out


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model NAME --model-args K=V ...``: the architecture of an official checkpoint."""
    parser.add_argument("--model", default=None, help="registered model name for an official .pth (e.g. crate_small)")
    parser.add_argument(
        "--model-args",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="architecture overrides for an official .pth, e.g. --model-args num_classes=10 image_size=32",
    )


def positive(name: str, value: int | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or value < 1:
        raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")


def check_out_dir(path: str | Path) -> Path:
    """Create ``path`` (a folder for outputs) now, so a bad --out fails before any work is done."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {path} is a file; pass a folder for the outputs")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".crate-write-test"
        probe.write_text("")
        probe.unlink()
    except PermissionError:
        raise ValueError(f"cannot write to {path} (permission denied); choose another --out") from None
    except OSError as e:
        raise ValueError(f"cannot write to {path} ({e.strerror}); choose another --out") from None
    return path


def add_dataclass_arguments(
    parser: argparse.ArgumentParser, cls: type, command: str, defaults: dict | None = None, config_flag: bool = True
) -> None:
    """One ``--flag`` per field of ``cls`` whose metadata lists ``command``; unset flags stay absent.

    The field metadata carries ``help`` (and optionally ``choices``, ``metavar``, ``shown``); values are
    parsed as strings and coerced by the dataclass itself.  ``config_flag`` adds ``--config FILE``.
    """
    defaults = defaults or {}
    if config_flag:
        parser.add_argument(
            "--config", metavar="FILE", default=argparse.SUPPRESS, help="YAML or JSON file of options (flags override)"
        )
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if command not in meta.get("commands", ()):
            continue
        default = defaults.get(f.name, f.default if f.default is not dataclasses.MISSING else f.default_factory())
        plain = " ".join(map(str, default)) if isinstance(default, list) else default
        shown = plain if f.name in defaults else meta.get("shown", plain)  # a command's own default wins
        kw: dict[str, Any] = {
            "dest": f.name,
            "default": argparse.SUPPRESS,
            "help": f"{meta['help']} (default: {shown if shown not in ({}, '', None) else 'none'})",
        }
        if "choices" in meta:
            kw["choices"] = meta["choices"]
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif isinstance(default, dict):
            parser.add_argument(flag, nargs="+", metavar=meta.get("metavar", "KEY=VALUE"), **kw)
        elif isinstance(default, list):
            parser.add_argument(flag, nargs="+", metavar="V", **kw)
        else:
            if "choices" not in meta:
                kw["metavar"] = meta.get("metavar", f.name.split("_")[-1].upper())
            parser.add_argument(flag, **kw)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter  # the help texts state their defaults


def add_threads_argument(parser: argparse.ArgumentParser, command: str) -> None:
    """``--threads N`` (0 = auto) for ``command``: the training commands' option, defined once by TrainConfig."""
    from ..train.config import TrainConfig

    formatter = parser.formatter_class  # keep the command's own help format
    add_dataclass_arguments(parser, TrainConfig, command, config_flag=False)
    parser.formatter_class = formatter


def apply_threads(args: argparse.Namespace) -> int:
    """Set torch's CPU threads from ``args.threads`` (absent = 0 = auto); returns the count used."""
    from ..train.threads import set_threads

    return set_threads(getattr(args, "threads", 0))


def given_options(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The options the user set: ``--config FILE`` first, then the flags (``model_args`` merged, not replaced)."""
    from ..train.config import read_options_file

    names = {f.name for f in dataclasses.fields(cls)}
    options = read_options_file(args.config) if getattr(args, "config", None) else {}
    options = {str(k).replace("-", "_"): v for k, v in options.items()}
    flags = {k: v for k, v in vars(args).items() if k in names}
    if "model_args" in flags:
        flags["model_args"] = {**(options.get("model_args") or {}), **parse_model_args(flags["model_args"])}
    return {**options, **flags}
