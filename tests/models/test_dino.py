"""CRATE-DINO (JMLR §4.1.3): the DINO pieces against independent computations, then the task end to end."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import tiny
import torch
import torch.nn.functional as F
from clitools import crate, one_line_error
from official import dino as official

from crate_transformer.models.dino import (
    DINOHead,
    DINOLoss,
    DINOModel,
    cosine_schedule,
    ema_update,
    teacher_temperature,
)
from crate_transformer.models.registry import create_model
from crate_transformer.train.dino import DINOOptions, MultiCropAugmentation

TINY_ARCH = {**tiny.DIGITS, "heads": 2}


def _student(out_dim: int = 16, **head: object) -> DINOModel:
    backbone = create_model("crate_mnist", **TINY_ARCH)
    return DINOModel(backbone, DINOHead(32, out_dim, hidden_dim=24, bottleneck_dim=8, **head), pool="avg")


# --------------------------------------------------------------------------- pieces
def test_ema_update_matches_the_formula() -> None:
    student, teacher = _student(), _student()
    before = [p.detach().clone() for p in teacher.parameters()]
    ema_update(teacher, student, 0.9)
    for t0, t1, s in zip(before, teacher.parameters(), student.parameters()):
        torch.testing.assert_close(t1, 0.9 * t0 + 0.1 * s, rtol=0, atol=1e-6)
    ema_update(teacher, student, 0.0)  # momentum 0: a copy
    assert all(torch.equal(t, s) for t, s in zip(teacher.parameters(), student.parameters()))


def test_cosine_schedules_match_dinos_cosine_scheduler() -> None:
    # DINO's momentum and weight-decay schedules: utils.cosine_scheduler (transcribed), one value per iteration
    epochs, niter = 5, 20
    for start, end in ((0.996, 1.0), (0.04, 0.4), (0.005, 0.4)):
        ref = official.cosine_scheduler(start, end, epochs, niter)
        ours = [cosine_schedule(start, end, it, epochs * niter) for it in range(epochs * niter)]
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-15)
    m = [cosine_schedule(0.996, 1.0, t, 100) for t in range(101)]
    assert m[0] == pytest.approx(0.996) and m[-1] == pytest.approx(1.0) and all(np.diff(m) >= 0)


@pytest.mark.parametrize("warmup,nepochs", [(0, 4), (1, 4), (2, 5), (30, 100), (5, 5)])
def test_teacher_temperature_is_dinos_per_epoch_table(warmup: int, nepochs: int) -> None:
    """DINOLoss.teacher_temp_schedule (transcribed), indexed by the whole epoch: linear over epochs 0..W-1."""
    cfg = DINOOptions(warmup_teacher_temp=0.04, teacher_temp=0.07, warmup_teacher_temp_epochs=warmup)
    ref = official.teacher_temp_schedule(0.04, 0.07, warmup, nepochs)
    ours = [teacher_temperature(cfg, e) for e in range(nepochs)]
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-15)
    if warmup >= 2:  # the warm-up value in epoch 0, the final value already in epoch W-1
        assert ours[0] == 0.04 and ours[warmup - 1] == 0.07
    with pytest.raises(ValueError, match="whole epoch index"):
        teacher_temperature(cfg, 0.5)  # constant within an epoch: a fractional epoch is a caller's mistake
    with pytest.raises(ValueError, match="warmup_teacher_temp_epochs must be an integer"):
        DINOOptions(warmup_teacher_temp_epochs=2.5)
    with pytest.raises(ValueError, match=r"non-negative integer \(whole epochs\)"):
        DINOOptions(warmup_teacher_temp_epochs=-1)
    assert DINOOptions(warmup_teacher_temp_epochs=3.0).warmup_teacher_temp_epochs == 3


def test_the_task_holds_the_temperature_for_a_whole_epoch() -> None:
    from crate_transformer.train.dino import DINOTask

    task = DINOTask()
    task.options = DINOOptions(warmup_teacher_temp=0.04, teacher_temp=0.07, warmup_teacher_temp_epochs=3)
    task.steps_per_epoch = 7
    ref = official.teacher_temp_schedule(0.04, 0.07, 3, 5)
    temps = [task.teacher_temp(step) for step in range(5 * 7)]
    np.testing.assert_allclose(temps, np.repeat(ref, 7), rtol=0, atol=1e-15)


def _dino_settings_task(head: DINOHead, cfg, steps_per_epoch: int, **options: object):
    """A DINOTask with just what ``before_optimizer_step`` reads (its student's head, options and sizes)."""
    from types import SimpleNamespace

    from crate_transformer.train.dino import DINOTask

    task = DINOTask()
    task.options, task.cfg = DINOOptions(**options), cfg
    task.steps_per_epoch, task.total_steps = steps_per_epoch, steps_per_epoch * cfg.optim.epochs
    task.student = SimpleNamespace(head=head)
    return task


def test_frozen_last_layer_and_weight_decay_schedule_match_dinos_loop() -> None:
    """The engine's optimizer + DINOTask.before_optimizer_step against DINO's train_one_epoch (transcribed):
    AdamW over get_params_groups, lr and wd per iteration from cosine_scheduler, cancel_gradients_last_layer.
    During epoch 0 the last layer has no gradient, so AdamW creates no state for it (step count 0, no weight
    decay); from epoch 1 its step count runs from 1 — as in DINO.  A zeroed gradient would count those steps."""
    from crate_transformer.train import TrainConfig
    from crate_transformer.train.optim import Optimization
    from crate_transformer.train.runtime import Runtime

    spe, epochs = 3, 3
    total = spe * epochs
    lr, min_lr, wd, wd_end = 5e-3, 1e-4, 0.04, 0.4
    head = DINOHead(16, 32, hidden_dim=24, bottleneck_dim=8)
    ref_head = copy.deepcopy(head)
    cfg = TrainConfig(lr=lr, min_lr=min_lr, weight_decay=wd, warmup_epochs=0, grad_clip=0, epochs=epochs)
    opt = Optimization(head, cfg.optim, spe, total, Runtime())
    task = _dino_settings_task(head, cfg, spe, freeze_last_layer=1, weight_decay_end=wd_end)
    ref_opt = torch.optim.AdamW(official.get_params_groups(ref_head))
    lr_s = official.cosine_scheduler(lr, min_lr, epochs, spe)
    wd_s = official.cosine_scheduler(wd, wd_end, epochs, spe)
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(8, 16, generator=g), torch.randn(8, 32, generator=g)) for _ in range(total)]
    loss_fn = DINOLoss(32)
    last, ref_last = (h.last_layer.parametrizations.weight.original1 for h in (head, ref_head))
    start = last.detach().clone()
    for it, (x, t) in enumerate(data):
        opt.zero_grad()
        opt.backward(loss_fn(head(x), t, 0.04, update=False))
        task.before_optimizer_step(opt.optimizer, it)
        opt.step()
        official.student_step(
            ref_head, lambda x=x, t=t: loss_fn(ref_head(x), t, 0.04, update=False), ref_opt, lr_s, wd_s, it,
            epoch=it // spe, clip_grad=0, freeze_last_layer=1,
        )  # fmt: skip
        assert opt.optimizer.param_groups[0]["weight_decay"] == pytest.approx(wd_s[it], rel=1e-12)
        assert opt.optimizer.param_groups[1]["weight_decay"] == 0.0
        steps = {float(s["step"]) for p, s in opt.optimizer.state.items() if p is not last}
        assert steps == {it + 1.0}
        expected = None if it < spe else float(it + 1 - spe)  # epoch 0: no state at all
        for o, p in ((opt.optimizer, last), (ref_opt, ref_last)):
            assert (float(o.state[p]["step"]) if p in o.state else None) == expected, it
        for (name, p), q in zip(head.named_parameters(), ref_head.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=f"step {it}, {name}")
        assert torch.equal(last, start) == (it < spe)  # untouched in epoch 0 (not even decayed), trained after


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
    cfg = DINOOptions.from_preset("paper", local_crops_number=3)
    aug = MultiCropAugmentation(cfg, global_size=32, channels=3, multiple=4)
    views = aug(torch.rand(5, 3, 40, 40))
    assert [tuple(v.shape) for v in views] == [(5, 3, 32, 32)] * 2 + [(5, 3, 12, 12)] * 3
    assert all(0.0 <= v.min() and v.max() <= 1.0 for v in views)
    grey = MultiCropAugmentation(DINOOptions.from_preset("digits", local_crops_number=2), 8, 1, multiple=2)
    gviews = grey(torch.rand(4, 1, 8, 8))
    assert [tuple(v.shape) for v in gviews] == [(4, 1, 8, 8)] * 2 + [(4, 1, 4, 4)] * 2
    student = _student()
    out = student(gviews)
    assert out.shape == (16, 16)
    # view by view gives the same outputs (batching by size changes nothing)
    single = torch.cat([student([v]) for v in gviews])
    torch.testing.assert_close(out, single, rtol=1e-5, atol=1e-5)


