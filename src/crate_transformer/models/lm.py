"""Language models: CRATE-BERT (masked LM) and CRATE-GPT (causal LM), JMLR §4.1.4 pp.43-47, and a
GPT-2 baseline, in nanoGPT's layout (Karpathy 2022, which the paper's GPT code follows).

* ``f_pre(X) = f_embed(X) + E_pos`` (eqs. (83), (88)): a token embedding plus the sinusoidal position
  embedding of Vaswani et al. (BERT, eq. (83)) or a learned one (GPT-2 / the official CRATE-GPT code).
* CRATE layers (eq. (45)) whose MSSA is bidirectional (BERT) or causal (GPT, eqs. (86)-(87)).
* ``f_head(Z) = W_head Z`` (eq. (84)) with ``W_head`` tied to the token embedding (what Table 10's
  parameter counts imply); no final LayerNorm, as in the official CRATE-GPT code (``final_norm`` adds one).
* ``mlp="ista_overcomplete"``: the sparsification step of the released crate-lm CRATE-GPT (Bai & Ma 2025),
  a tied 4d-atom dictionary and two ISTA steps from zero, no residual (:class:`~.layers.OvercompleteISTA`).
* :data:`CRATE_LM_FORMAT` and :data:`GPT2_FORMAT` read the authors' crate-lm checkpoints, nanoGPT ``ckpt.pt``
  files and Hugging Face GPT-2 state dicts (``ct.from_official(path, "crate_gpt_12l_pile")`` / ``"gpt2_base"``).
* Losses: masked tokens (eq. (85), :func:`mask_tokens`: 15 %, 80/10/10) and next token (eq. (89)).
* :meth:`LanguageModel.generate` samples with temperature / top-k / top-p and a key-value cache; CRATE's
  shared ``Q = K = V = U_kᵀZ`` projection caches one tensor per layer where GPT caches two.

Parameter counts (Table 10, p.97): a CRATE layer has ``3d² + 5d`` parameters, so a CRATE
LM has ``L(3d² + 5d) + V d`` plus ``n_ctx d`` for a learned position table; with the overcomplete ISTA
(``m = 4d`` atoms) a layer has ``(2 + 4)d² + 5d`` parameters.  The CRATE-BERT the authors released
(Table 10's 33M / 61M / 129M) puts RoBERTa's embedding and heads around the CRATE layers: ``arch="crate_bert"``,
:class:`~crate_transformer.models.bert.CRATEBert`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config_utils import Range, option
from ..errors import TaskError
from ..io import FILE_DIGESTS, TOKENIZER_NAME, CheckpointError, read_model_json
from ..layers import DIM_HEAD, MLP, EncoderLayer, LayerConfig
from ..layers.static_cache import StaticLayerCache
from ..loading.official import HEADS_NOT_STORED, OfficialFormat, index_count, rename, unwrap
from ._registry import PretrainedSource, register_arch, register_model, register_pretrained
from .base import Model, Trace
from .contract import LANGUAGE_MODEL, FamilyConfig
from .generation import TEMPERATURE, TOP_P, cache_nbytes, cached_length, generate, mask_tokens, sample_next
from .token_prior import TokenPrior
from .tokenizer import Tokenizer

__all__ = [
    "LM_ARCHS",
    "LMOutput",
    "lm_loss",
    "LMConfig",
    "LanguageModel",
    "CRATELanguageModel",
    "GPT",
    "build_lm",
    "mask_tokens",
    "sample_next",
    "cache_nbytes",
    "TEMPERATURE",
    "TOP_P",
    "sinusoidal_positions",
    "check_official_lm",
    "lm_checkpoint_fields",
    "lm_state",
    "EMBED_KEY_MAP",
    "crate_lm_to_native",
    "gpt2_to_native",
    "CRATE_LM_FORMAT",
    "GPT2_FORMAT",
]

LM_ARCHS = ("crate_lm", "gpt", "crate_bert")
POS_EMBEDS = ("learned", "sinusoidal")


@dataclass
class LMConfig(LayerConfig, FamilyConfig):
    """Every hyperparameter of a language model; round-trips through ``config.json`` (``arch`` names the class).

    ``causal=True`` is a GPT (next-token, eq. (89)), ``False`` a BERT (masked tokens, eq. (85)).  Values are
    coerced to the declared types and validated with one-line errors, as :class:`~crate_transformer.ModelConfig`.
    """

    arch: str = option(
        "crate_lm",
        "crate_lm (CRATE layers) | gpt (pre-norm MHSA + GELU MLP, GPT-2) | crate_bert (the released CRATE-BERT)",
        choices=LM_ARCHS,
    )
    causal: bool = option(True, "a GPT (next token, eq. (89)); False: a BERT (masked tokens, eq. (85))")
    vocab_size: int = option(262, "tokens V of the embedding and the head (the byte-level tokenizer's: 262)")
    block_size: int = option(128, "context length n")
    dim: int = option(128, "token width d")
    depth: int = option(4, "layers L")
    heads: int = option(4, "attention heads K")
    dim_head: int | None = option(None, "width p of a head (None: dim // heads)")
    pos_embed: str = option(
        "learned", "learned (GPT-2, official CRATE-GPT) | sinusoidal (eq. (83), CRATE-BERT)", choices=POS_EMBEDS
    )
    final_norm: bool = option(False, "a LayerNorm before the head (GPT-2: yes; official CRATE-GPT: no)")
    num_labels: int = option(0, "> 0: a sequence-classification head (GLUE fine-tuning, Table 5); 1 = regression")
    # the CRATE layers' settings (ignored by arch="gpt" but dropout, mlp_ratio, gelu) are LayerConfig's: eta, lambd,
    # ista_mode (none: Table 16's CRATE-GPT without ISTA), layer_form, mlp (ista_overcomplete: the crate-lm release),
    # odl_ratio, proj_bias, mlp_ratio, gelu (tanh: OpenAI GPT-2, Hugging Face's gelu_new), ...
    # crate_bert only: RoBERTa's embedding and heads (the authors' Hugging Face port)
    type_vocab_size: int = option(2, "crate_bert: token-type (segment) embeddings")
    pad_token_id: int = option(
        1, "crate_bert: the padding token, its position row; real tokens take positions pad_token_id + 1, + 2, ..."
    )
    layer_norm_eps: float = option(
        1e-12,
        "crate_bert: ε of the embedding's and the LM head's LayerNorm (the CRATE layers' keep 1e-5)",
        range=Range(0, lo_open=True),
    )
    tokenizer: str = option(
        "", "the tokenizer kind the model was trained with (its tokenizer.json is saved beside)", applies="always"
    )

    OMIT_AT_DEFAULT = ("tied_output", "tied_beta", "eps", "attention")  # added later: the files stay byte-identical
    KEY_ORDER = ("arch", "causal", "vocab_size", "block_size", "dim", "depth", "heads", "dim_head", "pos_embed",
                 "dropout", "final_norm", "num_labels", "eta", "lambd", "ista_mode", "layer_form", "scale_scores",
                 "mlp", "odl_ratio", "proj_bias", "type_vocab_size", "pad_token_id", "layer_norm_eps", "mlp_ratio",
                 "gelu", "tokenizer")  # fmt: skip
    kind = LANGUAGE_MODEL
    MODEL_TYPE = "crate_transformer_lm"  # config.json's model_type: transformers' AutoConfig (loading.transformers_hf)
    BLOCK_COUNTS = {"depth": "layers"}  # the numbered blocks of the weights these fields count

    @property
    def pipeline_tag(self) -> str:
        return "fill-mask" if not self.causal and self.num_labels == 0 else "text-generation"

    @property
    def white_box(self) -> bool:
        return self.arch != "gpt"

    @property
    def positions_skip_padding(self) -> bool:
        """Whether positions count real tokens only (the released CRATE-BERT's RoBERTa embedding), so the model
        must know the tokenizer's padding id (``pad_token_id``)."""
        return self.arch == "crate_bert"

    def layer_config(self) -> LayerConfig:
        """CRATE's layer settings, or GPT-2's block (MHSA + GELU MLP, both residual; ``gelu="tanh"``: OpenAI's)."""
        if self.arch != "gpt":
            return super().layer_config()
        return LayerConfig(attention="mhsa", mlp="mlp", dropout=self.dropout, mlp_ratio=self.mlp_ratio, gelu=self.gelu)

    def validate(self) -> None:
        self.check_positive("vocab_size", "block_size", "dim", "depth", "heads", "odl_ratio", "type_vocab_size")
        if self.arch == "crate_lm":
            self.check_layer()
        Range(0, integer=True, note="0 = no classification head").check("num_labels", self.num_labels)
        if self.dim_head is not None:
            DIM_HEAD.check("dim_head", self.dim_head)
        if self.dim_head is None and self.dim % self.heads:
            raise ValueError(f"dim {self.dim} is not divisible by heads {self.heads}; set dim_head or change heads")
        if self.arch == "gpt" and self.dim % self.heads:
            raise ValueError(f"a GPT needs dim divisible by heads, got dim={self.dim}, heads={self.heads}")
        if self.pos_embed == "sinusoidal" and self.dim % 2:
            raise ValueError(f"the sinusoidal position embedding needs an even dim, got {self.dim}")
        if self.arch == "crate_bert":
            self._check_bert()

    def _check_bert(self) -> None:
        if self.causal:
            raise ValueError("crate_bert is bidirectional (a masked LM); pass causal=False")
        if self.pos_embed != "learned":
            raise ValueError(
                "crate_bert has learned positions; the sinusoidal E_pos of eq. (83) is arch='crate_lm' "
                "(e.g. the crate_bert_eq83_* models)"
            )
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"pad_token_id must be a token id in [0, vocab_size={self.vocab_size}), got {self.pad_token_id}; "
                "use the tokenizer's padding id"
            )

    @property
    def head_dim(self) -> int:
        return self.dim_head if self.dim_head is not None else self.dim // self.heads


