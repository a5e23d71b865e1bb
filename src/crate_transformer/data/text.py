"""Text corpora for the language models: the built-in corpus, any text file or folder, tokenized once into
a memory-mapped token file and streamed in blocks.

* ``"python-docs"`` — Python's reference documentation as shipped with every CPython (``pydoc_data.topics``,
  ~465k characters); no download.
* a UTF-8 text file, or a folder of them (``*.txt``, ``*.md``, ``*.rst``, ``*.py``, ... recursively, sorted).

:func:`load_tokens` reads the corpus in ~1 MB pieces, tokenizes them and appends the ids to a ``uint16`` /
``uint32`` file in the token cache (``$CRATE_CACHE_DIR`` or ``~/.cache/crate_transformer/tokens``), keyed
by the corpus files (path, size, modification time) and the tokenizer; later runs map it with
``numpy.memmap``, so the corpus is never held in memory.  Documents are separated by the end-of-text token.

:class:`TokenBlocks` is a split of that file as non-overlapping windows of ``block_size + 1`` tokens
(inputs and their next-token targets; in training the window grid moves by a seeded offset each epoch)
under the same contract as the image sources
(:class:`~crate_transformer.data.ImageSource`): ``__len__``, ``steps_per_epoch`` and ``batches`` in global
batches of a ``(seed, epoch)`` order, each process taking its slice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import OptionError
from ..io import DamagedFileError, WriteError, atomic_write, read_side_file
from .base import ORIGIN, Position, epoch_generator, local_batches
from .hub import DATA_FILE_SUFFIXES, is_dataset_name, load_hub_dataset, local_read_errors

__all__ = [
    "BUILTIN_CORPORA",
    "TEXT_SUFFIXES",
    "corpus_files",
    "iter_documents",
    "load_tokens",
    "TokenBlocks",
    "split_tokens",
    "LabelledTexts",
    "read_labelled_table",
    "read_labelled",
    "eval_split_of",
]

BUILTIN_CORPORA = ("python-docs",)
TEXT_SUFFIXES = (".txt", ".text", ".md", ".rst", ".py", ".tex", ".html", ".htm", ".json", ".csv", ".tsv", ".xml")
_CHUNK = 1 << 20  # characters per tokenizer call
_COUNT_PIECE = 1 << 24  # tokens per bincount of TokenBlocks.token_counts


TABLE_SUFFIXES = (".parquet", ".arrow")  # binary tables: always a dataset, never text to read as is


def is_hub_corpus(source: str, columns: Sequence[str] = ()) -> bool:
    """Whether ``source`` is read by ``datasets`` rather than as text files: a dataset id
    (``wikitext:wikitext-2-raw-v1``), Parquet/Arrow files (or a folder of them), or CSV/JSON data files whose
    text ``columns`` are named (without them a ``.csv`` / ``.json`` is a text file like any other)."""
    if source in BUILTIN_CORPORA:
        return False
    if is_dataset_name(source):
        return True
    path = Path(source).expanduser()
    files = [path] if path.is_file() else list(path.glob("*")) + list(path.glob("*/*")) if path.is_dir() else []
    suffixes = {p.suffix.lower() for p in files}
    return bool(suffixes & set(TABLE_SUFFIXES)) or bool(columns and suffixes & set(DATA_FILE_SUFFIXES))


def corpus_files(source: str, columns: Sequence[str] = ()) -> list[Path]:
    """The text files of ``source`` (a file, or a folder searched recursively); [] for a built-in corpus or a
    dataset name (whose ``train`` split is then opened, so a missing dataset or column fails here with its fix).
    ``columns`` name a dataset's text columns (``--text-columns``); files and the built-in corpus have none."""
    if columns and not is_hub_corpus(source, columns):
        raise OptionError(
            f"text_columns names a dataset's columns and {source} is not a dataset; drop it", option="text_columns"
        )
    if source in BUILTIN_CORPORA:
        return []
    if is_hub_corpus(source, columns):
        _hub_text(source, columns)
        return []
    path = Path(source).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise ValueError(
                f"{path} holds no text files ({', '.join(TEXT_SUFFIXES[:5])}, ...); add some or pass a file"
            )
        return files
    raise ValueError(f"text corpus not found: {source}; pass 'python-docs' (built in), a text file or a folder")


