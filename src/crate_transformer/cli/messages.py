"""The command line's one translation of the library's messages into its own words.

A library message is plain text naming things as the Python API takes them (:mod:`crate_transformer.errors`):
``lr must be positive, got -1`` with ``option="lr"``, ``use amp='none'``, ``train it with task='lm'``,
``ct.list_models() lists them``.  Where ``crate`` shows one (``main``'s ``except``, its warnings formatter) it
rewrites, from a table of the command's own flags (:func:`command_flags`, derived from its parser):

* ``task='lm'`` → ``crate train-lm`` (``task='classification' with init_from`` → ``crate finetune``);
* ``ct.list_models()`` → ``crate models``, ``ct.list_pretrained()`` → ``crate models --pretrained``;
* each ``name=value`` whose name is an option of the command → ``--flag value`` (a switch ``--flag`` /
  ``--no-flag``, a list space-separated, ``model_args={'dim': 384}`` → ``--model-args dim=384``); a field of a
  model config the message is about (``within="model_args"``) → ``--model-args name=value``;
* each name the message is about (its ``option=``), bare or with a value, → its flag (``--model-args dim`` for
  a model field), even in a command that does not take it (the flag of the command that does).

Nothing else changes: words the message does not mark (no ``=``, not its subject) are left alone.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import re
import shlex
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Flags", "command_flags", "cli_message", "step_command", "flag", "task_command", "unrecognized"]
__all__ += ["error_message", "option_warnings"]

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
LISTINGS: dict[str, str] = {"models": "crate models", "pretrained": "crate models --pretrained"}
# the Python listings a library message or help text names → the commands that list the same
LISTING_CALLS: dict[str, str] = {"ct.list_models()": LISTINGS["models"], "ct.list_pretrained()": LISTINGS["pretrained"]}


def flag(name: str) -> str:
    """The flag of the option ``name`` (``batch_size`` → ``--batch-size``)."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


# what a finished run suggests doing next (an errors.Step action) → the command that does it
ACTIONS: dict[str, str] = {"analyze": "analyze", "evaluate": "eval", "fine-tune": "finetune", "generate": "generate"}

_TASK = re.compile(r"\btask='([\w-]+)'( with init_from)?")
_PAIR = re.compile(r"(?<![\w.\-/'\"=])([A-Za-z_]\w*)=(?=[^\s=])")
_CLOSE = {"[": "]", "(": ")", "{": "}"}


@dataclass(frozen=True)
class Flags:
    """How one command takes options: ``actions``, option name → its parser action (``init_from`` → ``--from``);
    ``entries``, a flag whose ``KEY=VALUE`` entries take the options ``entry_names`` (``crate ablate``'s
    ``--train-args``)."""

    actions: Mapping[str, argparse.Action] = field(default_factory=dict)
    entries: str = ""
    entry_names: frozenset[str] = frozenset()

    def flag(self, name: str) -> str:
        """``name``'s flag in this command (an option it does not know: named the CLI's usual way)."""
        action = self.actions.get(name)
        if action is None:
            return f"{self.entries} {name}" if name in self.entry_names else flag(name)
        return next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])

    def takes(self, name: str) -> bool:
        return name in self.actions or name in self.entry_names


def command_flags(parser: argparse.ArgumentParser) -> Flags:
    """The table of ``parser``'s options (its actions that have a ``--flag``), by the name the library uses."""
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest not in ("help", "version")}
    return Flags(actions)


def cli_message(text: str, flags: Flags, options: tuple[str, ...] = (), within: str = "") -> str:
    """``text``, a library message about ``options`` (``within``: the option holding them as entries), in the
    words of the command whose options ``flags`` are (module docstring)."""
    text = _TASK.sub(lambda m: "crate " + task_command(m[1], bool(m[2])), text)
    for call, command in LISTING_CALLS.items():
        text = text.replace(call, command)
    out, pos = [], 0
    for m in _PAIR.finditer(text):
        if m.start() < pos:
            continue
        end = _value_end(text, m.end())
        words = _pair(m[1], text[m.end() : end], flags, options, within)
        if words is not None:
            out += [_bare(text[pos : m.start()], flags, options, within), words]
            pos = end
    return "".join([*out, _bare(text[pos:], flags, options, within)])


def _bare(text: str, flags: Flags, options: tuple[str, ...], within: str) -> str:
    """``text`` with each bare name of ``options`` (a whole word) as its flag."""
    for name in options:
        shown = f"{flags.flag(within)} {name}" if within else flags.flag(name)
        text = re.sub(rf"(?<![\w\-./'\"=]){re.escape(name)}(?![\w\-/'\"(=])", lambda _, s=shown: s, text)
    return text


def _pair(name: str, raw: str, flags: Flags, options: tuple[str, ...], within: str) -> str | None:
    """``name=raw`` as the command takes it, or None where it is no option of the command (left as written)."""
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if within and name in options:
        return _entry(flags.flag(within), name, value)
    if not flags.takes(name) and name not in options:  # a subject is an option even where this command lacks it
        return None
    if name in flags.entry_names and name not in flags.actions:
        return _entry(flags.entries, name, value)
    return _option(flags, name, value)


