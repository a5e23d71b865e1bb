"""Loading the authors' CRATE-GPT (crate-lm) and GPT-2 / nanoGPT checkpoints: logits against the authors' code.

Tiny models with random weights are written in each format the loaders read — crate-lm's ``ckpt.pt``
(``crate_overcomplete.py``, the released model's code, and ``crate.py``), nanoGPT's ``ckpt.pt`` (keys prefixed
``_orig_mod.`` by ``torch.compile``, an AdamW state, ``model_args`` and ``config``), Hugging Face GPT-2 state
dicts (``.bin``-style with ``transformer.`` and the tied ``lm_head``, and ``GPT2Model`` keys in a
``.safetensors`` file) — then loaded with ``ct.from_official`` and compared with the transcribed originals
(tests/official/).  The released sizes' parameter counts are checked on the meta device.
"""

import math

import pytest
import torch
from official import crate_lm_official as crate_lm
from official import nanogpt_model as nanogpt
from safetensors.torch import save_file
from torch import nn

import crate_transformer as ct
from crate_transformer.io import CheckpointError
from crate_transformer.layers import OvercompleteISTA, odl_reference
from crate_transformer.loading.pipeline import load_model

TINY = dict(block_size=16, vocab_size=61, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=True)


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random (LayerNorm gains and biases too), so no term can be dropped unnoticed."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ista.weight"):  # the dictionaries at their kaiming scale keep ReLU codes non-trivial
                p.copy_(torch.empty_like(p).uniform_(-1, 1, generator=g) * math.sqrt(3 / p.shape[-1]))
            else:
                base = 1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight", "prenorm_1.weight",
                                             "prenorm_2.weight")) else 0.0  # fmt: skip
                p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def _nanogpt_ckpt(model: nn.Module, model_args: dict, path, compiled: bool = True):
    """``torch.save`` of the dict nanoGPT's / crate-lm's ``train.py`` writes, after one AdamW step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-9, betas=(0.9, 0.95))
    idx = torch.randint(model_args["vocab_size"], (1, 4))
    model(idx, idx)[1].backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    prefix = "_orig_mod." if compiled else ""
    ckpt = {
        "model": {prefix + k: v for k, v in model.state_dict().items()},
        "optimizer": opt.state_dict(),
        "model_args": dict(model_args),
        "iter_num": 600000,
        "best_val_loss": torch.tensor(2.9),
        "config": {"n_layer": model_args["n_layer"], "learning_rate": 6e-4, "dataset": "pile", "compile": True},
    }
    torch.save(ckpt, path)
    return path


def _tokens(vocab: int, n: int = 12, batch: int = 3) -> torch.Tensor:
    return torch.randint(vocab, (batch, n), generator=torch.Generator().manual_seed(1))


def _compare(ours: nn.Module, ref: nn.Module, vocab: int) -> None:
    """Every position's logits in float32 (≤ 1e-5) and float64 (≤ 1e-10)."""
    idx = _tokens(vocab)
    with torch.no_grad():
        assert (ours(idx) - ref(idx, idx)[0]).abs().max() <= 1e-5
        d_ours, d_ref = ours.double(), ref.double()
        err = (d_ours(idx) - d_ref(idx, idx)[0]).abs().max()
    assert err <= 1e-10, err


# --------------------------------------------------------------------------- crate-lm
def test_released_crate_gpt_format_loads_and_matches_crate_overcomplete(tmp_path):
    ref = _randomize(crate_lm.CRATEOvercomplete(crate_lm.CRATEConfig(**TINY)))
    path = _nanogpt_ckpt(ref, TINY, tmp_path / "ckpt-crate-2l-overparam-600000.pt")
    torch.load(path, weights_only=True)  # the whole container (optimizer, config) is plain data
    model = ct.from_official(path, "crate_gpt_12l_pile").eval()
    c = model.config
    assert (c.mlp, c.odl_ratio, c.final_norm, c.heads, c.depth, c.dim) == ("ista_overcomplete", 4, True, 4, 2, 32)
    assert (c.vocab_size, c.block_size) == (61, 16)  # read off the checkpoint, not the registry's 50304 / 1024
    assert model.num_params() == sum(p.numel() for p in ref.parameters())
    _compare(model, ref, TINY["vocab_size"])


def test_crate_py_format_loads_and_matches(tmp_path):
    """crate.py: complete ISTA (d × d), no ln_f, and the causal-mask ``attn.bias`` buffers in the state dict."""
    ref = _randomize(crate_lm.CRATE(crate_lm.CRATEConfig(**TINY)))
    assert "transformer.h.0.attn.bias" in ref.state_dict()
    path = _nanogpt_ckpt(ref, TINY, tmp_path / "ckpt.pt", compiled=False)
    model = ct.from_official(path, "crate_gpt_base").eval()
    assert (model.config.mlp, model.config.final_norm, model.config.heads) == ("ista", False, 4)
    _compare(model, ref, TINY["vocab_size"])