def _table_files(source: str) -> list[Path]:
    """The data files of a local dataset corpus (whose size and modification time key its token cache)."""
    path = Path(source).expanduser()
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in DATA_FILE_SUFFIXES)


def _read_file(path: Path) -> Iterator[str]:
    """``path`` in pieces of about ``_CHUNK`` characters, cut after a newline when possible."""
    try:
        with open(path, encoding="utf-8") as f:
            carry = ""
            while True:
                piece = f.read(_CHUNK)
                if not piece:
                    break
                piece, cut = carry + piece, (carry + piece).rfind("\n")
                carry, piece = (piece[cut + 1 :], piece[: cut + 1]) if cut >= 0 else ("", piece)
                yield piece
            if carry:
                yield carry
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not UTF-8 text (invalid byte at position {e.start}); convert it, e.g. "
            f"iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}"
        ) from None


def _hub_text(source: str, columns: Sequence[str] = ()) -> tuple[Any, list[str]]:
    """(the streamed ``train`` split of a dataset, its text columns: ``columns`` if given, else ``text``, else the
    first string column)."""
    ds = load_hub_dataset(source, split="train", streaming=True)
    feats = ds.features or {}
    missing = [c for c in columns if c not in feats]
    if missing and not feats and Path(source).expanduser().is_file():  # [] or {}: nothing to name columns from
        raise ValueError(f"{source} holds no rows; write rows into it or remove it")
    if missing:
        raise OptionError(
            f"dataset {source!r} has no column(s) {missing} (columns: {list(feats)}); fix text_columns",
            option="text_columns",
        )
    strings = [c for c, f in feats.items() if getattr(f, "dtype", None) in ("string", "large_string")]
    column = "text" if "text" in feats else (strings[0] if strings else None)
    if not columns and column is None:
        raise OptionError(
            f"dataset {source!r} has no text column (columns: {list(feats)}); name one with text_columns",
            option="text_columns",
        )
    _check_text_features(feats, list(columns) or [column], f"dataset {source!r}")
    return ds, list(columns) or [column]


def iter_documents(source: str, columns: Sequence[str] = ()) -> Iterator[Iterator[str]]:
    """The documents of ``source`` (one per file, per topic of the built-in corpus or per row of a dataset: its
    text ``columns`` joined by newlines), each as text pieces."""
    if source == "python-docs":
        from pydoc_data.topics import topics

        for key in sorted(topics):
            yield iter([topics[key]])
        return
    if is_hub_corpus(source, columns):  # one document per row, streamed: the corpus is never held whole
        ds, cols = _hub_text(source, columns)
        files = _table_files(source) if Path(source).expanduser().exists() else []
        kind = DATA_FILE_SUFFIXES.get(files[0].suffix.lower(), "dataset") if files else ""
        with local_read_errors(source, kind, files) if files else contextlib.nullcontext():
            rows = ("\n".join(row[c] for c in cols if row[c]) for row in ds)
            yield from (iter([text]) for text in rows if text)
        return
    for path in corpus_files(source, columns):
        yield _read_file(path)


def _fingerprint(source: str, tokenizer_json: str, columns: Sequence[str] = ()) -> str:
    h = hashlib.sha256(tokenizer_json.encode())
    if source in BUILTIN_CORPORA:
        h.update(f"{source}|{sys.version}".encode())
    if is_hub_corpus(source, columns) and is_dataset_name(source):  # its recorded sizes and checksums change
        ds, cols = _hub_text(source, columns)
        info = ds.info
        h.update(f"{source}|{cols}|{info.splits}|{info.download_checksums}|{info.dataset_size}".encode())
        return h.hexdigest()[:24]  # no files: corpus_files would only open the dataset a second time
    files = _table_files(source) if is_hub_corpus(source, columns) else corpus_files(source, columns)
    if columns:
        h.update(f"{list(columns)}".encode())
    for p in files:
        st = p.stat()
        h.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def cache_dir() -> Path:
    return Path(os.environ.get("CRATE_CACHE_DIR") or Path.home() / ".cache" / "crate_transformer" / "tokens")