def test_presets_and_options() -> None:
    paper = DINOOptions.from_preset("paper")
    assert (paper.out_dim, paper.hidden_dim, paper.bottleneck_dim, paper.local_crops_number) == (65536, 2048, 256, 8)
    assert (paper.student_temp, paper.teacher_temp, paper.momentum_teacher, paper.center_momentum) == (
        0.1, 0.04, 0.996, 0.9,
    )  # fmt: skip
    assert DINOOptions() == DINOOptions.from_preset("digits")  # the flags' shown defaults are the digits preset
    assert DINOOptions.from_preset("digits", out_dim=99).out_dim == 99
    with pytest.raises(ValueError, match="unknown preset .imagenet.; choose one of"):
        DINOOptions.from_preset("imagenet")
    with pytest.raises(ValueError, match="unknown DINO option"):
        DINOOptions.from_preset("digits", teacher_tmp=0.1)
    with pytest.raises(ValueError, match="area fractions"):
        DINOOptions(global_crops_scale=[0.5, 1.5])
    # DINO's cosine weight decay is on in both presets (main_dino.py: 0.04 -> 0.4); `none` keeps it constant
    from crate_transformer.train.dino import DINOTask

    assert paper.weight_decay_end == DINOOptions().weight_decay_end == 0.4
    assert DINOTask.check_options({"weight-decay-end": "none", "freeze-last-layer": "2"}) == {
        "weight_decay_end": None, "freeze_last_layer": 2,
    }  # fmt: skip
    with pytest.raises(ValueError, match="weight_decay_end must be"):
        DINOOptions(weight_decay_end=-0.1)


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


