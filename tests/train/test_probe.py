"""Frozen-feature evaluation: weighted k-NN and the linear probe against direct computations, and ``crate eval``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from crate_transformer import cli, create_model
from crate_transformer.analysis.probe import extract_features, knn_classify, knn_sweep, linear_probe, pool_tokens
from crate_transformer.data import load_dataset
from crate_transformer.train.evaluation import prepare_batch


def _blobs(n: int, d: int = 6, classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian clusters around fixed centres (the same for every seed: seeds draw new samples)."""
    centres = torch.randn(classes, d, generator=torch.Generator().manual_seed(123)) * 2
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    return centres[y] + torch.randn(n, d, generator=g), y


def _knn_by_hand(tx, ty, qx, k, t, classes):
    """The weighted k-NN rule written directly: cosine similarity, top-k, votes exp(s / T)."""
    tx = tx.double().numpy() / np.linalg.norm(tx.double().numpy(), axis=1, keepdims=True)
    qx = qx.double().numpy() / np.linalg.norm(qx.double().numpy(), axis=1, keepdims=True)
    preds = []
    for q in qx:
        s = tx @ q
        near = np.argsort(-s, kind="stable")[:k]
        votes = np.zeros(classes)
        for i in near:
            votes[ty[i]] += math.exp(s[i] / t)
        preds.append(int(np.argmax(votes)))
    return np.array(preds)


def test_knn_matches_the_rule_written_directly() -> None:
    tx, ty = _blobs(300)
    qx, qy = _blobs(120, seed=1)
    qx = qx + 1.5 * torch.randn(qx.shape, generator=torch.Generator().manual_seed(5))  # make mistakes possible
    accs = knn_sweep(tx, ty, qx, qy, ks=(1, 10, 20, 300), temperature=0.07, chunk=50)
    for k in (1, 10, 20, 300):
        expected = float((_knn_by_hand(tx, ty.numpy(), qx, k, 0.07, 3) == qy.numpy()).mean())
        assert accs[k] == pytest.approx(expected), k
    assert 0.4 < accs[20] < 1.0  # informative but not trivial
    assert knn_classify(tx, ty, qx, qy, k=20) == accs[20]


def test_linear_probe_is_sklearns_logistic_regression_with_the_scaling_folded_in() -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    for classes in (2, 4):
        tx, ty = _blobs(400, classes=classes)
        qx, qy = _blobs(200, classes=classes, seed=1)
        r = linear_probe(tx, ty, qx, qy, C=0.5)
        sc = StandardScaler().fit(tx.double().numpy())
        clf = LogisticRegression(C=0.5, max_iter=2000).fit(sc.transform(tx.double().numpy()), ty.numpy())
        assert r.acc == pytest.approx(clf.score(sc.transform(qx.double().numpy()), qy.numpy()))
        assert r.weight.shape == (classes, 6) and r.bias.shape == (classes,)
        logits = qx @ r.weight.T + r.bias  # the probe as a linear head on the raw features
        assert ((logits.argmax(1) == qy).float().mean().item()) == pytest.approx(r.acc, abs=1 / 200)
        assert r.acc > 0.8


def test_bad_features_are_one_line_errors() -> None:
    tx, ty = _blobs(50)
    with pytest.raises(ValueError, match="differ in width"):
        knn_sweep(tx, ty, tx[:, :3], ty)
    bad = tx.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        linear_probe(bad, ty, tx, ty)
    with pytest.raises(ValueError, match="two classes"):
        linear_probe(tx, torch.zeros_like(ty), tx, ty)
    with pytest.raises(ValueError, match="pooling"):
        pool_tokens(torch.zeros(2, 3, 4), "max")


def test_features_are_the_pooled_encoder_tokens() -> None:
    torch.manual_seed(0)
    model = create_model("crate_mnist", dim=32, depth=1, heads=2, patch_size=4, image_size=8, in_chans=1).eval()
    ds = load_dataset("digits", "test")
    mean, std = ds.mean, ds.std
    for pool in ("cls", "mean", "avg"):
        feats, labels = extract_features(model, ds, pool=pool, batch_size=100, mean=mean, std=std)
        assert feats.shape == (len(ds), 32) and torch.equal(labels, ds.labels.long())
        images, _ = next(iter(ds.batches(7, shuffle=False)))
        x = prepare_batch(images, device=torch.device("cpu"), image_size=8, channels=1, mean=mean, std=std)
        with torch.no_grad():
            z = model.forward_features(x)
        direct = {"cls": z[:, 0], "mean": z.mean(1), "avg": z[:, 1:].mean(1)}[pool]
        torch.testing.assert_close(feats[:7], direct)


def test_crate_eval_knn_and_linear_probe(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = create_model("crate_mnist", dim=32, depth=1, heads=2, patch_size=4, image_size=8, in_chans=1)
    model.save_pretrained(tmp_path / "m")
    out = tmp_path / "ev"
    argv = ["eval", tmp_path / "m", "--data", "digits", "--knn", "--linear-probe", "--pool", "avg", "--out", out]
    assert cli.main([str(a) for a in argv]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert set(report["knn"]) == {"10", "20", "100", "200"}
    assert report["pool"] == "avg" and report["dim"] == 32
    # a random encoder's features of the 8x8 digits still separate the classes far above chance (10%)
    assert report["knn"]["20"] > 0.5 and report["linear_probe"]["acc"] > 0.5
    assert (out / "knn.png").read_bytes()[:4] == b"\x89PNG"


def test_crate_eval_on_an_mae_run_reports_its_summarys_probe_with_the_pooling_named(tmp_path: Path, capsys) -> None:
    """Issue 49 §3: one number per quantity.  ``crate eval --linear-probe`` on a ``crate pretrain mae`` run uses the
    features of the run's own summary probe (probe.json, mean of the patch tokens) and says so; the class token is
    another number, labelled as such."""
    import tiny

    from crate_transformer.analysis.probe import POOL_WORDS, default_probe_pool, pool_words
    from crate_transformer.loading.pipeline import load_model

    run = tmp_path / "mae"
    mae = ["pretrain", "mae", "--data", "digits", "--max-steps", "2", "--epochs", "1", "--threads", "1"]
    assert cli.main([*mae, "--no-progress", "--no-recognition", "--model-args", *tiny.SSL_ARCH, "--out", str(run)]) == 0
    summary = json.loads((run / "probe.json").read_text())
    assert summary["pool"] == "avg" and summary["features"] == "mean of the patch tokens (pool=avg)"
    assert f"linear probe on the {pool_words('avg')} {100 * summary['encoder']['acc']:.2f}%" in capsys.readouterr().out
    assert cli.main(["eval", str(run), "--linear-probe", "--out", str(tmp_path / "ev")]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert report["pool"] == "avg" and report["features"] == pool_words("avg")
    assert report["linear_probe"]["acc"] == pytest.approx(summary["encoder"]["acc"], abs=1e-12)  # the same number
    assert f"linear probe (logistic) on the {pool_words('avg')}: {100 * summary['encoder']['acc']:.2f}%" in printed
    assert cli.main(["eval", str(run), "--linear-probe", "--pool", "cls", "--out", str(tmp_path / "cls")]) == 0
    assert f"on the {POOL_WORDS['cls']} (pool=cls)" in capsys.readouterr().out
    # outside a run: the model's own pooling, else the patch-token mean of eq. (72)
    model = create_model("crate_mnist", dim=32, depth=1, heads=2, patch_size=4, image_size=8, in_chans=1)
    assert default_probe_pool(model) == model.config.pool
    assert default_probe_pool(load_model(str(run / "model"))) == "avg"