def check_ids(ids: Tensor, size: int, what: str, problem: str, fix: str) -> None:
    """Ids in ``[0, size)``, else a one-line ValueError ``"{what} {id} {problem} [0, size); {fix}"``.

    Ids in host memory are checked on the host.  On an accelerator (and inside ``torch.compile``) reading them
    would stall the device on every forward, so the check is ``torch._assert_async``, raised by the device (a
    GPU reports it as a device-side assertion at its next synchronisation, as the embedding itself would).
    """
    if ids.device.type == "cpu" and not torch.compiler.is_compiling():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= size:
            raise ValueError(f"{what} {hi if hi >= size else lo} {problem} [0, {size}); {fix}")
    else:
        torch._assert_async(((ids >= 0) & (ids < size)).all(), f"a {what} {problem} [0, {size}); {fix}")


def lm_input(idx: Tensor | None, input_ids: Tensor | None) -> Tensor:
    """The token ids given as ``idx`` or as Hugging Face's ``input_ids`` (one of them)."""
    if (idx is None) == (input_ids is None):
        raise ValueError("pass the token ids once: model(idx) or model(input_ids=idx) (Hugging Face's name)")
    return idx if idx is not None else input_ids


def sinusoidal_positions(n: int, d: int) -> Tensor:
    """``E_pos`` of eq. (83) (Vaswani et al. 2017): ``sin(t / 10000^{2i/d})`` and ``cos(·)`` interleaved, (n, d)."""
    t = torch.arange(n, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, d, 2, dtype=torch.float64) / d)
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(t * freq), torch.cos(t * freq)
    return pe.float()


