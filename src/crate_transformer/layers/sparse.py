"""The sparsification step: CRATE's ISTA (eq. (44)) and its ablations (:class:`SoftISTA`, :class:`MMISTA`;
:class:`Skip`, no sparsification, Table 15), CRATE-α's overcomplete ISTA and the transformer MLP.

Each is a *second block* of :class:`~crate_transformer.layers.EncoderLayer`: it declares (:class:`SecondBlock`)
whether it adds to its input or replaces it, the attribute it is stored under (so state-dict keys never change) and
where its code is read, and it builds itself from a :class:`~crate_transformer.layers.LayerConfig` given whole."""

from __future__ import annotations

import weakref
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..objectives import full_precision
from .config import GELUS, LayerConfig

__all__ = ["SecondBlock", "ISTA", "SoftISTA", "MMISTA", "Skip", "MLP", "OvercompleteISTA", "TiedOvercompleteISTA"]


class SecondBlock:
    """What the layer asks of its second block, declared by each class and read once when the layer is built."""

    # Z_next = Z_half + f(LN2(Z_half)) (an MLP, CRATE-α's ODL), or f(LN2(Z_half)) (CRATE's ISTA, eq. (45))
    residual: ClassVar[bool] = False
    # the attribute the block is stored under, so the state-dict keys are the released ones (ista.* or mlp.*)
    state_key: ClassVar[str] = "mlp"
    # whether the block reads through LN2 at all (Skip has no LN2); the norms' eps and the attention's output bias
    # are the layer's settings (LayerConfig.ln_eps, LayerConfig.attention_bias), not the block's
    normed: ClassVar[bool] = True

    def code_site(self) -> tuple[nn.Module, str] | None:
        """Where the block's sparse code (or its MLP's units) is read: ``(module, unit kind)``, or None."""
        return None

    def output_bias(self, before: Tensor | None) -> Tensor | None:
        """The bias the layer adds unchanged to every output token, given the one added before this block."""
        return None


# --------------------------------------------------------------------------- ISTA
class Held:
    """ISTA's step matrix ``A`` held by :func:`~crate_transformer.layers.frozen_weights`, with what says which weights
    it is the product of: the parameter itself (a weak reference: a new ``Parameter`` is other weights), its version
    counter (bumped by every in-place change: ``add_``, ``copy_``, an optimizer's step, ``load_state_dict``) and
    its storage, kept alive so that a tensor put in its place (``param.data = …``, ``.to(dtype/device)``) cannot
    take its address.  ``compiled``: whether compiled code read ``A`` (a graph cannot read a version counter)."""

    __slots__ = ("weight", "version", "storage", "A", "compiled")

    def __init__(self, weight: Tensor, A: Tensor) -> None:
        self.weight, self.version, self.storage, self.A = weakref.ref(weight), weight._version, weight.detach(), A
        self.compiled = False

    def holds(self, weight: Tensor) -> bool:
        """Whether ``A`` is the product of ``weight`` as it is now: the same tensor, unchanged in place, on the
        same memory, device and dtype."""
        s = self.storage
        return (
            self.weight() is weight
            and weight._version == self.version
            and weight.data_ptr() == s.data_ptr()
            and weight.dtype == s.dtype
            and weight.device == s.device
        )


