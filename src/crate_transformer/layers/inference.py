"""Inference with the weights held still: :func:`frozen_weights`.

A product of the weights alone — ISTA's ``A = I + η (D − DᵀD)`` (eq. (44)) — is the same for every input while the
weights do not change, so inference (decoding a token, a single image, the analysis) need not recompute it at
every forward.  Rather than guessing when that is wanted, the caller says so: inside ``with frozen_weights(model):``
each such block computes its product on entry and drops it on exit.  The product is tied to the weights it was
computed from (the parameter, its version counter, its memory, device and dtype; ``ISTA.held_product``): a forward
after the weights changed in any way recomputes it, and a copy or pickle of the model taken inside carries none, so a
held product is never used for other weights."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn

__all__ = ["frozen_weights", "evaluating"]


@contextmanager
def frozen_weights(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, forwards of ``model`` reuse the products of its weights (each ISTA's step matrix ``A``).

    The weights may change inside (an optimizer step, ``load_state_dict``, ``param.data = …``, ``.double()``): the
    next forward sees it (a changed version counter, parameter or memory) and recomputes the product, which costs
    one ``d × d`` product again; copies of the model made inside (``copy.deepcopy``, ``torch.save(model)``) hold
    nothing until a context holds them.  A forward through which a gradient flows to a weight (``requires_grad``
    with grad mode on) computes its own product, so gradients are always the weights' own; gradients with respect
    to the input flow through the kept product.  Compiled code (torch.compile, torch.export) computes its own
    product too: the version counter cannot be read inside a graph.  Blocks already held by an enclosing
    ``frozen_weights`` are left to it.  Entered by ``generate``, evaluation, the analysis and the benchmarks::

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