@dataclass
class LMOutput:
    """What ``forward(idx, labels=...)`` returns: the ``loss`` and the ``logits`` by name, and indexable like
    Hugging Face's ``ModelOutput`` (``out[0]`` is the loss, ``out["logits"]``, ``out.to_tuple()``; fields that are
    None are left out, so without a loss ``out[0]`` is the logits)."""

    loss: Tensor | None = None
    logits: Tensor | None = None

    def keys(self) -> list[str]:
        """The fields that hold a value, in order (as ``ModelOutput.keys()``)."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def to_tuple(self) -> tuple[Tensor, ...]:
        return tuple(getattr(self, k) for k in self.keys())

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise KeyError(f"{key!r} is not in this output; it holds {self.keys()}")
            return getattr(self, key)
        return self.to_tuple()[key]

    def __iter__(self):  # noqa: ANN204  (the keys, as a ModelOutput, which is a dict)
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())


def lm_loss(logits: Tensor, labels: Tensor, causal: bool) -> Tensor:
    """The mean cross-entropy of ``logits`` (b, n, V) against ``labels`` (b, n), ``-100`` ignored (Hugging Face's
    convention).  Causal: position ``t`` predicts ``labels[t + 1]`` (the shift is inside, so ``labels = idx`` gives
    the next-token loss of eq. (89)); masked: position ``t`` predicts ``labels[t]`` (eq. (85), the masked tokens
    labelled and the rest ``-100``, as :func:`mask_tokens` returns them)."""
    b, n, vocab = logits.shape
    if not isinstance(labels, Tensor) or tuple(labels.shape) != (b, n) or labels.is_floating_point():
        shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
        raise ValueError(f"labels must be token ids of the input's shape {(b, n)}, got {shape}; e.g. labels=idx")
    real = labels[labels != -100]
    if real.numel() and (int(real.min()) < 0 or int(real.max()) >= vocab):
        bad = int(real.max()) if int(real.max()) >= vocab else int(real.min())
        raise ValueError(f"label {bad} is outside the vocabulary [0, {vocab}) and is not -100 (ignored)")
    if causal:
        logits, labels = logits[:, :-1], labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, vocab).float(), labels.reshape(-1).long(), ignore_index=-100)


class LanguageModel(TokenPrior, Model):
    """Token + position embedding → L layers → (LayerNorm) → tied head; see the module docstring.

    ``forward(idx)`` maps token ids ``(b, n)`` to logits ``(b, n, V)``.  The
    :class:`~crate_transformer.models.base.Model` contract: ``forward_features`` returns the last layer's tokens
    after the final LayerNorm (when the model has one), ``forward_head`` maps them to token logits,
    ``forward_trace`` returns every layer's (for ``crate analyze``); ``classify`` gives the sequence-classification
    logits.  :class:`CRATELanguageModel` and :class:`GPT` fix ``config.arch``.
    """

    config_class = LMConfig
    arch: str | None = None

    def __init__(self, config: LMConfig | None = None) -> None:
        if config is None:
            config = LMConfig(arch=self.arch or "crate_lm")
        if isinstance(config, LMConfig) and self.arch is not None and config.arch != self.arch:
            config = dataclasses.replace(config, arch=self.arch)
        super().__init__(config)
        c = self.config
        self.tokenizer = None  # attached by from_pretrained / training; saved with save_pretrained
        self._build_embedding(c)
        self.layers = self.build_layers(c)
        self.norm = nn.LayerNorm(c.dim) if c.final_norm else nn.Identity()
        self._build_heads(c)
        self._init_weights()

    def build_layers(self, c: LMConfig) -> nn.ModuleList:
        """The ``depth`` layers between the embedding and the head: CRATE layers, or GPT-2 blocks for ``arch="gpt"``;
        a family that is this language model with other layers overrides it (ToST, ``tost.py``).  Each layer takes
        ``(z, cache=, key_mask=)`` and returns the tokens, as :class:`~crate_transformer.layers.EncoderLayer`."""
        return nn.ModuleList(EncoderLayer.from_config(c, causal=c.causal) for _ in range(c.depth))

    @property
    def tokenizer(self) -> object | None:
        """The model's tokenizer (None until attached); its ids must fit the embedding (``vocab_size``)."""
        return self.__dict__.get("_tokenizer")

    @tokenizer.setter
    def tokenizer(self, tok: object | None) -> None:
        # a larger vocabulary would yield ids the embedding has no row for, failing later with "token id
        # outside the vocabulary" on text the tokenizer itself produced
        size = getattr(tok, "vocab_size", None)
        if size is not None and size > self.config.vocab_size:
            raise TaskError(
                f"the tokenizer has {size} tokens but the model's embedding has {self.config.vocab_size} "
                f"(vocab_size); use the tokenizer the model was trained with, or train a model with this "
                f"tokenizer (task='lm' and tokenizer='FILE': vocab_size={size})"
            )
        self.__dict__["_tokenizer"] = tok

    # ---------------------------------------------------------------- files: the tokenizer beside the weights
    def extra_files(self) -> dict[str, str]:
        """``tokenizer.json`` when a tokenizer is attached (saved and checksummed with the weights)."""
        return {TOKENIZER_NAME: self.tokenizer.to_str()} if self.tokenizer is not None else {}

    def load_extra_files(self, directory: Path, meta: Mapping[str, str]) -> None:
        """Attach the folder's verified ``tokenizer.json`` (none when the model was saved without one)."""
        path = directory / TOKENIZER_NAME
        if not path.is_file():
            if FILE_DIGESTS[TOKENIZER_NAME] in meta:
                raise CheckpointError(
                    f"no {TOKENIZER_NAME} in {directory}, but the model was saved with one; re-save it"
                )
            return
        self.attach_files({TOKENIZER_NAME: read_model_json(directory, TOKENIZER_NAME)[0]}, str(path))

    def attach_files(self, files: Mapping[str, str], source: str) -> None:
        """Attach the tokenizer whose ``tokenizer.json`` text ``files`` holds (a training state's, or the one read
        by :meth:`load_extra_files`); nothing when it holds none."""
        if TOKENIZER_NAME not in files:
            return
        try:
            tokenizer = Tokenizer.from_str(files[TOKENIZER_NAME], source=source)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        try:
            self.tokenizer = tokenizer
        except TaskError as e:  # a vocabulary larger than the embedding (its fix names a task: the CLI translates it)
            raise TaskError(f"{source}: {e}", option=e.options, within=e.within) from None

    def size_hint(self, state: Mapping[str, Tensor]) -> str:
        """A checkpoint of another width: the ``dim`` to pass."""
        if "wte.weight" in state and state["wte.weight"].shape[-1] != self.config.dim:
            return f"; pass dim={state['wte.weight'].shape[-1]} and heads=H, the head count it was trained with"
        return ""

    def _build_embedding(self, c: LMConfig) -> None:
        """``f_pre`` of eqs. (83)/(88): the token embedding ``wte``, a learned ``wpe`` or the sinusoidal table."""
        self.wte = nn.Embedding(c.vocab_size, c.dim)
        if c.pos_embed == "learned":
            self.wpe = nn.Embedding(c.block_size, c.dim)
        else:
            self.wpe = None
            self.register_buffer("pos_table", sinusoidal_positions(c.block_size, c.dim), persistent=False)
        self.drop = nn.Dropout(c.dropout)

    def _build_heads(self, c: LMConfig) -> None:
        """The tied head of eq. (84) has no parameters of its own; a classification head when ``num_labels``."""
        self.classifier = nn.Linear(c.dim, c.num_labels) if c.num_labels else None

    def _init_weights(self) -> None:
        """nanoGPT / official CRATE-GPT: Linear and Embedding weights N(0, 0.02), biases 0, the residual
        output projections N(0, 0.02/√(2L)); ISTA dictionaries (plain or overcomplete) keep their
        kaiming-uniform init."""
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for layer in self.layers:
            for out in (getattr(layer.attn, "proj", None), layer.block[3] if isinstance(layer.block, MLP) else None):
                if out is not None:
                    nn.init.normal_(out.weight, std=0.02 / math.sqrt(2 * self.config.depth))

    # ---------------------------------------------------------------- embedding
    def check_tokens(self, idx: Tensor, start: int | Tensor = 0) -> None:
        """One-line ValueError for ids the model cannot take (type, rank, range, longer than the context).  A
        tensor ``start`` (compiled decoding's position) is not read: its length was checked before decoding."""
        c = self.config
        if not isinstance(idx, Tensor) or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"expected a LongTensor of token ids, got {getattr(idx, 'dtype', type(idx).__name__)}")
        if idx.dim() != 2:
            hint = "; add a batch dimension with idx.unsqueeze(0)" if idx.dim() == 1 else ""
            raise ValueError(f"expected token ids of shape (batch, length), got shape {tuple(idx.shape)}{hint}")
        if idx.shape[0] == 0:
            raise ValueError("empty batch (0 sequences of tokens); pass at least one sequence")
        n = idx.shape[1]
        if n == 0:
            raise ValueError("empty token sequence; pass at least one token")
        if not isinstance(start, Tensor) and start + n > c.block_size:
            raise ValueError(
                f"sequence of {start + n} tokens is longer than the model's context of {c.block_size} "
                f"(block_size); pass at most {c.block_size} tokens, e.g. idx[:, -{c.block_size}:]"
            )
        check_ids(
            idx, c.vocab_size, "token id", "is outside the vocabulary", "encode the text with the model's own tokenizer"
        )

    def embed(self, idx: Tensor, start: int | Tensor = 0) -> Tensor:
        """``f_pre`` of eqs. (83)/(88): ``f_embed(X) + E_pos`` for positions ``start .. start + n − 1`` (``start``
        a Python int, or a 0-d tensor on the device: compiled decoding's position)."""
        self.check_tokens(idx, start)
        n = idx.shape[1]
        if isinstance(start, Tensor):
            pos = start + torch.arange(n, device=idx.device)
        else:
            pos = torch.arange(start, start + n, device=idx.device)
        e_pos = self.wpe(pos) if self.wpe is not None else self.pos_table[pos]
        return self.drop(self.wte(idx) + e_pos)

    # ---------------------------------------------------------------- forward
    def forward_features(
        self, idx: Tensor, cache: list[dict[str, Tensor]] | None = None, key_mask: Tensor | None = None
    ) -> Tensor:
        """The last layer's tokens (b, n, d); ``key_mask`` (b, n) False at padding, which no token attends to."""
        z = self.embed(idx, cached_length(cache))
        if cache is None:
            return self.norm(self.run_layers(z, key_mask=key_mask))
        for layer, layer_cache in zip(self.layers, cache):
            # a fixed-size buffer (compiled decoding) hides its positions not yet filled
            mask = layer_cache.key_mask if isinstance(layer_cache, StaticLayerCache) else key_mask
            z = layer(z, cache=layer_cache, key_mask=mask)
        return self.norm(z)

    def forward_head(self, z: Tensor, pre_logits: bool = False) -> Tensor:
        """``f_head(Z) = W_head Z`` (eq. (84)) with ``W_head`` = the token embedding (tied)."""
        return z if pre_logits else F.linear(z, self.wte.weight)

    def forward(
        self,
        idx: Tensor | None = None,
        cache: list[dict[str, Tensor]] | None = None,
        *,
        labels: Tensor | None = None,
        input_ids: Tensor | None = None,
    ) -> Tensor | LMOutput:
        """Logits ``(b, n, V)``.  With ``cache`` (from :meth:`new_cache`, causal models), ``idx`` holds only
        the tokens after those already cached, which are appended to it.

        Hugging Face's call: ``input_ids`` is ``idx``; with ``labels`` (b, n) the result is an :class:`LMOutput`
        holding ``loss`` (:func:`lm_loss`: next token when causal, ``labels = idx``; masked tokens otherwise) and
        ``logits``.  Without ``labels`` the logits tensor itself, as always."""
        if cache is not None and not self.config.causal:
            raise ValueError("a key-value cache needs a causal (GPT) model; this one is bidirectional (BERT)")
        logits = self.forward_head(self.forward_features(lm_input(idx, input_ids), cache))
        return logits if labels is None else LMOutput(lm_loss(logits, labels, self.config.causal), logits)

    def forward_trace(self, idx: Tensor, return_attention: bool = False) -> Trace:
        """Every layer's tokens (``tokens[0]`` = ``f_pre(X)``), MSSA outputs and attention maps in one pass."""
        z = self.embed(idx)
        return Trace.of(self.layers, z, return_attention)

    def classify(self, idx: Tensor, lengths: Tensor | None = None) -> Tensor:
        """Sequence-classification logits ``(b, num_labels)`` (Table 5 fine-tuning).

        Sequences are right-padded; ``lengths`` are their true lengths.  A causal model pools its last real
        token (which has seen the whole text and no padding); a bidirectional one, whose attention is masked
        at the padding, the mean of its real tokens.  Padding therefore never changes the logits.
        """
        if self.classifier is None:
            raise ValueError("this model has no classification head; create it with num_labels > 0")
        b, n = idx.shape
        given = lengths  # no lengths: no padding, no mask (a mask, all true or not, costs no host sync)
        lengths = torch.full((b,), n, device=idx.device) if lengths is None else lengths.to(idx.device)
        real = torch.arange(n, device=idx.device)[None] < lengths[:, None]
        z = self.forward_features(idx, key_mask=None if self.config.causal or given is None else real)
        if self.config.causal:
            pooled = z[torch.arange(b, device=z.device), lengths - 1]
        else:
            keep = real.to(z.dtype)
            pooled = (z * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)
        return self.classifier(pooled)

    # ---------------------------------------------------------------- generation
    def new_cache(self) -> list[dict[str, Tensor]]:
        """An empty key-value cache (one dict per layer) for :meth:`forward`."""
        return [{} for _ in self.layers]

    generate = generate  # generation.generate: the tokens after idx (its docstring)

    # ---------------------------------------------------------------- utilities
    def num_params(self, trainable_only: bool = False, exclude_positions: bool = False) -> int:
        """Parameters (the tied head counted once); ``exclude_positions`` leaves out a learned position
        table, as GPT-2 / nanoGPT report and Table 10's CRATE-GPT count does."""
        n = super().num_params(trainable_only)
        return n - (self.wpe.weight.numel() if exclude_positions and self.wpe is not None else 0)

    @property
    def num_classes(self) -> int:
        """The labels of the sequence-classification head (timm's name for ``num_labels``; 0: none)."""
        return int(self.config.num_labels)

    def get_classifier(self) -> nn.Module | None:
        """The sequence-classification head (None when the model has none)."""
        return self.classifier

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh sequence-classification head for ``num_classes`` labels (1 = regression); it reads the features
        of the last real token when causal, the mean of the real tokens when not (:meth:`classify`), so
        ``global_pool`` can only be that (``"last"`` / ``"avg"``)."""
        self.refuse_pool(global_pool, "last" if self.config.causal else "avg")
        self.config = dataclasses.replace(self.config, num_labels=num_classes)
        ref = self.wte.weight
        self.classifier = nn.Linear(self.config.dim, num_classes).to(ref.device, ref.dtype)
        nn.init.normal_(self.classifier.weight, std=0.02)
        nn.init.zeros_(self.classifier.bias)


class CRATELanguageModel(LanguageModel):
    """CRATE-GPT (``causal=True``) / CRATE-BERT (``causal=False``): ``CRATELanguageModel(LMConfig(...))``."""

    arch = "crate_lm"


class GPT(LanguageModel):
    """The GPT-2 baseline (separate Q, K, V; GELU MLP; final LayerNorm when ``final_norm``)."""

    arch = "gpt"


def build_lm(config: LMConfig) -> LanguageModel:
    """The language model ``config.arch`` names: this class or the subclass that builds it (CRATE-BERT's
    :class:`~crate_transformer.models.bert.CRATEBert` once ``bert.py`` is imported, as ``import crate_transformer``
    does)."""
    return LanguageModel.class_for(config.arch)(config)


# --------------------------------------------------------------------------- the authors' and GPT-2 checkpoints
# Keys after the "_orig_mod." (torch.compile), "module." (DDP) and "transformer." prefixes are stripped; "{i}" is
# a layer index.  nanoGPT (karpathy/nanoGPT model.py) and Hugging Face's GPT2LMHeadModel share the names.
EMBED_KEY_MAP = [("wte.weight", "wte.weight"), ("wpe.weight", "wpe.weight"), ("ln_f.", "norm.")]
GPT2_KEY_MAP = EMBED_KEY_MAP + [
    ("h.{i}.ln_1.", "layers.{i}.norm1."),
    ("h.{i}.attn.c_attn.", "layers.{i}.attn.qkv."),
    ("h.{i}.attn.c_proj.", "layers.{i}.attn.proj."),
    ("h.{i}.ln_2.", "layers.{i}.norm2."),
    ("h.{i}.mlp.c_fc.", "layers.{i}.mlp.0."),
    ("h.{i}.mlp.c_proj.", "layers.{i}.mlp.3."),
]
# crate-lm/crate-lm crate.py and crate_overcomplete.py (the released CRATE-GPT): ista.weight is D (d × d) in
# crate.py and Dᵀ (m × d) in crate_overcomplete.py, whose weight codes and decodes.
CRATE_LM_KEY_MAP = EMBED_KEY_MAP + [
    ("h.{i}.prenorm_1.", "layers.{i}.norm1."),
    ("h.{i}.attn.c_attn.", "layers.{i}.attn.qkv."),
    ("h.{i}.attn.c_proj.", "layers.{i}.attn.proj."),
    ("h.{i}.prenorm_2.", "layers.{i}.norm2."),
    ("h.{i}.ista.weight", "layers.{i}.ista.weight"),
]
_HF_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
_NANOGPT_ARGS = {"n_layer": "depth", "n_embd": "dim", "block_size": "block_size", "vocab_size": "vocab_size"}
_PREFIXES = ("_orig_mod.", "module.", "transformer.")


def check_official_lm(config: LMConfig) -> None:
    """One-line ``ValueError`` for a config these checkpoints cannot fill: they are causal GPTs with a learned
    position table, and crate-lm's layers are the official form with a ReLU ISTA and ``p^{-1/2}``-scaled scores."""
    want = {"causal": True, "pos_embed": "learned", "num_labels": 0}
    if config.arch == "crate_lm":
        want.update(layer_form="official", ista_mode="relu", scale_scores=True)
    wrong = [f"{k}={getattr(config, k)!r}" for k, v in want.items() if getattr(config, k) != v]
    if wrong:
        example = "crate_gpt_12l_pile" if config.arch == "crate_lm" else "gpt2_base"
        raise ValueError(
            f"crate-lm / nanoGPT / GPT-2 checkpoints are causal GPTs with learned positions, not {', '.join(wrong)}; "
            f"pass a GPT name such as {example} and drop those overrides"
        )


