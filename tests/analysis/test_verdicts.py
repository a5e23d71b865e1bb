"""Verdicts on the paper's claims: the rules on constructed token sets that must hold and must fail, the numbers
against float64 formulas written here, and `crate analyze` writing and printing the verdict table."""

import html
import json
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import crate_transformer as ct
from crate_transformer import analysis
from crate_transformer.analysis import LayerTable, official_rc
from crate_transformer.analysis.verdicts import (
    FAILS,
    HOLDS,
    NOT_APPLICABLE,
    Verdict,
    baseline_from_records,
    baseline_from_table,
    compression_verdict,
    decoder_verdict,
    incoherence_verdict,
    paired_drop,
    random_coherence,
    rate_reduction_note,
    sparsity_verdict,
)
from crate_transformer.objectives import rate_reduction

K, P, D, N_TOK = 4, 8, 32, 24  # heads, head dim, token dim, tokens per sample


def direct_rc(P_heads: np.ndarray, eps: float) -> float:
    """Official R^c of one sample's per-head projections (K, n, p), float64 numpy from the formula:
    unit-normalise each projected token, then 1/2 sum_k logdet(I + p/(n eps^2) P_k P_k^T)."""
    total = 0.0
    for Pk in P_heads:
        Pk = Pk / np.linalg.norm(Pk, axis=-1, keepdims=True)
        n, p = Pk.shape
        sign, val = np.linalg.slogdet(np.eye(n) + p / (n * eps**2) * Pk @ Pk.T)
        assert sign > 0
        total += 0.5 * val
    return total


def orthonormal_heads(rng: np.random.Generator) -> np.ndarray:
    """K mutually orthogonal orthonormal bases U_k (K, d, p) spanning R^d."""
    Q, _ = np.linalg.qr(rng.standard_normal((D, D)))
    return Q.reshape(D, K, P).transpose(1, 0, 2)


def tokens_of_rank(rng: np.random.Generator, rank: int, samples: int) -> np.ndarray:
    """(samples, n, d) tokens in a random rank-``rank`` subspace (plus a little noise): lower rank = more
    compressed, so R^c is lower."""
    out = []
    for _ in range(samples):
        basis = np.linalg.qr(rng.standard_normal((D, rank)))[0]
        out.append(rng.standard_normal((N_TOK, rank)) @ basis.T + 0.01 * rng.standard_normal((N_TOK, D)))
    return np.stack(out)


def rc_table(ranks: list[int], samples: int = 12, seed: int = 0) -> tuple[LayerTable, np.ndarray]:
    """A LayerTable whose layer l holds R^c of tokens of rank ranks[l] (via the library's official_rc)."""
    rng = np.random.default_rng(seed)
    U = orthonormal_heads(rng)
    cols, direct = [], []
    for r in ranks:
        Z = tokens_of_rank(rng, r, samples)
        proj = np.einsum("snd,kdp->sknp", Z, U)
        cols.append(official_rc(torch.from_numpy(proj), 0.1).numpy())
        direct.append([direct_rc(proj[i], 0.1) for i in range(samples)])
    values = np.stack(cols, 1)
    table = LayerTable({"rc_in": values, "nonzero": np.ones_like(values)}, {"eps": 0.1, "ista_output": False})
    return table, np.array(direct).T


def test_paired_drop_is_the_mean_difference_and_twice_its_standard_error():
    rng = np.random.default_rng(1)
    a, b = rng.normal(5, 2, 400), rng.normal(4, 2, 400)
    drop, noise = paired_drop(a, b)
    diff = a - b
    assert drop == pytest.approx(float(np.mean(diff)), rel=1e-12)
    se = float(np.std(diff, ddof=1)) / math.sqrt(len(diff))  # the analytic standard error of the mean
    assert noise == pytest.approx(2 * se, rel=0.08)  # the bootstrap estimates it
    assert paired_drop(a, b) == (drop, noise)  # seeded: the report is reproducible


