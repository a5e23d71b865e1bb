"""Is the CRATE-MAE decoder the structured inverse of its encoder?  (JMLR §3.5, eqs. (62)-(64), p.34; Remark 7)

Decoder layer ``g^{L-1-ℓ}`` is derived to undo encoder layer ``f^ℓ``: first ISTA with the linear
``E``, then compression with the subtracted MSSA.  On unmasked images we trace the encoder
(``Z^0 = f_pre(X)``, ``Z^{ℓ+1} = f^ℓ(Z^ℓ)``) and the decoder from the encoder's output
(``D^0 = LN(Z^L)``, ``D^{j+1} = g^j(D^j)``) and report, per encoder layer ℓ, the mean token cosine
similarity (scale-free, since every layer starts with a LayerNorm) of

* ``cos_chain``    — ``D^{L-ℓ}`` (the decoder's reconstruction of ``Z^ℓ``, chained from the top) vs ``Z^ℓ``;
* ``cos_local``    — ``g^{L-1-ℓ}(Z^{ℓ+1})`` (one decoder layer on the true ``Z^{ℓ+1}``) vs ``Z^ℓ``;
* ``cos_identity`` — ``Z^{ℓ+1}`` vs ``Z^ℓ``: the do-nothing baseline a layer-wise inverse must beat.

``cos_local > cos_identity`` says decoder layer ``L-1-ℓ`` maps the encoder's output of layer ℓ back
toward its input; ``cos_chain`` says how much of that survives composition.  Nothing ties the
decoder's coordinates to the encoder's (no weight tying, Remark 7), so an inverse may hold only up to
a linear change of basis: ``r2_chain`` (and the baseline ``r2_identity``) is the held-out R² of the
ridge least-squares affine map from ``D^{L-ℓ}`` (resp. ``Z^{ℓ+1}``) to ``Z^ℓ``, fitted on the tokens of half
the images and scored on the other half.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..layers.inference import evaluating
from ..models.contract import MASKED_AUTOENCODER
from ._common import eval_trace

__all__ = ["decoder_inversion", "is_autoencoder", "reconstruction_recognition"]


def is_autoencoder(model: nn.Module) -> bool:
    """True for a masked autoencoder (``model.kind``), whose CRATE decoder (``decoder_trace``) is measured."""
    return model.kind == MASKED_AUTOENCODER


def _cka_per_image(a: Tensor, b: Tensor) -> Tensor:
    """Linear CKA of each image's token sets (b, n, d1), (b, n, d2) → (b,), float64: ``‖AᵀB‖²_F / (‖AᵀA‖_F ‖BᵀB‖_F)``
    with tokens centred.  Invariant to rotations and rescaling of either basis, so it compares the decoder with the
    encoder although nothing ties their coordinates (Remark 7)."""
    a, b = a.double(), b.double()
    a, b = a - a.mean(-2, keepdim=True), b - b.mean(-2, keepdim=True)
    cross = (a.transpose(-1, -2) @ b).pow(2).sum((-2, -1))
    norm = lambda t: (t.transpose(-1, -2) @ t).pow(2).sum((-2, -1)).sqrt()  # noqa: E731
    return cross / (norm(a) * norm(b)).clamp_min(1e-300)


def _cos(a: Tensor, b: Tensor) -> float:
    return float(F.cosine_similarity(a.float(), b.float(), dim=-1).mean())


def _linear_r2(a: Tensor, b: Tensor) -> float:
    """Held-out R² of the (lightly ridge-regularised) least-squares affine map ``a → b``; the tokens of the
    first half of the images fit it, those of the second half score it."""
    half = max(1, a.shape[0] // 2)
    if a.shape[0] < 2:
        return float("nan")
    flat = lambda t: t.reshape(-1, t.shape[-1]).double()  # noqa: E731
    a_fit, b_fit, a_test, b_test = flat(a[:half]), flat(b[:half]), flat(a[half:]), flat(b[half:])
    ones = lambda t: torch.cat([t, torch.ones(len(t), 1, dtype=t.dtype, device=t.device)], 1)  # noqa: E731
    X = ones(a_fit).cpu()
    gram = X.T @ X
    ridge = 1e-3 * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
    w = torch.linalg.solve(gram + ridge, X.T @ b_fit.cpu())
    resid = b_test.cpu() - ones(a_test).cpu() @ w
    total = b_test.cpu() - b_fit.cpu().mean(0)
    return float(1 - resid.pow(2).sum() / total.pow(2).sum())


@torch.no_grad()
def decoder_inversion(model: nn.Module, images: Tensor, per_image: bool = False) -> list[dict]:
    """One row per encoder layer, numbered 1..L as in the report: ``layer`` ℓ+1, ``decoder_layer`` L-ℓ, ``cos_chain``,
    ``cos_local``, ``cos_identity``, ``r2_chain``, ``r2_identity`` (module docstring); ``images``: normalised input.
    ``per_image`` adds, one value per image (for the decoder verdict and its noise estimate), ``cka_out_per_image``
    = CKA(``D^{L-ℓ}``, ``Z^ℓ``) (decoder layer L-ℓ's output, chained from the top) and ``cka_in_per_image`` =
    CKA(``D^{L-ℓ-1}``, ``Z^ℓ``) (that layer's input: the do-nothing baseline)."""
    if not is_autoencoder(model):
        raise ValueError("decoder_inversion needs a CRATE-MAE (a model with decoder layers); e.g. crate_mae_mnist")
    _, trace = eval_trace(model, images)
    Z = trace.tokens  # Z[ℓ] = input of encoder layer ℓ, Z[L] = encoder output
    L = len(model.layers)
    with evaluating(model):
        D = model.decoder_trace(Z[L])  # D[j] = input of decoder layer j
        rows = []
        for layer in range(L):
            j = L - 1 - layer
            local = model.decoder_layers[j](Z[layer + 1])
            rows.append({
                "layer": layer + 1, "decoder_layer": j + 1, "cos_chain": _cos(D[L - layer], Z[layer]),
                "cos_local": _cos(local, Z[layer]), "cos_identity": _cos(Z[layer + 1], Z[layer]),
                "r2_chain": _linear_r2(D[L - layer], Z[layer]), "r2_identity": _linear_r2(Z[layer + 1], Z[layer]),
            })  # fmt: skip
            if per_image:
                rows[-1]["cka_out_per_image"] = _cka_per_image(D[L - layer], Z[layer]).tolist()
                rows[-1]["cka_in_per_image"] = _cka_per_image(D[L - layer - 1], Z[layer]).tolist()
    return rows


@torch.no_grad()
def reconstruction_recognition(
    model: nn.Module,
    train_x: Tensor,
    train_y: Tensor,
    test_x: Tensor,
    test_y: Tensor,
    *,
    mean: list[float],
    std: list[float],
    seed: int = 0,
    k: int = 20,
    batch_size: int = 500,
) -> dict[str, float]:
    """How recognisable are the reconstructions?  A number for the reconstruction figure (Fig. 11, p.39).

    A weighted k-NN classifier on raw pixels (:func:`~crate_transformer.analysis.probe.knn_classify`, fitted on
    the training images ``train_x``) labels three versions of each held-out image, all with the same
    seeded mask: ``original``; ``mean_fill``, the do-nothing reconstruction (masked patches replaced by
    the mean training image there); and ``reconstruction``, the visible patches with the model's
    predictions at the masked ones (:meth:`~crate_transformer.models.mae.CRATEMAE.reconstruct`).  Inputs are
    normalised images ``(b, c, h, w)``; the classifier sees pixel values (``x · std + mean``).
    """
    from .probe import knn_classify

    if not is_autoencoder(model):
        raise ValueError("reconstruction_recognition needs a CRATE-MAE; e.g. crate_mae_mnist")
    dev = next(model.parameters()).device
    shape = (1, -1, 1, 1)
    pixels = lambda x: (x.float().cpu() * torch.tensor(std).view(shape) + torch.tensor(mean).view(shape)).flatten(1)  # noqa: E731
    p = model.config.patch_size
    n = (test_x.shape[-2] // p) * (test_x.shape[-1] // p)
    noise = torch.rand(len(test_x), n, generator=torch.Generator().manual_seed(seed))
    mean_image = train_x.float().mean(0, keepdim=True)
    recon, mean_fill = [], []
    with evaluating(model):
        for s in range(0, len(test_x), batch_size):
            x = test_x[s : s + batch_size].to(dev)
            r, mask_img, _ = model.reconstruct(x, noise=noise[s : s + batch_size].to(dev))
            recon.append(pixels(r))
            mean_fill.append(pixels(x * (1 - mask_img) + mean_image.to(dev) * mask_img))
    ref, labels = pixels(train_x), train_y.long().cpu()
    k = min(k, len(ref))  # fewer training images than k: every one votes, and the result says which k was used
    acc = lambda x: knn_classify(ref, labels, x, test_y.long().cpu(), k=k)  # noqa: E731
    return {"original": acc(pixels(test_x)), "mean_fill": acc(torch.cat(mean_fill)),
            "reconstruction": acc(torch.cat(recon)), "k": k, "images": len(test_x)}  # fmt: skip
