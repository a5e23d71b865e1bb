"""Compiled static-cache decoding (``generate(..., compile=True)``): the tokens of eager decoding, one compilation for
every token, no graph break, no host sync in a step, and its errors.

One module-scoped fixture compiles each model's step once (inductor's first compilation costs tens of seconds on
two cores); the tests read what it recorded.  With ``CRATE_TEST_DEVICE=cuda`` the same tests run on the GPU, where
the step is a CUDA graph.
"""

from __future__ import annotations

from typing import Any

import pytest
import tiny
import torch
from clitools import one_line_error
from conftest import TEST_DEVICE
from devicecheck import DeviceWatch

import crate_transformer as ct
from crate_transformer.models.generation import Decoding, decode_compiled, sample_next, token_probs
from crate_transformer.models.tokenizer import Tokenizer

pytestmark = pytest.mark.gpu
SIZE = dict(dim=32, depth=2, heads=2, vocab_size=64, block_size=64)
MODELS = {"CRATE-GPT": "crate_gpt_mini", "GPT": "gpt_mini", "ToST": "tost_gpt_mini"}
NEW = 10  # tokens generated: the prompt's pass, then NEW - 1 compiled steps


def _model(name: str, device: str = TEST_DEVICE) -> torch.nn.Module:
    torch.manual_seed(0)
    return ct.create_model(MODELS[name], **SIZE).to(device).eval()


def _counts() -> dict[str, int]:
    stats = torch._dynamo.utils.counters
    return {"graphs": stats["stats"]["unique_graphs"], "breaks": sum(stats["graph_break"].values())}


@pytest.fixture(scope="module")
def decoded() -> dict[str, Any]:
    """Per model: eager and compiled greedy tokens and logits, the compilations and graph breaks counted over the
    first compiled generation and over a second one (another length, same buffers) with recompiling an error;
    for CRATE-GPT also sampled tokens (top-k, top-p, a seeded generator) both ways."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    out: dict[str, Any] = {}
    for name in MODELS:
        model = _model(name)
        prompt = torch.randint(0, SIZE["vocab_size"], (2, 5), device=TEST_DEVICE)
        eager = model.generate(prompt, NEW, temperature=0, return_logits=True)
        before = _counts()
        compiled = model.generate(prompt, NEW, temperature=0, return_logits=True, compile=True)
        first = _counts()
        with torch._dynamo.config.patch(error_on_recompile=True):
            again = model.generate(prompt[:, :3], NEW + 4, temperature=0, compile=True)
        row = dict(eager=eager, compiled=compiled, again=again, prompt=prompt, after=_counts(), model=model)
        row.update(compiles=first["graphs"] - before["graphs"], breaks=first["breaks"] - before["breaks"])
        if name == "CRATE-GPT":
            kw = dict(temperature=0.9, top_k=20, top_p=0.9)
            row["sampled"] = [
                model.generate(prompt, NEW, generator=torch.Generator(TEST_DEVICE).manual_seed(7), compile=c, **kw)
                for c in (False, True)
            ]
        out[name] = row
    return out


@pytest.mark.parametrize("name", MODELS)
def test_compiled_greedy_decoding_gives_the_eager_tokens(decoded: dict, name: str) -> None:
    row = decoded[name]
    (tokens, logits), (tokens_c, logits_c) = row["eager"], row["compiled"]
    assert tokens.shape == (2, 5 + NEW) and torch.equal(tokens_c, tokens)
    assert logits_c.shape == logits.shape and torch.allclose(logits_c, logits, atol=1e-5, rtol=1e-4)
    assert logits.std() > 0.05  # not a comparison of flat logits
    shorter = _model(name).generate(row["prompt"][:, :3], NEW + 4, temperature=0)
    assert torch.equal(row["again"], shorter)


def test_compiled_sampling_with_a_seed_gives_the_eager_tokens(decoded: dict) -> None:
    eager, compiled = decoded["CRATE-GPT"]["sampled"]
    assert torch.equal(compiled, eager)
    greedy = decoded["CRATE-GPT"]["eager"][0]
    assert not torch.equal(eager, greedy)  # the draw did sample


@pytest.mark.parametrize("name", MODELS)
def test_the_step_compiles_once_without_graph_breaks(decoded: dict, name: str) -> None:
    """One graph for the NEW - 1 steps of a generation, none more for a second one of another length (recompiling
    raises there), and no graph break (the step is compiled with fullgraph=True as well)."""
    row = decoded[name]
    assert row["compiles"] == 1 and row["breaks"] == 0
    assert row["after"]["breaks"] == 0


def test_a_compiled_crate_step_multiplies_by_the_held_step_matrix(decoded: dict) -> None:
    """generate holds the weights (frozen_weights) before it compiles, so ISTA costs one d × d product per token in
    the compiled step as in the eager one: three per layer with MSSA's U and W (the thin form would be four)."""
    if TEST_DEVICE != "cpu":
        pytest.skip("a CUDA graph replays its kernels unseen by the profiler's aten events")
    row = decoded["CRATE-GPT"]
    with torch.profiler.profile(record_shapes=True) as prof:
        row["model"].generate(row["prompt"], NEW, temperature=0, compile=True)  # compiled already: the steps only
    d = SIZE["dim"]
    square = [e for e in prof.events() if e.name in ("aten::mm", "aten::addmm") and [d, d] in e.input_shapes]
    depth = SIZE["depth"]
    assert len(square) == 3 * depth * NEW + depth  # the prompt's pass, NEW - 1 steps, DᵀD once per layer on entry
    ista = [e for e in square if e.name == "aten::addmm" and e.input_shapes[:3] == [[d], [2, d], [d, d]]]
    # x A − ηλ by the held A and MSSA's output projection, each with a bias row (the thin form's second product
    # would add the whole x instead)
    assert len(ista) == 2 * depth * (NEW - 1)