def load_tokens(source: str, tokenizer: object, columns: Sequence[str] = ()) -> np.ndarray:
    """The corpus (a dataset's text ``columns``) as a read-only memory-mapped array of token ids (built on first
    use, see the module doc)."""
    key = _fingerprint(source, tokenizer.to_str(), columns)
    path = cache_dir() / f"{key}.bin"
    meta_path = path.with_suffix(".json")
    if path.is_file() and meta_path.is_file():
        damage = _cache_damage(path, meta_path, tokenizer.vocab_size)
        if damage is None:
            meta = json.loads(meta_path.read_text())
            return np.memmap(path, dtype=meta["dtype"], mode="r", shape=(meta["tokens"],))
        warnings.warn(f"token cache {path} is damaged ({damage}); rebuilding it from {source}", stacklevel=2)
    _build(source, tokenizer, path, meta_path, columns)
    meta = json.loads(meta_path.read_text())
    return np.memmap(path, dtype=meta["dtype"], mode="r", shape=(meta["tokens"],))


def _cache_damage(path: Path, meta_path: Path, vocab_size: int) -> str | None:
    """What is wrong with a cached token file and its ``.json`` (None when they agree and every id is one of the
    tokenizer's ``vocab_size``: a flipped bit that makes an id no tokenizer gave is damage to the cache)."""
    try:
        meta = read_side_file(meta_path, "it is rebuilt")
    except DamagedFileError as e:
        return str(e).removesuffix("; it is rebuilt")
    dtype, n = meta.get("dtype"), meta.get("tokens")
    if dtype not in ("uint16", "uint32") or isinstance(n, bool) or not isinstance(n, int) or n < 2:
        return f"{meta_path.name} holds no valid dtype and token count"
    size = path.stat().st_size
    if size != n * np.dtype(dtype).itemsize:
        return f"{path.name} has {size:,} bytes, not the {n:,} {dtype} tokens its {meta_path.name} records"
    tokens = np.memmap(path, dtype=dtype, mode="r", shape=(n,))
    top = max((int(tokens[i : i + _CHUNK].max()) for i in range(0, n, _CHUNK)), default=0)
    if top >= vocab_size:
        return f"it holds the id {top:,}, and the tokenizer has {vocab_size:,} tokens"
    return None


def _build(source: str, tokenizer: object, path: Path, meta_path: Path, columns: Sequence[str]) -> None:
    dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.uint32
    count = 0

    def write(tmp: str) -> None:
        nonlocal count
        with open(tmp, "wb") as f:
            for doc in iter_documents(source, columns):
                wrote = False
                for piece in doc:
                    ids = tokenizer.encode(piece)
                    if ids:  # f.write, not ndarray.tofile: a full disk must raise OSError(ENOSPC) for atomic_write
                        f.write(np.asarray(ids, dtype=dtype).tobytes())
                        count, wrote = count + len(ids), True
                if wrote:
                    f.write(np.asarray([tokenizer.eos_id], dtype=dtype).tobytes())
                    count += 1

    try:
        atomic_write(path, write)
    except WriteError as e:  # the user did not choose this folder: name the setting that moves it
        raise WriteError(f"{e} (the token cache; CRATE_CACHE_DIR=FOLDER puts it elsewhere)") from None
    if count < 2:
        path.unlink(missing_ok=True)
        raise ValueError(f"{source} holds no text; pass a corpus with some UTF-8 text in it")
    atomic_write(
        meta_path,
        lambda tmp: Path(tmp).write_text(
            json.dumps({"dtype": np.dtype(dtype).name, "tokens": count, "source": str(source)})
        ),
    )