def test_compression_holds_when_rc_falls_and_fails_when_it_rises_or_stays():
    falling, direct = rc_table([16, 8, 2])
    np.testing.assert_allclose(falling.values["rc_in"], direct, rtol=1e-10)  # the measured R^c is the formula's
    v = compression_verdict(falling, "classifier")
    assert v.verdict == HOLDS and "falls" in v.explanation
    means = direct.mean(0)
    assert v.measured["drop"] == pytest.approx(means[0] - means[-1], rel=1e-10)
    assert v.measured["per_layer_mean"] == pytest.approx(list(means), rel=1e-6)
    assert v.measured["drop"] > v.measured["noise"] > 0

    rising = compression_verdict(rc_table([2, 8, 16])[0], "CRATE-MAE encoder")
    assert rising.verdict == FAILS and "rises" in rising.explanation and "opposite" in rising.explanation
    flat = compression_verdict(rc_table([8, 8, 8], seed=3)[0], "classifier")
    assert flat.verdict == FAILS and "within the noise" in flat.explanation
    # a change is a drop or a rise in words, never a signed number
    assert f"rise {-rising.measured['drop']:.3g} ± " in rising.summary and "decompresses" in rising.summary
    for v in (rising, flat):
        assert not re.search(r"(drop|rise)( of)? -", v.summary + v.explanation)
    assert abs(flat.measured["drop"]) <= flat.measured["noise"]


def test_against_the_untrained_network_holds_only_beyond_what_it_does():
    trained, direct = rc_table([16, 8, 2])
    means = direct.mean(0)
    # an untrained network that already falls as much: the claim is not what training did
    same = baseline_from_table(rc_table([16, 8, 2], seed=5)[0], "an untrained network (seed 5)")
    v = compression_verdict(trained, "classifier", baseline=same)
    delta = v.measured["drop"] - v.measured["initialisation"]["drop"]
    joint = math.hypot(v.measured["noise"], v.measured["initialisation"]["noise"])
    assert abs(delta) <= joint
    verb = "increased" if delta > 0 else "reduced"
    assert v.verdict == FAILS and "Reference, an untrained network (seed 5): " in v.explanation
    assert "the untrained network already compresses" in v.explanation
    assert f"training {verb} the drop by {abs(delta):.3g}, within the joint noise {joint:.2g}" in v.explanation
    assert v.reference == "an untrained network (seed 5)" and "At initialisation" not in v.explanation
    first, last = same.per_layer["rc_in"][0], same.per_layer["rc_in"][-1]
    assert f"; untrained {first:.4g} -> {last:.4g} (already compresses): training {verb} the drop" in v.summary
    # an untrained network that stays flat: the trained drop is beyond it
    flat_table, flat_direct = rc_table([8, 8, 8], seed=3)
    flat = baseline_from_table(flat_table, "fresh")
    v = compression_verdict(trained, "classifier", baseline=flat)
    init = v.measured["initialisation"]
    joint = math.hypot(v.measured["noise"], init["noise"])
    added = v.measured["drop"] - init["drop"]
    assert v.verdict == HOLDS and f"training increased the drop by {added:.3g}, beyond the joint noise" in v.explanation
    assert "the untrained network stays flat within its noise" in v.explanation
    assert v.summary.startswith(f"R^c {means[0]:.4g} -> {means[-1]:.4g} (compresses; drop ")
    fm = flat_direct.mean(0)
    assert init["drop"] == pytest.approx(fm[0] - fm[-1], rel=1e-9)  # the float64 formula's drop
    assert init["per_layer_mean"] == pytest.approx(list(fm), rel=1e-9)
    assert init["change"] == pytest.approx(added, rel=1e-12) and added > joint
    assert v.measured["drop"] == pytest.approx(means[0] - means[-1], rel=1e-10)


