"""Objectives vs a direct float64 numpy transcription of the paper's formulas (column form), on the device under
test (``CRATE_TEST_DEVICE``)."""

import numpy as np
import pytest
import torch
from tolerances import tol

import crate_transformer as ct


def np_logdet(A):
    sign, val = np.linalg.slogdet(A)
    assert sign > 0
    return val


def np_R(Zc, eps):  # eq. (8): Zc is d x n
    d, n = Zc.shape
    return 0.5 * np_logdet(np.eye(d) + d / (n * eps**2) * Zc @ Zc.T)


def np_Rc(Zc, U, eps):  # eq. (13): U is K x d x p
    d, n = Zc.shape
    p = U.shape[-1]
    return sum(0.5 * np_logdet(np.eye(n) + p / (n * eps**2) * (Uk.T @ Zc).T @ (Uk.T @ Zc)) for Uk in U)


def rand_U(K, d, p, seed=0):
    g = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(g.standard_normal((d, d)))
    return torch.from_numpy(np.stack([Q[:, k * p : (k + 1) * p] for k in range(K)]))


@pytest.mark.parametrize("n,d", [(10, 24), (40, 12)])  # both Gram branches (n <= d and n > d)
def test_coding_rate_matches_formula(n, d, device):
    Z = torch.randn(3, n, d, dtype=torch.float64)
    got = ct.coding_rate(Z.to(device), eps=0.3).cpu()
    want = [np_R(z.numpy().T, 0.3) for z in Z]
    np.testing.assert_allclose(got.numpy(), want, rtol=tol(torch.float64, device)["rtol"])


def test_float32_input_with_float64_computation(device):
    Z = torch.randn(2, 16, 8)
    got = ct.coding_rate(Z.to(device), eps=0.5, dtype=torch.float64).cpu()
    assert got.dtype == torch.float64
    want = [np_R(z.double().numpy().T, 0.5) for z in Z]
    np.testing.assert_allclose(got.numpy(), want, rtol=tol(torch.float64, device)["rtol"])
    np.testing.assert_allclose(ct.coding_rate(Z.to(device), eps=0.5).cpu().numpy(), got.numpy(), rtol=1e-4)


def test_subspace_coding_rate_matches_formula_and_is_sum_of_subspace_rates(device):
    K, d, p, n = 4, 16, 4, 12
    U = rand_U(K, d, p)
    Z = torch.randn(2, n, d, dtype=torch.float64)
    got = ct.subspace_coding_rate(Z.to(device), U.to(device), eps=0.2).cpu()
    want = [np_Rc(z.numpy().T, U.numpy(), 0.2) for z in Z]
    np.testing.assert_allclose(got.numpy(), want, rtol=tol(torch.float64, device)["rtol"])
    U, Z = U.to(device), Z.to(device)
    got = got.to(device)
    per = sum(ct.subspace_coding_rate(Z, U[k : k + 1], eps=0.2) for k in range(K))
    torch.testing.assert_close(got, per)
    # each subspace rate is the coding rate of the projected tokens (p-dim, so alpha = beta)
    per2 = sum(ct.coding_rate(Z @ U[k], eps=0.2) for k in range(K))
    torch.testing.assert_close(got, per2)


def test_rate_reduction_and_sparse_rate_reduction(device):
    K, d, p, n = 2, 8, 4, 10
    U = rand_U(K, d, p)
    Z = torch.relu(torch.randn(n, d, dtype=torch.float64))
    Zc = Z.numpy().T
    dr = np_R(Zc, 0.5) - np_Rc(Zc, U.numpy(), 0.5)
    Z, U = Z.to(device), U.to(device)
    rel = tol(torch.float64, device)["rtol"]
    assert ct.rate_reduction(Z, U, eps=0.5).item() == pytest.approx(dr, rel=rel)
    l1 = ct.sparse_rate_reduction(Z, U, lambd=0.3, eps=0.5, norm="l1").item()
    l0 = ct.sparse_rate_reduction(Z, U, lambd=0.3, eps=0.5, norm="l0").item()
    assert l1 == pytest.approx(dr - 0.3 * np.abs(Zc).sum(), rel=rel)
    assert l0 == pytest.approx(dr - 0.3 * (Zc != 0).sum(), rel=rel)
    with pytest.raises(ValueError, match="norm"):
        ct.sparse_rate_reduction(Z, U, norm="l2")