def test_sample_next_draws_what_multinomial_draws() -> None:
    """The noise the compiled step takes is torch.multinomial's own draw: same tokens, same generator state."""
    logits = torch.randn(4, 300) * 3
    for seed in range(20):
        g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        ref = torch.multinomial(token_probs(logits, 0.8, 50, 0.95), 1, generator=g1)
        assert torch.equal(sample_next(logits, temperature=0.8, top_k=50, top_p=0.95, generator=g2), ref)
        assert torch.equal(torch.rand(3, generator=g1), torch.rand(3, generator=g2))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decoding_steps_read_nothing_from_the_device(name: str, temperature: float) -> None:
    """The compiled path's loop (the step uncompiled: inductor cannot compile for ``meta``) on ``meta``: no value
    read, no copy between host and device, in the prompt's pass or in any step."""
    model = _model(name, "meta")
    prompt = torch.zeros(2, 5, dtype=torch.long, device="meta")
    with DeviceWatch("meta") as watch:
        tokens, steps = decode_compiled(model, prompt, 6, Decoding(temperature=temperature), compile_step=False)
    assert not watch.events, "\n\n".join(map(str, watch.events))
    assert tokens.shape == (2, 11) and len(steps) == 1


def test_prompt_and_new_tokens_past_the_context_is_a_one_line_error(capsys: pytest.CaptureFixture, tmp_path) -> None:
    model = _model("CRATE-GPT", "cpu")
    prompt = torch.zeros(1, 60, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^compiled decoding .* 60 \+ 5 = 65; pass fewer tokens \(max_new_tokens\)"):
        model.generate(prompt, 5, compile=True)
    with pytest.raises(ValueError, match="drop compile or keep the cache"):
        model.generate(prompt[:, :4], 5, compile=True, use_cache=False)
    assert model.generate(prompt, 5, temperature=0).shape == (1, 65)  # eager slides the window
    lm = ct.create_model("crate_gpt_mini", **tiny.LM)
    lm.tokenizer = Tokenizer.byte_level()
    folder = lm.save_pretrained(tmp_path / "m")
    err = one_line_error(capsys, "generate", folder, "--compile", "--max-new-tokens", 100, "--prompt", "ab")
    assert "2 + 100 = 102; pass fewer tokens (--max-new-tokens), or drop --compile" in err


def test_sample_next_refuses_what_it_refused() -> None:
    with pytest.raises(ValueError, match="temperature must be"):
        sample_next(torch.zeros(1, 5), temperature=-1.0)