def test_sparsity_that_training_reduced_says_so_in_words():
    """Issue 49's case: the non-zero fraction falls after training, but the untrained network falls further: the
    verdict fails and says training *reduced* the drop (no signed number), the untrained one already gets sparser."""
    rng = np.random.default_rng(4)
    trained = sparsity_table(relu_codes(rng, [0.1, 0.55]))  # 0.46 -> 0.29
    untrained = baseline_from_table(sparsity_table(relu_codes(rng, [0.0, 1.2])), "an untrained network (seed 0)")
    v = sparsity_verdict(trained, "classifier", baseline=untrained)
    drop, init = v.measured["drop"], v.measured["initialisation"]["drop"]
    assert drop > v.measured["noise"] and init > drop  # both fall, the untrained one by more
    assert v.verdict == FAILS and v.name == "sparsity"
    assert f"training reduced the drop by {init - drop:.3g}, beyond the joint noise" in v.explanation
    assert "the untrained network already gets sparser" in v.explanation
    assert "the non-zero fraction falls" in v.explanation and "-" + f"{init - drop:.3g}" not in v.explanation
    assert v.line() == f"[FAILS] classifier, sparsity: {v.summary}"
    assert v.summary.startswith("non-zero fraction 0.4") and "(gets sparser; drop" in v.summary
    assert "untrained 0.5" in v.summary and "(already gets sparser): training reduced the drop by" in v.summary


def test_a_starting_checkpoint_is_stated_beside_the_untrained_reference_not_decided_by():
    trained = rc_table([16, 8, 2])[0]
    flat = baseline_from_table(rc_table([8, 8, 8], seed=3)[0], "an untrained network (seed 0)")
    # the checkpoint it was fine-tuned from fell further than the fine-tuned model does
    recs = [
        {"layer": ell, "n_samples": 64, "rc_in": rc, "rc_in_std": 0.5} for ell, rc in ((1, 60.0), (2, 40.0), (3, 9.0))
    ]
    start = baseline_from_records(recs, "the starting checkpoint (step 0 of this fine-tuning run)", start=True)
    v = compression_verdict(trained, "classifier", baseline=flat, start=start)
    assert v.verdict == HOLDS  # as without the start: the untrained network decides
    assert v.verdict == compression_verdict(trained, "classifier", baseline=flat).verdict
    moved = v.measured["drop"] - 51.0
    joint = math.hypot(v.measured["noise"], start.drop["rc_in"][1])
    assert "From the starting checkpoint (step 0 of this fine-tuning run): 60 -> 9 (drop 51" in v.explanation
    assert f"fine-tuning reduced the drop by {-moved:.3g}, beyond the joint noise {joint:.2g}" in v.explanation
    assert "; starting checkpoint 60 -> 9 (compresses): fine-tuning reduced the drop by" in v.summary
    assert v.measured["starting_checkpoint"]["per_layer_mean"] == [60.0, 40.0, 9.0]
    assert "At initialisation" not in v.explanation and "untrained" in v.summary


def test_baseline_from_logged_records_uses_the_noise_of_two_independent_means():
    recs = [
        {"layer": 1, "n_samples": 25, "rc_in": 10.0, "rc_in_std": 3.0, "nonzero": 0.5, "nonzero_std": 0.1},
        {"layer": 2, "n_samples": 25, "rc_in": 9.0, "rc_in_std": 2.0, "nonzero": 0.4, "nonzero_std": 0.2},
        {"layer": 3, "n_samples": 25, "rc_in": 7.0, "rc_in_std": 4.0, "nonzero": 0.45, "nonzero_std": 0.05},
    ]
    b = baseline_from_records(list(reversed(recs)), "the run's step 0")  # any order
    assert b.kind == "untrained" and baseline_from_records(recs, "x", start=True).label == "the starting checkpoint"
    assert b.per_layer["rc_in"] == [10.0, 9.0, 7.0]
    assert b.drop["rc_in"][0] == pytest.approx(3.0) and b.drop["rc_in"][1] == pytest.approx(2 * 5.0 / 5.0)
    assert b.drop["nonzero"][0] == pytest.approx(0.05)
    assert b.drop["nonzero"][1] == pytest.approx(2 * math.sqrt((0.1**2 + 0.05**2) / 25))


