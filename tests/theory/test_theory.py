"""The theory lab (crate_transformer.theory): data model, steps, and each experiment's property.

Every experiment is run once at reduced size (``quick``; the denoising one at the paper's d=768) by a
module-scoped fixture; the tests then assert the property each experiment demonstrates, and check the
building blocks against independent computations (closed forms written out, autograd, scikit-learn).
"""

import json
import math

import numpy as np
import pytest
import torch

from crate_transformer import theory as th
from crate_transformer.cli import main
from crate_transformer.objectives import subspace_coding_rate, subspace_coding_rate_grad


def claim(report, text):
    """The check of ``report`` whose claim contains ``text``."""
    hits = [c for c in report["checks"] if text in c["claim"]]
    assert len(hits) == 1, f"{text!r} matches {len(hits)} checks of {report['experiment']}"
    return hits[0]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("theory")
    return out, th.run_all(out, quick=True, progress_bar=False)


# --------------------------------------------------------------------------- outputs and CLI
@pytest.mark.slow
def test_every_experiment_writes_png_and_json(reports):
    out, reps = reports
    assert set(reps) == set(th.EXPERIMENTS)
    for name in reps:
        png, js = out / f"{name}.png", out / f"{name}.json"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size < 200_000
        data = json.loads(js.read_text())
        assert data["experiment"] == name and data["checks"] and data["results"]
        assert all(isinstance(c["holds"], bool) and c["detail"] for c in data["checks"])