def _option(flags: Flags, name: str, value: Any) -> str:
    """``--flag value`` for option ``name``: a switch by its on or off flag, a list's items, a dict's entries."""
    flag, action = flags.flag(name), flags.actions.get(name)
    if isinstance(value, bool):
        if isinstance(action, argparse.BooleanOptionalAction) or action is None:
            return flag if value else "--no-" + flag[2:]
        return flag if value == (action.const is True) else f"no {flag}"  # store_true / store_false
    if isinstance(value, dict):
        return " ".join([flag, *(shlex.quote(f"{k}={_plain(v)}") for k, v in value.items())])
    if isinstance(value, (list, tuple)):
        return " ".join([flag, *(shlex.quote(str(v)) for v in value)])
    return f"{flag} {shlex.quote(str(value))}"


def _entry(flag: str, name: str, value: Any) -> str:
    return f"{flag} {shlex.quote(f'{name}={_plain(value)}')}"


def _plain(value: Any) -> str:
    """A ``KEY=VALUE`` entry's value as YAML reads it back (``[a, b]`` for a tuple)."""
    return str(list(value) if isinstance(value, tuple) else value)


def _value_end(text: str, i: int) -> int:
    """Where the Python literal starting at ``text[i]`` ends: a quoted string, a bracketed container, or a word."""
    if i >= len(text):
        return i
    if text[i] in "'\"":
        return _quoted_end(text, i)
    if text[i] in _CLOSE:
        depth = 0
        while i < len(text):
            if text[i] in "'\"":
                i = _quoted_end(text, i)
                continue
            depth += (text[i] in _CLOSE) - (text[i] in _CLOSE.values())
            i += 1
            if depth == 0:
                return i
        return i
    m = re.compile(r"[^\s,;:)\]}]+").match(text, i)
    return m.end() if m else i


def _quoted_end(text: str, i: int) -> int:
    quote, i = text[i], i + 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return min(i + 1, len(text))


def step_command(step: Any) -> str:
    """A finished run's next :class:`~crate_transformer.errors.Step` as the command that does it
    (``crate eval runs/x --knn``)."""
    flags = Flags()
    where = [flags.flag("init_from"), step.run] if step.action == "fine-tune" else [step.run]
    options = [_option(flags, k, v) for k, v in step.options]
    return " ".join(["crate", ACTIONS.get(step.action, step.action), *where, *options])


def unrecognized(words: list[str], parser: argparse.ArgumentParser) -> str:
    """argparse's ``unrecognized arguments`` for ``words`` (each flag with the values typed after it) naming, for
    each unknown flag, the nearest of ``parser``'s own (difflib on the names without dashes; a switch's ``--no-``
    form only for a word typed so): ``unrecognized arguments: --lrr 0.1 (did you mean --lr?)``."""
    import difflib

    known = {s[2:]: s for a in parser._actions for s in a.option_strings if s.startswith("--")}
    groups: list[list[str]] = []
    for word in words:  # a flag starts a group; the values after it (a negative number too) join it
        if not groups or (word.startswith("-") and not word[1:2].isdigit()):
            groups.append([])
        groups[-1].append(word)
    said = []
    for group in groups:
        name = group[0].split("=")[0].lstrip("-")
        names = [k for k in known if name.startswith("no-") or not k.startswith("no-")]
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.7) if group[0].startswith("-") else []
        said.append(" ".join(group) + (f" (did you mean {known[near[0]]}?)" if near else ""))
    return "unrecognized arguments: " + ", ".join(said)


def error_message(e: BaseException, args: argparse.Namespace | None = None, takes_model: bool = False,
                  flags: Flags | None = None) -> str:  # fmt: skip
    """``e`` as the CLI says it: a library error's Python names as the flags of the command at hand (``flags``,
    :func:`~.messages.cli_message`); a file that needs a model name says how the command (``args``;
    ``takes_model``: it has ``--model``) takes one."""
    from ..errors import OptionError
    from ..loading.pipeline import ArchitectureNeeded  # the loaders, imported on this error path only

    if args is not None and isinstance(e, ArchitectureNeeded):
        said = f"{e.path} looks like {e.what}, which does not store its architecture"
        if takes_model:
            return f"{said}; pass {' or '.join(f'--model {n}' for n in e.examples)}"
        return (
            f"{said}, and crate {args.command} takes no --model; load it in Python with ct.from_official(PATH, "
            f"{e.examples[0]!r}), attach the tokenizer it was trained with where it is a language model "
            "(model.tokenizer = ct.Tokenizer.from_file(...)), save it with model.save_pretrained(DIR) and pass DIR"
        )
    if not isinstance(e, OptionError):
        return str(e)
    return cli_message(str(e), flags or Flags(), e.options, e.within)


@contextlib.contextmanager
def option_warnings(command: str, flags: Callable[[], Flags] = Flags) -> Iterator[None]:
    """Inside the block, an :class:`~crate_transformer.errors.OptionWarning` Python shows is one line
    (``crate train-lm: warning: ...``, its Python names as the command's flags, ``flags()``) written above any
    progress bar; other warnings as Python shows them. Only the formatting changes, so a caller recording warnings
    (``warnings.catch_warnings(record=True)``, ``pytest.warns``) still gets every warning."""
    from ..errors import OptionWarning

    python_way = warnings.formatwarning

    def one_line(message: Warning | str, category: type, filename: str, lineno: int, *rest: Any) -> str:
        if not isinstance(message, OptionWarning):
            return python_way(message, category, filename, lineno, *rest)
        from tqdm import tqdm

        text = cli_message(str(message), flags(), message.options, message.within)
        tqdm.write(f"crate {command}: warning: {text}", file=sys.stderr)  # above the bar, not through it
        return ""  # written already: Python adds nothing

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = python_way