class ISTA(SecondBlock, nn.Module):
    """The sparsification step: one proximal-gradient step on the non-negative LASSO (42), eq. (44) (JMLR p.25;
    Alg. 3)::

        Z^{ℓ+1} = ReLU(Z + η Dᵀ(Z − D Z) − ηλ 1),   Z = Z^{ℓ+1/2}

    the official code's form, one step started from ``Z^{ℓ+1/2}`` itself.  Row tokens ``x`` get the pre-activation
    ``x A − ηλ`` with ``A = I + η (D − DᵀD)`` (:meth:`step_matrix`), computed whichever way costs fewer FLOPs for
    the ``n`` token rows (the results agree to float rounding):

    * **thin**: ``x + η (x − x Dᵀ) D``, two ``n × d × d`` matmuls: ``4nd²`` FLOPs, ``12nd²`` with the backward;
    * **fused**: ``x A``, one matmul after the token-independent ``DᵀD``: ``2nd² + 2d³``, ``6nd² + 6d³`` with
      the backward — cheaper from ``n = d`` rows on, with or without the backward.

    Inside :func:`~crate_transformer.layers.frozen_weights` (inference: generation, evaluation, the analysis) ``A``
    is computed once on entry and every forward through which no gradient flows to ``D`` pays ``2nd²``: a decoded
    token or a single image one matrix product.  The held ``A`` is tied to ``D`` itself (``Held``): a forward
    after ``D`` changed in any way recomputes it, and copies and pickles of the block never carry it.

    The ablations of the step (``ista_mode``, JMLR Tables 13 and 15) are their own blocks, each its entry of the
    layer's table :data:`~crate_transformer.layers.SECOND_BLOCKS`, picked once when the layer is built:
    :class:`SoftISTA` (``"soft"``), :class:`MMISTA` (``"mm"``) and :class:`Skip` (``"none"``).

    ``D`` is ``d×d``, kaiming-uniform initialised as in the official code; η and λ are
    configuration (saved with the model), not parameters.
    """

    state_key = "ista"
    mode: ClassVar[str] = "relu"  # the layer's ista_mode this block is (LayerConfig.second_block)

    def __init__(self, dim: int, eta: float = 0.1, lambd: float = 0.1) -> None:
        super().__init__()
        self.eta, self.lambd = eta, lambd
        self.weight = nn.Parameter(torch.empty(dim, dim))
        nn.init.kaiming_uniform_(self.weight)
        self.held: Held | None = None  # A while a frozen_weights context holds this block (never copied)

    @classmethod
    def from_config(cls, dim: int, c: LayerConfig) -> ISTA:
        return cls(dim, c.eta, c.lambd)

    def code_site(self) -> tuple[nn.Module, str]:
        return (self, "ista")

    def step_matrix(self) -> Tensor:
        """``A = I + η (D − DᵀD)`` such that the ISTA pre-activation of row tokens is ``x A − ηλ``."""
        D = self.weight
        # one product with its sum fused in (addmm): three kernels where I + η(D − DᵀD) written out takes five
        start = torch.eye(D.shape[0], dtype=D.dtype, device=D.device).add_(D, alpha=self.eta)
        return torch.addmm(start, D.T, D, alpha=-self.eta)

    @property
    def frozen(self) -> Tensor | None:
        """The held ``A`` (None while no :func:`~crate_transformer.layers.frozen_weights` holds the block)."""
        return None if self.held is None else self.held.A

    def freeze(self) -> None:
        """Hold ``A`` for the forwards to come (:func:`~crate_transformer.layers.frozen_weights`), in ``D``'s precision
        whatever the caller's autocast, with what ties it to ``D`` (``Held``).  Nothing is held for a weight whose
        changes cannot be seen: a sharded one (FSDP's ``DTensor``, whole only inside its forward) or an inference
        tensor (made under ``torch.inference_mode``: no version counter)."""
        D = self.weight
        if type(D.data) is not torch.Tensor or D.is_inference():
            self.held = None
            return
        with torch.no_grad(), full_precision(D):
            self.held = Held(D, self.step_matrix())

    def thaw(self) -> None:
        self.held = None

    def stale_read(self) -> str | None:
        """Why compiled code may have read a held ``A`` that is not ``D``'s own any more (None if it did not): it
        cannot check ``D``'s version, so a change of ``D`` is found at the next eager forward or on leaving the
        context, and refused then (:func:`~crate_transformer.layers.frozen_weights`)."""
        held = self.held
        if held is None or not held.compiled or held.holds(self.weight):
            return None
        return (
            "ISTA's weight changed inside frozen_weights while compiled code kept reading the step matrix held for "
            "the old weight (a compiled graph cannot check a weight's version), so its outputs since the change are "
            "stale; change weights outside the context, or leave it and enter it again after the change"
        )

    def held_product(self, D: Tensor | None = None) -> Tensor | None:
        """The held ``A`` for ``D`` (the block's weight, passed by a forward that has read it) as it is now,
        recomputed where ``D`` changed since it was computed; None outside the context and where a gradient flows to
        ``D`` (the product must be ``D``'s own).  Compiled code reads the held ``A`` unchecked (a version counter is
        not traceable) and says so (``Held.compiled``), so that a change of ``D`` after it is refused
        (:meth:`stale_read`) rather than used; an exported program never holds one."""
        held = self.held
        if held is None:
            return None
        D = self.weight if D is None else D
        if (torch.is_grad_enabled() and D.requires_grad) or torch.compiler.is_exporting():
            return None
        if torch.compiler.is_compiling():
            if held.storage.dtype != D.dtype or held.storage.device != D.device:
                return None  # a moved or cast model: its own product
            held.compiled = True
            return held.A
        if held.holds(D):
            return held.A
        if (stale := self.stale_read()) is not None:
            raise RuntimeError(stale)
        self.freeze()
        return self.frozen

    def __getstate__(self) -> dict[str, Any]:
        """The module's state without the held ``A``: a copy or a pickle taken inside the context (an EMA or
        best-model copy, ``torch.save(model)``) is not held, and computes its own product until it is."""
        state = super().__getstate__()
        state["held"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = {**state, "held": None}  # a whole-model pickle of an earlier version kept ``frozen`` (always None)
        state.pop("frozen", None)
        super().__setstate__(state)

    def forward(self, x: Tensor) -> Tensor:
        """Eq. (44): ``ReLU(x A − ηλ)`` of row tokens ``x`` (:meth:`preactivation`)."""
        return F.relu(self.preactivation(x))

    def preactivation(self, x: Tensor) -> Tensor:
        """``x A − ηλ`` (eq. (44) before the ReLU), by the kept ``A``, the thin or the fused product."""
        rows, D, bias = x.reshape(-1, x.shape[-1]), self.weight, -self.eta * self.lambd
        A = self.held_product(D)
        thin = rows.shape[0] < D.shape[0]  # thin is cheaper (class docstring)
        if isinstance(thin, torch.SymBool):  # a row count torch.export keeps dynamic: the fused form holds for
            thin = statically_known_true(thin)  # every count, where a guard on the count would fail the export
        if A is None and thin:
            return torch.addmm(rows + bias, rows - F.linear(rows, D), D, alpha=self.eta).view_as(x)
        # the bias as a row of d entries: a GPU's GEMM adds it in its epilogue (cuBLASLt); a (1,) bias would be
        # expanded into the whole output first and read back by the GEMM, two passes over n x d
        row = rows.new_full((D.shape[0],), bias)
        return torch.addmm(row, rows, self.step_matrix() if A is None else A).view_as(x)

    def extra_repr(self) -> str:
        return f"dim={self.weight.shape[0]}, eta={self.eta}, lambd={self.lambd}, mode={self.mode!r}"


class SoftISTA(ISTA):
    """The soft-threshold ablation (``ista_mode="soft"``, JMLR Table 13, p.100): eq. (44)'s pre-activation
    through ``S_{ηλ}(u) = sign(u) max(|u| − ηλ, 0)`` instead of the ReLU, the threshold applied to
    ``Z + η Dᵀ(Z − D Z)`` (:meth:`ISTA.preactivation` adds ``−ηλ``, added back here)."""

    mode = "soft"

    def forward(self, x: Tensor) -> Tensor:
        t = self.eta * self.lambd
        u = self.preactivation(x) + t
        return torch.sign(u) * F.relu(u.abs() - t)


class MMISTA(ISTA):
    """The majorisation-minimisation ablation (``ista_mode="mm"``): the step of eq. (123), JMLR p.62, with
    ``α = d/(n ε²)`` for ``n`` tokens of width ``d``: ``ReLU((1 + 4/(9(1+α))) Dᵀz − 4λ/(9α))`` (row tokens:
    ``x D``).  ``eps`` is ε (the layer's ``eps``)."""

    mode = "mm"

    def __init__(self, dim: int, eta: float = 0.1, lambd: float = 0.1, eps: float = 0.1) -> None:
        super().__init__(dim, eta, lambd)
        self.eps = eps

    @classmethod
    def from_config(cls, dim: int, c: LayerConfig) -> MMISTA:
        return cls(dim, c.eta, c.lambd, c.eps)

    def forward(self, x: Tensor) -> Tensor:
        n, d = x.shape[-2], x.shape[-1]
        alpha = d / (n * self.eps**2)
        return F.relu((1 + 4 / (9 * (1 + alpha))) * (x @ self.weight) - 4 * self.lambd / (9 * alpha))


class Skip(SecondBlock, nn.Module):
    """No sparsification (``ista_mode="none"``, Tables 15-16): ``Z_next = Z_half``.  The layer reads it without
    a LayerNorm, and it has no parameters; files saved while the layer kept an unused ISTA block and LN2 still load
    (their keys are dropped, :attr:`obsolete`)."""

    state_key = "ista"
    normed = False
    obsolete: ClassVar[tuple[str, ...]] = ("ista.weight", "norm2.weight", "norm2.bias")

    @classmethod
    def from_config(cls, dim: int, c: LayerConfig) -> Skip:
        return cls()

    def forward(self, x: Tensor) -> Tensor:
        return x

    def output_bias(self, before: Tensor | None) -> Tensor | None:
        return before


class MLP(SecondBlock, nn.Sequential):
    """The transformer MLP ``Linear(d, h) → GELU → Dropout → Linear(h, d)``, ``h = int(d·mlp_ratio)``
    (ViT; CRATE-MLP of JMLR Table 17).  A ``Sequential``, so its keys are ``0.*`` and ``3.*`` (timm-like).
    ``gelu="tanh"`` is the tanh approximation OpenAI's GPT-2 was trained with (HF's ``gelu_new``); ``bias=False``
    leaves out both biases (nanoGPT's ``bias=False`` models)."""

    def __init__(
        self, dim: int, mlp_ratio: float = 4.0, dropout: float = 0.0, gelu: str = "exact", bias: bool = True
    ) -> None:
        if gelu not in GELUS:
            raise ValueError(f"unknown gelu {gelu!r}; choose one of {GELUS}")
        hidden = int(dim * mlp_ratio)
        act = nn.GELU(approximate="tanh" if gelu == "tanh" else "none")
        super().__init__(nn.Linear(dim, hidden, bias=bias), act, nn.Dropout(dropout), nn.Linear(hidden, dim, bias=bias))

    residual = True

    @classmethod
    def from_config(cls, dim: int, c: LayerConfig) -> MLP:
        return cls(dim, c.mlp_ratio, c.dropout, c.gelu)

    def code_site(self) -> tuple[nn.Module, str]:
        return (self[1], "mlp")  # the GELU's output: the MLP's units

    def output_bias(self, before: Tensor | None) -> Tensor | None:
        return self[3].bias


class OvercompleteISTA(SecondBlock, nn.Module):
    """CRATE-α's sparse-coding block (Yang et al. 2024, "Scaling White-Box Transformers for Vision", §3).

    Three changes to CRATE's ISTA, which is how CRATE was scaled to ImageNet-21K / CLIP sizes:
    an **overcomplete** dictionary ``D ∈ R^{d×m}``, ``m = ratio·d`` (default 4); two ISTA steps started
    from zero instead of one step started from the input; a **decoupled** decoder dictionary ``D1``
    mapping the sparse code back to ``R^d``.  The layer adds the input back (a residual, see
    :class:`EncoderLayer`).  Row form of :func:`odl_reference`; parameters ``D``, ``D1`` as in the
    official ``torch_inference/model/crate_alpha.py`` (kaiming-uniform).

    ``tied=True`` is the overcomplete ISTA of the crate-lm language models (Bai & Ma 2025, "Improving
    Neuron-level Interpretability with White-box Language Models"): the same two steps, decoded with ``D``
    itself (``D1 = D``, no second dictionary; ``odl_reference(Z, D, D)``), initialised as the official
    ``crate_overcomplete.py`` (kaiming-uniform on the ``m × d`` matrix ``Dᵀ``).
    """

    residual = True

    def __init__(self, dim: int, ratio: int = 4, eta: float = 0.1, lambd: float = 0.1, tied: bool = False) -> None:
        super().__init__()
        self.eta, self.lambd = eta, lambd
        if tied:
            self.D = nn.Parameter(nn.init.kaiming_uniform_(torch.empty(ratio * dim, dim)).T.contiguous())
            self.D1 = None
            return
        self.D = nn.Parameter(torch.empty(dim, ratio * dim))
        self.D1 = nn.Parameter(torch.empty(dim, ratio * dim))
        nn.init.kaiming_uniform_(self.D)
        nn.init.kaiming_uniform_(self.D1)

    @classmethod
    def from_config(cls, dim: int, c: LayerConfig) -> OvercompleteISTA:
        return cls(dim, c.odl_ratio, c.eta, c.lambd)

    def code_site(self) -> tuple[nn.Module, str]:
        return (self, "odl")

    def code(self, x: Tensor) -> Tensor:
        """The sparse code ``A2`` of row tokens ``x`` (…, d) → (…, m).

        Four thin matmuls, each with its scaling and shift fused in (``addmm``); nothing here is independent of
        the tokens (a Gram matrix ``DᵀD`` would be ``m × m``, costlier than the two products it replaces)."""
        rows, D, shift = x.reshape(-1, x.shape[-1]), self.D, -self.eta * self.lambd
        # the shift as a bias row: a GPU's GEMM adds it in its epilogue (ISTA.preactivation)
        a1 = torch.addmm(rows.new_full(D.shape[1:], shift), rows, D, alpha=self.eta).relu_()
        residual = torch.addmm(rows, a1, D.T, beta=-1)  # D A1 − Z in row form
        return torch.addmm(a1 + shift, residual, D, alpha=-self.eta).relu_().view(*x.shape[:-1], -1)

    def forward(self, x: Tensor) -> Tensor:
        return self.code(x) @ (self.D if self.D1 is None else self.D1).T

    def extra_repr(self) -> str:
        d, m = self.D.shape
        return f"dim={d}, atoms={m}, eta={self.eta}, lambd={self.lambd}, tied={self.D1 is None}"


class TiedOvercompleteISTA(OvercompleteISTA):
    """The crate-lm language models' sparsification step: :class:`OvercompleteISTA` with one tied dictionary
    (``tied=True``) which, like CRATE's ISTA, **replaces** the tokens: ``Z_next = ODL(LN2(Z_half))``."""

    residual = False

    def __init__(self, dim: int, ratio: int = 4, eta: float = 0.1, lambd: float = 0.1) -> None:
        super().__init__(dim, ratio, eta, lambd, tied=True)

    def code_site(self) -> tuple[nn.Module, str]:
        return (self, "ista_overcomplete")