def test_non_monotone_layers_are_named():
    v = compression_verdict(rc_table([12, 2, 16, 1])[0], "classifier")
    assert v.verdict == HOLDS  # first to last falls ...
    assert v.measured["rises"] == [2] and "not monotone: it rises from layer 2 -> 3" in v.explanation
    monotone = compression_verdict(rc_table([16, 8, 2])[0], "classifier")
    assert monotone.measured["rises"] == [] and "not monotone" not in monotone.explanation


def _coherence_rows(U: np.ndarray, layer: int = 1) -> dict:
    """The block coherence ||Q_i^T Q_j||_F / sqrt(p) of bases U (K, d, p), float64 numpy, as a row of incoherence."""
    Q = [np.linalg.qr(u)[0] for u in U]
    k, d, p = U.shape
    c = [np.linalg.norm(Q[i].T @ Q[j]) / math.sqrt(p) for i in range(k) for j in range(k) if i != j]
    return {"layer": layer, "heads": k, "dim": d, "dim_head": p, "mean_cross_coherence": float(np.mean(c))}


def test_incoherence_holds_for_orthogonal_subspaces_and_fails_for_random_ones():
    rng = np.random.default_rng(0)
    orth = [_coherence_rows(orthonormal_heads(rng), layer) for layer in (1, 2)]
    assert orth[0]["mean_cross_coherence"] == pytest.approx(0.0, abs=1e-12)
    random_rows = [_coherence_rows(rng.standard_normal((K, D, P)), layer) for layer in (1, 2)]
    v = incoherence_verdict(orth, "classifier", initial=random_rows)
    assert v.verdict == HOLDS and "the untrained network 0." in v.explanation and "untrained 0." in v.summary
    assert v.reference.startswith("random subspaces of the same sizes") and v.name == "incoherence"
    assert v.measured["initialisation"] == [r["mean_cross_coherence"] for r in random_rows]
    w = incoherence_verdict([orth[0], random_rows[1]], "classifier")
    assert w.verdict == FAILS and "layer(s) 2" in w.explanation
    # the chance level: random subspaces' mean coherence, against a float64 draw written here
    mean, std = random_coherence(K, D, P, draws=200)
    here = [_coherence_rows(rng.standard_normal((K, D, P)))["mean_cross_coherence"] for _ in range(400)]
    assert mean == pytest.approx(np.mean(here), abs=3 * np.std(here) / math.sqrt(200))
    assert std == pytest.approx(np.std(here), rel=0.25)
    assert mean == pytest.approx(math.sqrt(P / D), rel=0.1)  # about sqrt(p/d)
    one_head = incoherence_verdict([{**orth[0], "heads": 1}], "classifier")
    assert one_head.verdict == NOT_APPLICABLE


def test_not_applicable_with_one_layer_or_too_few_samples():
    one_layer = compression_verdict(rc_table([8])[0], "classifier")
    assert one_layer.verdict == NOT_APPLICABLE and "1 layer" in one_layer.explanation
    few = compression_verdict(rc_table([16, 2], samples=3)[0], "classifier")
    assert few.verdict == NOT_APPLICABLE and "3 sample" in few.explanation
    assert few.tag == "[n/a]" and one_layer.line() == "[n/a] classifier, compression: " + one_layer.summary


def relu_codes(rng: np.random.Generator, shifts: list[float], samples: int = 10) -> np.ndarray:
    """ReLU(g - shift) of Gaussian codes per layer: (samples, layers, n, d); a larger shift = more exact zeros."""
    return np.stack([np.maximum(rng.standard_normal((samples, N_TOK, D)) - s, 0.0) for s in shifts], 1)


def sparsity_table(codes: np.ndarray, ista: bool = True) -> LayerTable:
    from crate_transformer.objectives import sparsity

    nonzero = 1.0 - sparsity(torch.from_numpy(codes)).numpy()  # the library's count of exact zeros
    direct = (codes != 0).mean((-2, -1))  # the same written here
    np.testing.assert_allclose(nonzero, direct, rtol=0, atol=1e-15)
    return LayerTable({"nonzero": nonzero, "rc_in": np.zeros_like(nonzero)}, {"ista_output": ista})


