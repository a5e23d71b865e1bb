"""The GPT baseline in TransformerLens, without forking it: the hook names of both, and the route there.

TransformerLens (4.x) wraps a Hugging Face model (``TransformerBridge.boot_transformers(name, hf_model=...)``) and
gives it its hook names.  The package's GPT baseline is GPT-2's layer (LayerNorm → standard attention → residual →
LayerNorm → GELU MLP → residual; learned positions, a final LayerNorm, the head tied to the token embedding), so
its weights are a ``transformers.GPT2LMHeadModel``'s, transposed where GPT-2 stores ``Conv1D`` weights
(:func:`to_hf_gpt2`), and TransformerLens runs that (:func:`to_transformer_lens`).  CRATE-GPT's layer (MSSA, ISTA)
has no counterpart among TransformerLens' architectures: its hooks are the package's own
(``model.run_with_cache``, ``model.intervene``) or nnsight's (``docs/hooks.md``).

:data:`TRANSFORMER_LENS_NAMES` maps the package's hook names onto TransformerLens'.  TransformerLens keeps a head
axis after the token axis (``(b, n, K, p)``) where the package keeps it before (``(b, K, n, p)``, as the attention
computes it).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["TRANSFORMER_LENS_NAMES", "transformer_lens_name", "to_hf_gpt2", "to_transformer_lens"]

# the package's name (``{i}`` the layer) → TransformerLens'; ``head`` is the logits TransformerLens returns
TRANSFORMER_LENS_NAMES = {
    "embed": "blocks.0.hook_resid_pre",  # hook_embed + hook_pos_embed
    "layers.{i}.z_in": "blocks.{i}.hook_resid_pre",
    "layers.{i}.attn.q": "blocks.{i}.attn.hook_q",
    "layers.{i}.attn.k": "blocks.{i}.attn.hook_k",
    "layers.{i}.attn.v": "blocks.{i}.attn.hook_v",
    "layers.{i}.attn.pattern": "blocks.{i}.attn.hook_pattern",
    "layers.{i}.attn.out": "blocks.{i}.hook_attn_out",
    "layers.{i}.z_half": "blocks.{i}.hook_resid_mid",
    "layers.{i}.mlp.hidden": "blocks.{i}.mlp.hook_post",
    "layers.{i}.z_out": "blocks.{i}.hook_resid_post",
}


def transformer_lens_name(name: str) -> str:
    """TransformerLens' name for the package's hook ``name`` (``layers.3.z_half`` → ``blocks.3.hook_resid_mid``);
    one line for a name with no counterpart."""
    found = re.fullmatch(r"layers\.(\d+)\.(.+)", name)
    key, i = (f"layers.{{i}}.{found.group(2)}", found.group(1)) if found else (name, "")
    if key not in TRANSFORMER_LENS_NAMES:
        raise ValueError(f"{name} has no TransformerLens name; those that do: {', '.join(TRANSFORMER_LENS_NAMES)}")
    return TRANSFORMER_LENS_NAMES[key].replace("{i}", i)


def _gpt2_layers(model: nn.Module) -> None:
    """One line unless ``model`` is a GPT-2 model: standard attention and MLP layers (its hook names say so), a
    causal context, learned positions, heads of width dim / heads."""
    names = set(model.hook_names()) if callable(getattr(model, "hook_names", None)) else set()
    c = getattr(model, "config", None)
    gpt2 = {"layers.0.attn.q", "layers.0.mlp.hidden"} <= names and getattr(model, "wpe", None) is not None
    if not gpt2 or not getattr(c, "causal", False) or model.layers[0].attn.dim_head * c.heads != c.dim:
        raise ValueError(
            f"TransformerLens' GPT-2 takes the GPT baseline (gpt_*: standard attention and MLP layers, learned "
            f"positions), not this {type(model).__name__}; hook it with model.run_with_cache / intervene or nnsight"
        )


def _gpt2_state(model: nn.Module) -> dict[str, Tensor]:
    """The weights under GPT-2's names; a ``Conv1D`` weight is the ``Linear``'s transposed; a bias the model leaves
    out is zero."""

    def linear(prefix: str, lin: nn.Linear) -> dict[str, Tensor]:
        bias = lin.bias if lin.bias is not None else torch.zeros(lin.out_features)
        return {f"{prefix}.weight": lin.weight.T, f"{prefix}.bias": bias}

    def norm(prefix: str, ln: nn.LayerNorm) -> dict[str, Tensor]:
        bias = ln.bias if ln.bias is not None else torch.zeros_like(ln.weight)
        return {f"{prefix}.weight": ln.weight, f"{prefix}.bias": bias}

    state = {"transformer.wte.weight": model.wte.weight, "transformer.wpe.weight": model.wpe.weight}
    for i, layer in enumerate(model.layers):
        p = f"transformer.h.{i}"
        state |= norm(f"{p}.ln_1", layer.norm1) | norm(f"{p}.ln_2", layer.norm2)
        state |= linear(f"{p}.attn.c_attn", layer.attn.qkv) | linear(f"{p}.attn.c_proj", layer.attn.proj)
        state |= linear(f"{p}.mlp.c_fc", layer.block[0]) | linear(f"{p}.mlp.c_proj", layer.block[3])
    state |= norm("transformer.ln_f", model.norm)
    return {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in state.items()}


def to_hf_gpt2(model: nn.Module) -> Any:
    """The GPT baseline as a ``transformers.GPT2LMHeadModel`` (float32, eval mode) with the same logits: GPT-2's
    configuration read off the model (``gelu="tanh"`` is GPT-2's ``gelu_new``), the weights of :func:`_gpt2_state`,
    the head tied to the token embedding as in the package."""
    import transformers

    _gpt2_layers(model)
    c, layer = model.config, model.layers[0]
    config = transformers.GPT2Config(
        vocab_size=c.vocab_size, n_positions=c.block_size, n_embd=c.dim, n_layer=c.depth, n_head=c.heads,
        n_inner=layer.block[0].out_features, layer_norm_epsilon=layer.norm1.eps, tie_word_embeddings=True,
        activation_function="gelu_new" if layer.block[1].approximate == "tanh" else "gelu",
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    hf = transformers.GPT2LMHeadModel(config)
    missing, unexpected = hf.load_state_dict(_gpt2_state(model), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # lm_head is tied to wte
        raise ValueError(f"GPT-2 has other weights than the model: missing {missing}, unexpected {unexpected}")
    hf.tie_weights()
    return hf.eval()


def _token_ids_tokenizer(vocab_size: int) -> Any:
    """A ``transformers`` tokenizer that reads the ids written as numbers (``"3 14 15"``): TransformerLens asks for
    one, and the package's models run on token ids (no beginning-of-text token is added)."""
    import tokenizers
    import transformers
    from tokenizers import models, pre_tokenizers

    tok = tokenizers.Tokenizer(models.WordLevel({str(i): i for i in range(vocab_size)}, unk_token="0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="0", pad_token="0", eos_token="0")


def to_transformer_lens(model: nn.Module, tokenizer: Any = None) -> Any:
    """The GPT baseline as TransformerLens' ``TransformerBridge`` (its ``run_with_cache``, ``run_with_hooks`` and hook
    names, :data:`TRANSFORMER_LENS_NAMES`), built from :func:`to_hf_gpt2` with no download: ``tokenizer`` a
    ``transformers`` tokenizer, by default one that reads token ids written as numbers."""
    from transformer_lens.model_bridge import TransformerBridge

    hf = to_hf_gpt2(model)
    tok = tokenizer if tokenizer is not None else _token_ids_tokenizer(model.config.vocab_size)
    return TransformerBridge.boot_transformers("gpt2", hf_model=hf, tokenizer=tok)