def split_tokens(n_tokens: int, val_fraction: float, block_size: int) -> int:
    """The first held-out token: the last ``val_fraction`` of the stream is held out (at least one block)."""
    if not 0 < val_fraction < 1:
        raise OptionError(
            f"a language model needs a held-out split; pass val_fraction in (0, 1), got {val_fraction}",
            option="val_fraction",
        )
    cut = int(n_tokens * (1 - val_fraction))
    if cut < block_size + 1 or n_tokens - cut < block_size + 1:
        fits = min(cut, n_tokens - cut) - 1  # the largest context whose window fits in both splits
        need = math.ceil((block_size + 1) / min(val_fraction, 1 - val_fraction)) + 1
        smaller = f", or a context of at most {fits} tokens (model_args={{'block_size': {fits}}})" if fits >= 2 else ""
        raise OptionError(
            f"the corpus has {n_tokens:,} tokens, too few for a {block_size}-token context with {val_fraction:.0%} "
            f"held out (about {need:,} are needed); use more text{smaller}"
        )
    return cut


class TokenBlocks:
    """Non-overlapping windows of ``block_size + 1`` tokens of ``tokens[lo:hi]``, yielded as int64 batches.

    Evaluation (``shuffle=False``) reads the ``len(self)`` windows starting at token ``lo + i·block_size``.
    Training (``shuffle=True``) moves the window grid by a seeded offset in ``[0, block_size)`` each epoch
    (0 in epoch 0), so tokens near a window's start — with little context — are not the same ones every
    epoch; it reads the :attr:`train_windows` windows that fit at any offset.
    """

    def __init__(self, tokens: np.ndarray, block_size: int, lo: int, hi: int, name: str, split: str) -> None:
        self.tokens, self.block_size, self.lo, self.hi = tokens, block_size, lo, hi
        self.name, self.split = name, split

    def __len__(self) -> int:
        return max(0, (self.hi - self.lo - 1) // self.block_size)

    @property
    def train_windows(self) -> int:
        """Windows per training epoch: those that fit whatever the epoch's offset."""
        return max(0, (self.hi - self.lo - self.block_size) // self.block_size)

    @property
    def num_tokens(self) -> int:
        return self.hi - self.lo

    def steps_per_epoch(self, batch_size: int) -> int:
        return self.train_windows // batch_size

    def token_counts(self, vocab_size: int) -> np.ndarray:
        """How often each token id occurs in ``tokens[lo:hi]`` (int64, ``(vocab_size,)``), counted in pieces of
        the memory-mapped file (never read whole)."""
        counts = np.zeros(vocab_size, dtype=np.int64)
        for start in range(self.lo, self.hi, _COUNT_PIECE):
            piece = np.bincount(np.asarray(self.tokens[start : min(start + _COUNT_PIECE, self.hi)]))
            if len(piece) > vocab_size:
                raise ValueError(
                    f"the token file holds id {len(piece) - 1}, outside the vocabulary of {vocab_size}; delete the "
                    f"token cache ({cache_dir()}) to tokenize the corpus again"
                )
            counts[: len(piece)] += piece
        return counts

    def offset(self, seed: int, epoch: int) -> int:
        """The training window grid's shift in epoch ``epoch`` (seeded; 0 in epoch 0)."""
        if epoch == 0:
            return 0
        return int(torch.randint(self.block_size, (1,), generator=epoch_generator(seed, epoch)))

    def get(self, indices: Tensor, offset: int = 0) -> Tensor:
        """Windows ``indices`` of the grid shifted by ``offset`` tokens, int64 ``(len(indices), block_size + 1)``."""
        B, lo = self.block_size, self.lo + offset
        rows = [np.asarray(self.tokens[lo + i * B : lo + i * B + B + 1], dtype=np.int64) for i in indices.tolist()]
        return torch.from_numpy(np.stack(rows))

    def batches(
        self, batch_size: int, *, shuffle: bool = True, at: Position = ORIGIN, drop_last: bool | None = None
    ) -> Iterator[Tensor]:
        """This process's windows of each global batch (see :func:`~crate_transformer.data.base.local_batches`)."""
        n, offset = (self.train_windows, self.offset(at.seed, at.epoch)) if shuffle else (len(self), 0)
        for mine in local_batches(n, batch_size, shuffle=shuffle, at=at, drop_last=drop_last):
            yield self.get(mine, offset)


# --------------------------------------------------------------------------- labelled texts (GLUE-style tables)
def read_labelled_table(
    path: str | Path, text_columns: Sequence[str] = (), label_column: str = ""
) -> tuple[list[tuple[str, ...]], list[str], tuple[str, ...], str]:
    """Rows of a CSV / TSV file with a header: ``(texts, labels, text_columns, label_column)``.

    GLUE layouts are recognised: the label column is ``label`` / ``score`` / ``gold_label`` (otherwise
    ``label_column`` must name it), the texts are ``sentence`` / ``text`` or a pair such as ``sentence1,
    sentence2`` / ``question, sentence`` / ``question1, question2`` / ``premise, hypothesis`` (or the first
    other column).  Errors name ``file:line``.
    """
    import csv

    path = Path(path).expanduser()
    if not path.is_file():
        raise ValueError(f"table not found: {path}; pass a CSV or TSV file with a header row")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not UTF-8 text (invalid byte at position {e.start}); convert it to UTF-8"
        ) from None
    if lines and lines[0].lstrip()[:1] in ("{", "["):
        raise ValueError(
            f"{path}:1: this is JSON (lines), not a CSV/TSV table; write it as a CSV or TSV with a header row "
            "naming a text column and a label column"
        )
    delimiter = "\t" if path.suffix.lower() == ".tsv" or (lines and "\t" in lines[0]) else ","
    reader = csv.DictReader(
        lines, delimiter=delimiter, quoting=csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL, strict=True
    )
    header = [h.strip() for h in (reader.fieldnames or [])]
    if len(header) < 2:
        raise ValueError(f"{path}:1: needs a header row with a text column and a label column, got {header}")
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:  # csv.DictReader would keep the last of them without a word
        raise ValueError(f"{path}:1: the header names {twice} more than once; give every column its own name")
    label, text_columns = _table_columns(path, header, text_columns, label_column)
    texts, labels = [], []
    while True:
        line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise ValueError(
                f"{path}:{line}: {e} (a quote opened on this line is never closed); close it, or double "
                f'the quotes inside a quoted field ("")'
            ) from None
        row = {(k or "").strip(): v for k, v in row.items()}
        value = (row.get(label) or "").strip()
        if not value:
            raise ValueError(f"{path}:{line}: empty {label!r}; every row needs a label or score")
        texts.append(_row_texts(row, text_columns, f"{path}:{line}"))
        labels.append((value, line))
    if not texts:
        raise ValueError(f"{path} has a header but no rows")
    return texts, _check_labels(path, label, labels), tuple(text_columns), label


def _row_texts(row: dict, columns: Sequence[str], where: str) -> tuple[str, ...]:
    """The texts of one table row; a field the row lacks (``csv`` gives None: fewer fields than the header) is
    refused, naming the line and the column — never read as an empty text."""
    short = next((c for c in columns if row.get(c) is None), None)
    if short is not None:
        raise ValueError(
            f"{where}: no {short!r} (the row has fewer fields than the header); fill it in or drop the row"
        )
    return tuple(row[c] for c in columns)


def read_labelled(
    source: str, split: str = "train", text_columns: Sequence[str] = (), label_column: str = ""
) -> tuple[list[tuple[str, ...]], list[str], tuple[str, ...], str]:
    """``read_labelled_table`` for a CSV/TSV file; ``split`` of a dataset (``glue:sst2``, Parquet/JSON files)."""
    path = Path(source).expanduser()
    if path.suffix.lower() in (".csv", ".tsv") or (path.exists() and not (path.is_dir() or _is_data_file(path))):
        return read_labelled_table(source, text_columns, label_column)
    if not path.exists() and not is_dataset_name(source):
        raise ValueError(f"table not found: {source}; pass a CSV or TSV file, data files or a dataset id (glue:sst2)")
    ds = load_hub_dataset(source, split=split)
    where = f"the {split} split of {source}"
    label, cols = _table_columns(where, list(ds.features), text_columns, label_column)
    _check_text_features(ds.features, cols, where)
    names = getattr(ds.features[label], "names", None)  # a ClassLabel: its names are the labels
    raw = ds[label]
    if any(v is None or (names is not None and v < 0) for v in raw):
        raise ValueError(f"{where} has rows without a label ({label!r} is empty or -1); evaluate on another split")
    if names is not None and (bad := next((v for v in raw if v >= len(names)), None)) is not None:
        raise ValueError(
            f"{where} has the label {bad}, but its {label!r} column names {len(names)} classes {names[:5]}; "
            "fix the labels or the column's ClassLabel names"
        )
    labels = [names[v] if names is not None else str(v) for v in raw]
    texts = list(zip(*(_present(ds[c], c, where) for c in cols)))
    if not texts:
        raise ValueError(f"{where} has no rows")
    return texts, _check_labels(where, label, [(v, i + 1) for i, v in enumerate(labels)]), tuple(cols), label


def _present(values: list, column: str, where: str) -> list:
    """The texts of a dataset's ``column``; a row whose text is null (a Parquet / Arrow null) is refused, naming the
    row and the column — never trained as an empty text."""
    row = next((i for i, t in enumerate(values) if t is None), None)
    if row is not None:
        raise ValueError(
            f"row {row} of {where}: {column!r} is null (no text); fill it in or drop the rows without one "
            f"(ds.filter(lambda r: r[{column!r}] is not None))"
        )
    return values


def _check_text_features(features: Any, columns: Sequence[str], where: str) -> None:
    """Each text column of a dataset holds strings (not numbers, lists or structs), named in one line."""
    for c in columns:
        dtype = getattr(features[c], "dtype", None)
        if dtype not in ("string", "large_string"):
            kind = dtype or type(features[c]).__name__.lower()
            strings = [k for k, f in features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
            raise ValueError(
                f"{where}: column {c!r} holds {kind}, not text; name the text column(s) with text_columns "
                f"(string columns: {strings or 'none'})"
            )


def eval_split_of(source: str) -> str | None:
    """A dataset's held-out split: ``validation`` (GLUE hides its test labels), else ``test``; None for a table."""
    path = Path(source).expanduser()
    if path.suffix.lower() in (".csv", ".tsv") or not (is_dataset_name(source) or path.is_dir() or _is_data_file(path)):
        return None
    splits = load_hub_dataset(source)
    return next((s for s in ("validation", "test") if s in splits), None)


def _is_data_file(path: Path) -> bool:
    return path.suffix.lower() in DATA_FILE_SUFFIXES


def _table_columns(
    path: Path | str, header: list[str], text_columns: Sequence[str], label_column: str
) -> tuple[str, list[str]]:
    """The label column and the text column(s) of a table with columns ``header``."""
    lower = {h.lower(): h for h in header}
    label = label_column or next((lower[k] for k in ("label", "score", "gold_label") if k in lower), "")
    if not label:
        raise OptionError(
            f"{path}:1: no label column (label, score or gold_label) among the columns {header}; name it with "
            "label_column",
            option="label_column",
        )
    if label not in header:
        raise ValueError(f"{path}:1: no column {label!r}; columns: {header}")
    if f"{label}.1" in header:  # pandas (datasets' CSV reader) renames a second column of the same name
        raise ValueError(
            f"{path}: the header names {label!r} twice (the second read as '{label}.1'); give every column its own name"
        )
    if not text_columns:
        pairs = (
            ("sentence1", "sentence2"),
            ("question", "sentence"),
            ("question1", "question2"),
            ("premise", "hypothesis"),
            ("sentence",),
            ("text",),
        )
        found = next((p for p in pairs if all(k in lower for k in p)), None)
        skip = {"idx", "id", "index", label.lower()}
        text_columns = [lower[k] for k in found] if found else [h for h in header if h.lower() not in skip][:1]
    missing = [c for c in text_columns if c not in header]
    if missing or not text_columns:
        raise ValueError(f"{path}:1: no text column(s) {missing or text_columns}; columns: {header}")
    if len(text_columns) > 2 or len(set(text_columns)) < len(text_columns):
        raise ValueError(
            f"{path}: text_columns names {list(text_columns)}; a text classifier reads one text or a pair of "
            "different columns: name one or two"
        )
    if label in text_columns:
        raise ValueError(f"{path}: {label!r} is the label column and cannot also be a text column; name another")
    return label, list(text_columns)


# the largest label a table may hold as a number: a score's squared error, summed over a batch, must stay finite in
# float32 (the loss's precision, at most 3.4e38): 1e15 squared is 1e30.  A larger number (one 1e308 in a 0/1 column)
# is a damaged row, not a score.
LABEL_LIMIT = 1e15


def _check_labels(path: Path | str, column: str, labels: list[tuple[str, int]]) -> list[str]:
    """The labels, refused when a number is not finite or beyond ±:data:`LABEL_LIMIT`, or numbers and names are
    mixed (naming the line)."""

    def number(v: str) -> float | None:
        try:
            return float(v)
        except ValueError:
            return None

    values = [(v, line, number(v)) for v, line in labels]
    for v, line, x in values:
        if x is not None and not np.isfinite(x):
            raise ValueError(f"{path}:{line}: {column} {v!r} is not a finite number; give every row a real label")
        if x is not None and abs(x) > LABEL_LIMIT:
            raise ValueError(
                f"{path}:{line}: {column} {v!r} is beyond ±{LABEL_LIMIT:.0e}, where a score's squared error "
                "overflows float32; fix the row (or rescale the scores)"
            )
    names = [(v, line) for v, line, x in values if x is None]
    if names and len(names) < len(values):
        (v, line), (n, nline) = names[0], next((v, line) for v, line, x in values if x is not None)
        raise ValueError(
            f"{path}:{line}: {column} {v!r} is a name but line {nline} has the number {n!r}; "
            "make every label a number or every label a name"
        )
    return [v for v, _ in labels]


class LabelledTexts:
    """Encoded texts with labels (class indices, int64) or scores (float32), padded per batch.

    ``batches`` yields ``(ids (b, L) right-padded with pad_id, lengths (b,), targets (b,))``, in global batches
    under the same contract as :class:`TokenBlocks`.
    """

    def __init__(self, ids: list[list[int]], targets: Tensor, pad_id: int, name: str, split: str) -> None:
        self.ids, self.targets, self.pad_id, self.name, self.split = ids, targets, pad_id, name, split

    def __len__(self) -> int:
        return len(self.ids)

    def steps_per_epoch(self, batch_size: int) -> int:
        return len(self) // batch_size

    def subset(self, indices: Sequence[int], split: str) -> LabelledTexts:
        return LabelledTexts([self.ids[i] for i in indices], self.targets[list(indices)], self.pad_id, self.name, split)

    def get(self, indices: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        rows = [self.ids[i] for i in indices.tolist()]
        lengths = torch.tensor([len(r) for r in rows])
        ids = torch.full((len(rows), int(lengths.max())), self.pad_id, dtype=torch.long)
        for j, r in enumerate(rows):
            ids[j, : len(r)] = torch.tensor(r)
        return ids, lengths, self.targets[indices]

    def batches(
        self, batch_size: int, *, shuffle: bool = True, at: Position = ORIGIN, drop_last: bool | None = None
    ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        for mine in local_batches(len(self), batch_size, shuffle=shuffle, at=at, drop_last=drop_last):
            yield self.get(mine)
