"""CRATE's layers (JMLR §2.3-2.5 and §3.5) and ToST's compression step (TSSA, Wu et al., ICLR 2025).

Tokens are rows, ``x`` of shape ``(b, n, d)``.  A module's weight ``W`` acts as ``F.linear(x, W) = x Wᵀ``,
i.e. as ``W z`` on a column token ``z``, so ``MSSA.qkv.weight`` is ``[U_1ᵀ; …; U_Kᵀ]`` and
``ISTA.weight`` is the dictionary ``D``.

Each module has a fast path (what ``forward`` runs) and the plain transcription of the paper's equations as a
free function in :mod:`.reference` (:func:`mssa_reference`, :func:`ista_reference`, :func:`tssa_reference`), which
the tests compare against and the theory lab uses directly.

* :mod:`.reference` — the equations, column form; :mod:`.config` — :class:`LayerConfig`, the layer's settings;
  :mod:`.attention` — MSSA, MHSA, the cache; :mod:`.tssa` — ToST's TSSA; :mod:`.sparse` — ISTA and its ablations, the
  overcomplete ISTA, the MLP, Skip; :mod:`.block` — the encoder layer built from the two tables
  :data:`ATTENTIONS` and :data:`SECOND_BLOCKS`, the decoder layer, stochastic depth, :func:`trace_layer`;
  :mod:`.inference` — :func:`frozen_weights`.
"""

from __future__ import annotations

from .attention import MHSA, MSSA, attend, cache_append
from .block import (
    ATTENTIONS,
    SECOND_BLOCKS,
    DecoderLayer,
    DropPath,
    EncoderLayer,
    drop_path_rates,
    set_drop_path,
    trace_layer,
)
from .config import DIM_HEAD, GELUS, ISTA_MODES, LAYER_FORMS, MLPS, LayerConfig
from .inference import evaluating, frozen_weights
from .reference import ista_reference, mssa_reference, odl_reference, ssa_reference, tssa_reference
from .sparse import ISTA, MLP, MMISTA, OvercompleteISTA, SecondBlock, Skip, SoftISTA, TiedOvercompleteISTA
from .tssa import TSSA

__all__ = [
    "ISTA_MODES",
    "LAYER_FORMS",
    "MSSA",
    "TSSA",
    "ISTA",
    "SoftISTA",
    "MMISTA",
    "MHSA",
    "MLP",
    "OvercompleteISTA",
    "TiedOvercompleteISTA",
    "Skip",
    "SecondBlock",
    "EncoderLayer",
    "LayerConfig",
    "DecoderLayer",
    "ssa_reference",
    "mssa_reference",
    "tssa_reference",
    "ista_reference",
    "attend",
    "cache_append",
    "odl_reference",
    "ATTENTIONS",
    "SECOND_BLOCKS",
    "MLPS",
    "GELUS",
    "DIM_HEAD",
    "DropPath",
    "drop_path_rates",
    "set_drop_path",
    "trace_layer",
    "frozen_weights",
    "evaluating",
]
