"""``crate models``: the registry with parameter counts; ``--pretrained``: the zoo of released weights."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..config import Config
from ..config_utils import option
from .options import add_command_options


@dataclass
class ModelsOptions(Config):
    """The options of ``crate models`` (the name pattern is its positional argument)."""

    pretrained: bool = option(
        False,
        "list the models with released weights: source, file, input, normalisation, classes, licence, loader, and "
        "whether the file is already in the Hugging Face cache",
        basic=True,
    )
    check: bool = option(
        False,
        "with --pretrained: ask every known address of each release (a HEAD request, 5 s at most each) and say "
        "which answered, and what to do when none does",
        basic=True,
    )


def configure_models(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'crate_*'")
    add_command_options(parser, ModelsOptions)


def run_models(args: argparse.Namespace) -> int:
    if args.check and not args.pretrained:
        raise ValueError("--check asks the sources of released weights: pass it with --pretrained")
    if args.pretrained:
        return _run_zoo(args.pattern, args.check)
    import torch

    from ..models.contract import LANGUAGE_MODEL
    from ..models.registry import build, list_models, model_config

    names = list_models(args.pattern)
    if not names:
        raise ValueError(f"no registered model matches {args.pattern!r}; run `crate models` to list them all")
    rows = []
    for name in names:
        c = model_config(name)
        with torch.device("meta"):  # counts only: no memory, no initialisation
            model = build(c)
        params = f"{model.num_params():,}"
        if model.official_num_params() is not None:  # e.g. Table 9 counts CRATE-MAE's official layout
            params += f" ({model.official_num_params():,} official)"
        if c.kind == LANGUAGE_MODEL:
            kind = ("GPT " if c.causal else "BERT ") + f"ctx {c.block_size}, vocab {c.vocab_size:,}"
            rows.append((name, c.arch, "+".join(c.layer_blocks), c.dim, c.depth, c.heads, kind, params))
            continue
        blocks = "+".join(c.layer_blocks)
        rows.append((name, c.arch, blocks, c.dim, c.depth, c.heads, f"image {c.image_size}/{c.patch_size}", params))
    _print_table(("name", "arch", "blocks", "dim", "depth", "heads", "input", "params"), rows)
    return 0


def _print_table(header: tuple[str, ...], rows: list[tuple]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip())


def _run_zoo(pattern: str, check: bool = False) -> int:
    """One row per released checkpoint; ``status`` is ``cached`` (in the cache, its content checked: loads
    offline), ``corrupt`` (in the cache but damaged: a line names the file and the fix), ``download`` (fetched on
    first use) or ``manual`` (a Google Drive page: download it and pass ``pretrained_file=``).  ``check``: then
    one line per release saying which of its addresses answered (:func:`_print_answers`)."""
    from ..loading.pretrained import IMAGENET_MEAN, IMAGENET_STD, ZOO, cache_status, list_pretrained

    names = list_pretrained(pattern)
    if not names:
        raise ValueError(f"no released weights match {pattern!r}; run `crate models --pretrained` to list them all")
    rows, statuses = [], {name: cache_status(name) for name in names}
    for name in names:
        s = ZOO[name]
        status = statuses[name][0]
        norm = "-" if s.mean is None else f"mean {list(s.mean)} std {list(s.std)}"
        norm = "ImageNet mean/std" if (s.mean, s.std) == (IMAGENET_MEAN, IMAGENET_STD) else norm
        rows.append((name, s.loader, status, s.source, s.filename or "-", s.input, norm, s.classes, s.licence))
    _print_table(("name", "loader", "status", "source", "file", "input", "normalisation", "classes", "licence"), rows)
    for name, (status, detail) in statuses.items():
        if status == "manual":
            print(f"{name}: download {ZOO[name].page} and load it with create_model({name!r}, pretrained_file=PATH)")
        elif status == "corrupt":
            print(detail)  # names the file and how to fetch it again
    if check:
        _print_answers(names)
    return 0


def _print_answers(names: list[str]) -> None:
    """Per release, the first address that answered (and the ones that did not), or what to do when none did."""
    from ..loading.pretrained import no_source_fix, probe_sources

    for name in names:
        answers = probe_sources(name)
        good = [a for a in answers if a.answered]
        failed = "; ".join(f"{a.address}: {a.detail}" for a in answers if not a.answered)
        if good:
            more = f" (no answer from {failed})" if failed else ""
            print(f"{name}: answered by {good[0].address} ({good[0].detail}){more}")
        else:
            print(f"{name}: no answer from {failed or 'any address (none is known)'}")
            print(no_source_fix(name))
