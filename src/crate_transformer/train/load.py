"""``load_model`` at the path it had while it lived with the trainer; it is
:func:`crate_transformer.checkpoint.load_model` (also ``ct.load_model``), beside the other loaders, and reads the
run layout through :mod:`crate_transformer.runfiles`."""

from __future__ import annotations

from ..checkpoint import load_model

__all__ = ["load_model"]