def test_membership_coding_rate_matches_eq9(device):
    d, n, eps = 6, 30, 0.4
    Z = torch.randn(n, d, dtype=torch.float64)
    labels = torch.tensor([i % 3 for i in range(n)])
    labels[labels == 2] = 3  # class 2 empty, class 3 present
    Zc = Z.numpy().T
    want = 0.0
    for k in range(4):
        idx = (labels == k).numpy()
        if idx.sum() == 0:
            continue
        Zk = Zc[:, idx]
        want += 0.5 * np_logdet(np.eye(d) + d / (idx.sum() * eps**2) * Zk @ Zk.T)
    got = ct.membership_coding_rate(Z.to(device), labels.to(device), num_classes=4, eps=eps)
    assert got.item() == pytest.approx(want, rel=tol(torch.float64, device)["rtol"])


@pytest.mark.parametrize("n,d", [(9, 20), (25, 7)])
def test_coding_rate_grad_matches_autograd(n, d, device):
    Z = torch.randn(2, n, d, dtype=torch.float64).to(device).requires_grad_()
    ct.coding_rate(Z, eps=0.5).sum().backward()
    torch.testing.assert_close(ct.coding_rate_grad(Z.detach(), eps=0.5), Z.grad, rtol=1e-9, atol=1e-10)


def test_subspace_coding_rate_grad_matches_autograd(device):
    U = rand_U(3, 12, 4).to(device)
    Z = torch.randn(2, 15, 12, dtype=torch.float64).to(device).requires_grad_()
    ct.subspace_coding_rate(Z, U, eps=0.5).sum().backward()
    torch.testing.assert_close(ct.subspace_coding_rate_grad(Z.detach(), U, eps=0.5), Z.grad, rtol=1e-9, atol=1e-10)


def test_rate_is_invariant_to_orthogonal_transform(device):
    d = 10
    Q, _ = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64))
    Q, Z = Q.to(device), torch.randn(20, d, dtype=torch.float64).to(device)
    # R(DZ) = R(Z) for orthogonal D (eq. (120)); row tokens: Z Dᵀ
    torch.testing.assert_close(ct.coding_rate(Z @ Q.T), ct.coding_rate(Z))


def test_eps_is_precision_not_its_square(device):
    """The official CodingRate(eps=0.01) is eps²: ours with eps=0.1 must give the same value."""
    b, h, m, p = 2, 3, 11, 5
    X = torch.nn.functional.normalize(torch.randn(b, h, m, p, dtype=torch.float64), dim=-1).to(device)
    eye = torch.eye(m, dtype=torch.float64, device=device)
    official = 0.5 * torch.logdet(eye + p / (m * 0.01) * X @ X.transpose(-1, -2)).sum(1)
    ours = ct.coding_rate(X, eps=0.1).sum(1)
    torch.testing.assert_close(ours, official)


def test_sparsity_measures():
    Z = torch.tensor([[0.0, 1.0, -2.0, 0.0], [0.0, 0.0, 3.0, 4.0]])
    assert ct.sparsity(Z).item() == pytest.approx(4 / 8)
    assert ct.l1_per_entry(Z).item() == pytest.approx(10 / 8)


def test_subspaces_from_qkv_matches_mssa():
    from crate_transformer.layers import MSSA

    m = MSSA(12, heads=3, dim_head=4)
    U = ct.subspaces_from_qkv(m.qkv.weight, 3)
    assert U.shape == (3, 12, 4)
    torch.testing.assert_close(U, m.subspaces())
    x = torch.randn(5, 12)
    torch.testing.assert_close(x @ U[1], m.qkv(x)[:, 4:8])


