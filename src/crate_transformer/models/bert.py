"""CRATE-BERT as the authors released it (JMLR §4.1.4, Table 10, p.97), and the key map of its checkpoints.

The released model is the authors' Hugging Face port (``transformers`` fork, ``models/crate/modeling_crate.py``,
``CrateForMaskedLM`` / ``CrateForSequenceClassification``, e.g. ``jackbai/crate-base``).  Its CRATE layers are
this package's (eq. (45), the official form: ``Z + MSSA(LN(Z))`` with one shared ``U_kᵀ`` for query, key and
value, then ``ISTA(LN(·))`` with η = λ = 0.1 and no residual), with no bias on MSSA's output ``W`` (eq. (37)).
Around them it puts RoBERTa's pieces instead of the literal eqs. (83)-(84):

* ``f_pre``: token + learned position + token-type embedding, then LayerNorm and dropout.  Positions are
  counted over the real tokens from ``pad_token_id + 1`` on; padding takes the position row ``pad_token_id``
  (fairseq's ``make_positions``), so ``block_size`` tokens need ``block_size + pad_token_id + 1`` rows;
* ``f_head``: ``W_E · LN(GELU(W z + b)) + b_V`` with ``W_E`` the token embedding (tied) and a vocabulary bias;
* a sequence classifier on the first (``<s>``) token: ``out_proj(tanh(dense(z_0)))``.

Parameters: ``L(3d² + 4d) + (V + P + T + 2) d + d² + 3d + V`` with ``P = block_size + pad_token_id + 1``
position rows and ``T`` token types, i.e. 32,621,657 / 60,912,729 / 128,697,433 for ``crate_bert_medium``
/ ``base`` / ``large`` (Table 10: 33M / 61M / 129M).  The literal eqs. (83)-(84) form is ``arch="crate_lm"``
(:class:`~crate_transformer.models.lm.CRATELanguageModel`, the ``crate_bert_eq83_*`` models).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..io import CheckpointError
from ..loading.official import HEADS_NOT_STORED, OfficialFormat, index_count, rename, unwrap
from ._registry import PretrainedSource, register_arch, register_model, register_pretrained
from .lm import LanguageModel, LMConfig, LMOutput, check_ids, lm_input, lm_loss

__all__ = [
    "CRATEBert",
    "MaskedLMHead",
    "ClassificationHead",
    "position_ids",
    "BERT_KEY_MAP",
    "bert_official_to_native",
    "bert_native_to_official",
    "bert_config_file",
    "bert_checkpoint_fields",
    "is_bert_state",
    "BERT_FORMAT",
]


def position_ids(idx: Tensor, pad_id: int) -> Tensor:
    """RoBERTa's position ids: the real tokens of a row count ``pad_id + 1, pad_id + 2, …``, padding is ``pad_id``."""
    real = idx.ne(pad_id).long()
    return torch.cumsum(real, dim=1) * real + pad_id


class MaskedLMHead(nn.Module):
    """``f_head`` of the release: ``LN(GELU(dense(z))) W_Eᵀ + bias`` with ``W_E`` the (tied) token embedding."""

    def __init__(self, dim: int, vocab_size: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, z: Tensor, embedding: Tensor) -> Tensor:
        return F.linear(self.norm(F.gelu(self.dense(z))), embedding, self.bias)


class ClassificationHead(nn.Module):
    """RoBERTa's sentence classifier on the first token: ``out_proj(tanh(dense(z_0)))``, dropout before each."""

    def __init__(self, dim: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, num_labels)
        self.drop = nn.Dropout(dropout)

    def forward(self, z: Tensor) -> Tensor:
        x = torch.tanh(self.dense(self.drop(z[:, 0])))
        return self.out_proj(self.drop(x))


