"""Datasets by name: ``--data ylecun/mnist``, ``--data uoft-cs/cifar10``, ``--data glue:sst2``, ``--data wikitext``.

A ``--data`` argument that is not a local path and looks like a Hugging Face dataset id (``NAME``,
``OWNER/NAME``, optionally ``:CONFIG``) is opened with ``datasets.load_dataset`` — the real library,
so its cache (``HF_DATASETS_CACHE``, default ``~/.cache/huggingface/datasets``), its offline mode
(``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``: read the cache, never the network) and its
streaming (``streaming=True``: rows arrive as they download, nothing is stored) all apply.  Local
data files that ``datasets`` reads by extension (``.parquet``, ``.arrow``, ``.csv``, ``.json``,
``.jsonl``), or a folder of them, are opened the same way.

Which task reads what:

- image classification (training, fine-tuning, pre-training): the image and label columns are
  found from the features (:mod:`.hf`), the ``train`` split trains and ``test`` (else ``validation``)
  tests — for ``ylecun/mnist`` and ``uoft-cs/cifar10`` the standard 10,000-image test sets, so the
  numbers compare with published ones;
- language modelling: the ``text`` column (else the first string column) of the
  ``train`` split, streamed through the tokenizer into the token cache (:mod:`.text`);
- text classification: GLUE-style columns (``sentence``, ``sentence1`` +
  ``sentence2``, ``question`` + ``sentence``, ``premise`` + ``hypothesis`` …) and a ``label`` column;
  the ``validation`` split evaluates (GLUE's test labels are hidden).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "require_datasets",
    "DATA_FILE_SUFFIXES",
    "is_dataset_name",
    "parse_dataset_name",
    "load_hub_dataset",
    "local_read_errors",
]

DATA_FILE_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow", ".csv": "csv", ".json": "json", ".jsonl": "json"}
_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?(:[\w.-]+)?$")


def is_dataset_name(text: str) -> bool:
    """Whether ``text`` (not an existing path) reads as ``NAME``, ``OWNER/NAME`` or either with ``:CONFIG``."""
    return bool(_NAME.match(text)) and not Path(text).expanduser().exists()


def parse_dataset_name(text: str) -> tuple[str, str | None]:
    """``"glue:sst2"`` → ``("glue", "sst2")``; ``"ylecun/mnist"`` → ``("ylecun/mnist", None)``."""
    name, _, config = text.partition(":")
    return name, config or None


def require_datasets() -> Any:
    """The ``datasets`` package, or a one-line error saying how to install it."""
    try:
        import datasets
    except ImportError:
        raise ValueError(
            "reading a Hugging Face dataset needs the datasets package; pip install crate-transformer[hf]"
        ) from None
    return datasets


def _local_files(path: Path) -> tuple[str, dict[str, list[str]] | list[str]] | None:
    """(builder, data files) of a data file or a folder of data files, or None when ``path`` holds none."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix.lower() in DATA_FILE_SUFFIXES)
    builders = {DATA_FILE_SUFFIXES.get(p.suffix.lower()) for p in files}
    if not files or None in builders:
        return None
    if len(builders) > 1:
        raise ValueError(f"{path} mixes data file types {sorted(builders)}; keep one kind of file per dataset")
    for p in files:
        _check_data_file(p)
    by_split: dict[str, list[str]] = {}
    for p in files:  # "train-00000-of-00001.parquet", "test.csv", "validation/x.jsonl" name their split
        rel = p.name if path.is_file() else p.relative_to(path).as_posix()
        split = next((s for s in ("train", "test", "validation") if s in rel), "")
        by_split.setdefault(split or "train", []).append(str(p))
    return builders.pop(), by_split


def _check_data_file(path: Path) -> None:
    """An empty data file or a Parquet file without rows: one line naming it (``datasets`` would report an
    internal reason, or none)."""
    if path.stat().st_size == 0:
        raise ValueError(f"{path} is empty (0 bytes); write rows into it or remove it")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.read_metadata(path).num_rows
        except Exception as e:  # noqa: BLE001 - ArrowInvalid and OSError: a damaged file
            raise ValueError(f"{path} is not a readable Parquet file ({_root_reason(e)}); re-create it") from None
        if rows == 0:
            raise ValueError(f"{path} holds no rows; write rows into it or remove it")