def test_sparsity_holds_when_zeros_grow_with_depth_and_fails_when_they_shrink():
    rng = np.random.default_rng(0)
    sparser = sparsity_verdict(sparsity_table(relu_codes(rng, [0.0, 0.5, 1.0])), "classifier")
    assert sparser.verdict == HOLDS
    assert sparser.measured["first"] == pytest.approx(0.5, abs=0.02)  # P(g > 0) = 1/2
    assert sparser.measured["last"] == pytest.approx(0.5 * math.erfc(1 / math.sqrt(2)), abs=0.02)  # P(g > 1)
    denser = sparsity_verdict(sparsity_table(relu_codes(rng, [1.0, 0.0])), "language model")
    assert denser.verdict == FAILS and "rises" in denser.explanation
    # outputs without exact zeros and without an ISTA block: nothing to count
    dense = np.abs(rng.standard_normal((6, 2, N_TOK, D))) + 0.1
    na = sparsity_verdict(sparsity_table(dense, ista=False), "ViT classifier")
    assert na.verdict == NOT_APPLICABLE and "no exact zeros" in na.explanation


def rotation(rng: np.random.Generator) -> np.ndarray:
    """A random orthogonal matrix (d, d)."""
    return np.linalg.qr(rng.standard_normal((D, D)))[0]


def near_identity(rng: np.random.Generator) -> np.ndarray:
    """An encoder step A = I + 0.5 G / sqrt(d): it moves the tokens, but not far."""
    return np.eye(D) + 0.5 * rng.standard_normal((D, D)) / math.sqrt(D)