def test_overcomplete_ista_tied_is_odl_reference_with_one_dictionary():
    """``OvercompleteISTA(tied=True)`` = two ISTA steps from zero decoded by the same ``D`` (column form)."""
    block = OvercompleteISTA(8, ratio=3, eta=0.3, lambd=0.05, tied=True).double()
    assert block.D1 is None and tuple(block.D.shape) == (8, 24)
    x = torch.randn(5, 8, dtype=torch.float64)
    expected = odl_reference(x.T, block.D.detach(), block.D.detach(), eta=0.3, lambd=0.05).T
    assert torch.allclose(block(x), expected, rtol=0, atol=1e-12)


def test_loaded_crate_gpt_generates_and_round_trips(tmp_path):
    ref = _randomize(crate_lm.CRATEOvercomplete(crate_lm.CRATEConfig(**TINY)))
    model = ct.from_official(_nanogpt_ckpt(ref, TINY, tmp_path / "ckpt.pt"), "crate_gpt_12l_pile")
    idx = _tokens(TINY["vocab_size"], n=4, batch=2)
    _, cached = model.generate(idx, 6, temperature=0, return_logits=True)
    _, plain = model.generate(idx, 6, temperature=0, use_cache=False, return_logits=True)
    assert (cached - plain).abs().max() <= 1e-5
    model.save_pretrained(tmp_path / "saved")
    again = ct.from_pretrained(tmp_path / "saved")
    assert again.config == model.config
    assert torch.equal(again(idx), model(idx))


# --------------------------------------------------------------------------- nanoGPT and Hugging Face GPT-2
@pytest.mark.parametrize("bias", [True, False])
def test_nanogpt_ckpt_loads_and_matches(tmp_path, bias):
    """nanoGPT's ``ckpt.pt``; ``bias=False`` (its training default) loads with zero biases, the same function."""
    args = {**TINY, "bias": bias, "vocab_size": 64}
    ref = _randomize(nanogpt.GPT(nanogpt.GPTConfig(**args)))
    model = ct.from_official(_nanogpt_ckpt(ref, args, tmp_path / "ckpt.pt"), "gpt2_base").eval()
    c = model.config
    assert (c.arch, c.gelu, c.vocab_size, c.heads) == ("gpt", "exact", 64, 4)
    _compare(model, ref, args["vocab_size"])


def _hf_state_dict(ref: nn.Module, prefix: str = "transformer.") -> dict:
    """What GPT2LMHeadModel.state_dict() holds for ``ref``'s weights: Conv1D (in, out) weights, mask buffers."""
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    sd = {}
    for k, v in ref.state_dict().items():
        sd[k.replace("transformer.", prefix, 1)] = v.T.contiguous() if k.endswith(conv1d) else v.clone()
    n = ref.config.block_size
    for i in range(ref.config.n_layer):
        sd[f"{prefix}h.{i}.attn.bias"] = torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)
        sd[f"{prefix}h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    return sd


def _gpt2_reference(args: dict) -> nn.Module:
    """nanoGPT with OpenAI GPT-2's GELU (Hugging Face ``gelu_new``: 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))))."""
    ref = _randomize(nanogpt.GPT(nanogpt.GPTConfig(**args)))
    for block in ref.transformer.h:
        block.mlp.gelu = nn.GELU(approximate="tanh")
    return ref


def test_hf_gpt2_state_dict_loads_and_matches(tmp_path):
    args = {**TINY, "vocab_size": 64}
    ref = _gpt2_reference(args)
    sd_hf = _hf_state_dict(ref)
    # the layout is the one nanoGPT's from_pretrained copies from (its asserts check names and shapes)
    check = nanogpt.load_hf_state_dict(_gpt2_reference(args), sd_hf)
    assert all(torch.equal(a, b) for a, b in zip(check.state_dict().values(), ref.state_dict().values()))
    torch.save(sd_hf, tmp_path / "pytorch_model.bin")
    model = ct.from_official(tmp_path / "pytorch_model.bin", "gpt2_base", dim=32, heads=4).eval()
    assert model.config.gelu == "tanh"
    _compare(model, ref, args["vocab_size"])


def test_hf_gpt2_safetensors_without_prefix_loads(tmp_path):
    """GPT2Model keys (no ``transformer.`` prefix, no ``lm_head``) in a ``.safetensors`` file, as on the Hub."""
    args = {**TINY, "vocab_size": 64}
    ref = _gpt2_reference(args)
    sd = {k: v for k, v in _hf_state_dict(ref, prefix="").items() if not k.endswith(("lm_head.weight", ".attn.bias"))}
    save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "model.safetensors")
    model = ct.from_official(tmp_path / "model.safetensors", "gpt2_base", dim=32, heads=4).eval()
    _compare(model, ref, args["vocab_size"])
    exact = ct.from_official(tmp_path / "model.safetensors", "gpt2_base", dim=32, heads=4, gelu="exact").eval()
    idx = _tokens(64)
    assert 1e-6 < (exact(idx) - model(idx)).abs().max() < 1e-1  # a GELU override is honoured (and matters)


