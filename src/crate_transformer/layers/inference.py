"""Inference with the weights held still: :func:`frozen_weights`.

A product of the weights alone — ISTA's ``A = I + η (D − DᵀD)`` (eq. (44)) — is the same for every input while the
weights do not change, so inference (decoding a token, a single image, the analysis) need not recompute it at
every forward.  Rather than guessing when that is wanted, the caller says so: inside ``with frozen_weights(model):``
each such block computes its product on entry and drops it on exit.  The product is tied to the weights it was
computed from (the parameter, its version counter, its memory, device and dtype; ``ISTA.held_product``): a forward
after the weights changed in any way recomputes it, and a copy or pickle of the model taken inside carries none, so a
held product is never used for other weights.

:func:`traced_images` is the input boundary of an exported program (``torch.export``): the cast and check the eager
model makes of its images, kept in the graph."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

__all__ = ["frozen_weights", "evaluating", "traced_images"]


@contextmanager
def frozen_weights(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, forwards of ``model`` reuse the products of its weights (each ISTA's step matrix ``A``).

    The weights may change inside (an optimizer step, ``load_state_dict``, ``param.data = …``, ``.double()``): the
    next forward sees it (a changed version counter, parameter or memory) and recomputes the product, which costs
    one ``d × d`` product again; copies of the model made inside (``copy.deepcopy``, ``torch.save(model)``) hold
    nothing until a context holds them.  A forward through which a gradient flows to a weight (``requires_grad``
    with grad mode on) computes its own product, so gradients are always the weights' own; gradients with respect
    to the input flow through the kept product.  Compiled code (``torch.compile``) reads the held product
    unchecked, as a graph cannot read a version counter: a weight changed while compiled code reads it is refused,
    a one-line ``RuntimeError`` at the next eager forward or on leaving the context, never left stale.  An
    exported program (``torch.export``) holds nothing.  Blocks already held by an enclosing ``frozen_weights`` are
    left to it.  Entered by ``generate``, evaluation, the analysis and the benchmarks::

        with ct.frozen_weights(model.eval()), torch.no_grad():
            logits = model(image[None])
    """
    held = [m for m in model.modules() if callable(getattr(m, "freeze", None)) and getattr(m, "frozen", 0) is None]
    left = False
    try:
        for module in held:
            module.freeze()
        yield model
        left = True
    finally:
        # a change of the weights that compiled code inside may have read past is refused, never left silent
        stale = [why for m in held if left and callable(getattr(m, "stale_read", None)) and (why := m.stale_read())]
        for module in held:
            module.thaw()
    if stale:
        raise RuntimeError(stale[0])


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


def traced_images(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Images ``x`` in ``dtype`` inside a program traced by ``torch.export`` (docs/export.md), as the eager model
    takes them: floating images of any dtype cast to the parameters' (float64 images work), integer or boolean ones
    refused in one line.  The eager checks read the dtype, which a graph cannot: the program casts with
    ``_to_copy`` (``Tensor.to`` is traced as an assertion that the dtype is the traced one) and checks with a
    device-side assertion, kept by the program as the language models' token check is: ``full_like(x, 0.5)`` is
    0.5 only in a floating dtype."""
    probe = torch.full_like(x[:1, :1, :1, :1], 0.5)
    torch._assert_async(
        (probe == 0.5).all(),
        "expected floating-point images, got integer ones; convert with x.float() / 255 and normalise",
    )
    return torch.ops.aten._to_copy.default(x, dtype=dtype)
