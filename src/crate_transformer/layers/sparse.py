"""The sparsification step: CRATE's ISTA (eq. (44)), CRATE-α's overcomplete ISTA, the transformer MLP."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.optim.optimizer import register_optimizer_step_post_hook

ISTA_MODES = ("relu", "soft", "mm", "none")
GELUS = ("exact", "tanh")  # the MLP's GELU: erf (nanoGPT, timm) | tanh approximation (OpenAI / HF GPT-2)

# --------------------------------------------------------------------------- ISTA
# Optimizer steps taken in this process (every torch.optim optimizer).  A fused optimizer (``fused=True``) writes
# the parameters without bumping their version counters, so a version alone cannot prove a weight unchanged.
_optimizer_steps = 0


def _count_optimizer_step(*_: Any) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)


def reusable_weight(w: Tensor) -> bool:
    """Whether a product of the parameter ``w`` computed in this forward may be kept for later ones.

    Only where no gradient flows to ``w`` (grad mode off), on a trainable ``nn.Parameter`` of a real device,
    outside compilation, tracing, CUDA-graph capture, ``torch.func`` transforms, dispatch modes (FakeTensorMode,
    FLOP counters) and a process group (FSDP and DeepSpeed write gathered weights in place, unseen).  Frozen
    parameters (``requires_grad=False``: EMA copies, DINO teachers) are excluded because EMA code commonly
    updates them through ``.data``, which no version counter sees.
    """
    if torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.is_grad_enabled() or not w.requires_grad:
        return False
    if type(w) is not nn.Parameter or w.device.type == "meta" or w.is_inference():
        return False
    if w.is_cuda and torch.cuda.is_current_stream_capturing():  # a graph would replay the kept matrix, stale
        return False
    if torch._C._are_functorch_transforms_active() or torch._C._len_torch_dispatch_stack():
        return False
    return not (torch.distributed.is_available() and torch.distributed.is_initialized())


class ISTA(nn.Module):
    """The sparsification step: one proximal-gradient step on the non-negative LASSO (42).

    ``mode="relu"`` (default, eq. (44), JMLR p.25; Alg. 3): ``ReLU(Z + η Dᵀ(Z − D Z) − ηλ)``.  Row tokens
    ``x`` get the pre-activation ``x A − ηλ`` with ``A = I + η (D − DᵀD)`` (:meth:`step_matrix`), computed
    whichever way costs fewer FLOPs for the ``n`` token rows (the results agree to float rounding):

    * **thin**: ``x + η (x − x Dᵀ) D``, two ``n × d × d`` matmuls: ``4nd²`` FLOPs, ``12nd²`` with the backward;
    * **fused**: ``x A``, one matmul after the token-independent ``DᵀD``: ``2nd² + 2d³``, ``6nd² + 6d³`` with
      the backward — cheaper from ``n = d`` rows on, with or without the backward.

    When no gradient flows to ``D`` (:func:`reusable_weight`: inference, generation, analysis) ``A`` is
    computed once and reused by later forwards, so a decoded token or a single image pays ``2nd²``.  It is
    rebuilt whenever ``D`` or η may have changed: an in-place write PyTorch tracks (version counter:
    ``load_state_dict``, ``copy_``, optimizers, EMA updates), a new tensor or storage for ``D`` (``.to()``,
    ``.half()``, ``assign=True`` loads), any optimizer step (fused ones bypass the version counter),
    ``train()``/``eval()``, and any forward through which a gradient flows to ``D``.  Writes through ``.data``
    are invisible to PyTorch; switch the mode (``model.eval()``) after one.  The matrix is a plain attribute:
    not in ``state_dict``, not copied or pickled.

    Ablations:

    * ``"soft"`` — soft threshold ``S_{ηλ}`` instead of ReLU (Table 13, JMLR p.100);
    * ``"mm"``   — the majorisation-minimisation step of eq. (123), JMLR p.62, with
      ``α = d/(n ε²)``: ``ReLU((1 + 4/(9(1+α))) Dᵀz − 4λ/(9α))``;
    * ``"none"`` — no sparsification (Table 15); the layer skips this block.

    ``D`` is ``d×d``, kaiming-uniform initialised as in the official code; η and λ are
    configuration (saved with the model), not parameters.
    """

    def __init__(self, dim: int, eta: float = 0.1, lambd: float = 0.1, mode: str = "relu", eps: float = 0.1) -> None:
        super().__init__()
        if mode not in ISTA_MODES:
            raise ValueError(f"unknown ISTA mode {mode!r}; choose one of {ISTA_MODES}")
        self.eta, self.lambd, self.mode, self.eps = eta, lambd, mode, eps
        self.weight = nn.Parameter(torch.empty(dim, dim))
        nn.init.kaiming_uniform_(self.weight)
        self._kept: tuple | None = None  # (D, its key, A, D's storage) of the last reusable forward

    def step_matrix(self) -> Tensor:
        """``A = I + η (D − DᵀD)`` such that the ISTA pre-activation of row tokens is ``x A − ηλ``."""
        D = self.weight
        eye = torch.eye(D.shape[0], dtype=D.dtype, device=D.device)
        return eye + self.eta * (D - D.T @ D)

    def kept_step_matrix(self) -> Tensor | None:
        """``A`` for a forward through which no gradient flows, computed once and reused while ``D`` and η are
        unchanged (see the class docstring); None where :func:`reusable_weight` says reuse is not safe."""
        w = self.weight
        if not reusable_weight(w):
            return None
        # the stream: a matrix computed on one CUDA stream is not ready on another without a synchronisation
        stream = torch.cuda.current_stream(w.device).cuda_stream if w.is_cuda else None
        key = (w._version, w.data_ptr(), w.dtype, w.device, stream, self.eta, _optimizer_steps)
        kept = self._kept
        if kept is not None and kept[0] is w and kept[1] == key:
            return kept[2]
        with torch.autocast(w.device.type, enabled=False):  # full precision whatever the caller's autocast
            A = self.step_matrix()
        self._kept = (w, key, A, w.detach())  # holding D's storage: no later tensor can take its address
        return A

    def forward(self, x: Tensor) -> Tensor:
        if self.mode == "mm":
            n, d = x.shape[-2], x.shape[-1]
            alpha = d / (n * self.eps**2)
            return F.relu((1 + 4 / (9 * (1 + alpha))) * (x @ self.weight) - 4 * self.lambd / (9 * alpha))
        rows, D, bias = x.reshape(-1, x.shape[-1]), self.weight, -self.eta * self.lambd
        A = self.kept_step_matrix()
        if A is None and torch.is_grad_enabled() and D.requires_grad:
            self._kept = None  # D is being trained: what was kept may be stepped past unseen
        thin = rows.shape[0] < D.shape[0]  # thin is cheaper (class docstring)
        if isinstance(thin, torch.SymBool):  # a row count torch.export keeps dynamic: the fused form holds for
            thin = statically_known_true(thin)  # every count, where a guard on the count would fail the export
        if A is None and thin:
            pre = torch.addmm(rows + bias, rows - F.linear(rows, D), D, alpha=self.eta).view_as(x)
        else:
            pre = torch.addmm(x.new_full((1,), bias), rows, self.step_matrix() if A is None else A).view_as(x)
        if self.mode == "soft":
            return torch.sign(pre + self.eta * self.lambd) * F.relu(
                (pre + self.eta * self.lambd).abs() - self.eta * self.lambd
            )
        return F.relu(pre)

    def train(self, mode: bool = True) -> ISTA:
        self._kept = None
        return super().train(mode)

    def _apply(self, fn: Any, recurse: bool = True) -> ISTA:
        self._kept = None  # .to(), .half(), .cuda(), share_memory(): D gets new storage
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_kept": None}  # copies and pickles recompute it

    def extra_repr(self) -> str:
        return f"dim={self.weight.shape[0]}, eta={self.eta}, lambd={self.lambd}, mode={self.mode!r}"


class MLP(nn.Sequential):
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


class OvercompleteISTA(nn.Module):
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

    def code(self, x: Tensor) -> Tensor:
        """The sparse code ``A2`` of row tokens ``x`` (…, d) → (…, m).

        Four thin matmuls, each with its scaling and shift fused in (``addmm``); nothing here is independent of
        the tokens (a Gram matrix ``DᵀD`` would be ``m × m``, costlier than the two products it replaces)."""
        rows, D, shift = x.reshape(-1, x.shape[-1]), self.D, -self.eta * self.lambd
        a1 = torch.addmm(rows.new_full((1,), shift), rows, D, alpha=self.eta).relu_()
        residual = torch.addmm(rows, a1, D.T, beta=-1)  # D A1 − Z in row form
        return torch.addmm(a1 + shift, residual, D, alpha=-self.eta).relu_().view(*x.shape[:-1], -1)

    def forward(self, x: Tensor) -> Tensor:
        return self.code(x) @ (self.D if self.D1 is None else self.D1).T

    def extra_repr(self) -> str:
        d, m = self.D.shape
        return f"dim={d}, atoms={m}, eta={self.eta}, lambd={self.lambd}, tied={self.D1 is None}"
