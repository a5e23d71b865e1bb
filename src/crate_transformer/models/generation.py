"""Generation from a causal language model (:meth:`~crate_transformer.models.lm.LanguageModel.generate`), sampling, the
key-value cache's helpers, and BERT's token masking (eq. (85)).

Two decoding paths give the same tokens:

* **eager** (default): each step runs the newest token against a growing cache (a dict per layer: CRATE's MSSA
  keeps ``"w"``, MHSA ``"k"`` and ``"v"``, ToST's causal TSSA three running sums and a ``"length"``); past the
  context the window slides and the cache is rebuilt.
* **compiled** (``compile=True``): the prompt runs eagerly, then its cache moves into fixed-size buffers
  (:class:`~crate_transformer.layers.static_cache.StaticCache`, allocated once for prompt + new tokens) and one step —
  the model on the token at the position tensor ``pos``, the next token chosen, ``pos`` advanced — is compiled
  once by ``torch.compile(mode="reduce-overhead")``: a CUDA graph replayed per token on a GPU, inductor's code
  on a CPU.  Nothing in the step is a Python number that changes per token, so it never recompiles, and
  nothing reads a value on the host: the tokens are written into a buffer on the device, sampling draws its
  noise from the generator outside the step (the draw ``torch.multinomial`` makes, so a seed gives the same
  text on both paths).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..config_utils import NON_NEGATIVE, POSITIVE, Range
from ..errors import OptionError
from ..layers.inference import evaluating
from ..layers.static_cache import LENGTH, StaticCache

__all__ = [
    "TEMPERATURE",
    "TOP_P",
    "generate",
    "sample_next",
    "token_probs",
    "mask_tokens",
    "cache_nbytes",
    "cached_length",
]

TEMPERATURE = Range(0, note="0 = greedy")  # of sample_next / generate / crate generate --temperature
TOP_P = Range(0, 1, lo_open=True, note="1 = off")  # nucleus threshold, likewise
# graphs the compiled step may hold in a process (torch's default of 8 per function would make a benchmark of two
# model pairs at two batch sizes and two dtypes fall back to eager without a word)
STEP_GRAPHS = 64
CAPACITY_STEP = 128  # compiled decoding's buffers hold a multiple of this (capped at the context): few shapes


# --------------------------------------------------------------------------- objectives and sampling
def mask_tokens(
    idx: Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    special_ids: Tensor | list[int] = (),
    prob: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT masking for eq. (85): choose each non-special token with probability ``prob`` (the set Ω);
    of those, 80 % become ``[MASK]``, 10 % a random token, 10 % stay.  Returns ``(inputs, labels)`` with
    ``labels = -100`` outside Ω (ignored by the cross-entropy)."""
    Range(0, 1, lo_open=True, hi_open=True, note="the share of tokens masked").check("prob", prob)
    dev = idx.device

    def uniform() -> Tensor:
        return torch.rand(idx.shape, generator=generator, device=dev)

    chosen = uniform() < prob
    if len(special_ids):
        chosen &= ~torch.isin(idx, torch.as_tensor(special_ids, device=dev))
    labels = torch.where(chosen, idx, torch.full_like(idx, -100))
    u = uniform()
    inputs = torch.where(chosen & (u < 0.8), torch.full_like(idx, mask_id), idx)
    rand = torch.randint(vocab_size, idx.shape, generator=generator, device=dev)
    inputs = torch.where(chosen & (u >= 0.8) & (u < 0.9), rand, inputs)
    return inputs, labels


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """One-line errors for sampling settings out of range."""
    TEMPERATURE.check("temperature", temperature)
    if top_k is not None:
        POSITIVE.check("top_k", top_k)
    if top_p is not None:
        TOP_P.check("top_p", top_p)


