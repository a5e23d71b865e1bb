"""The small files a run folder, a sweep or a cache holds beside the weights, read by one reader.

* :func:`read_side_file` — the one reader of the small files a run folder, a sweep or a cache holds beside the
  weights (``config.yaml``, ``metrics.jsonl``, ``trackers.json``, indexes, caches): a file that is unreadable,
  empty, not UTF-8, malformed or of the wrong kind is a one-line :class:`~crate_transformer.io.errors.DamagedFileError`
  naming it, what is wrong and how to recover.
* :func:`load_yaml` — the one parser of YAML text (these files, ``--config`` files, ``--model-args`` values):
  ``yaml.safe_load`` with the aliases' expansion bounded.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import DamagedFileError
from .paths import _read_regular, path_kind

__all__ = ["SIDE_FORMS", "read_side_file", "load_yaml", "YAML_VALUES"]

YAML_VALUES = 100_000  # values a YAML document may expand to (with its aliases repeated); far above any config


_JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


SIDE_FORMS = ("json", "jsonl", "yaml", "text")


_REQUIRED = object()  # read_side_file's default ``missing``: a missing file is refused


def read_side_file(
    path: str | Path, fix: str, form: str = "json", expect: type | None = dict, missing: Any = _REQUIRED
) -> Any:
    """The content of a file a run folder, a sweep or a cache holds beside the weights: the one reader of them all.

    ``form``: ``"json"`` (one value), ``"jsonl"`` (a list of values, one a line), ``"yaml"`` or ``"text"`` (the
    text itself); ``expect``: the kind of the value (of each line's value for ``"jsonl"``), ``None`` for any;
    ``missing``: what a file that does not exist reads as (by default it is refused).  What the path is comes
    first (:func:`path_kind`): a folder, a broken link, a device, a FIFO or a socket is named and never opened (a
    link to ``/dev/zero`` would never end, a FIFO would block).  An unreadable, empty, non-UTF-8, malformed or
    wrongly kinded file is a one-line :class:`DamagedFileError` ``"<path> is damaged: <what>; <fix>"`` — ``fix``
    is how to recover (restore it, delete it and what that costs).  The one thing tolerated is a ``"jsonl"``
    file's last line cut short by a killed writer (no final newline): it is skipped with a warning naming the file.
    """
    path = Path(path)
    if missing is not _REQUIRED and path_kind(path) == "missing":
        return missing
    data = _read_regular(path, fix, DamagedFileError)
    if not data.strip():
        raise DamagedFileError(f"{path} is damaged: it is empty ({len(data)} bytes); {fix}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DamagedFileError(
            f"{path} is damaged: it is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); {fix}"
        ) from None
    return text if form == "text" else _side_value(text, path, fix, form, expect)


def _side_value(text: str, path: Path, fix: str, form: str, expect: type | None) -> Any:
    """The value of a side file's ``text`` (see :func:`read_side_file`)."""
    try:
        value = _PARSERS[form](text, path)
    except (ValueError, ImportError) as e:  # json.JSONDecodeError, yaml.YAMLError (re-raised as ValueError)
        raise DamagedFileError(f"{path} is damaged: {str(e).splitlines()[0]}; {fix}") from None
    for where, item in enumerate(value if form == "jsonl" else [value], start=1):
        if expect is not None and not isinstance(item, expect):
            at = f" line {where}" if form == "jsonl" else ""
            raise DamagedFileError(f"{path}{at} holds a JSON {_kind(type(item))}, not {_kind(expect, 'a')}; {fix}")
    return value


def _kind(t: type, article: str = "") -> str:
    """A JSON / YAML kind by its Python type, in words (``article="a"``: with "a" or "an" before it)."""
    word = {dict: "object", **_JSON_KINDS}.get(t, t.__name__)
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}" if article else word


def _parse_json(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"it is not valid JSON ({e.msg} at line {e.lineno})") from None


def _parse_jsonl(text: str, path: Path) -> list:
    lines = text.split("\n")
    values = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number == len(lines):  # no newline after it: a write cut short by a kill
                warnings.warn(
                    f"{path}: its last line is cut short (a killed run?); that record is skipped", stacklevel=4
                )
                break
            raise ValueError(f"line {number} is not valid JSON ({e.msg})") from None
    return values


def _parse_yaml(text: str, path: Path) -> Any:
    import yaml

    try:
        return load_yaml(text, str(path))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"it is not valid YAML ({getattr(e, 'problem', None) or type(e).__name__}{at})") from None


_PARSERS: dict[str, Callable[[str, Path], Any]] = {"json": _parse_json, "jsonl": _parse_jsonl, "yaml": _parse_yaml}


def load_yaml(text: str, where: str = "the YAML") -> Any:
    """``yaml.safe_load(text)`` (``yaml.YAMLError`` for malformed text), refused in one line when its aliases
    expand it to more than :data:`YAML_VALUES` values or make it refer to itself: a 1 KB file of nested
    aliases is 10**8 strings to anything that walks or prints it."""
    import yaml

    data = yaml.safe_load(text)
    stack, seen = [data], 0
    while stack:
        value = stack.pop()
        seen += 1
        if seen > YAML_VALUES:
            raise ValueError(
                f"{where} expands to more than {YAML_VALUES:,} values (its aliases, *name, repeat what an anchor "
                "&name holds, or refer to themselves); write the values out"
            )
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return data
