"""Two plain-text corpora built from what this machine has installed, for the language-model benchmarks.

* ``stdlib`` — the Python standard library's own source: every ``.py`` file under ``sysconfig``'s ``stdlib``
  directory except ``site-packages`` and test folders (``test``, ``tests``, ``idle_test``), whole files in a
  seeded order, concatenated up to ``--chars`` characters.
* ``english`` — plain English from licence and documentation texts: the paragraphs of
  ``/usr/share/common-licenses/*`` and of ``/usr/share/doc/*/copyright`` and ``README*`` (gzipped ones
  included) that are prose — ASCII, at least 200 characters, at least 90% letters, spaces and punctuation,
  at least half their words lower-case words — each kept once (compared without case and spacing), with the
  Debian ``Field: value`` lines and ``.`` lines dropped; files in a seeded order, up to ``--chars`` characters.

The same machine gives the same bytes (the script prints each corpus's SHA-256 and sizes); another machine gives
another selection of the same kinds of text.  ``python-docs`` (Python's reference documentation) is built in.

    python benchmarks/lm_corpora.py --out corpora --chars 500000
    python benchmarks/lm_corpora.py --tiny    # 20,000 characters each, in a temp dir (seconds; a test runs it)
"""

from __future__ import annotations

import gzip
import hashlib
import random
import re
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

from _common import NON_NEGATIVE, POSITIVE, Arguments

CORPORA = ("stdlib", "english")
LICENCES, DOCS = Path("/usr/share/common-licenses"), Path("/usr/share/doc")
_SKIP_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
_FIELD = re.compile(r"^[A-Z][A-Za-z-]*: ")  # a Debian copyright-format field line
_PUNCT = set(" \n.,;:'\"()-")


def _seeded(paths: list[Path], seed: int) -> list[Path]:
    """``paths`` sorted, then shuffled with ``seed`` (the same order on every run)."""
    paths = sorted(paths)
    random.Random(seed).shuffle(paths)
    return paths


def _take(texts: Iterator[str], chars: int) -> tuple[str, int]:
    """Whole texts joined by blank lines while they fit in ``chars`` characters; with how many were taken."""
    out, size = [], 0
    for text in texts:
        if out and size + len(text) + 2 > chars:
            break
        out.append(text)
        size += len(text) + 2
    return "\n\n".join(out) + "\n", len(out)


def stdlib_sources(seed: int = 0) -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not _SKIP_DIRS & set(p.relative_to(root).parts[:-1])]
    return _seeded([p for p in files if p.is_file()], seed)


def build_stdlib(chars: int, seed: int = 0) -> tuple[str, int]:
    def texts() -> Iterator[str]:
        for path in stdlib_sources(seed):
            try:
                yield path.read_text(encoding="utf-8").strip()
            except (UnicodeDecodeError, OSError):
                continue

    return _take(texts(), chars)


def _read(path: Path) -> str | None:
    raw = path.read_bytes()
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError):
            return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _prose(paragraph: str) -> bool:
    words = paragraph.split()
    return (
        len(paragraph) >= 200
        and paragraph.isascii()
        and sum(c.isalpha() or c in _PUNCT for c in paragraph) >= 0.9 * len(paragraph)
        and sum(w.isalpha() and w.islower() for w in words) >= 0.5 * len(words)
    )


def english_sources(seed: int = 0) -> list[Path]:
    files = [p for p in LICENCES.glob("*") if p.is_file()] if LICENCES.is_dir() else []
    if DOCS.is_dir():
        files += [p for p in DOCS.rglob("*") if p.name.lower().startswith(("copyright", "readme"))]
    return _seeded([p for p in files if p.is_file() and not p.is_symlink()], seed)


def build_english(chars: int, seed: int = 0) -> tuple[str, int]:
    seen: set[str] = set()

    def texts() -> Iterator[str]:
        for path in english_sources(seed):
            text = _read(path) or ""
            kept = []
            for paragraph in re.split(r"\n\s*\n", text):
                lines = [line.strip() for line in paragraph.strip().splitlines()]
                lines = [line for line in lines if line != "." and not _FIELD.match(line)]
                paragraph = "\n".join(lines)
                key = " ".join(paragraph.lower().split())
                if _prose(paragraph) and key not in seen:
                    seen.add(key)
                    kept.append(paragraph)
            if kept:
                yield "\n\n".join(kept)

    return _take(texts(), chars)


def build(name: str, out: Path, chars: int, seed: int = 0) -> Path:
    """Write corpus ``name`` (``stdlib`` or ``english``) to ``out/<name>.txt``; raises when nothing was found."""
    text, files = (build_stdlib if name == "stdlib" else build_english)(chars, seed)
    if files == 0:
        raise SystemExit(f"no {name} texts found on this machine; pass another corpus")
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.txt"
    path.write_text(text, encoding="utf-8")
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    print(f"{name}: {len(text):,} characters from {files} files, sha256 {digest}…, {path}")
    return path


def main() -> None:
    p = Arguments(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("corpora"))
    p.add_argument(
        "--chars", type=int, range=POSITIVE, default=500_000, help="characters per corpus (whole files up to it)"
    )
    p.add_argument("--seed", type=int, range=NON_NEGATIVE, default=0, help="the file order")
    p.add_argument("--corpora", nargs="+", choices=CORPORA, default=list(CORPORA))
    p.add_argument("--tiny", action="store_true", help="20,000 characters per corpus, in a new temp dir")
    args = p.parse_args()
    if args.tiny:
        args.chars, args.out = 20_000, Path(tempfile.mkdtemp(prefix="lm_corpora_"))
    for name in args.corpora:
        build(name, args.out, args.chars, args.seed)


if __name__ == "__main__":
    main()