def token_probs(logits: Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """``softmax(logits / T)`` (float32, (b, V)) restricted to the ``top_k`` most likely tokens and to the
    smallest set whose probability reaches ``top_p`` (nucleus sampling); ``temperature > 0``."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs >= top_p  # tokens after the nucleus is complete
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.softmax(logits, dim=-1)


def _noise(shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None) -> Tensor:
    """Exp(1) draws: ``torch.multinomial(p, 1)`` is ``argmax(p / q)`` for ``q`` so drawn from the same generator
    (the Gumbel-max trick), so a step given ``q`` samples what multinomial would, and reads nothing back."""
    return torch.empty(shape, device=device).exponential_(1, generator=generator)


def _choose(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, noise: Tensor | None) -> Tensor:
    """The next token (b, 1): the argmax at temperature 0, else a draw from :func:`token_probs` given ``noise``."""
    if temperature == 0:
        return logits.float().argmax(-1, keepdim=True)
    return (token_probs(logits, temperature, top_k, top_p) / noise).argmax(-1, keepdim=True)


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token per row of ``logits`` (b, V) → (b, 1): greedy at temperature 0, else sample from
    ``softmax(logits / T)`` restricted to the ``top_k`` most likely tokens and to the smallest set whose
    probability reaches ``top_p`` (nucleus sampling); the same draw as ``torch.multinomial`` with ``generator``."""
    check_sampling(temperature, top_k, top_p)
    noise = None if temperature == 0 else _noise(tuple(logits.shape), logits.device, generator)
    return _choose(logits, temperature, top_k, top_p, noise)


# --------------------------------------------------------------------------- the cache
def cache_nbytes(cache: list[Any]) -> int:
    """Bytes held by a key-value cache (every layer's tensors; a ``"length"`` count is not a tensor)."""
    return sum(t.numel() * t.element_size() for layer in cache for t in layer.values() if isinstance(t, Tensor))


def cached_length(cache: list[Any] | None) -> int | Tensor:
    """Tokens a cache holds: a :class:`StaticCache`'s position tensor; the ``"length"`` entry where a layer keeps
    a constant-size state (ToST's running sums); else the token axis of its first tensor (keys and values)."""
    if isinstance(cache, StaticCache):
        return cache.pos
    if not cache or not cache[0]:
        return 0
    first = cache[0]
    return first[LENGTH] if LENGTH in first else next(iter(first.values())).shape[-2]


# --------------------------------------------------------------------------- generation
def _next_logits(model: nn.Module, ids: Tensor, cache: list[Any] | None) -> Tensor:
    return model.forward_head(model.forward_features(ids, cache)[:, -1])  # the head on the last token only


@dataclass(frozen=True)
class Decoding:
    """How :func:`generate` picks and hands out tokens (its keyword arguments)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | None = None
    eos_id: tuple[int, ...] | None = None  # the end tokens (any of them ends a row)
    on_token: Callable[[Tensor], None] | None = None
    use_cache: bool = True
    keep_logits: bool = False

    @property
    def sampling(self) -> tuple[float, int | None, float | None]:
        """``(temperature, top_k, top_p)``: what a compiled step needs (constants of its graph)."""
        return self.temperature, self.top_k, self.top_p

    def draw(self, logits: Tensor) -> Tensor:
        """The next token from ``logits`` drawn eagerly (:func:`sample_next`)."""
        t, k, p = self.sampling
        return sample_next(logits, temperature=t, top_k=k, top_p=p, generator=self.generator)

    def all_ended(self, nxt: Tensor) -> bool:
        """Whether every row has just produced an end token (a host read, only when one is given)."""
        return self.eos_id is not None and bool(torch.isin(nxt, torch.tensor(self.eos_id, device=nxt.device)).all())


def _one_of(ours: str, value: Any, hf: str, hf_value: Any) -> Any:
    """The value given under this package's name or Hugging Face's; both is a one-line error."""
    if value is not None and hf_value is not None:
        raise OptionError(f"{ours} and {hf} (Hugging Face's name) are the same argument; pass one", option=ours)
    return value if value is not None else hf_value


def _prompt(idx: Tensor | None, input_ids: Tensor | None, max_new_tokens: int | None) -> Tensor:
    """The prompt given as ``idx`` or Hugging Face's ``input_ids``, with a length to generate (both needed)."""
    idx = _one_of("idx", idx, "input_ids", input_ids)
    if idx is None or max_new_tokens is None:
        raise OptionError(
            "generate needs the prompt and a length: generate(idx, max_new_tokens) or generate(input_ids=idx, "
            "max_new_tokens=n)",
            option="max_new_tokens",
        )
    NON_NEGATIVE.check("max_new_tokens", max_new_tokens)
    return idx


def check_token_id(name: str, value: Any, vocab_size: int) -> None:
    """A token id in ``[0, vocab_size)`` (``eos_id``, ``pad_token_id``), else one line naming the vocabulary."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise OptionError(
            f"{name}={value!r} is not a token of this model's vocabulary [0, {vocab_size}); pass an id its tokenizer "
            "gives (e.g. tokenizer.eos_id)",
            option=name,
        )


def resolve_sampling(
    temperature: float | None, top_k: int | None, top_p: float | None, do_sample: bool | None
) -> tuple[float, int | None, float | None]:
    """``(temperature, top_k, top_p)`` from this package's and Hugging Face's arguments, one line for what cannot
    apply.  ``do_sample=None`` (this package's call): ``temperature`` defaults to 1 (sampling); ``do_sample=False``
    (Hugging Face's default): greedy; ``do_sample=True``: sampling at ``temperature`` (default 1).  Under greedy
    decoding (``temperature=0`` or ``do_sample=False``) the most likely token is taken, so a ``temperature``,
    ``top_k`` or ``top_p`` given with it would change nothing: refused."""
    if do_sample is not None and not isinstance(do_sample, bool):
        raise OptionError(f"do_sample must be True or False, got {do_sample!r}", option="do_sample")
    if do_sample is False and temperature not in (None, 0):
        raise OptionError(
            f"temperature={temperature} applies to sampling, and do_sample=False decodes greedily; pass do_sample=True "
            "or drop temperature",
            option=("temperature", "do_sample"),
        )
    if do_sample is True and temperature == 0:
        raise OptionError(
            "do_sample=True samples at a temperature > 0, got temperature=0 (greedy); pass temperature > 0, or "
            "do_sample=False for greedy decoding",
            option=("temperature", "do_sample"),
        )
    temperature = 0.0 if do_sample is False else 1.0 if temperature is None else temperature
    check_sampling(temperature, top_k, top_p)
    given = [f"{n}={v}" for n, v in (("top_k", top_k), ("top_p", top_p)) if v is not None]
    if temperature == 0 and given:
        why = "do_sample=False" if do_sample is False else "temperature=0"
        raise OptionError(
            f"{' and '.join(given)} {'filters' if len(given) == 1 else 'filter'} the tokens sampled from, and {why} "
            "decodes greedily (the most likely token); drop them, or sample (temperature > 0, do_sample=True)",
            option=tuple(g.split("=")[0] for g in given),
        )
    return temperature, top_k, top_p


def check_prompt_mask(attention_mask: Tensor | None, idx: Tensor) -> None:
    """Hugging Face's ``attention_mask`` (1 = a token, 0 = padding) for an unpadded prompt: the ones a tokenizer
    returns for prompts of one length.  Padding is refused in one line: positions here count every token, so a
    padded row would be read at other positions than the same prompt alone."""
    if attention_mask is None:
        return
    if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(idx.shape):
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
        raise OptionError(
            f"attention_mask must have the prompt's shape {tuple(idx.shape)}, got {shape}", option="attention_mask"
        )
    if not bool((attention_mask == 1).all()):
        raise OptionError(
            "attention_mask marks padding, and generate takes unpadded prompts; generate each prompt on its own (or "
            "prompts of one length, attention_mask all ones)",
            option="attention_mask",
        )


def _end_tokens(
    eos: int | list[int] | tuple[int, ...] | None, pad_token_id: int | None, vocab_size: int
) -> tuple[int, ...] | None:
    """``eos_id`` / Hugging Face's ``eos_token_id`` (an id or a list of ids) as a tuple, each checked, and
    ``pad_token_id`` checked: a token, and given with an end token (it fills what follows one)."""
    ids = None if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    for i in () if ids is None else ids or (None,):
        check_token_id("eos_id", i, vocab_size)
    if pad_token_id is not None:
        check_token_id("pad_token_id", pad_token_id, vocab_size)
        if ids is None:
            raise OptionError(
                "pad_token_id fills the rows that ended at an end token, and none is given; pass eos_token_id "
                "(eos_id) too, or drop pad_token_id",
                option="pad_token_id",
            )
    return ids


def pad_after_eos(idx: Tensor, start: int, eos: tuple[int, ...], pad: int) -> Tensor:
    """Hugging Face's ``pad_token_id``: every token a row produced after its first end-of-sequence token (among the
    new tokens from ``start``) becomes ``pad``.  Rows are independent, so this is what stopping each row would give."""
    new = idx[:, start:]
    is_end = torch.isin(new, torch.tensor(eos, device=idx.device)).long()
    after = is_end.cumsum(1) - is_end > 0  # an end token before this one (the first end token itself is kept)
    return torch.cat([idx[:, :start], new.masked_fill(after, pad)], dim=1)


@torch.no_grad()
def generate(
    model: nn.Module,
    idx: Tensor | None = None,
    max_new_tokens: int | None = None,
    *,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    eos_id: int | list[int] | None = None,
    return_logits: bool = False,
    on_token: Callable[[Tensor], None] | None = None,
    compile: bool = False,
    input_ids: Tensor | None = None,
    do_sample: bool | None = None,
    attention_mask: Tensor | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Append ``max_new_tokens`` sampled tokens to ``idx`` (b, n) (causal models only): the method
    :meth:`LanguageModel.generate <crate_transformer.models.lm.LanguageModel.generate>`.

    ``on_token`` is called with each step's new tokens (b, 1) as they are sampled (to stream the text).

    ``temperature`` 0 is greedy (the default is 1: sampling).  With ``use_cache`` each step runs the newest token
    only, against the cached earlier ones; once the context is full, the window slides and the cache is rebuilt
    from the last ``block_size`` tokens, exactly what the uncached path computes.  ``return_logits`` also returns
    every step's ``(b, steps, V)`` logits (the cached and uncached paths agree to float rounding).  ``eos_id``
    (an id or a list): stop once every row has produced one.

    ``compile=True`` decodes on fixed-size cache buffers with one compiled step per token (a CUDA graph on a
    GPU; the module docstring): the same tokens, the first call slower while it compiles; prompt + new tokens
    must fit the context.

    Hugging Face's call is the same decoding: ``generate(input_ids=ids, max_new_tokens=20, do_sample=True,
    attention_mask=mask, eos_token_id=e, pad_token_id=p)``; ``do_sample=False`` is greedy (:func:`resolve_sampling`),
    ``attention_mask`` must be all ones, ``pad_token_id`` replaces what a row makes after its end token.  What
    cannot apply (a filter under greedy decoding, an id outside the vocabulary) is a one-line error.
    """
    c = model.config
    if not c.causal:
        raise ValueError("generation needs a causal (GPT) model; this one is a masked LM (objective mlm)")
    idx = _prompt(idx, input_ids, max_new_tokens)
    sampling = resolve_sampling(temperature, top_k, top_p, do_sample)
    eos = _end_tokens(_one_of("eos_id", eos_id, "eos_token_id", eos_token_id), pad_token_id, c.vocab_size)
    how = Decoding(*sampling, generator, eos, on_token, use_cache, return_logits)
    if compile:
        check_compiled(model, idx, max_new_tokens, use_cache)
    model.check_tokens(idx[:, -c.block_size :])
    check_prompt_mask(attention_mask, idx)
    start = idx.shape[1]
    with evaluating(model):
        run = decode_compiled if compile and max_new_tokens else decode_eager
        idx, steps = run(model, idx, max_new_tokens, how)
    if pad_token_id is not None:
        idx = pad_after_eos(idx, start, eos, pad_token_id)
    if return_logits:
        return idx, torch.stack(steps, 1) if steps else idx.new_zeros(idx.shape[0], 0, c.vocab_size).float()
    return idx


def decode_eager(model: nn.Module, idx: Tensor, new: int, how: Decoding) -> tuple[Tensor, list[Tensor]]:
    """Token by token against a growing cache (or, without ``use_cache``, the whole window every step); past the
    context the window slides and the cache is rebuilt from the last ``block_size`` tokens."""
    block, cache, steps = model.config.block_size, None, []
    for _ in range(new):
        window = idx[:, -block:]
        if not how.use_cache:
            logits = _next_logits(model, window, None)
        elif cache is None or cached_length(cache) >= block:
            cache = model.new_cache()
            logits = _next_logits(model, window, cache)
        else:
            logits = _next_logits(model, idx[:, -1:], cache)
        steps.append(logits)
        nxt = how.draw(logits)
        idx = torch.cat([idx, nxt], dim=1)
        if how.on_token is not None:
            how.on_token(nxt)
        if how.all_ended(nxt):
            break
    return idx, steps


# --------------------------------------------------------------------------- compiled decoding
def check_compiled(model: nn.Module, idx: Tensor, new: int, use_cache: bool) -> None:
    """One-line errors for what compiled decoding cannot do: run without a cache, or past the context (its
    buffers hold prompt + new tokens; the eager path slides the window instead)."""
    block = model.config.block_size
    if not use_cache:
        raise OptionError(
            "compiled decoding runs on a cache of fixed size; drop compile or keep the cache", option="compile"
        )
    if isinstance(idx, Tensor) and idx.dim() == 2 and idx.shape[1] + new > block:
        raise OptionError(
            f"compiled decoding holds prompt + new tokens in the context of {block} (block_size), got "
            f"{idx.shape[1]} + {new} = {idx.shape[1] + new}; pass fewer tokens (max_new_tokens), or drop compile to "
            "slide the window",
            option=("max_new_tokens", "compile"),
        )


def capacity_for(tokens: int, block_size: int) -> int:
    """Buffer positions for ``tokens``: rounded up to a multiple of :data:`CAPACITY_STEP`, at most the context,
    so generations of similar lengths share one compiled step."""
    return min(block_size, -(-tokens // CAPACITY_STEP) * CAPACITY_STEP)


def decode_step(model: nn.Module, cache: StaticCache, out: Tensor, noise: Tensor | None, sampling: tuple) -> Tensor:
    """One token: the model on ``out[:, pos]`` against ``cache``, the next token written to ``out[:, pos + 1]``,
    ``pos`` advanced; returns the logits (b, V).  Every write is in place and every index a tensor: the function
    :func:`compiled_step` compiles once."""
    pos = cache.pos.view(1)
    logits = _next_logits(model, out.index_select(1, pos), cache)
    out.index_copy_(1, pos + 1, _choose(logits, *sampling, noise))
    cache.advance(1)
    return logits


_COMPILED: dict[str, Callable] = {}


def compiled_step(compile_step: bool = True) -> Callable:
    """:func:`decode_step` under ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (made once per
    process; ``compile_step=False``: the plain function, what the device checks run on ``meta``)."""
    if not compile_step:
        return decode_step
    if "step" not in _COMPILED:
        _COMPILED["step"] = torch.compile(decode_step, mode="reduce-overhead", fullgraph=True, dynamic=False)
    return _COMPILED["step"]


# per model, the buffers of its last compiled generation: the next one of the same shapes writes into the same
# addresses, so a CUDA graph is replayed, not recorded again (a new address makes cudagraph trees re-record)
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _buffers(model: nn.Module, cache: list[Any], capacity: int, idx: Tensor) -> tuple[StaticCache, Tensor]:
    """The :class:`StaticCache` holding ``cache`` and the token buffer ``(b, capacity + 1)``, reused when the last
    generation of ``model`` had the same :meth:`StaticCache.signature` and token buffer."""
    key = (StaticCache.signature(cache, capacity), idx.shape[0], idx.dtype, idx.device)
    kept = _KEPT.get(model)
    if kept is not None and kept[0] == key:
        return kept[1].load(cache), kept[2]
    out = idx.new_zeros(idx.shape[0], capacity + 1)
    torch._dynamo.mark_static_address(out)
    _KEPT[model] = (key, StaticCache.from_dynamic(cache, capacity), out)
    return _KEPT[model][1], out


@torch.no_grad()
def decode_compiled(
    model: nn.Module, idx: Tensor, new: int, how: Decoding, compile_step: bool = True
) -> tuple[Tensor, list[Tensor]]:
    """The prompt eagerly (its logits and first token as :func:`decode_eager`'s), then ``new − 1`` compiled
    steps on a :class:`StaticCache`; the tokens stay on the device until the end (``on_token`` and ``eos_id``
    read them per token, as they must)."""
    b, n = idx.shape
    cache = model.new_cache()
    logits = _next_logits(model, idx, cache)
    static, out = _buffers(model, cache, capacity_for(n + new - 1, model.config.block_size), idx)
    out[:, :n] = idx
    out[:, n : n + 1] = first = how.draw(logits)
    steps, step, done = [logits], compiled_step(compile_step), 1
    if how.on_token is not None:
        how.on_token(first)
    ended = how.all_ended(first)
    while done < new and not ended:
        noise = None if how.temperature == 0 else _noise((b, model.config.vocab_size), idx.device, how.generator)
        if done == 1:  # the step that may compile: a graph per model, batch, buffer length, dtype and sampling
            with torch._dynamo.config.patch(recompile_limit=STEP_GRAPHS):
                logits = step(model, static, out, noise, how.sampling)
        else:
            logits = step(model, static, out, noise, how.sampling)
        done += 1
        if how.keep_logits:
            steps.append(logits.clone())  # a CUDA graph's output is overwritten by its next replay
        if how.on_token is not None or how.eos_id is not None:
            nxt = out[:, n + done - 1 : n + done].clone()
            if how.on_token is not None:
                how.on_token(nxt)
            ended = how.all_ended(nxt)
    return out[:, : n + done].clone(), steps
