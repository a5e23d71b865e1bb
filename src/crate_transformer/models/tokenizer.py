"""Tokenizers that work offline, all one class around a Hugging Face ``tokenizers.Tokenizer``.

* ``Tokenizer.byte_level()`` — the 256 bytes plus special tokens; no training, every text round-trips.
* ``Tokenizer.train("bpe" | "wordpiece", texts, vocab_size)`` — trained on the user's corpus in about a
  second (byte-level BPE as GPT-2 / RoBERTa, whose tokenizer CRATE-BERT uses, JMLR p.44; WordPiece as BERT).
* ``Tokenizer.from_file("tokenizer.json")`` — any saved ``tokenizers`` file (missing special tokens are added).

A language model is saved with its tokenizer (``tokenizer.json`` beside ``config.json``).
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import OptionWarning
from ..io import TOKENIZER_NAME, atomic_write

__all__ = ["Tokenizer", "TOKENIZER_KINDS", "TOKENIZER_NAME", "SPECIAL_TOKENS"]

TOKENIZER_KINDS = ("byte", "bpe", "wordpiece")
# end of text (document separator, GPT-2's), padding, the masked-LM mask, classification and separator, unknown
SPECIAL_TOKENS = ("<|endoftext|>", "[PAD]", "[MASK]", "[CLS]", "[SEP]", "[UNK]")


def _hf():  # noqa: ANN202
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - a declared dependency
        raise ValueError("language models need the tokenizers package; pip install tokenizers") from None
    return tokenizers


class Tokenizer:
    """Text ↔ token ids.  ``encode(text)``, ``encode_batch(texts)``, ``decode(ids)``, ``save(path)``;
    ``vocab_size`` and the ids of the special tokens (``eos_id``, ``pad_id``, ``mask_id``, ``cls_id``,
    ``sep_id``)."""

    def __init__(self, hf: object, kind: str = "file") -> None:
        self.hf, self.kind = hf, kind
        missing = [t for t in SPECIAL_TOKENS if hf.token_to_id(t) is None]
        if missing:
            hf.add_special_tokens(missing)
        ids = {t: hf.token_to_id(t) for t in SPECIAL_TOKENS}
        self.eos_id, self.pad_id, self.mask_id = ids["<|endoftext|>"], ids["[PAD]"], ids["[MASK]"]
        self.cls_id, self.sep_id, self.unk_id = ids["[CLS]"], ids["[SEP]"], ids["[UNK]"]
        self.special_ids = sorted(ids.values())

    # ---------------------------------------------------------------- construction
    @classmethod
    def byte_level(cls) -> Tokenizer:
        """The 256 byte values (GPT-2's byte-to-unicode alphabet) and the special tokens; no training."""
        tk = _hf()
        alphabet = tk.pre_tokenizers.ByteLevel.alphabet()
        vocab = {ch: i for i, ch in enumerate(sorted(alphabet, key=lambda c: _byte_of(c)))}
        hf = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=[]))
        hf.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        hf.decoder = tk.decoders.ByteLevel()
        return cls(hf, "byte")

    @classmethod
    def train(cls, kind: str, texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
        """Train a ``"bpe"`` (byte-level, lossless) or ``"wordpiece"`` (lower-cased, BERT) vocabulary on ``texts``."""
        if kind == "byte":
            return cls.byte_level()
        if kind not in TOKENIZER_KINDS:
            raise ValueError(f"unknown tokenizer {kind!r}; choose one of {TOKENIZER_KINDS} or a tokenizer.json file")
        if vocab_size < 300:
            raise ValueError(f"vocab_size {vocab_size} is too small for a trained tokenizer; use 300 or more")
        tk = _hf()
        if kind == "bpe":
            hf = tk.Tokenizer(tk.models.BPE())
            hf.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
            hf.decoder = tk.decoders.ByteLevel()
            trainer = tk.trainers.BpeTrainer(
                vocab_size=vocab_size,
                special_tokens=list(SPECIAL_TOKENS),
                initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                show_progress=False,
            )
        else:
            hf = tk.Tokenizer(tk.models.WordPiece(unk_token="[UNK]"))
            hf.normalizer = tk.normalizers.BertNormalizer(lowercase=True)
            hf.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
            hf.decoder = tk.decoders.WordPiece()
            trainer = tk.trainers.WordPieceTrainer(
                vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False
            )
        hf.train_from_iterator(texts, trainer)
        return cls(hf, kind)

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Any ``tokenizers`` JSON file (ours, GPT-2's, BERT's, ...)."""
        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_NAME
        if not path.is_file():
            raise ValueError(f"tokenizer file not found: {path}; pass a tokenizer.json or one of {TOKENIZER_KINDS}")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{path} is not a tokenizer.json (a binary file: invalid UTF-8 at byte {e.start}); pass a "
                f"tokenizers JSON file (tokenizer.save(...)) or one of {TOKENIZER_KINDS}"
            ) from None
        return cls.from_str(text, source=str(path))

    @classmethod
    def from_str(cls, text: str, source: str = "tokenizer JSON") -> Tokenizer:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{source}:{e.lineno}:{e.colno}: invalid JSON ({e.msg}), not a valid tokenizers JSON file; pass one "
                f"(tokenizer.save(...)) or one of {TOKENIZER_KINDS}"
            ) from None
        try:
            kind = data.pop("crate_kind", "file") if isinstance(data, dict) else "file"
            hf = _hf().Tokenizer.from_str(json.dumps(data))
        except Exception as e:  # tokenizers raises its own Exception type
            raise ValueError(f"{source} is not a valid tokenizers JSON file ({str(e).splitlines()[0]})") from None
        return cls(hf, kind)

    # ---------------------------------------------------------------- use
    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        enc = self.hf.encode(text, add_special_tokens=False)
        self._warn_unknown([(text, enc)])
        return enc.ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encs = self.hf.encode_batch(list(texts), add_special_tokens=False)
        self._warn_unknown(list(zip(texts, encs)))
        return [e.ids for e in encs]

    def _warn_unknown(self, pairs: list[tuple[str, object]]) -> None:
        """Warn (once per tokenizer) when a vocabulary without every character (WordPiece) encodes words as
        ``[UNK]``: the model then never sees them, and text decoded from the ids shows ``[UNK]`` instead."""
        if self.__dict__.get("_warned_unknown"):
            return
        unknown = [(text, enc.offsets[i]) for text, enc in pairs for i, t in enumerate(enc.ids) if t == self.unk_id]
        if not unknown:
            return
        self._warned_unknown = True
        text, (a, b) = unknown[0]
        warnings.warn(
            OptionWarning(
                f"{len(unknown)} word(s) of the text are not in the {self.kind} tokenizer's vocabulary and become "
                f"[UNK] (the first: {text[a:b]!r}); retrain it on text holding them, or use tokenizer='bpe' "
                "(byte-level: every text is kept); warned once",
                option="tokenizer",
            ),
            stacklevel=3,
        )

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``; ``skip_special_tokens`` drops the control tokens but keeps ``[UNK]`` (it stands
        for text the vocabulary cannot represent, which would otherwise vanish from the output)."""
        ids = [int(i) for i in ids]
        if skip_special_tokens:
            drop = set(self.special_ids) - {self.unk_id}
            ids = [i for i in ids if i not in drop]
        return self.hf.decode(ids, skip_special_tokens=False)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each id as readable text (for plots): its decoded string, or the special token's name."""
        return [self.hf.id_to_token(i) if i in self.special_ids else self.decode([i]) for i in map(int, ids)]

    def to_str(self) -> str:
        data = json.loads(self.hf.to_str())
        data["crate_kind"] = self.kind  # ignored by tokenizers, read back by from_str
        return json.dumps(data, ensure_ascii=False)

    def save(self, path: str | Path) -> Path:
        """Write ``tokenizer.json`` atomically (``path`` may be the model folder)."""
        path = Path(path)
        if path.suffix != ".json":
            path = path / TOKENIZER_NAME
        data = self.to_str().encode("utf-8")
        return atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"


@functools.cache
def _unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted (printable bytes map to themselves)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(map(chr, cs), bs))


def _byte_of(ch: str) -> int:
    return _unicode_to_byte()[ch]