def test_cli_runs_one_experiment_and_rejects_bad_arguments(tmp_path, capsys):
    assert main(["theory", "tweedie", "--out", str(tmp_path), "--quick", "--no-progress"]) == 0
    assert (tmp_path / "tweedie.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    written = json.loads((tmp_path / "tweedie.json").read_text())
    # the command writes what the API returns for the same experiment, seed and --quick sizes
    api = th.run_experiment("tweedie", quick=True, progress_bar=False)
    for report in (written, api):
        report.pop("runtime_s"), report.pop("files", None)
    assert written == json.loads(json.dumps(api)) and written["config"]["n"] == th.QUICK["tweedie"]["n"]
    # and prints the verdict of each of those checks under a count that matches them
    out = capsys.readouterr().out.splitlines()
    held = sum(c["holds"] for c in written["checks"])
    assert out[0].startswith(f"tweedie: {held}/{len(written['checks'])} claims hold"), out
    assert [line.strip() for line in out[1:]] == [
        f"[{'holds' if c['holds'] else 'FAILS'}] {c['claim']}" for c in written["checks"]
    ]
    assert main(["theory", "bogus", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown experiment 'bogus'" in err and "approximation" in err
    assert main(["theory", "ista", "--seed", "-1", "--out", str(tmp_path)]) == 2
    (tmp_path / "afile").write_text("x")
    assert main(["theory", "tweedie", "--quick", "--no-progress", "--out", str(tmp_path / "afile")]) == 2
    # an earlier result is never replaced without asking
    before = (tmp_path / "tweedie.json").read_text()
    capsys.readouterr()
    assert main(["theory", "tweedie", "--quick", "--no-progress", "--seed", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "tweedie.png holds the result of an earlier crate theory run; pass --overwrite" in err, err
    assert (tmp_path / "tweedie.json").read_text() == before
    argv = ["theory", "tweedie", "--quick", "--no-progress", "--seed", "1", "--out", str(tmp_path), "--overwrite"]
    assert main(argv) == 0 and json.loads((tmp_path / "tweedie.json").read_text())["config"]["seed"] == 1


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("approximation", {"d": 64, "K": 8, "p": 16}, "K\\*p"),
        ("unrolled", {"n": 0}, "n must be a positive integer"),
        ("denoising", {"sigmas": (-0.1,)}, "sigma must be a finite number > 0"),
        ("tweedie", {"sigmas": ()}, "non-empty"),
        ("ista", {"lambd": 0.0}, "lambd"),
        ("diffusion", {"sigma": 0.1, "sigma_min": 0.2}, "sigma_min must be below sigma"),
        ("diffusion", {"K": 8, "p": 16}, "mutually orthogonal"),
    ],
)
def test_bad_sizes_raise_one_line_value_errors(name, kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        th.run_experiment(name, progress_bar=False, **kwargs)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- data model
def test_orthogonal_and_incoherent_subspaces():
    U = th.random_subspaces(24, 3, 8, seed=1)
    G = torch.einsum("kdp,jdq->kjpq", U, U)
    want = torch.eye(3, dtype=U.dtype)[:, :, None, None] * torch.eye(8, dtype=U.dtype)
    torch.testing.assert_close(G, want.expand_as(G), atol=1e-12, rtol=0)
    assert th.subspace_coherence(U) < 1e-12
    Ui = th.random_subspaces(24, 5, 8, orthogonal=False, seed=1)  # K·p > d is allowed when merely incoherent
    torch.testing.assert_close(Ui.transpose(1, 2) @ Ui, torch.eye(8, dtype=U.dtype).expand(5, 8, 8), atol=1e-12, rtol=0)
    assert 0 < th.subspace_coherence(Ui) <= 1 + 1e-12
    with pytest.raises(ValueError, match="orthogonal=False"):
        th.random_subspaces(24, 4, 8)


def test_sampling_model_memberships_energies_and_seeds():
    U = th.random_subspaces(32, 4, 8, seed=0)
    S = th.sample_subspace_mixture(U, 4000, 0.5, seed=3)
    assert S.Z.shape == (4000, 32) and S.labels.min() >= 0 and S.labels.max() < 4
    torch.testing.assert_close(S.Z, S.signal + S.noise)
    assert float(th.off_subspace_energy(S.signal, U, S.labels).max()) < 1e-12  # X_♮ lies on its own subspace
    # eq. (231): E‖U α‖² = 1 and E‖δ‖² = σ²
    assert abs(float(S.signal.pow(2).sum(1).mean()) - 1) < 0.05
    assert abs(float(S.noise.pow(2).sum(1).mean()) / 0.25 - 1) < 0.05
    assert np.allclose(np.bincount(S.labels.numpy(), minlength=4) / 4000, 0.25, atol=0.03)
    iso = th.sample_subspace_mixture(U, 4000, 0.5, convention="isotropic", seed=3)  # eq. (11): E‖α‖² = p
    assert abs(float(iso.signal.pow(2).sum(1).mean()) / 8 - 1) < 0.05
    torch.testing.assert_close(
        th.sample_subspace_mixture(U, 10, 0.1, seed=7).Z, th.sample_subspace_mixture(U, 10, 0.1, seed=7).Z
    )
    assert not torch.equal(
        th.sample_subspace_mixture(U, 10, 0.1, seed=7).Z, th.sample_subspace_mixture(U, 10, 0.1, seed=8).Z
    )
    with pytest.raises(ValueError, match="weights"):
        th.sample_subspace_mixture(U, 10, weights=torch.tensor([1.0, -1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="sigma"):
        th.sample_subspace_mixture(U, 10, -1.0)


# --------------------------------------------------------------------------- steps vs the formulas written out
def test_neumann_and_mssa_gradients_match_the_column_form_formulas():
    K, d, p, n, eps = 4, 32, 8, 12, 0.7
    U = th.random_subspaces(d, K, p, seed=2)
    Z = th.normalize_tokens(th.sample_subspace_mixture(U, n, 0.1, seed=2).Z)
    Zc, beta = Z.T, p / (n * eps**2)
    A = [U[k].T @ Zc for k in range(K)]
    neumann = beta * sum(U[k] @ A[k] @ (torch.eye(n, dtype=Z.dtype) - beta * A[k].T @ A[k]) for k in range(K))  # (98)
    ssa = [A[k] @ torch.softmax(A[k].T @ A[k], dim=0) for k in range(K)]  # (92), column softmax
    mssa = beta * sum(U[k] @ ssa[k] for k in range(K))  # (93)
    torch.testing.assert_close(th.neumann_gradient(Z, U, eps), neumann.T)
    torch.testing.assert_close(th.mssa_gradient(Z, U, eps), (beta * Zc - beta * mssa).T)  # (106)
    kb = 0.3
    torch.testing.assert_close(th.mssa_compression_step(Z, U, eps, kb / beta), ((1 - kb) * Zc + kb * mssa).T)  # (91)


# --------------------------------------------------------------------------- approximation (Approximation 9)
@pytest.mark.slow
def test_approximation_neumann_bound_and_where_mssa_agrees(reports):
    rep = reports[1]["approximation"]
    r = rep["results"]
    rho, mssa, neumann = (np.array(r[k]) for k in ("rho_mean", "rel_error_mssa", "rel_error_neumann"))
    assert claim(rep, "Neumann step (98)")["holds"] and (neumann <= rho**2 + 1e-12).all()
    small = rho < 1
    assert small.any() and (mssa[small] < rho[small]).all()  # agreement where the Neumann series converges
    assert mssa[0] < 0.05 and mssa[-1] > 1  # … and breakdown at large β (β=10)
    assert not claim(rep, "softmax step")["holds"]  # the softmax term is not the 2nd-order term


@pytest.mark.slow
def test_approximation_which_steps_lower_rc(reports):
    rep = reports[1]["approximation"]
    assert claim(rep, "exact gradient step lowers R^c")["holds"]
    assert claim(rep, "MSSA step (1−κβ)Z")["holds"]
    # Hu et al. (NeurIPS 2024): the residual form raises R^c; only after renormalising does it compress
    assert not claim(rep, "implemented residual step")["holds"]
    assert claim(rep, "renormalised")["holds"]
    # independently: a descent step with κ < 2/L, L = 9β/4, lowers R^c at any β
    U = th.random_subspaces(32, 4, 8, seed=5)
    Z = th.normalize_tokens(th.sample_subspace_mixture(U, 40, 0.2, seed=5).Z)
    for beta in (0.05, 1.0, 20.0):
        eps = th.eps_from_beta(8, 40, beta)
        Zp = th.exact_compression_step(Z, U, eps, 0.85 / beta)
        assert float(subspace_coding_rate(Zp, U, eps)) < float(subspace_coding_rate(Z, U, eps))
        e = th.approximation_errors(Z, U, eps)
        assert e["neumann"] <= e["rho"] ** 2 + 1e-12


# --------------------------------------------------------------------------- unrolled
@pytest.mark.slow
def test_unrolled_crate_compresses_and_sparsifies(reports):
    rep = reports[1]["unrolled"]
    ex = {k: np.array(v, dtype=float) for k, v in rep["results"]["runs"]["exact/subspaces"].items()}
    assert (ex["rc"][1::2] < ex["rc"][0:-1:2]).all()  # every compression step lowers R^c
    assert (np.diff(ex["rc"][::2]) < 0).all()  # R^c of the layer outputs falls with depth
    assert (np.diff(ex["nonzero_fraction"][2::2]) < 0).all()  # sparser with depth
    assert ex["distance"][-1] < ex["distance"][0] and ex["distance"][1] < ex["distance"][0]
    assert (ex["zero_tokens"] == 0).all()
    # where the paper's picture breaks (reported, and tested so a change is noticed)
    ms = np.array(rep["results"]["runs"]["mssa/subspaces"]["distance"], dtype=float)
    assert (ms[1::2] - ms[0:-1:2] > 0).all()  # MSSA steps move tokens away from their subspaces
    sk = np.array(rep["results"]["runs"]["skip/subspaces"]["rc_step_change"], dtype=float)
    assert (sk > 0).all()  # the residual step raises the raw R^c
    rd = np.array(rep["results"]["runs"]["exact/random"]["distance"], dtype=float)
    assert rd[-1] > 3 * rd[0]  # a ReLU in a random basis destroys the subspace structure


def test_unrolled_layer_with_eta_one_is_the_exact_lasso_solution():
    U = th.random_subspaces(16, 2, 8, seed=0)
    S = th.sample_subspace_mixture(U, 10, 0.1, seed=0)
    D = th.orthogonal_dictionary(U, "random", seed=1)
    torch.testing.assert_close(D.T @ D, torch.eye(16, dtype=D.dtype))
    torch.testing.assert_close(th.ista_step(S.Z, S.Z, D, 1.0, 0.05), torch.relu(S.Z @ D - 0.05))
    Ds = th.orthogonal_dictionary(th.random_subspaces(16, 2, 4, seed=0), "subspaces")  # K·p < d: completed
    torch.testing.assert_close(Ds.T @ Ds, torch.eye(16, dtype=D.dtype))


# --------------------------------------------------------------------------- denoising (Theorem 16)
@pytest.mark.slow
def test_theorem16_at_crate_base_scale(reports):
    rep = reports[1]["denoising"]
    r = {k: np.array(v) for k, v in rep["results"].items() if isinstance(v, list)}
    assert rep["config"]["d"] == 768 and rep["config"]["n"] == 196
    assert (r["off_energy_ratio"] < 0.5).all()  # (a) most off-subspace noise removed by one step
    np.testing.assert_allclose(r["off_energy_ratio"], r["off_energy_ratio_nominal"], rtol=0.05)
    np.testing.assert_allclose(r["off_energy_ratio"][0], r["off_energy_ratio_limit"][0], rtol=0.1)  # (249)
    np.testing.assert_allclose(r["shrink"], r["shrink_predicted"], atol=0.01)  # (b) 1/(1 + β⁻¹)
    assert (np.abs(r["shrink"] - r["shrink_asymptotic"]) > 0.05).all()  # (247) needs n/d → 0: not at this scale
    assert (np.diff(r["residual_rel"]) > 0).all() and r["residual_rel"][0] < 0.02  # (c)


def test_theorem16_nominal_formula_matches_direct_projections():
    K, p, n = 3, 8, 18
    d = K * p
    U = th.random_subspaces(d, K, p, seed=4)
    S = th.sample_subspace_mixture(U, n, 0.05, seed=4)
    beta = 2.0
    got = th.theorem16_nominal(S, beta)
    P = []  # eq. (313) written with d×d matrices
    for k in range(K):
        Pk = torch.zeros(d, d, dtype=S.Z.dtype)
        for j in range(K):
            if j != k:
                A = U[j].T @ S.signal[S.labels == j].T
                inner = (
                    torch.eye(p, dtype=A.dtype)
                    - A @ torch.linalg.inv(torch.eye(A.shape[1], dtype=A.dtype) / beta + A.T @ A) @ A.T
                )
                Pk += U[j] @ inner @ U[j].T
        P.append(Pk)
    want = torch.stack([S.noise[i] - P[int(S.labels[i])] @ S.noise[i] + S.signal[i] / (1 + 1 / beta) for i in range(n)])
    torch.testing.assert_close(got, want)


# --------------------------------------------------------------------------- tweedie
def test_mixture_score_against_autograd_and_bayes():
    U = th.random_subspaces(12, 3, 3, seed=6)
    for sigma in (0.05, 0.5):
        x = th.sample_subspace_mixture(U, 50, sigma, convention="isotropic", seed=6).Z
        xg = x.clone().requires_grad_(True)
        (auto,) = torch.autograd.grad(th.gmm_log_density(xg, U, sigma).sum(), xg)
        torch.testing.assert_close(th.gmm_score(x, U, sigma), auto, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(th.tweedie_denoiser(x, U, sigma), th.gmm_posterior_mean(x, U, sigma))
    # unequal weights (the general form (225), which (215) assumes away through (213))
    w = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    xg = x.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(th.gmm_log_density(xg, U, 0.5, weights=w).sum(), xg)
    torch.testing.assert_close(th.gmm_score(x, U, 0.5, weights=w), auto, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
def test_tweedie_attention_form_tends_to_posterior_mean_and_projection(reports):
    rep = reports[1]["tweedie"]
    r = {k: np.array(v) for k, v in rep["results"].items()}
    assert r["score_vs_autograd"].max() < 1e-8 and r["tweedie_vs_bayes"].max() < 1e-8
    assert (np.diff(r["attention_vs_posterior"]) > 0).all() and r["attention_vs_posterior"][0] < 1e-3
    assert r["attention_vs_projection"][0] < 1e-6 and r["argmax_accuracy"][0] == 1.0
    assert (r["mse_posterior_mean"] < r["mse_noisy"]).all()


# --------------------------------------------------------------------------- ista
@pytest.mark.slow
def test_ista_descent_and_sklearn(reports):
    rep = reports[1]["ista"]
    r = rep["results"]
    assert claim(rep, "descent lemma")["holds"]
    assert r["final_distance_to_sklearn"] < 1e-6 and r["code_vs_math_max_abs"] < 1e-12
    mults = rep["config"]["step_multipliers"]
    for fam, ratios in r["min_decrease_ratio"].items():
        for c, ratio in zip(mults, ratios):
            if c < 2:
                assert ratio >= 1 / c - 0.5 - 1e-9, (fam, c)


def test_sklearn_scaling_gives_the_lasso_minimiser():
    g = torch.Generator().manual_seed(0)
    D = torch.randn(20, 12, generator=g, dtype=torch.float64) / 4
    X = torch.randn(5, 20, generator=g, dtype=torch.float64)
    Z = th.sklearn_nonneg_lasso(X, D, 0.2)
    F = th.nonneg_lasso_objective(Z, X, D, 0.2)
    assert (Z >= 0).all() and math.isfinite(F)
    # KKT of (42): gradient + λ = 0 on the support, ≥ 0 off it
    grad = (Z @ D.T - X) @ D + 0.2
    assert float(grad[Z > 0].abs().max()) < 1e-8 and float(grad[Z == 0].min()) > -1e-8
    assert F <= th.nonneg_lasso_objective(th.ista_solve(X, D, 0.2, 50)[-1], X, D, 0.2) + 1e-12


# --------------------------------------------------------------------------- diffusion
@pytest.mark.slow
def test_structured_diffusion_inverts_denoising_at_first_order(reports):
    rep = reports[1]["diffusion"]
    r = rep["results"]
    rec, enc = np.array(r["reconstruction_error"]), np.array(r["encoder_error_vs_ode"])
    assert (np.diff(rec) < 0).all() and (np.diff(enc) < 0).all()
    steps = np.array(r["steps"])
    assert -1.3 < np.polyfit(np.log(steps[-3:]), np.log(rec[-3:]), 1)[0] < -0.7
    assert r["exact_round_trip_error"] < 1e-8
    assert (
        r["rc_encoded_exact"] < r["rc_input"]
        and r["off_subspace_fraction_encoded_exact"] < r["off_subspace_fraction_input"]
    )
    assert not claim(rep, "as printed")["holds"]  # the (1+2κ)^L off-by-one of App. B.4


def test_diffusion_grid_and_single_steps():
    times, kappa = th.diffusion_grid(0.09, 0.0009, 8)
    assert len(times) == 9 and math.isclose(times[-1], 0.09, rel_tol=1e-12)
    np.testing.assert_allclose((times[1:] - times[:-1]) / (2 * times[:-1]), kappa)  # (435)
    U = th.random_subspaces(16, 2, 8, seed=0)
    Z = th.sample_subspace_mixture(U, 8, 0.3, seed=0).Z
    up = th.structured_diffuse(Z, U, 0.5, 0.09, 0.0009, 8)
    torch.testing.assert_close(up[1], Z + kappa * subspace_coding_rate_grad(Z, U, 0.5))  # (434)
    assert len(th.structured_denoise(Z, U, 0.5, 0.09, 0.0009, 8)) == 9
