"""``crate generate``: text from a causal language model (temperature, top-k, top-p, KV cache)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from ..config import Config
from ..config_utils import NON_NEGATIVE, POSITIVE, option
from ..models.lm import TEMPERATURE, TOP_P
from ..train.config import SystemOptions
from .options import SAMPLING, SYSTEM, add_command_options, apply_threads, like


@dataclass
class GenerateOptions(Config):
    """The options of ``crate generate`` (the checkpoint is its positional argument)."""

    prompt: str = option("", "text to continue", shown="start from the end-of-text token", basic=True)
    max_new_tokens: int = option(200, "tokens to generate", range=POSITIVE, basic=True)
    temperature: float = option(0.8, "softmax temperature; 0 = greedy", range=TEMPERATURE, basic=True, group=SAMPLING)
    top_k: int = option(
        50, "sample among the k most likely tokens (0 = all)", range=NON_NEGATIVE, basic=True, group=SAMPLING
    )
    top_p: float = option(0.95, "nucleus sampling threshold (1 = off)", range=TOP_P, basic=True, group=SAMPLING)
    num_samples: int = option(1, "independent samples", range=POSITIVE, basic=True, group=SAMPLING)
    cache: bool = option(True, "keep the keys and values of earlier tokens (KV cache); off: recompute the whole "
                         "context at every step", group=SYSTEM)  # fmt: skip
    seed: int = option(0, "random seed: the same seed gives the same text", basic=True, group=SAMPLING)
    device: str = like(SystemOptions, "device", basic=True, group=SYSTEM)
    threads: int = like(SystemOptions, "threads", group=SYSTEM)
    compile: bool = like(
        SystemOptions,
        "compile",
        help="decode with one compiled step per token on a fixed-size cache (a CUDA graph on a GPU): the same text, "
        "faster once compiled; prompt + new tokens must fit the context",
        group=SYSTEM,
    )


def configure_generate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", help="a crate train-lm run dir, a save_pretrained language-model dir or hf-hub:ORG/NAME"
    )
    add_command_options(parser, GenerateOptions)


GENERATE_BATCH = 32  # samples generated together: a huge --num-samples runs in batches, never all at once


class _Samples:
    """The tokens of the samples being generated; a single sample's text is printed as its tokens come."""

    def __init__(self, tok: object, prefix: list[int], rows: int, stream: bool) -> None:
        self.tok, self.rows, self.stream, self.shown = tok, [list(prefix) for _ in range(rows)], stream, ""

    def __call__(self, nxt: object) -> None:
        for row, t in zip(self.rows, nxt.view(-1).tolist()):
            row.append(t)
        if self.stream:
            self.show()

    def text(self, row: list[int]) -> str:
        return self.tok.decode(row, skip_special_tokens=True)

    def show(self, final: bool = False) -> None:
        """Print the new part of the text (a character still missing bytes waits, unless ``final``)."""
        text = self.text(self.rows[0])
        if not final:
            text = text.rstrip("\ufffd")
        if text.startswith(self.shown):
            sys.stdout.write(text[len(self.shown) :])
            self.shown = text
        sys.stdout.write("\n" if final else "")
        sys.stdout.flush()


def run_generate(args: argparse.Namespace) -> int:
    """``crate generate``: print ``--num-samples`` continuations of ``--prompt`` (one sample streams as it is made).

    Ctrl-C ends it with the text generated so far and exit code 130.
    """
    import torch

    model, tok, device = _generation_model(args)
    ids = tok.encode(args.prompt) if args.prompt else [tok.eos_id]
    prefix = ids if args.prompt else []  # the end-of-text start token is not shown
    g = torch.Generator(device=device).manual_seed(args.seed)
    sampled = args.temperature > 0  # greedy decoding takes no filters (generate refuses them)
    kw = dict(temperature=args.temperature, top_k=args.top_k or None if sampled else None,
              top_p=args.top_p if args.top_p < 1 and sampled else None, use_cache=args.cache, generator=g,
              compile=args.compile)  # fmt: skip
    samples, done = None, 0
    try:
        while done < args.num_samples:
            rows = min(GENERATE_BATCH, args.num_samples - done)
            samples = _Samples(tok, prefix, rows, stream=args.num_samples == 1)
            if samples.stream:
                samples.show()  # the prompt at once
            model.generate(torch.tensor([ids] * rows, device=device), args.max_new_tokens, on_token=samples, **kw)
            _print_samples(samples, done)
            done, samples = done + rows, None
    except KeyboardInterrupt:
        if samples is not None:
            _print_samples(samples, done)
        print(f"crate generate: interrupted; the text generated so far is above ({done} of {args.num_samples} "
              "samples complete)", file=sys.stderr, flush=True)  # fmt: skip
        return 130
    return 0


def _print_samples(samples: _Samples, first: int) -> None:
    if samples.stream:
        samples.show(final=True)
        return
    for i, row in enumerate(samples.rows):
        sys.stdout.write(f"--- sample {first + i + 1}\n{samples.text(row)}\n")
    sys.stdout.flush()


def _generation_model(args: argparse.Namespace) -> tuple:
    """The language model (on its device), its tokenizer and the device, or a one-line error."""
    from ..loading.pipeline import load_model
    from ..models.contract import LANGUAGE_MODEL
    from ..train import resolve_device

    apply_threads(args)
    model = load_model(args.checkpoint)
    if model.kind != LANGUAGE_MODEL:
        raise ValueError(f"{args.checkpoint} is an image model; crate generate needs a language model (crate train-lm)")
    if model.tokenizer is None:
        raise ValueError(
            f"{args.checkpoint} has no tokenizer.json beside its weights; save the model with its tokenizer"
        )
    device = resolve_device(args.device)
    return model.to(device), model.tokenizer, device
