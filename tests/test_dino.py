"""CRATE-DINO (JMLR §4.1.3): the DINO pieces against independent computations, then the task end to end."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from crate_transformer.dino import (
    DINOConfig,
    DINOHead,
    DINOLoss,
    DINOModel,
    MultiCropAugmentation,
    cosine_schedule,
    ema_update,
    teacher_temperature,
)
from crate_transformer.registry import create_model

TINY_ARCH = dict(image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=2, heads=2)


def _student(out_dim: int = 16, **head: object) -> DINOModel:
    backbone = create_model("crate_mnist", **TINY_ARCH)
    return DINOModel(backbone, DINOHead(32, out_dim, hidden_dim=24, bottleneck_dim=8, **head), pool="mean")


# --------------------------------------------------------------------------- pieces
def test_ema_update_matches_the_formula() -> None:
    student, teacher = _student(), _student()
    before = [p.detach().clone() for p in teacher.parameters()]
    ema_update(teacher, student, 0.9)
    for t0, t1, s in zip(before, teacher.parameters(), student.parameters()):
        torch.testing.assert_close(t1, 0.9 * t0 + 0.1 * s, rtol=0, atol=1e-6)
    ema_update(teacher, student, 0.0)  # momentum 0: a copy
    assert all(torch.equal(t, s) for t, s in zip(teacher.parameters(), student.parameters()))


def test_cosine_schedules_and_teacher_temperature() -> None:
    # DINO's cosine_scheduler: base + 0.5 (start - base)(1 + cos(pi t / T))
    total = 100
    m = [cosine_schedule(0.996, 1.0, t, total) for t in range(total + 1)]
    ref = 1.0 + 0.5 * (0.996 - 1.0) * (1 + np.cos(np.pi * np.arange(total + 1) / total))
    np.testing.assert_allclose(m, ref, rtol=0, atol=1e-12)
    assert m[0] == pytest.approx(0.996) and m[-1] == pytest.approx(1.0) and all(np.diff(m) >= 0)
    cfg = DINOConfig(warmup_teacher_temp=0.04, teacher_temp=0.07, warmup_teacher_temp_epochs=30)
    assert teacher_temperature(cfg, 0) == pytest.approx(0.04)
    assert teacher_temperature(cfg, 15) == pytest.approx(0.055)
    assert teacher_temperature(cfg, 30) == teacher_temperature(cfg, 99) == pytest.approx(0.07)


def test_loss_is_the_cross_entropy_over_distinct_views_and_the_centre_is_an_ema_of_the_batch_mean() -> None:
    g = torch.Generator().manual_seed(1)
    b, k, views = 5, 7, 4  # 2 global + 2 local views
    s = torch.randn(views * b, k, generator=g)
    t = torch.randn(2 * b, k, generator=g)
    loss_fn = DINOLoss(k, student_temp=0.1, center_momentum=0.9)
    loss_fn.center.copy_(torch.randn(1, k, generator=g))
    c0 = loss_fn.center.numpy().copy()
    loss = loss_fn(s, t, teacher_temp=0.04)
    # numpy reference: softmax((t - c) / tau_t) against log_softmax(s / tau_s), every pair with v != iq
    sn, tn = s.double().numpy(), t.double().numpy()
    q = np.exp((tn - c0) / 0.04)
    q /= q.sum(-1, keepdims=True)
    logp = sn / 0.1 - np.log(np.exp(sn / 0.1).sum(-1, keepdims=True))
    terms = [
        -(q[i * b : (i + 1) * b] * logp[v * b : (v + 1) * b]).sum(-1).mean()
        for i in range(2)
        for v in range(views)
        if v != i
    ]
    assert len(terms) == 6
    assert loss.item() == pytest.approx(np.mean(terms), rel=1e-5)
    np.testing.assert_allclose(loss_fn.center.numpy(), 0.9 * c0 + 0.1 * tn.mean(0, keepdims=True), rtol=1e-5, atol=1e-6)
    frozen = loss_fn.center.clone()
    loss_fn(s, t, teacher_temp=0.04, update=False)
    assert torch.equal(loss_fn.center, frozen)


def test_head_is_l2_normalised_with_a_unit_norm_weight_normalised_last_layer() -> None:
    head = DINOHead(32, 50, hidden_dim=24, bottleneck_dim=8, nlayers=3)
    linears = [m for m in head.mlp if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(32, 24), (24, 24), (24, 8)]
    assert sum(isinstance(m, torch.nn.GELU) for m in head.mlp) == 2
    w = head.last_layer.weight  # the effective weight: every row has norm 1 (g fixed to 1)
    torch.testing.assert_close(w.norm(dim=1), torch.ones(50))
    x = torch.randn(6, 32)
    z = F.normalize(head.mlp(x), dim=-1)
    torch.testing.assert_close(head(x), z @ w.T)
    assert [p.shape for p in head.last_layer_parameters()] == [torch.Size([50, 8])]  # g is not trained
    bn = DINOHead(32, 50, hidden_dim=24, bottleneck_dim=8, use_bn=True, norm_last_layer=False)
    assert sum(isinstance(m, torch.nn.BatchNorm1d) for m in bn.mlp) == 2 and len(bn.last_layer_parameters()) == 2


def test_multicrop_views_and_the_wrapper_batches_views_by_size() -> None:
    cfg = DINOConfig.from_preset("paper", local_crops_number=3)
    aug = MultiCropAugmentation(cfg, global_size=32, channels=3, multiple=4)
    views = aug(torch.rand(5, 3, 40, 40))
    assert [tuple(v.shape) for v in views] == [(5, 3, 32, 32)] * 2 + [(5, 3, 12, 12)] * 3
    assert all(0.0 <= v.min() and v.max() <= 1.0 for v in views)
    grey = MultiCropAugmentation(DINOConfig.from_preset("digits", local_crops_number=2), 8, 1, multiple=2)
    gviews = grey(torch.rand(4, 1, 8, 8))
    assert [tuple(v.shape) for v in gviews] == [(4, 1, 8, 8)] * 2 + [(4, 1, 4, 4)] * 2
    student = _student()
    out = student(gviews)
    assert out.shape == (16, 16)
    # view by view gives the same outputs (batching by size changes nothing)
    single = torch.cat([student([v]) for v in gviews])
    torch.testing.assert_close(out, single, rtol=1e-5, atol=1e-5)


def test_presets_and_options() -> None:
    paper = DINOConfig.from_preset("paper")
    assert (paper.out_dim, paper.hidden_dim, paper.bottleneck_dim, paper.local_crops_number) == (65536, 2048, 256, 8)
    assert (paper.student_temp, paper.teacher_temp, paper.momentum_teacher, paper.center_momentum) == (
        0.1, 0.04, 0.996, 0.9,
    )  # fmt: skip
    assert DINOConfig.from_preset("digits", out_dim=99).out_dim == 99
    with pytest.raises(ValueError, match="unknown DINO preset"):
        DINOConfig.from_preset("imagenet")
    with pytest.raises(ValueError, match="unknown DINO option"):
        DINOConfig.from_preset("digits", teacher_tmp=0.1)
    with pytest.raises(ValueError, match="area fractions"):
        DINOConfig(global_crops_scale=[0.5, 1.5])


def test_teacher_copy_gets_no_gradient_and_the_student_classifier_head_is_frozen() -> None:
    student = _student()
    teacher = copy.deepcopy(student).requires_grad_(False)
    x = [torch.randn(3, 1, 8, 8), torch.randn(3, 1, 8, 8)]
    loss = DINOLoss(16)(student(x), teacher(x), 0.04)
    loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert all(p.grad is None for p in student.backbone.head.parameters())
    assert student.backbone.layers[0].attn.qkv.weight.grad is not None
    assert math.isfinite(loss.item())