# --------------------------------------------------------------------------- the task on the engine
ARCH = tiny.SSL_ARCH
HEAD = ["--out-dim", "64", "--hidden-dim", "32", "--bottleneck-dim", "16"]
TINY = ["--data", "digits", "--threads", "1", "--no-progress", "--batch-size", "64", "--eval-every", "0",
        "--warmup-epochs", "1", "--model-args", *ARCH, *HEAD]  # fmt: skip


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def dino_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`crate pretrain dino` on the 8x8 digits: 4 epochs x 22 steps, 2 global + 2 local (4 px) views."""
    run = tmp_path_factory.mktemp("dino") / "run"
    assert crate("pretrain", "dino", *TINY, "--epochs", 4, "--local-crops-number", 2, "--out", run) == 0
    return run


def test_pretraining_learns_without_collapse(dino_run: Path) -> None:
    records = _records(dino_run)
    train = [r for r in records if r["split"] == "train"]
    final = next(r for r in records if r.get("final"))
    # no collapse: l2-normalised teacher features keep a per-dimension std far above 0 (a collapsed teacher
    # gives one point, std 0; isotropic features in 32-d would give 1/sqrt(32) = 0.18)
    assert final["feature_std"] > 0.03 and train[-1]["feature_std"] > 0.03
    assert train[-1]["teacher_entropy"] < math.log(64) / 2  # nor the uniform one (entropy log K = 4.16)
    # the loss decreases: the last epoch's mean is below the first epoch's mean (measured 5.5 -> 3.9)
    per_epoch = [[r["loss"] for r in train if e < r["epoch"] <= e + 1] for e in (0, 3)]
    assert np.mean(per_epoch[1]) < np.mean(per_epoch[0]) - 0.5, per_epoch
    # k-NN on the teacher's features: far above chance (10 classes: 10%)
    assert final["knn_20"] > 0.10 + 0.50 and final["probe"] > 0.60
    assert set(final) >= {"knn_10", "knn_20", "knn_100", "knn_200"}
    sched = [r for r in records if r["split"] == "schedule"]
    steps = np.array([r["step"] for r in sched]) - 1  # the momentum of the update after step s (0-based s)
    expected = 1 - (1 - 0.99) * (np.cos(np.pi * steps / 88) + 1) / 2  # DINO's schedule over 4 x 22 steps
    np.testing.assert_allclose([r["momentum"] for r in sched], expected, rtol=0, atol=1e-12)
    assert [r["teacher_temp"] for r in sched] == [0.04] * len(sched)  # the digits preset: no warm-up
    assert (dino_run / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_the_run_saves_the_teacher_backbone_as_a_classifier(dino_run: Path, capsys: pytest.CaptureFixture) -> None:
    from crate_transformer.loading.pipeline import load_model
    from crate_transformer.train import load_training_state

    state = load_training_state(dino_run)
    teacher = state["task"]["export_model"]
    for source in (dino_run, dino_run / "model", dino_run / "checkpoints" / "last.pt"):
        model = load_model(source)
        assert model.config.pool == "avg" and model.config.data.name == "digits"
        assert all(torch.equal(model.state_dict()[k], v) for k, v in teacher.items())
    student = {k.removeprefix("backbone."): v for k, v in state["model"].items() if k.startswith("backbone.")}
    assert any(not torch.equal(student[k], teacher[k]) for k in teacher)  # the EMA, not the student
    # the wrong command refuses the run, naming the right one
    err = one_line_error(capsys, "train", "--resume", dino_run)
    assert f"crate pretrain dino --resume {dino_run}" in err
    # frozen-feature evaluation of the saved model through `crate eval` gives the run's own numbers
    assert crate("eval", dino_run, "--knn", "--linear-probe", "--out", dino_run.parent / "eval") == 0
    report = json.loads((dino_run.parent / "eval" / "eval.json").read_text())
    final = next(r for r in _records(dino_run) if r.get("final"))
    assert report["pool"] == "avg" and report["knn"]["20"] == pytest.approx(final["knn_20"])
    assert report["linear_probe"]["acc"] == pytest.approx(final["probe"])


def test_crate_analyze_on_a_dino_run(dino_run: Path) -> None:
    out = dino_run.parent / "analysis"
    argv = ["analyze", dino_run, "--num-images", 24, "--num-vis", 2, "--no-progress", "--masks", 2, "--out", out]
    assert crate(*argv) == 0
    for fig in ("attention.png", "pca.png", "maskcut.png"):
        assert (out / "figures" / fig).stat().st_size > 2000, fig
    report = json.loads((out / "report.json").read_text())  # the verdicts name the model a DINO backbone
    sections = {"DINO backbone (train)", "DINO backbone (test)", "DINO backbone"}  # the last: incoherence
    assert {v["section"] for v in report["verdicts"]} == sections


def _optimizer_steps(state: dict) -> list[float]:
    """AdamW's step count of every parameter the optimizer holds (0 for one without state)."""
    opt = state["optimizer"]
    ids = [i for group in opt["param_groups"] for i in group["params"]]
    return sorted(float(opt["state"][i]["step"]) if i in opt["state"] else 0.0 for i in ids)