def _check_json(path: Path) -> None:
    """A JSON file (one document) or JSON lines (one per line) that ``json`` parses, else file:line:column."""
    import json

    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise ValueError(f"{path} holds no rows (only blank lines); write rows into it or remove it")
    try:
        json.loads(text)
        return
    except json.JSONDecodeError as whole:
        if whole.msg != "Extra data":  # not several documents: one malformed document
            first = whole
        else:
            first = None
    if first is None:
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    json.loads(line)
                except json.JSONDecodeError as e:
                    first = json.JSONDecodeError(e.msg, e.doc, e.pos)
                    first.lineno, first.colno = n, e.colno
                    break
    if first is not None:
        raise ValueError(
            f"{path}:{first.lineno}:{first.colno}: invalid JSON ({first.msg}); write one JSON object per line "
            "(JSON lines) or one JSON document"
        )


@contextlib.contextmanager
def local_read_errors(text: str, builder: str, files: Sequence[str | Path] = ()) -> Iterator[None]:
    """Any failure of ``datasets`` reading local data files (a cut Parquet file, malformed JSON, a CSV pandas
    cannot parse) as one line naming the files and the reader's own reason (for JSON ``files``, the first
    malformed line); the reader's log lines about it are held back (the one line says it)."""
    import logging

    log = logging.getLogger("datasets")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    except Exception as e:  # noqa: BLE001 - DatasetGenerationError, ArrowInvalid, JSONDecodeError, ParserError, ...
        for f in files:
            if Path(f).suffix.lower() in (".json", ".jsonl"):
                _check_json(Path(f))
        reason = _root_reason(e)
        # datasets' words for a split of zero rows (a header-only CSV, []), and a stream of them ending at once
        if "corresponds to no data" in reason or isinstance(_innermost(e), StopIteration):
            raise ValueError(f"{text} holds no rows; write rows into it or remove it") from None
        raise ValueError(f"{text}: cannot read it as {builder} data ({reason}); fix or re-create it") from None
    finally:
        log.setLevel(level)


def _innermost(e: BaseException) -> BaseException:
    """The innermost exception ``e`` was raised from (or while handling)."""
    seen = set()
    while (e.__cause__ or e.__context__) is not None and id(e) not in seen:
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return e


def _root_reason(e: BaseException) -> str:
    """The first line of the innermost exception ``e`` was raised from (the reader's own words), cut short."""
    e = _innermost(e)
    first = (str(e).strip().splitlines() or [""])[0] or type(e).__name__
    return first if len(first) <= 160 else first[:159] + "…"


def _not_found(text: str, error: Exception) -> ValueError:
    """The one-line error for a dataset that neither the cache nor the Hub has."""
    from ..loading.hub import hub_answer, hub_failure, unreachable

    offline = os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"
    name, config = parse_dataset_name(text)
    call = f"datasets.load_dataset({name!r}{'' if config is None else f', {config!r}'})"
    answer = None if offline else hub_answer(error)
    if answer is not None and getattr(answer.response, "status_code", None) != 404:  # answered: not "offline"
        return hub_failure(answer, f"dataset {text!r}", "check the name and config, or pass a local copy")
    if offline or unreachable(error) or "offline" in str(error).lower() or "couldn't reach" in str(error).lower():
        return ValueError(
            f"dataset {text!r} is not in the local Hugging Face cache and the Hub cannot be reached (offline); "
            f'run `python -c "import datasets; {call}"` once with network access, or pass a local copy '
            "(a save_to_disk folder or Parquet/CSV/JSON files)"
        )
    return ValueError(f"dataset {text!r} was not found on the Hugging Face Hub ({error}); check the name and config")


def load_hub_dataset(text: str, *, split: str | None = None, streaming: bool = False) -> Any:
    """``datasets.load_dataset`` of a dataset id (``NAME[:CONFIG]``) or of local data files.

    Returns a ``DatasetDict`` (``split=None``), a ``Dataset``, or an ``IterableDataset`` when streaming.
    A dataset neither cached nor reachable is a one-line ValueError naming it and the fix.
    """
    datasets = require_datasets()
    path = Path(text).expanduser()
    if path.exists():
        found = _local_files(path)
        if found is None:
            raise ValueError(f"{text} holds no {'/'.join(DATA_FILE_SUFFIXES)} files; pass a dataset folder or file")
        builder, files = found
        with local_read_errors(text, builder, [f for fs in files.values() for f in fs]):
            ds = datasets.load_dataset(builder, data_files=files, split=split, streaming=streaming)
            if streaming and ds.features is None:  # streamed CSV/JSON: the columns, from the first rows
                ds = ds._resolve_features()
        return ds
    name, config = parse_dataset_name(text)
    try:
        return datasets.load_dataset(name, config, split=split, streaming=streaming)
    except (FileNotFoundError, ConnectionError) as e:
        raise _not_found(text, e) from None
    except ValueError as e:
        if "config" in str(e).lower() and "available" in str(e).lower():
            raise ValueError(f"dataset {name!r} needs a config: {str(e).splitlines()[0]}; pass {name}:CONFIG") from None
        raise
