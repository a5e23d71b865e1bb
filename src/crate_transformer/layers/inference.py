"""Inference with the weights held still: :func:`frozen_weights`.

A product of the weights alone — ISTA's ``A = I + η (D − DᵀD)`` (eq. (44)) — is the same for every input while the
weights do not change, so inference (decoding a token, a single image, the analysis) need not recompute it at
every forward.  Rather than guessing when that is safe, the caller says so: inside ``with frozen_weights(model):``
each such block computes its product once, on entry, and drops it on exit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["frozen_weights", "evaluating"]


@contextmanager
def frozen_weights(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, forwards of ``model`` reuse the products of its weights (each ISTA's step matrix ``A``).

    The caller promises that the weights, their device and their dtype do not change inside: load, train, move or
    cast the model outside it.  A forward through which a gradient flows to a weight (``requires_grad`` with grad
    mode on) still computes its own product, so gradients are always the weights' own; gradients with respect to
    the input flow through the kept product.  Blocks already held by an enclosing ``frozen_weights`` are left to
    it.  Entered by ``generate``, evaluation, the analysis and the benchmarks::

        with ct.frozen_weights(model.eval()), torch.no_grad():
            logits = model(image[None])
    """
    held = [m for m in model.modules() if callable(getattr(m, "freeze", None)) and getattr(m, "frozen", 0) is None]
    try:
        for module in held:
            module.freeze()
        yield model
    finally:
        for module in held:
            module.thaw()


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode with its weights held (:func:`frozen_weights`) for the block, and its training mode
    restored afterwards: how evaluation, generation and the analysis run a model (they add ``torch.no_grad``)."""
    was_training = model.training
    model.eval()
    try:
        with frozen_weights(model):
            yield model
    finally:
        model.train(was_training)