def test_resume_continues_exactly(tmp_path: Path) -> None:
    """2 epochs in one go == 1 epoch, stop, resume: student, teacher, both heads and the centre bit for bit.
    On the way: DINO's per-epoch teacher-temperature warm-up, cosine weight decay and frozen last layer."""
    common = [*TINY, "--epochs", 2, "--train-subset", 640, "--deterministic", "--local-crops-number", 1,
              "--warmup-teacher-temp", 0.03, "--warmup-teacher-temp-epochs", 2, "--log-every", 1]  # fmt: skip
    assert crate("pretrain", "dino", *common, "--out", tmp_path / "full") == 0
    assert crate("pretrain", "dino", *common, "--max-steps", 10, "--out", tmp_path / "part") == 0
    from crate_transformer.train import load_training_state

    # the first epoch leaves the head's last layer where it started (DINO's freeze_last_layer = 1): no
    # gradient, so AdamW neither moves nor decays it and keeps no state for it; the teacher's copy is the
    # EMA of that unchanged weight
    w = "head.last_layer.parametrizations.weight.original1"
    first = load_training_state(tmp_path / "part")
    unit = lambda v: F.normalize(v, dim=1)  # noqa: E731
    assert first["step"] == 10
    torch.testing.assert_close(first["model"][w], first["task"]["teacher_head"][w[5:]], rtol=0, atol=1e-7)
    steps = _optimizer_steps(first)
    assert steps[0] == 0.0 and set(steps[1:]) == {10.0}  # the last layer alone has no AdamW state
    assert crate("pretrain", "dino", "--resume", tmp_path / "part", "--max-steps", 0) == 0

    a, b = load_training_state(tmp_path / "full"), load_training_state(tmp_path / "part")
    assert a["step"] == b["step"] == 20
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
    assert (unit(a["model"][w]) - unit(first["model"][w])).abs().max() > 1e-3  # it moved in the second epoch
    for key in ("export_model", "teacher_head"):
        assert all(torch.equal(v, b["task"][key][k]) for k, v in a["task"][key].items()), key
    assert torch.equal(a["task"]["center"], b["task"]["center"]) and a["task"]["step"] == 20
    steps = _optimizer_steps(a)
    assert steps[0] == 10.0 and set(steps[1:]) == {20.0}  # the last layer's AdamW steps start in epoch 1
    # the schedules each step used, against DINO's tables (transcribed): 2 epochs x 10 steps
    sched = [r for r in _records(tmp_path / "full") if r["split"] == "schedule"]
    used = np.array([r["step"] for r in sched]) - 1
    assert list(used) == list(range(20))
    temps = official.teacher_temp_schedule(0.03, 0.04, 2, 2)[used // 10]  # indexed by the epoch
    np.testing.assert_allclose([r["teacher_temp"] for r in sched], temps, rtol=0, atol=1e-15)
    wd = official.cosine_scheduler(0.04, 0.4, 2, 10)  # --weight-decay 0.04, the default --weight-decay-end
    np.testing.assert_allclose([r["weight_decay"] for r in sched], wd[used], rtol=0, atol=1e-15)
    groups = a["optimizer"]["param_groups"]
    assert groups[0]["weight_decay"] == pytest.approx(wd[19], rel=1e-12) and groups[1]["weight_decay"] == 0.0


def test_the_vit_baseline_is_a_backbone_too() -> None:
    vit = create_model("vit_mnist", image_size=8, patch_size=2, dim=16, depth=1, heads=2)
    student = DINOModel(vit, DINOHead(16, 32, hidden_dim=24, bottleneck_dim=8), pool="cls")
    views = [torch.randn(3, 1, 8, 8), torch.randn(3, 1, 8, 8), torch.randn(3, 1, 4, 4)]
    out = student(views)
    assert out.shape == (9, 32)
    z = vit.forward_features(views[2])[:, 0]  # the class token of the local view, through the head
    torch.testing.assert_close(out[6:], student.head(z))


@pytest.mark.parametrize("model", ["crate_mnist", "vit_tiny"])
def test_the_dino_student_decays_what_dinos_get_params_groups_decays(model: str) -> None:
    """DINO decays every tensor of 2+ dimensions, the position table and class token included (its
    ``utils.get_params_groups``); the supervised rule exempts those two, so the DINO task follows DINO's."""
    from crate_transformer.train.optim import param_groups

    backbone = create_model(model, **{**tiny.DIGITS, "num_classes": 10})
    student = DINOModel(backbone, DINOHead(backbone.config.dim, 32, hidden_dim=24, bottleneck_dim=8))
    ours = param_groups(student, 0.04)
    theirs = official.get_params_groups(student)
    assert [{id(p) for p in g["params"]} for g in ours] == [{id(p) for p in g["params"]} for g in theirs]
    decayed = {id(p) for p in ours[0]["params"]}
    assert id(backbone.pos_embed) in decayed and id(backbone.cls_token) in decayed
    assert ours[0]["weight_decay"] == 0.04 and ours[1]["weight_decay"] == 0.0
    assert id(backbone.pos_embed) not in {id(p) for p in param_groups(backbone, 0.04)[0]["params"]}  # supervised


def test_dino_pretrains_a_backbone_whose_config_has_no_pooling(tmp_path: Path) -> None:
    """ToST pools by class attention and records no pooling in its config: DINO pools its features itself and
    leaves the config alone (it raised a TypeError on the unknown field)."""
    common = TINY[: TINY.index("--model-args")]
    arch = ["--model-args", "dim=32", "depth=1", "heads=2"]
    run = tmp_path / "run"
    assert (
        crate("pretrain", "dino", *common, *arch, *HEAD, "--model", "tost_mnist", "--max-steps", 2, "--out", run) == 0
    )
    assert (run / "model" / "config.json").is_file()
