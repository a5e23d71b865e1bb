"""The token prior of an untrained language model (:meth:`TokenPrior.init_token_prior`): a mixin of
:class:`~crate_transformer.models.lm.LanguageModel`, which has the token embedding ``wte``, the ``layers``, the final
``norm`` and ``forward_features`` it reads."""

from __future__ import annotations

import torch
from torch import Tensor

from ..layers.inference import evaluating

__all__ = ["TokenPrior"]


class TokenPrior:
    """Setting a language model's initial predictions to the token frequencies (see :meth:`init_token_prior`)."""

    def _logit_bias(self) -> Tensor | None:
        """A bias on the token logits ``(V,)``, or None: the tied head of eq. (84) has none."""
        return None

    def _feature_bias(self) -> Tensor | None:
        """A bias adding a constant vector to the features the head reads: the final LayerNorm's, else the last
        layer's ``output_bias()`` (None when the last layer replaces the tokens, as CRATE's ISTA does, or says
        nothing of one)."""
        bias = getattr(self.norm, "bias", None)
        if bias is not None:
            return bias
        output_bias = getattr(self.layers[-1], "output_bias", None)
        return output_bias() if output_bias is not None else None

    @torch.no_grad()
    def init_token_prior(self, log_prior: Tensor, idx: Tensor) -> bool:
        """Make the untrained model predict the token distribution ``softmax(log_prior)`` (``(V,)``, e.g. the
        training tokens' log frequencies), measured on the token ids ``idx`` ``(b, n)``; True when done.

        Without it, training first learns the token frequencies, and a model whose head has no bias learns them by
        making its features the same for every token: in CRATE-GPT the first layer's MSSA output outgrows the token
        embedding, each later LayerNorm passes a nearly token-independent vector and the lower layers' gradients
        shrink, so the loss sits near the unigram entropy (docs/language-models.md; this is the "initialise the
        output bias to the log prior" advice of Karpathy's "A Recipe for Training Neural Networks", 2019).

        A logit bias is set to the centred log prior.  A tied head gets ``ℓ_v / s`` added to every coordinate of
        row ``v`` of the embedding, ``s`` the mean over ``idx``'s tokens of the head's features summed over
        coordinates: the logits move by ``ℓ_v`` while the layers, which read the embedding through LayerNorm (it
        removes a constant vector), are unchanged.  When the features have no such constant part (a final
        LayerNorm, a residual last layer), the bias that adds one is set to 1 first; False (nothing changed) when
        there is none (CRATE-α's ODL).
        """
        ell = torch.log_softmax(log_prior.double(), 0)
        ell = (ell - (ell.exp() * ell).sum()).float()  # centred on the prior's mean: frequent tokens move least
        bias = self._logit_bias()
        if bias is not None:
            bias.copy_(ell.to(bias))
            return True
        s = self._feature_sums(idx)
        if not s.mean() > 4 * s.std(correction=0):  # no part of the features constant over tokens to carry the prior
            channel = self._feature_bias()
            if channel is None:
                return False
            channel.fill_(1.0)
            s = self._feature_sums(idx)
        self.wte.weight.add_((ell / s.mean()).to(self.wte.weight)[:, None])
        return True

    def _feature_sums(self, idx: Tensor) -> Tensor:
        """The head's features of every token of ``idx`` summed over coordinates (eval mode: no dropout)."""
        with evaluating(self):
            return self.forward_features(idx).float().sum(-1).flatten()