class CRATEBert(LanguageModel):
    """The released CRATE-BERT (see the module docstring): ``CRATEBert(LMConfig(arch="crate_bert", causal=False))``.

    ``forward(idx, key_mask=…, token_type_ids=…)`` gives the masked-LM logits ``(b, n, V)``; ``key_mask`` (b, n)
    is the attention mask (True / 1 for real tokens), ``token_type_ids`` the segments (default 0).
    """

    arch = "crate_bert"

    def __init__(self, config: LMConfig | None = None) -> None:
        if config is None:
            config = LMConfig(arch="crate_bert", causal=False)
        elif isinstance(config, LMConfig) and config.arch != "crate_bert":
            config = dataclasses.replace(config, arch="crate_bert", causal=False, pos_embed="learned")
        super().__init__(config)

    def _build_embedding(self, c: LMConfig) -> None:
        pad = c.pad_token_id
        self.wte = nn.Embedding(c.vocab_size, c.dim, padding_idx=pad)
        self.wpe = nn.Embedding(c.block_size + pad + 1, c.dim, padding_idx=pad)
        self.token_type = nn.Embedding(c.type_vocab_size, c.dim)
        self.embed_norm = nn.LayerNorm(c.dim, eps=c.layer_norm_eps)
        self.drop = nn.Dropout(c.dropout)

    def _build_heads(self, c: LMConfig) -> None:
        self.lm_head = MaskedLMHead(c.dim, c.vocab_size, c.layer_norm_eps)
        self.classifier = ClassificationHead(c.dim, c.num_labels, c.dropout) if c.num_labels else None

    def _init_weights(self) -> None:
        """As the port (BERT's): Linear and Embedding weights N(0, 0.02), biases and padding rows 0; LayerNorms
        1 / 0; ISTA dictionaries keep their kaiming-uniform init."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()

    def _logit_bias(self) -> Tensor:
        """The masked-LM head's vocabulary bias (what :meth:`init_token_prior` sets)."""
        return self.lm_head.bias

    # ---------------------------------------------------------------- forward
    def embed(self, idx: Tensor, start: int = 0, token_type_ids: Tensor | None = None) -> Tensor:
        """``f_pre``: ``LN(W_E x + W_T t + W_P pos)`` then dropout, positions by :func:`position_ids`."""
        if start:
            raise ValueError("CRATE-BERT is bidirectional and has no key-value cache; pass start=0")
        self.check_tokens(idx)
        if token_type_ids is None:
            types = torch.zeros_like(idx)
        else:
            types, n = token_type_ids, self.config.type_vocab_size
            if types.shape != idx.shape:
                raise ValueError(
                    f"token_type_ids must have the shape of the tokens {tuple(idx.shape)}, got {tuple(types.shape)}"
                )
            check_ids(types, n, "token type", "is outside the token types", f"pass token_type_ids in [0, {n})")
        z = self.wte(idx) + self.token_type(types) + self.wpe(position_ids(idx, self.config.pad_token_id))
        return self.drop(self.embed_norm(z))

    def forward_features(
        self,
        idx: Tensor,
        cache: list[dict[str, Tensor]] | None = None,
        key_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """The last layer's tokens (b, n, d); ``key_mask`` (b, n) False / 0 at padding, which no token attends to."""
        if cache is not None:
            raise ValueError("a key-value cache needs a causal (GPT) model; CRATE-BERT is bidirectional")
        if key_mask is not None and tuple(key_mask.shape) != tuple(idx.shape):
            raise ValueError(
                f"key_mask must have the shape of the tokens {tuple(idx.shape)}, got {tuple(key_mask.shape)}"
            )
        z = self.embed(idx, token_type_ids=token_type_ids)
        return self.norm(self.run_layers(z, key_mask=key_mask))

    def forward_head(self, z: Tensor, pre_logits: bool = False) -> Tensor:
        """The masked-LM logits (b, n, V) of the last layer's tokens (:class:`MaskedLMHead`); ``pre_logits``: the
        head's normalised features, before the tied decoder."""
        if pre_logits:
            return self.lm_head.norm(F.gelu(self.lm_head.dense(z)))
        return self.lm_head(z, self.wte.weight)

    def forward(
        self,
        idx: Tensor | None = None,
        cache: list[dict[str, Tensor]] | None = None,
        *,
        key_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
    ) -> Tensor | LMOutput:
        """Masked-LM logits ``(b, n, V)``, the port's ``CrateForMaskedLM(ids, attention_mask, token_type_ids)``;
        Hugging Face's names (``input_ids``, ``attention_mask`` for ``key_mask``) work too, and with ``labels`` (the
        masked tokens' ids, ``-100`` elsewhere) an :class:`~crate_transformer.models.lm.LMOutput` with the
        masked-LM ``loss`` and the ``logits``."""
        if key_mask is not None and attention_mask is not None:
            raise ValueError("key_mask and attention_mask (Hugging Face's name) are the same mask; pass one")
        mask = key_mask if key_mask is not None else attention_mask
        logits = self.forward_head(self.forward_features(lm_input(idx, input_ids), cache, mask, token_type_ids))
        return logits if labels is None else LMOutput(lm_loss(logits, labels, causal=False), logits)

    def classify(self, idx: Tensor, lengths: Tensor | None = None, token_type_ids: Tensor | None = None) -> Tensor:
        """Sequence-classification logits ``(b, num_labels)`` from the first token (``<s>`` / ``[CLS]``).

        Sequences are right-padded to ``lengths``; the padding is masked out of the attention, so it never
        changes the logits (the port's ``CrateForSequenceClassification`` with its attention mask).
        """
        if self.classifier is None:
            raise ValueError("this model has no classification head; create it with num_labels > 0")
        real = None  # no lengths: no padding, no mask
        if lengths is not None:
            real = torch.arange(idx.shape[1], device=idx.device)[None] < lengths.to(idx.device)[:, None]
        z = self.forward_features(idx, key_mask=real, token_type_ids=token_type_ids)
        return self.classifier(z)

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh first-token classification head for ``num_classes`` labels (1 = regression); ``global_pool`` can
        only be ``"token"`` (the first token's features)."""
        self.refuse_pool(global_pool, "token")
        self.config = dataclasses.replace(self.config, num_labels=num_classes)
        ref = self.wte.weight
        head = ClassificationHead(self.config.dim, num_classes, self.config.dropout)
        self.classifier = head.to(ref.device, ref.dtype)
        for lin in (self.classifier.dense, self.classifier.out_proj):
            nn.init.normal_(lin.weight, std=0.02)
            nn.init.zeros_(lin.bias)


# --------------------------------------------------------------------------- the port's checkpoints
# (port key prefix, native key prefix); "{i}" is a layer index.  The port ties lm_head.decoder.weight to the word
# embedding and lm_head.decoder.bias to lm_head.bias; bert_official_to_native checks and drops the copies.
BERT_KEY_MAP = [
    ("crate.embeddings.word_embeddings.", "wte."),
    ("crate.embeddings.position_embeddings.", "wpe."),
    ("crate.embeddings.token_type_embeddings.", "token_type."),
    ("crate.embeddings.LayerNorm.", "embed_norm."),
    ("crate.encoder.layer.{i}.attention.self.prenorm.", "layers.{i}.norm1."),
    ("crate.encoder.layer.{i}.attention.self.qkv.", "layers.{i}.attn.qkv."),
    ("crate.encoder.layer.{i}.attention.output.dense.", "layers.{i}.attn.proj."),
    ("crate.encoder.layer.{i}.output.prenorm.", "layers.{i}.norm2."),
    ("crate.encoder.layer.{i}.output.weight", "layers.{i}.ista.weight"),
    ("lm_head.dense.", "lm_head.dense."),
    ("lm_head.layer_norm.", "lm_head.norm."),
    ("lm_head.bias", "lm_head.bias"),
    ("classifier.dense.", "classifier.dense."),
    ("classifier.out_proj.", "classifier.out_proj."),
]
# buffers some transformers versions save, and the pooler (a bare CrateModel's; unused by the MLM and
# sequence-classification heads, and not part of Table 10's counts)
_UNUSED = ("crate.embeddings.position_ids", "crate.embeddings.token_type_ids", "crate.pooler.")


def is_bert_state(state: Mapping[str, Any]) -> bool:
    """Whether a state dict is the port's (``crate.embeddings.*`` / ``crate.encoder.*``, or a bare ``CrateModel``)."""
    return any(k.startswith(("crate.embeddings.", "crate.encoder.", "embeddings.word_embeddings.")) for k in state)


def _tied_copy(state: dict[str, Tensor], copy: str, kept: str) -> None:
    """Drop ``copy`` after checking that it equals ``kept`` (which it replaces when ``kept`` is absent)."""
    value = state.pop(copy, None)
    if value is None:
        return
    if kept not in state:
        state[kept] = value
    elif not torch.equal(state[kept], value):
        raise CheckpointError(
            f"{copy} differs from {kept}: this checkpoint has an untied LM head, which the released CRATE-BERT "
            "ties to the word embedding; re-save it with tied weights"
        )


def _with_prefix(state: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
    """A bare ``CrateModel``'s keys (``embeddings.*``, ``encoder.*``, ``pooler.*``) under the heads' ``crate.``."""
    if any(k.startswith("crate.") for k in state):
        return state
    bare = ("embeddings.", "encoder.", "pooler.")
    return {(f"crate.{k}" if k.startswith(bare) else k): v for k, v in state.items()}


def bert_official_to_native(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The port's ``CrateForMaskedLM`` / ``CrateForSequenceClassification`` / ``CrateModel`` state dict →
    :class:`CRATEBert` keys (:data:`BERT_KEY_MAP`); tied copies and unused buffers / pooler are dropped."""
    out = {k: v for k, v in _with_prefix(state).items() if not k.startswith(_UNUSED)}
    _tied_copy(out, "lm_head.decoder.weight", "crate.embeddings.word_embeddings.weight")
    _tied_copy(out, "lm_head.decoder.bias", "lm_head.bias")
    return rename(out, BERT_KEY_MAP, forward=True)


def bert_native_to_official(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A :class:`CRATEBert` state dict → the port's ``CrateForMaskedLM`` keys (with ``classifier.*`` when present),
    tied copies included, so that the port's ``load_state_dict`` accepts it strictly."""
    out = rename(state, BERT_KEY_MAP, forward=False)
    if "lm_head.bias" in out:
        out["lm_head.decoder.weight"] = out["crate.embeddings.word_embeddings.weight"]
        out["lm_head.decoder.bias"] = out["lm_head.bias"]
    return out


# the port's config.json field → LMConfig field
_CONFIG_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "dim",
    "num_hidden_layers": "depth",
    "num_attention_heads": "heads",
    "type_vocab_size": "type_vocab_size",
    "layer_norm_eps": "layer_norm_eps",
    "pad_token_id": "pad_token_id",
    "hidden_dropout_prob": "dropout",
}


def bert_config_file(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~crate_transformer.models.lm.LMConfig` fields of the port's ``config.json`` (``model_type:
    "crate"``):
    width, depth, heads, vocabulary, positions, token types, LayerNorm eps, padding id and dropout.

    ``max_position_embeddings`` rows hold ``max_position_embeddings − pad_token_id − 1`` tokens (``block_size``).
    A ``config.json`` of another model type is ignored: its sizes are not this format's.
    """
    if hf.get("model_type") != "crate":
        return {}
    out = {ours: hf[theirs] for theirs, ours in _CONFIG_FIELDS.items() if hf.get(theirs) is not None}
    positions, pad = hf.get("max_position_embeddings"), hf.get("pad_token_id", 1)
    if positions is not None:  # as stored (the loader types and bounds it: file_fields); a non-number is named
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (positions, pad))
        out["block_size"] = positions - pad - 1 if numbers else positions
    return out


def bert_checkpoint_fields(raw: object) -> dict[str, Any]:
    """The fields the port's tensors fix: vocabulary, depth, token types and a classification head's
    ``num_labels``.  The width is left to ``config.json`` or the model name: the tensors do not store the head
    count that goes with it (a different width is a shape error)."""
    state = _with_prefix(unwrap(raw))
    depth = index_count(state, r"crate\.encoder\.layer\.(\d+)\.")
    out: dict[str, Any] = {"depth": depth} if depth else {}
    for key, field in (
        ("crate.embeddings.word_embeddings.weight", "vocab_size"),
        ("crate.embeddings.token_type_embeddings.weight", "type_vocab_size"),
        ("classifier.out_proj.weight", "num_labels"),
    ):
        if key in state:
            out[field] = state[key].shape[0]
    return out


def _check_config(config: LMConfig) -> None:
    if config.proj_bias or config.mlp != "ista":
        raise ValueError(
            f"the released CRATE-BERT has ISTA blocks and no bias on MSSA's output W, not mlp={config.mlp!r}, "
            f"proj_bias={config.proj_bias!r}; drop those overrides"
        )


BERT_FORMAT = OfficialFormat(
    name="CRATE-BERT",
    origin="the authors' Hugging Face port, src/transformers/models/crate/modeling_crate.py",
    to_native=lambda state, config: bert_official_to_native(state),
    detect=is_bert_state,
    example="crate_bert_base",
    check=_check_config,
    fields=bert_checkpoint_fields,
    overridable=("dropout",),
    config_file=bert_config_file,
    optional=("lm_head.",),
    unstored=HEADS_NOT_STORED,
    file_names={**{ours: theirs for theirs, ours in _CONFIG_FIELDS.items()}, "block_size": "max_position_embeddings"},
)


# --------------------------------------------------------------------------- registry entries
register_arch("crate_bert", CRATEBert, official=BERT_FORMAT)
# CRATE-BERT as the authors released it (JMLR Table 10, p.97; their Hugging Face port,
# models/crate/modeling_crate.py): RoBERTa's vocabulary (V = 50,265), embedding (learned positions from
# pad_token_id + 1 = 2, so 512 rows hold 510 tokens; 2 token types; LayerNorm eps 1e-12) and masked-LM head, no bias on
# MSSA's W, dropout 0.1.  Parameters 32,621,657 / 60,912,729 / 128,697,433 (paper: 33M / 61M / 129M; "60.9M").
# The literal eqs. (83)-(84) form is crate_bert_eq83_* (arch crate_lm, lm.py).
_BERT = dict(arch="crate_bert", causal=False, vocab_size=50265, block_size=510, proj_bias=False, dropout=0.1)
register_model("crate_bert_medium", **_BERT, dim=512, depth=8, heads=8)
register_model("crate_bert_base", **_BERT, dim=768, depth=12, heads=12)
register_model("crate_bert_large", **_BERT, dim=1024, depth=24, heads=16)
register_pretrained(
    PretrainedSource(
        name="crate_bert_base",
        title="CRATE-BERT-Base (transformers-format port)",
        loader=BERT_FORMAT.name,
        filename="pytorch_model.bin",
        repo_id="jackbai/crate-base",
        also=("config.json",),  # the port's sizes, read by the loader beside the weights
        input="RoBERTa BPE tokens, context 510 (512 position rows)",
        classes="masked tokens (vocabulary 50,265)",
        licence="not stated",
        reference="configuration_crate.py of the CRATE-BERT transformers port (jackbai/crate-base)",
    )
)