def lm_state(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A nanoGPT-style state dict (crate-lm, nanoGPT, ToST's tost_lang) as the key maps expect it: prefixes
    stripped, the causal-mask buffers and the tied head dropped (a head that is not tied is refused)."""
    out = {}
    for key, value in state.items():
        while key.startswith(_PREFIXES):
            key = key.split(".", 1)[1]
        if not key.endswith((".attn.bias", ".attn.masked_bias")):  # causal-mask buffers, not parameters
            out[key] = value
    head = out.pop("lm_head.weight", None)
    if head is not None and "wte.weight" in out and not torch.equal(head, out["wte.weight"]):
        raise ValueError("the checkpoint's lm_head.weight differs from wte.weight; only tied heads load")
    return out


def _model_arg(model_args: Mapping[str, Any], arg: str) -> int:
    """A size in nanoGPT's ``model_args`` as an integer, or a one-line error naming the entry."""
    value = model_args[arg]
    if isinstance(value, bool) or not isinstance(value, int) and not (isinstance(value, str) and value.isdigit()):
        raise ValueError(
            f"the checkpoint's model_args hold {arg}={str(value)[:40]!r}, not a whole number; the file is damaged or "
            "was not written by nanoGPT / crate-lm"
        )
    return int(value)


def lm_checkpoint_fields(raw: object) -> dict[str, Any]:
    """The :class:`LMConfig` values a crate-lm / nanoGPT / GPT-2 file fixes (``OfficialFormat.fields``).

    Vocabulary, context and depth from the tensors; the head count, and with it the width, from nanoGPT's
    ``model_args`` (a Hugging Face state dict stores no head count, so the width then comes from the model
    name); crate-lm's ISTA variant (a ``d × d`` dictionary: ``crate.py``; ``m × d``: ``crate_overcomplete.py``)
    and final LayerNorm from the keys present; ``gelu="tanh"`` for the Hugging Face layout (overridable).
    """
    model_args = raw.get("model_args") if isinstance(raw, Mapping) else None
    model_args = model_args if isinstance(model_args, Mapping) else {}
    state = lm_state(unwrap(raw))
    if "wte.weight" not in state or "wpe.weight" not in state:
        raise ValueError("not a GPT-style language model: no wte.weight / wpe.weight (token and position tables)")
    (vocab, dim), block = state["wte.weight"].shape, state["wpe.weight"].shape[0]
    found: dict[str, Any] = {
        "vocab_size": vocab,
        "dim": dim,
        "block_size": block,
        "depth": index_count(state, r"h\.(\d+)\."),
    }
    for arg, name in _NANOGPT_ARGS.items():
        if model_args.get(arg) is not None and _model_arg(model_args, arg) != found[name]:
            raise ValueError(
                f"the checkpoint's model_args say {arg}={model_args[arg]} but its tensors have {name}={found[name]}; "
                "the file is inconsistent"
            )
    if model_args.get("n_head") is not None:
        found["heads"] = _model_arg(model_args, "n_head")
    else:
        del found["dim"]  # without the head count the name's width and heads apply (a mismatch is a shape error)
    ista = state.get("h.0.ista.weight")
    if ista is not None:
        atoms = ista.shape[0]
        found.update(mlp="ista" if atoms == dim else "ista_overcomplete", final_norm="ln_f.weight" in state)
        if atoms != dim:
            found["odl_ratio"] = max(atoms // dim, 1)
    else:
        found["final_norm"] = True
        if _is_hf_layout(state, dim):
            found["gelu"] = "tanh"  # OpenAI's GPT-2 (Hugging Face's default activation gelu_new)
    return found


# the attention tensors of a GPT-2 block (nanoGPT's and Hugging Face's names, the causal-mask buffers included): a
# block whose attention holds others (ToST's TSSA temperature and denominator bias) is another format
_GPT2_ATTENTION = tuple(f".attn.{n}" for n in ("c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"))
_GPT2_ATTENTION += (".attn.bias", ".attn.masked_bias")


def _only_gpt2_attention(state: Mapping[str, Tensor]) -> bool:
    return all(k.endswith(_GPT2_ATTENTION) for k in state if ".attn." in k)


def _has_token_table(state: Mapping[str, Tensor]) -> bool:
    return any(k.endswith("wte.weight") for k in state)


def _is_hf_layout(state: Mapping[str, Tensor], dim: int) -> bool:
    """Hugging Face's Conv1D stores ``c_attn.weight`` as ``(in, out) = (d, 3d)``; nanoGPT's Linear ``(3d, d)``."""
    return tuple(state.get("h.0.attn.c_attn.weight", torch.empty(0)).shape) == (dim, 3 * dim)


def crate_lm_to_native(state: Mapping[str, Tensor], config: LMConfig) -> dict[str, Tensor]:
    """crate-lm keys → native; ``crate_overcomplete.py`` stores ``Dᵀ`` (m × d), :class:`OvercompleteISTA` ``D``."""
    out = rename(lm_state(state), CRATE_LM_KEY_MAP, forward=True)
    if config.mlp == "ista_overcomplete":
        for i in range(config.depth):
            if f"layers.{i}.ista.weight" in out:
                out[f"layers.{i}.mlp.D"] = out.pop(f"layers.{i}.ista.weight").T.contiguous()
    return out


def gpt2_to_native(state: Mapping[str, Tensor], config: LMConfig) -> dict[str, Tensor]:
    """nanoGPT / Hugging Face GPT-2 keys → native.  Conv1D weights ``(in, out)`` are transposed; nanoGPT's
    ``bias=False`` models (no bias at all) get zero biases, the same function: a missing bias adds nothing.
    A checkpoint with only some biases is left as it is (the strict load names the missing ones)."""
    state = lm_state(state)
    if "wte.weight" in state and _is_hf_layout(state, state["wte.weight"].shape[-1]):
        state = {k: v.T.contiguous() if k.endswith(_HF_CONV1D) else v for k, v in state.items()}
    out = rename(state, GPT2_KEY_MAP, forward=True)
    if any(k.endswith(".bias") for k in state):
        return out
    for key in [k for k in out if k.endswith(".weight") and k.startswith(("layers.", "norm."))]:
        out[key.removesuffix("weight") + "bias"] = out[key].new_zeros(out[key].shape[0])
    return out


CRATE_LM_FORMAT = OfficialFormat(
    name="CRATE-GPT (crate-lm)",
    origin="crate-lm/crate-lm crate_overcomplete.py / crate.py, nanoGPT-style ckpt.pt",
    to_native=crate_lm_to_native,
    detect=lambda state: any(k.endswith(".ista.weight") for k in state) and _has_token_table(state),
    example="crate_gpt_12l_pile",
    check=check_official_lm,
    fields=lm_checkpoint_fields,
    unstored=HEADS_NOT_STORED,
    file_names={"heads": "model_args.n_head"},
)
GPT2_FORMAT = OfficialFormat(
    name="GPT-2",
    origin="karpathy/nanoGPT ckpt.pt, or Hugging Face GPT2LMHeadModel / GPT2Model weights",
    to_native=gpt2_to_native,
    detect=lambda state: any(k.endswith(".mlp.c_fc.weight") for k in state) and _only_gpt2_attention(state),
    example="gpt2_base",
    check=check_official_lm,
    fields=lm_checkpoint_fields,
    overridable=("gelu",),
    unstored=HEADS_NOT_STORED,
    file_names={"heads": "model_args.n_head"},
)


# --------------------------------------------------------------------------- registry entries
register_arch("crate_lm", CRATELanguageModel, official=CRATE_LM_FORMAT)
register_arch("gpt", GPT, official=GPT2_FORMAT)
# Language models, JMLR Table 10 (p.97).  The released CRATE-BERT is arch crate_bert (bert.py); crate_bert_eq83_* are
# the literal eqs. (83)-(84) form (sinusoidal E_pos, the head tied to the embedding and nothing else):
# 32,047,616 / 59,883,264 / 127,091,712 parameters.
# CRATE-GPT as the official nanoGPT-based code (V = 50,304, learned wpe, context 1,024).
# Parameters (tied head, position table excluded): GPT 59.9M / 241.6M (paper: 60M / 242M).  Table 10's "Small"
# GPT-2 (64M) has no CRATE entry; crate_gpt_small is CRATE at that width and depth.  gpt2_* are the GPT-2 baselines
# (124M / 774M with wpe; 64M "Small").
_BERT_EQ83 = dict(arch="crate_lm", causal=False, pos_embed="sinusoidal", vocab_size=50265, block_size=512)
_GPT = dict(vocab_size=50304, block_size=1024)
register_model("crate_bert_eq83_medium", **_BERT_EQ83, dim=512, depth=8, heads=8)
register_model("crate_bert_eq83_base", **_BERT_EQ83, dim=768, depth=12, heads=12)
register_model("crate_bert_eq83_large", **_BERT_EQ83, dim=1024, depth=24, heads=16)
register_model("crate_gpt_small", arch="crate_lm", **_GPT, dim=512, depth=12, heads=8)
register_model("crate_gpt_base", arch="crate_lm", **_GPT, dim=768, depth=12, heads=12)
register_model("crate_gpt_large", arch="crate_lm", **_GPT, dim=1280, depth=36, heads=20)
register_model("gpt2_small", arch="gpt", final_norm=True, **_GPT, dim=512, depth=12, heads=8)
register_model("gpt2_base", arch="gpt", final_norm=True, **{**_GPT, "vocab_size": 50257}, dim=768, depth=12, heads=12)
register_model("gpt2_large", arch="gpt", final_norm=True, **{**_GPT, "vocab_size": 50257}, dim=1280, depth=36, heads=20)
# OpenAI's GPT-2 medium and XL (gpt2_base and gpt2_large above are GPT-2 small and large): 354.8M / 1,557.6M.
_GPT2 = dict(arch="gpt", final_norm=True, vocab_size=50257, block_size=1024)
register_model("gpt2_medium", **_GPT2, dim=1024, depth=24, heads=16)
register_model("gpt2_xl", **_GPT2, dim=1600, depth=48, heads=25)
# The released crate-lm CRATE-GPT (Bai & Ma 2025; Hugging Face JackBAI/CRATE-GPT-12L-Pile-600000steps, file
# ckpt-crate-12l-overparam-600000.pt, trained on the Pile with crate-lm's crate_overcomplete.py): MSSA + the tied
# overcomplete ISTA (4d atoms, no residual) and a final LayerNorm; 81,934,848 parameters (81,148,416 without wpe).
register_model(
    "crate_gpt_12l_pile", arch="crate_lm", **_GPT, dim=768, depth=12, heads=12, mlp="ista_overcomplete", final_norm=True
)
# Laptop presets (the lm task's default: byte-level tokenizer, context 128, d = 128, 4 layers, 4 heads),
# and the GPT of the same width, depth and heads with a 4x GELU MLP (the README's comparison).
_MINI = dict(vocab_size=262, block_size=128, dim=128, depth=4, heads=4)
register_model("crate_gpt_mini", arch="crate_lm", **_MINI)
register_model("crate_bert_mini", arch="crate_lm", causal=False, pos_embed="sinusoidal", **_MINI)
register_model("gpt_mini", arch="gpt", final_norm=True, **_MINI)
register_pretrained(
    PretrainedSource(
        name="crate_gpt_12l_pile",
        title="CRATE-GPT 12 layers, overcomplete ISTA, the Pile (600k steps)",
        loader=CRATE_LM_FORMAT.name,
        filename="ckpt-crate-12l-overparam-600000.pt",
        repo_id="JackBAI/CRATE-GPT-12L-Pile-600000steps",
        input="GPT-2 BPE tokens, context 1024",
        classes="next token (vocabulary 50,304)",
        licence="not stated (the training code is MIT)",
        reference="github.com/crate-lm/crate-lm README.md (commit 3d5027b)",
    )
)