def cka(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Linear CKA per image, float64, from the definition: centre the tokens, then
    ||A^T B||_F^2 / (||A^T A||_F ||B^T B||_F); (images, n, d) x2 -> (images,)."""
    out = []
    for x, y in zip(a, b):
        x, y = x - x.mean(0), y - y.mean(0)
        out.append(np.linalg.norm(x.T @ y) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))
    return np.array(out)


def decoder_similarities(
    mirror: bool, basis: np.ndarray | None = None, layers: int = 3, images: int = 8, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Encoder layers Z^(l+1) = Z^l A_l^T (+ noise); the decoder layer for l applies A_l^-1 (a mirror: it undoes the
    step) or A_l again (a second step away from Z^l).  ``basis``: the decoder works in its own rotated coordinates
    (input Z Q, output in the same coordinates); returns CKA(output, Z^l), CKA(input, Z^l)
    (images, layers)."""
    rng = np.random.default_rng(seed)
    Q = np.eye(D) if basis is None else basis
    Z = [rng.standard_normal((images, N_TOK, D))]
    steps = [near_identity(rng) for _ in range(layers)]
    for A in steps:
        Z.append(Z[-1] @ A.T + 0.05 * rng.standard_normal(Z[-1].shape))
    out, inp = [], []
    for ell, A in enumerate(steps):
        dec = Q.T @ (np.linalg.inv(A) if mirror else A).T @ Q  # the step in the decoder's coordinates
        d_in = Z[ell + 1] @ Q
        out.append(cka(d_in @ dec, Z[ell]))
        inp.append(cka(d_in, Z[ell]))
    return np.array(out).T, np.array(inp).T


def test_decoder_holds_for_a_mirror_in_any_basis_and_fails_otherwise():
    out, inp = decoder_similarities(mirror=True)
    v = decoder_verdict(out, inp)
    assert v.verdict == HOLDS and v.section == "CRATE-MAE decoder"
    assert v.measured["margin_per_layer"] == pytest.approx(list((out - inp).mean(0)), rel=1e-12)
    assert out.min() > 0.99 > inp.max()  # an exact inverse up to the noise
    rotated = decoder_verdict(*decoder_similarities(mirror=True, basis=rotation(np.random.default_rng(5))))
    assert rotated.verdict == HOLDS  # CKA does not care that the decoder's basis is not the encoder's
    assert rotated.measured["margin_per_layer"] == pytest.approx(v.measured["margin_per_layer"], rel=1e-9)
    not_mirror = decoder_verdict(*decoder_similarities(mirror=False))
    assert not_mirror.verdict == FAILS and "at no layer" in not_mirror.explanation
    # a mirror at one layer only is not a mirror: the rule asks for every layer
    out_bad, inp_bad = decoder_similarities(mirror=False)
    first_only = [np.concatenate([good[:, :1], bad[:, 1:]], 1) for good, bad in ((out, out_bad), (inp, inp_bad))]
    mixed = decoder_verdict(*first_only)
    assert mixed.verdict == FAILS and "only at encoder layer(s) 1;" in mixed.explanation
    assert decoder_verdict(out[:2], inp[:2]).verdict == NOT_APPLICABLE


def test_library_cka_is_the_definition_and_basis_free():
    from crate_transformer.analysis.decoder import _cka_per_image

    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, N_TOK, D)), rng.standard_normal((3, N_TOK, 16))
    lib = _cka_per_image(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    np.testing.assert_allclose(lib, cka(a, b), rtol=1e-12)
    turned = 3.0 * a @ rotation(rng)  # rotated and rescaled
    np.testing.assert_allclose(_cka_per_image(torch.from_numpy(turned), torch.from_numpy(b)).numpy(), lib, rtol=1e-10)


def rr_direct(Z: np.ndarray, U: np.ndarray, eps: float) -> float:
    """ΔR of eq. (14) for row tokens Z (n, d), float64 numpy from eqs. (8) and (13)."""
    n, d = Z.shape
    R = 0.5 * np.linalg.slogdet(np.eye(n) + d / (n * eps**2) * Z @ Z.T)[1]
    p = U.shape[-1]
    Rc = sum(0.5 * np.linalg.slogdet(np.eye(n) + p / (n * eps**2) * (Z @ Uk) @ (Z @ Uk).T)[1] for Uk in U)
    return R - Rc


def test_the_rate_reduction_note_states_a_true_reason():
    """The note's reason: tokens each inside one of K orthogonal subspaces give ΔR >= 0 (block-diagonal Gram);
    the same number of directions straddling the subspaces gives ΔR < 0."""
    rng = np.random.default_rng(0)
    U = orthonormal_heads(rng)
    # few directions (one per head, plus a little spread inside that head): every token lies in one U_k
    coef = np.zeros((N_TOK, P))
    coef[:, 0] = 1.0
    coef += 0.05 * rng.standard_normal((N_TOK, P))
    inside = np.stack([U[i % K] @ coef[i] for i in range(N_TOK)])
    straddle = inside @ rotation(rng).T  # the same token set rotated off the subspaces
    for name, Z in (("inside", inside), ("straddle", straddle)):
        Zn = Z / np.linalg.norm(Z, axis=-1, keepdims=True)
        lib = float(rate_reduction(torch.from_numpy(Zn), torch.from_numpy(U), 0.1))
        assert lib == pytest.approx(rr_direct(Zn, U, 0.1), rel=1e-10)
        if name == "inside":
            assert lib >= 0
        else:
            assert lib < 0
    neg = LayerTable({"rate_reduction": np.array([[-3.0, -1.0, 2.0]] * 4)}, {"eps": 0.1})
    note = rate_reduction_note(neg, D, K, P)
    assert "negative at layer(s) 1, 2 (min -3)" in note and "eq. (14)" in note and "straddle" in note
    assert rate_reduction_note(LayerTable({"rate_reduction": np.ones((4, 3))}), D, K, P) is None


def test_a_negative_rate_reduction_on_two_splits_is_one_note_naming_both():
    """The report's notes above the figures: one paragraph with the reason, not one copy per split."""
    import crate_transformer as ct
    from crate_transformer.analysis.report import rate_notes

    model = ct.create_model("crate_mnist", image_size=8, patch_size=4, dim=16, depth=3, heads=2, in_chans=1)
    train = LayerTable({"rate_reduction": np.array([[-3.0, -1.0, 2.0]] * 4)}, {"eps": 0.1})
    test = LayerTable({"rate_reduction": np.array([[1.0, -0.5, 2.0]] * 4)}, {"eps": 0.1})
    (note,) = rate_notes(model, {"train": train, "test": test})
    assert "negative at layer(s) 1, 2 (min -3) on train, and at layer(s) 2 (min -0.5) on test because" in note
    assert note.count("eq. (8)") == 1  # the reason once
    (only,) = rate_notes(model, {"train": train, "test": LayerTable({"rate_reduction": np.ones((4, 3))})})
    assert "on train because" in only and "test" not in only
    assert rate_notes(model, {"test": test}) == [rate_reduction_note(test, 16, 2, 8)]
    assert "at layer(s) 2 (min -0.5) because" in rate_notes(model, {"test": test})[0]


def test_verdict_record():
    with pytest.raises(ValueError, match="verdict must be"):
        Verdict("classifier", "claim", "maybe", "rule", "why")
    v = Verdict("classifier", "claim", FAILS, "rule", "why.", {"drop": 1.0})
    assert v.line() == "[FAILS] classifier: claim. why." and v.to_dict()["measured"] == {"drop": 1.0}
    named = Verdict("classifier", "claim", HOLDS, "rule", "why.", name="compression", summary="R^c 3 -> 1")
    assert named.line() == "[holds] classifier, compression: R^c 3 -> 1"
    assert Verdict(**named.to_dict()) == named  # report.json's verdicts read back


# --------------------------------------------------------------------------- end to end
def test_crate_analyze_writes_and_prints_the_verdict_table(tmp_path, capsys):
    from crate_transformer.cli import main as cli_main
    from crate_transformer.data import DataSpec, load_dataset, normalize

    torch.manual_seed(0)
    train = load_dataset("digits", "train")
    model = ct.create_model(
        "crate_tiny", image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=2, heads=4
    )
    model.config.data = DataSpec(source="digits", name="digits", mean=list(train.mean), std=list(train.std))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x_all = normalize(train.images.float() / 255, train.mean, train.std)
    # the run's own measurement at step 0, as training's measure hook logs it into metrics.jsonl
    step0 = [
        {"split": "measure", "step": 0, **r} for r in analysis.measure(model, x_all[:32], progress=False).to_records()
    ]
    (tmp_path / "run").mkdir()
    # a fine-tuning run (init_from): its step 0 is the checkpoint it started from
    (tmp_path / "run" / "config.yaml").write_text("task: classification\ninit_from: base\nsystem: {seed: 2}\n")
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in step0))
    for step in range(40):  # a tiny trained run
        idx = torch.arange(step * 64, step * 64 + 64) % len(train)
        loss = F.cross_entropy(model(x_all[idx]), train.labels[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().save_pretrained(tmp_path / "run" / "model")
    out = tmp_path / "an"
    argv = [str(tmp_path / "run"), "--num-images", "16", "--num-vis", "1", "--no-progress", "--out", str(out)]
    assert cli_main(["analyze", *argv]) == 0  # as `crate analyze` runs it: options resolved, then the command
    printed = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    verdicts = report["verdicts"]
    sections = ["classifier (train)"] * 2 + ["classifier (test)"] * 2 + ["classifier"]
    assert [v["section"] for v in verdicts] == sections
    assert all(v["verdict"] in (HOLDS, FAILS, NOT_APPLICABLE) for v in verdicts)
    # every layer verdict is decided against the untrained network (the run's seed) and, the starting checkpoint
    # ('base') being gone, states the move from the run's own step-0 records beside it; the figures draw both
    for v in verdicts[:4]:
        metric = "rc_in" if "R^c" in v["claim"] else "nonzero"
        assert v["measured"]["starting_checkpoint"]["per_layer_mean"] == pytest.approx([r[metric] for r in step0])
        assert "From the starting checkpoint (base), from the run's step-0 records (32 of" in v["explanation"]
        assert v["reference"] == (
            "an untrained network of the same architecture (seed 2, the run's seed) on the same images; beside it "
            "the starting checkpoint (base), from the run's step-0 records (32 of its training images, not the "
            "images measured here)"
        )
        split = v["section"].split("(")[1].rstrip(")")
        untrained = [r[metric] for r in report["initialisation"][f"{split} untrained"]]
        assert v["measured"]["initialisation"]["per_layer_mean"] == pytest.approx(untrained)
        assert "At initialisation" not in v["explanation"]
    assert report["starting_checkpoint"]["layers"][0]["rc_in"] == step0[0]["rc_in"]
    assert report["starting_checkpoint"]["measured_on"] == "the run's step-0 records"
    caption = report["figures"]["layerwise.png"]["caption"]
    assert "from the run's step-0 records (32 of its training images" in caption
    assert any(n.startswith("starting checkpoint: base (config.yaml's init_from) does not load: ") for n in
               report["notes"])  # fmt: skip
    assert "an untrained network of the same architecture (seed 2, the run's seed)" in caption
    assert "subspaces U_k of different heads are incoherent" in verdicts[4]["claim"]
    assert len(verdicts[4]["measured"]["initialisation"]) == 2
    # the verdict's numbers are the report's own layer table
    test_layers = report["measure"]["test"]["layers"]
    comp = verdicts[2]
    assert comp["measured"]["drop"] == pytest.approx(test_layers[0]["rc_in"] - test_layers[-1]["rc_in"], rel=1e-9)
    for v in verdicts:
        tag = {"holds": "[holds]", "fails": "[FAILS]"}.get(v["verdict"], "[n/a]")
        assert f"{tag} {v['section']}, {v['name']}: {v['summary']}" in printed
    page = (out / "report.html").read_text()
    first_table = page.index("<table>")
    claims, rules = page.index("<ul class='claims'>"), page.index("<details class='rules'>")
    assert page.index("Did the paper's claims hold?") < claims < rules < first_table < page.index("Layer-wise")
    assert all(html.escape(v["summary"]) in page[claims:rules] for v in verdicts)  # one line each, first
    assert all(
        html.escape(v["explanation"]) in page[rules:] and html.escape(v["rule"]) in page[rules:] for v in verdicts
    )


def test_crate_analyze_on_an_external_checkpoint_compares_with_a_fresh_model(tmp_path, capsys):
    """A checkpoint without a run (no step-0 record): the reference is a freshly initialised model of the same
    architecture measured on the same images; the layer figure draws both curves."""
    from crate_transformer.cli import main as cli_main

    model = ct.create_model(
        "crate_tiny", image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=2, heads=4
    )
    model.eval().save_pretrained(tmp_path / "m")
    out = tmp_path / "an"
    argv = [str(tmp_path / "m"), "--data", "digits", "--num-images", "8", "--num-vis", "1", "--no-progress"]
    assert cli_main(["analyze", *argv, "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["initialisation"]) == {"train untrained", "test untrained"}
    init = analysis.report.initial_model(model)  # what the report compared with, measured here on the same images
    assert all(
        torch.equal(a, b)
        for a, b in zip(init.state_dict().values(), analysis.report.initial_model(model).state_dict().values())
    )
    comp = report["verdicts"][2]
    ref = "an untrained network of the same architecture (seed 0; the checkpoint records no training seed)"
    assert comp["section"] == "classifier (test)" and f"Reference, {ref} on the same images" in comp["explanation"]
    fresh_rc = [r["rc_in"] for r in report["initialisation"]["test untrained"]]
    assert comp["measured"]["initialisation"]["per_layer_mean"] == pytest.approx(fresh_rc)
    assert ref in report["figures"]["layerwise.png"]["caption"]
    printed = capsys.readouterr().out
    assert f"compared with: {ref}" in printed and "At initialisation" not in printed