# --------------------------------------------------------------------------- released sizes
def test_parameter_counts_of_released_sizes():
    """OpenAI GPT-2 (124M / 355M / 774M / 1.56B) and the released CRATE-GPT, against the originals on meta."""
    with torch.device("meta"):
        for name, (layers, heads, dim) in {
            "gpt2_base": (12, 12, 768),
            "gpt2_medium": (24, 16, 1024),
            "gpt2_large": (36, 20, 1280),
            "gpt2_xl": (48, 25, 1600),
        }.items():
            ref = nanogpt.GPT(nanogpt.GPTConfig(n_layer=layers, n_head=heads, n_embd=dim, vocab_size=50257))
            assert ct.create_model(name).num_params() == sum(p.numel() for p in ref.parameters()), name
        counts = [ct.create_model(n).num_params() for n in ("gpt2_base", "gpt2_medium", "gpt2_large", "gpt2_xl")]
        assert counts == [124_439_808, 354_823_168, 774_030_080, 1_557_611_200]
        release = ct.create_model("crate_gpt_12l_pile")
        ref = crate_lm.CRATEOvercomplete(crate_lm.CRATEConfig())  # crate_overcomplete.py's defaults: 12L, 768
        assert release.num_params() == sum(p.numel() for p in ref.parameters()) == 81_934_848
        assert release.num_params(exclude_positions=True) == ref.get_num_params() == 81_148_416


# --------------------------------------------------------------------------- errors
def _one_line(excinfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg
    return msg


def test_wrong_name_or_format_is_one_line_error(tmp_path):
    crate_path = _nanogpt_ckpt(_randomize(crate_lm.CRATEOvercomplete(crate_lm.CRATEConfig(**TINY))), TINY,
                               tmp_path / "crate.pt")  # fmt: skip
    gpt_path = _nanogpt_ckpt(_randomize(nanogpt.GPT(nanogpt.GPTConfig(**TINY))), TINY, tmp_path / "gpt.pt")
    with pytest.raises(CheckpointError) as e:
        ct.from_official(crate_path, "gpt2_base")
    assert "crate_gpt_12l_pile" in _one_line(e)
    with pytest.raises(CheckpointError) as e:
        ct.from_official(gpt_path, "crate_gpt_base")
    assert "gpt2_base" in _one_line(e)
    with pytest.raises(CheckpointError) as e:
        ct.from_official(gpt_path, "crate_small")
    assert "gpt2_base" in _one_line(e)
    with pytest.raises(CheckpointError) as e:  # the checkpoint's model_args say 4 heads
        ct.from_official(crate_path, "crate_gpt_12l_pile", heads=8)
    assert "heads=8 (checkpoint: 4)" in _one_line(e)
    with pytest.raises(CheckpointError) as e:  # crate_bert_* is the released CRATE-BERT, another format
        ct.from_official(crate_path, "crate_bert_base")
    assert "is not a CRATE-BERT checkpoint" in _one_line(e) and "crate_gpt_12l_pile" in str(e.value)
    with pytest.raises(ValueError) as e:  # a bidirectional CRATE-BERT cannot compute a causal checkpoint
        ct.from_official(crate_path, "crate_bert_eq83_base")
    assert "causal=False" in _one_line(e)
    with pytest.raises(ValueError) as e:
        ct.from_official(crate_path, "crate_gpt_nonexistent")
    assert "unknown model" in _one_line(e)
    torch.save({"model": {"encoder.weight": torch.zeros(2, 2)}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError) as e:
        ct.from_official(tmp_path / "other.pt", "gpt2_base")
    assert "matches no format" in _one_line(e)
    partial = {k: v for k, v in torch.load(gpt_path, weights_only=True)["model"].items() if "c_attn.bias" not in k}
    torch.save({"model": partial, "model_args": TINY}, tmp_path / "partial.pt")
    with pytest.raises(CheckpointError) as e:  # some biases missing: reported, never zero-filled
        ct.from_official(tmp_path / "partial.pt", "gpt2_base")
    assert "missing keys: layers.0.attn.qkv.bias" in _one_line(e)


def test_state_dict_without_head_count_needs_matching_width(tmp_path):
    """A Hugging Face state dict stores no head count: a width other than the name's must come with dim= and heads=."""
    torch.save(_hf_state_dict(_gpt2_reference({**TINY, "vocab_size": 64})), tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as e:
        ct.from_official(tmp_path / "pytorch_model.bin", "gpt2_base")
    assert "heads=H" in _one_line(e) and "dim=32" in _one_line(e)


def test_load_model_reads_nanogpt_ckpt_and_asks_for_a_name(tmp_path):
    ref = _randomize(crate_lm.CRATEOvercomplete(crate_lm.CRATEConfig(**TINY)))
    path = _nanogpt_ckpt(ref, TINY, tmp_path / "ckpt.pt")
    with pytest.raises(CheckpointError) as e:
        load_model(path)
    assert "crate_gpt_12l_pile" in _one_line(e)
    model = load_model(path, "crate_gpt_12l_pile").eval()
    _compare(model, ref, TINY["vocab_size"])