def test_bad_input_errors():
    U = rand_U(2, 8, 4)
    with pytest.raises(ValueError, match="shape \\(K, d, p\\)"):
        ct.subspace_coding_rate(torch.randn(5, 6), U)
    with pytest.raises(ValueError, match="floating-point"):
        ct.coding_rate(torch.ones(4, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="eps"):
        ct.coding_rate(torch.randn(4, 3), eps=0.0)
    with pytest.raises(ValueError, match="\\(\\.\\.\\., n, d\\)"):
        ct.coding_rate(torch.randn(4))


# --------------------------------------------------------------------------- precision of the linear algebra
def test_float64_computation_of_float32_subspace_rates(device):
    """dtype=float64 on float32 tokens: U follows the computation's dtype (it used to stay float32 and fail)."""
    K, d, p, n = 2, 8, 4, 6
    U, Z = rand_U(K, d, p).float(), torch.randn(2, n, d)
    want = [np_Rc(z.double().numpy().T, U.double().numpy(), 0.3) for z in Z]
    want_rr = [np_R(z.double().numpy().T, 0.3) - w for z, w in zip(Z, want)]
    U, Z, rtol = U.to(device), Z.to(device), tol(torch.float64, device)["rtol"]
    rc = ct.subspace_coding_rate(Z, U, eps=0.3, dtype=torch.float64)
    assert rc.dtype == torch.float64
    np.testing.assert_allclose(rc.cpu().numpy(), want, rtol=rtol)
    rr = ct.rate_reduction(Z, U, eps=0.3, dtype=torch.float64)
    np.testing.assert_allclose(rr.cpu().numpy(), want_rr, rtol=rtol)
    grad = ct.subspace_coding_rate_grad(Z, U, eps=0.3, dtype=torch.float64)
    torch.testing.assert_close(grad, ct.subspace_coding_rate_grad(Z.double(), U.double(), eps=0.3))


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
def test_half_precision_tokens_are_computed_in_float32(half, device):
    """Cholesky / slogdet / solve have no half kernels: half tokens are computed (and returned) in float32."""
    K, d, p, n = 2, 8, 4, 6
    U, Z = rand_U(K, d, p).to(device, half), torch.randn(2, n, d).to(device, half)
    Zd, Ud = Z.double(), U.double()  # the same (rounded) values in float64
    for got, want in [
        (ct.coding_rate(Z, 0.3), ct.coding_rate(Zd, 0.3)),
        (ct.subspace_coding_rate(Z, U, 0.3), ct.subspace_coding_rate(Zd, Ud, 0.3)),
        (ct.rate_reduction(Z, U, 0.3), ct.rate_reduction(Zd, Ud, 0.3)),
        (ct.sparse_rate_reduction(Z, U, 0.1, 0.3), ct.sparse_rate_reduction(Zd, Ud, 0.1, 0.3)),
        (ct.coding_rate_grad(Z, 0.3), ct.coding_rate_grad(Zd, 0.3)),
        (ct.subspace_coding_rate_grad(Z, U, 0.3), ct.subspace_coding_rate_grad(Zd, Ud, 0.3)),
    ]:
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, **tol(torch.float32, device))


def test_the_linear_algebra_runs_outside_autocast(device):
    """Under bf16 autocast (a mixed-precision training step) the Gram matrices stay float32: the rates agree with
    float64 to float32 rounding (1e-5), which a bf16 Gram misses."""
    K, d, p, n = 2, 32, 16, 48
    U, Z = rand_U(K, d, p).float().to(device), torch.randn(2, n, d).to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        assert (Z @ Z.mT).dtype == torch.bfloat16  # what autocast would do to the Gram
        r, rc = ct.coding_rate(Z, 0.1), ct.subspace_coding_rate(Z, U, 0.1)
        grad = ct.subspace_coding_rate_grad(Z, U, 0.1)
    torch.testing.assert_close(r.double(), ct.coding_rate(Z.double(), 0.1), rtol=1e-5, atol=0)
    torch.testing.assert_close(rc.double(), ct.subspace_coding_rate(Z.double(), U.double(), 0.1), rtol=1e-5, atol=0)
    assert grad.dtype == torch.float32
