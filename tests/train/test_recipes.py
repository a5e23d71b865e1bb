"""The training-recipe pieces, each against its definition: mixup / cutmix / random erasing, soft-target
cross-entropy, drop path, layer-wise lr decay (vs MAE's ``param_groups_lrd``), LARS (vs MAE's), LAMB and the
EMA (vs float64 formulas), the MAE linear-probe protocol, and the named presets."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from clitools import crate, one_line_error
from official import mae_optim
from torch import nn

from crate_transformer.analysis.probe import sgd_linear_probe
from crate_transformer.layers import DropPath, drop_path_rates
from crate_transformer.loading.pipeline import load_model
from crate_transformer.models.alpha import AlphaConfig, CRATEAlpha
from crate_transformer.models.classifier import ModelConfig, build_model
from crate_transformer.models.mae import CRATEMAE, MAEConfig
from crate_transformer.train import TrainConfig, load_training_state
from crate_transformer.train.mix import MixupCutmix, random_erasing, smooth_one_hot, soft_target_cross_entropy
from crate_transformer.train.optim import LAMB, LARS, ModelEma, build_optimizer, param_groups
from crate_transformer.train.recipes import RECIPES, recipe_options
from crate_transformer.train.rundir import read_run_config

TINY = dict(image_size=16, patch_size=4, in_chans=3, num_classes=5, dim=32, depth=2, heads=2)


# --------------------------------------------------------------------------- mixup / cutmix / erasing
def _mixer(kind: str, lam: float, smoothing: float = 0.1) -> MixupCutmix:
    m = MixupCutmix(5, mixup_alpha=0.8, cutmix_alpha=1.0, smoothing=smoothing)
    m.choose = lambda: (kind, lam)  # the drawn λ is what the check needs to know
    return m


def test_mixup_mixes_images_and_targets_with_the_same_lambda() -> None:
    x, y = torch.rand(6, 3, 8, 8), torch.tensor([0, 1, 2, 3, 4, 0])
    m = _mixer("mixup", 0.3)
    torch.manual_seed(1)
    out, t = m(x, y)
    kind, lam, pairs = m.last
    assert kind == "mixup" and lam == pytest.approx(0.3)
    torch.testing.assert_close(out, 0.3 * x + 0.7 * x[pairs])
    onehot = F.one_hot(y, 5).double() * 0.9 + 0.1 / 5
    torch.testing.assert_close(t.double(), 0.3 * onehot + 0.7 * onehot[pairs], atol=1e-6, rtol=0)
    torch.testing.assert_close(t.sum(1), torch.ones(6))


@pytest.mark.parametrize("lam", [0.2, 0.55, 0.9])
def test_cutmix_target_weight_is_the_pasted_box_area(lam: float) -> None:
    x = torch.arange(8.0).view(8, 1, 1, 1).expand(8, 3, 12, 10).contiguous()  # every image distinct
    y = torch.arange(8) % 5
    m = _mixer("cutmix", lam, smoothing=0.0)
    out, t = m(x, y)
    _, own, pairs = m.last
    for i in range(8):
        pasted = (out[i] != x[i]).any(0)  # the box (empty when paired with itself)
        assert torch.equal(out[i][:, pasted], x[pairs[i]][:, pasted])
        frac = pasted.float().mean().item() if pairs[i] != i else None
        if frac is not None:
            assert t[i, y[pairs[i]]].item() == pytest.approx(frac, abs=1e-6) or y[pairs[i]] == y[i]
            assert 1 - own == pytest.approx(frac, abs=1e-6)
            rows, cols = pasted.any(1).nonzero(), pasted.any(0).nonzero()
            assert pasted.sum() == len(rows) * len(cols)  # a rectangle
            assert len(rows) == int(math.sqrt(1 - lam) * 12) and len(cols) == int(math.sqrt(1 - lam) * 10)


def test_mixing_law_is_timms_batch_law() -> None:
    m = MixupCutmix(5, mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.5, switch_prob=0.25)
    torch.manual_seed(0)
    kinds = [m.choose()[0] for _ in range(4000)]
    assert kinds.count("none") / 4000 == pytest.approx(0.5, abs=0.03)
    assert kinds.count("cutmix") / kinds.count("mixup") == pytest.approx(1 / 3, rel=0.15)
    only_mixup = MixupCutmix(5, mixup_alpha=0.8, cutmix_alpha=0.0)
    lams = torch.tensor([only_mixup.choose()[1] for _ in range(4000)])
    assert lams.mean().item() == pytest.approx(0.5, abs=0.02)  # Beta(0.8, 0.8): mean 1/2, var 1/(4·2.6)
    assert lams.var().item() == pytest.approx(1 / (4 * 2.6), rel=0.1)


def test_soft_target_cross_entropy_matches_torch_on_smoothed_labels() -> None:
    logits, y = torch.randn(7, 5, dtype=torch.float64), torch.randint(0, 5, (7,))
    ours = soft_target_cross_entropy(logits.float(), smooth_one_hot(y, 5, 0.1))
    torch.testing.assert_close(ours, F.cross_entropy(logits.float(), y, label_smoothing=0.1))
    t = torch.softmax(torch.randn(7, 5, dtype=torch.float64), -1)
    manual = -(t * torch.log_softmax(logits, -1)).sum(1).mean()
    torch.testing.assert_close(soft_target_cross_entropy(logits, t.float()).double(), manual, rtol=1e-6, atol=1e-6)


def test_random_erasing_fills_one_box_with_the_value() -> None:
    x = torch.randn(64, 3, 20, 20) + 5.0  # never 0 before erasing
    out = random_erasing(1.0, value=0.0)(x)
    for i in range(64):
        erased = (out[i] == 0).all(0)
        assert torch.equal(out[i][:, ~erased], x[i][:, ~erased])
        rows, cols = erased.any(1).nonzero(), erased.any(0).nonzero()
        assert erased.sum() == len(rows) * len(cols) > 0
        assert erased.float().mean() <= 1 / 3 + 0.05
    assert torch.equal(random_erasing(0.0)(x), x)


# --------------------------------------------------------------------------- drop path
def test_drop_path_per_sample_zero_or_scaled_with_expectation_kept() -> None:
    dp = DropPath(0.25).train()
    x = torch.ones(20000, 3, 4)
    out = dp(x)
    per_sample = out.view(20000, -1)
    assert ((per_sample == 0).all(1) | (per_sample == 1 / 0.75).all(1)).all()  # whole samples
    assert (per_sample[:, 0] == 0).float().mean().item() == pytest.approx(0.25, abs=0.015)
    assert out.mean().item() == pytest.approx(1.0, abs=0.02)
    assert dp.eval()(x) is x
    assert DropPath(0.0).train()(x) is x


def test_drop_path_rates_rise_linearly_to_the_rate() -> None:
    assert drop_path_rates(0.1, 1) == [0.0]
    torch.testing.assert_close(torch.tensor(drop_path_rates(0.3, 4)), torch.linspace(0, 0.3, 4))


@pytest.mark.parametrize("family", ["crate", "vit", "alpha", "mae"])
def test_drop_path_models_unchanged_at_zero_and_in_eval(family: str) -> None:
    def make(rate: float) -> nn.Module:
        torch.manual_seed(0)
        if family == "alpha":
            return CRATEAlpha(AlphaConfig(**TINY, drop_path=rate))
        if family == "mae":
            mae = {k: v for k, v in TINY.items() if k != "num_classes"}
            return CRATEMAE(MAEConfig(**mae, drop_path=rate))
        return build_model(ModelConfig(arch=family, **TINY, drop_path=rate))

    plain, dropped = make(0.0), make(0.5)
    for a, b in zip(plain.state_dict().values(), dropped.state_dict().values()):
        assert torch.equal(a, b)  # same keys, same weights: the option adds no state
    assert [layer.drop_path.p for layer in dropped.layers] == [0.0, 0.5]
    x = torch.randn(4, 3, 16, 16)
    run = (lambda m: m.forward_features(x)) if family == "mae" else (lambda m: m(x))
    torch.testing.assert_close(run(plain.eval()), run(dropped.eval()))
    torch.manual_seed(3)
    a = run(plain.train())
    torch.manual_seed(3)
    b = run(plain.train())
    assert torch.equal(a, b)  # rate 0 draws nothing
    assert not torch.allclose(run(dropped.train()), run(plain.train()))


# --------------------------------------------------------------------------- LLRD and the optimizers
class _AsTimm(nn.Module):
    """The package's model with timm's names (``layers`` → ``blocks``) for MAE's ``param_groups_lrd``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.blocks = model, model.layers

    def named_parameters(self, *a, **k):  # type: ignore[override]
        for n, p in self.model.named_parameters():
            yield n.replace("layers.", "blocks.", 1) if n.startswith("layers.") else n, p


@pytest.mark.parametrize("decay", [0.65, 0.75])
@pytest.mark.parametrize("arch", ["crate", "vit"])
def test_llrd_groups_equal_maes_param_groups_lrd(arch: str, decay: float) -> None:
    model = build_model(ModelConfig(arch=arch, **{**TINY, "depth": 3}))
    ours = param_groups(model, 0.05, decay)
    skip = {n.replace("layers.", "blocks.", 1) for n in model.no_weight_decay()}
    theirs = mae_optim.param_groups_lrd(_AsTimm(model), 0.05, list(skip), decay)
    assert len(ours) == len(theirs) > 4
    for a, b in zip(ours, theirs):
        assert a["lr_scale"] == pytest.approx(b["lr_scale"], rel=1e-15) and a["weight_decay"] == b["weight_decay"]
        assert [id(p) for p in a["params"]] == [id(p) for p in b["params"]]
    opt = build_optimizer("adamw", ours, lr=1e-3)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-3 * g["lr_scale"] for g in theirs])


def test_param_groups_without_llrd_are_the_engines_two_groups() -> None:
    model = build_model(ModelConfig(**TINY))
    decay, rest = param_groups(model, 0.05)
    skip = model.no_weight_decay()
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in rest["params"]} == skip and decay["weight_decay"] == 0.05
    assert not {names[id(p)] for p in decay["params"]} & skip and rest["weight_decay"] == 0.0


def _two_models(seed: int = 0) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)
    a = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    b = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3))
    b.load_state_dict(a.state_dict())
    return a, b


def _loss(model: nn.Module, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step)
    return model(torch.randn(8, 6, generator=g)).pow(2).mean()


def test_lars_steps_equal_maes_lars() -> None:
    a, b = _two_models()
    groups = lambda m: [{"params": [p for p in m.parameters() if p.ndim > 1], "weight_decay": 0.1},  # noqa: E731
                        {"params": [p for p in m.parameters() if p.ndim < 2], "weight_decay": 0.0}]  # fmt: skip
    ours, theirs = LARS(groups(a), lr=0.5, momentum=0.9), mae_optim.LARS(groups(b), lr=0.5, momentum=0.9)
    for step in range(5):
        for model, opt in ((a, ours), (b, theirs)):
            opt.zero_grad()
            _loss(model, step).backward()
            opt.step()
        for p, q in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert not torch.equal(next(a.parameters()), _two_models()[0][0].weight)


def test_lars_first_step_is_the_trust_ratio_formula_in_float64() -> None:
    w = nn.Parameter(torch.randn(4, 3, dtype=torch.float64))
    g = torch.randn(4, 3, dtype=torch.float64)
    w0 = w.detach().clone()
    w.grad = g.clone()
    LARS([w], lr=0.3, weight_decay=0.01, momentum=0.9, trust_coefficient=0.001).step()
    u = g + 0.01 * w0
    expected = w0 - 0.3 * (0.001 * w0.norm() / u.norm()) * u
    torch.testing.assert_close(w.detach(), expected, rtol=1e-12, atol=1e-14)


def test_lamb_steps_equal_the_papers_algorithm_in_float64() -> None:
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(4, 3, dtype=torch.float64)), nn.Parameter(torch.zeros(3, dtype=torch.float64))]
    ref = [p.detach().clone() for p in params]
    m = [torch.zeros_like(p) for p in ref]
    v = [torch.zeros_like(p) for p in ref]
    lr, (b1, b2), eps, wd = 0.01, (0.9, 0.999), 1e-6, 0.05
    opt = LAMB(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for t in range(1, 6):
        grads = [torch.randn_like(p) for p in ref]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for i, g in enumerate(grads):  # You et al. 2019, Algorithm 2, per tensor, φ(z) = z
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            r = (m[i] / (1 - b1**t)) / ((v[i] / (1 - b2**t)).sqrt() + eps) + wd * ref[i]
            xn, rn = ref[i].norm(), r.norm()
            ratio = xn / rn if xn > 0 and rn > 0 else 1.0
            ref[i] = ref[i] - lr * ratio * r
        for p, r_ in zip(params, ref):
            torch.testing.assert_close(p.detach(), r_, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["adamw", "lion", "sgd", "lars", "lamb"])
def test_every_optimizer_lowers_a_quadratic(name: str) -> None:
    a, _ = _two_models()
    opt = build_optimizer(name, param_groups(a, 0.0), lr={"lion": 1e-3, "sgd": 0.05, "lars": 0.5}.get(name, 1e-2))
    first = _loss(a, 0).item()
    for _ in range(30):
        opt.zero_grad()
        _loss(a, 0).backward()
        opt.step()
    assert _loss(a, 0).item() < first


def test_ema_after_n_steps_is_the_closed_form() -> None:
    model = nn.Linear(3, 2)
    d, n = 0.9, 6
    ema = ModelEma(model, d)
    history = [model.weight.detach().double().clone()]
    for _ in range(n):
        with torch.no_grad():
            model.weight.add_(torch.randn_like(model.weight))
        history.append(model.weight.detach().double().clone())
        ema.update(model)
    closed = d**n * history[0] + sum((1 - d) * d ** (n - k) * history[k] for k in range(1, n + 1))
    torch.testing.assert_close(ema.module.weight.double(), closed, rtol=1e-5, atol=1e-6)
    assert not ema.module.training and not any(p.requires_grad for p in ema.module.parameters())
    with pytest.raises(ValueError, match=r"decay must be a finite number in \(0, 1\)"):
        ModelEma(model, 1.0)


def test_ema_that_cannot_warm_up_is_a_warning_with_a_decay_that_can() -> None:
    model = nn.Linear(3, 2)
    warning = ModelEma(model, 0.99996).warmup_warning(150)  # DeiT's decay over a small dataset's run
    assert warning is not None and "keeps 99.4% of the initial weights after the run's 150 steps" in warning
    suggested = float(re.search(r"use ema=([0-9.]+) or lower", warning).group(1))
    assert suggested == pytest.approx(0.9697) and suggested**150 <= 0.01  # its average keeps at most 1% of θ_0
    assert ModelEma(model, suggested).warmup_warning(150) is None
    assert ModelEma(model, 0.99996).warmup_warning(375_000) is None  # DeiT's own 300 ImageNet epochs


# --------------------------------------------------------------------------- linear probe (MAE protocol)
def test_sgd_linear_probe_is_bn_then_linear_folded_into_raw_features() -> None:
    torch.manual_seed(0)
    centers = torch.randn(3, 8) * 4 + 10  # far from 0 mean: the BatchNorm's statistics matter when folded
    y = torch.arange(300) % 3
    x = centers[y] + torch.randn(300, 8)
    for opt in ("lars", "sgd"):
        r = sgd_linear_probe(x[:240], y[:240], x[240:], y[240:], optimizer=opt, epochs=30, batch_size=32,
                             warmup_epochs=3, blr=0.5 if opt == "sgd" else 8.0)  # fmt: skip
        assert r.protocol == opt and r.acc > 0.95 and r.train_acc > 0.95
        pred = (x[240:] @ r.weight.T + r.bias).argmax(1)
        assert (pred == y[240:]).float().mean().item() == pytest.approx(r.acc)
    with pytest.raises(ValueError, match="optimizer lars"):
        sgd_linear_probe(x, y, x, y, optimizer="adam")


# --------------------------------------------------------------------------- presets
def test_presets_set_their_documented_values_and_flags_override() -> None:
    paper = TrainConfig.from_dict({"recipe": "crate-paper"})
    assert (paper.optim.optimizer, paper.optim.lr, paper.optim.weight_decay, paper.optim.batch_size) == (
        "lion",
        2.4e-4,
        0.5,
        2048,
    )
    assert (paper.optim.warmup_epochs, paper.optim.label_smoothing, paper.augmentation.augment) == (
        5.0,
        0.1,
        "crop-flip",
    )
    ft = TrainConfig.from_dict({"recipe": "crate-paper", "init_from": "run"})
    assert (
        ft.optim.optimizer,
        ft.optim.lr,
        ft.optim.weight_decay,
        ft.augmentation.randaugment_n,
        ft.augmentation.randaugment_m,
    ) == ("adamw", 5e-5, 0.01, 2, 14)
    alpha = TrainConfig.from_dict({"recipe": "crate-alpha-finetune"})
    assert (
        alpha.augmentation.mixup,
        alpha.augmentation.cutmix,
        alpha.optim.betas,
        alpha.optim.min_lr,
        alpha.augmentation.randaugment_n,
    ) == (
        0.8,
        1.0,
        [0.9, 0.95],
        1e-6,
        2,
    )
    mae = TrainConfig.from_dict({"recipe": "mae-finetune"})
    assert (mae.optim.layer_decay, mae.optim.drop_path, mae.augmentation.random_erasing, mae.optim.label_smoothing) == (
        0.65,
        0.1,
        0.25,
        0.1,
    )
    deit = TrainConfig.from_dict({"recipe": "deit", "lr": 5e-4, "ema": 0.0})
    assert (deit.optim.lr, deit.optim.ema, deit.augmentation.mixup, deit.optim.epochs) == (
        5e-4,
        0.0,
        0.8,
        300,
    )  # flags win
    assert TrainConfig.from_dict({"recipe": "deit"}, TrainConfig(lr=1.0)).optim.lr == 1e-3  # the recipe beats the base
    for name, r in RECIPES.items():
        values = recipe_options(name)
        TrainConfig.from_dict(values)  # every value is valid
        assert r.source and values
    with pytest.raises(ValueError, match="unknown recipe"):
        recipe_options("nope")


# --------------------------------------------------------------------------- end to end
TINY_RUN = ["--data", "digits", "--image-size", "8", "--threads", "1", "--no-progress", "--measure-every", "0",
            "--epochs", "2", "--batch-size", "64", "--max-steps", "12"]  # fmt: skip
ARCH = ["--model-args", "dim=32", "depth=2", "heads=2", "patch_size=4"]


def test_crate_train_with_the_recipe_pieces_writes_ema_weights(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    flags = ["--mixup", "0.8", "--cutmix", "1", "--drop-path", "0.1", "--ema", "0.99", "--optimizer", "lars",
             "--lr", "0.5", "--random-erasing", "0.25", "--layer-decay", "0.75"]  # fmt: skip
    assert crate("train", *TINY_RUN, *flags, "--out", run, *ARCH) == 0
    assert "EMA weights (model_ema/)" in capsys.readouterr().out
    model, ema = load_model(run / "model"), load_model(run / "model_ema")
    assert model.config.drop_path == ema.config.drop_path == 0.1
    assert [layer.drop_path.p for layer in model.layers] == [0.0, 0.1]
    assert ema.config.data.classes == model.config.data.classes
    diffs = [not torch.equal(a, b) for a, b in zip(model.state_dict().values(), ema.state_dict().values())]
    assert any(diffs)  # the average lags the trained weights
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    final = next(r for r in records if r.get("final"))
    assert 0.0 <= final["ema_acc"] <= 1.0 and "acc" in final
    assert crate("eval", run / "model_ema", "--data", "digits") == 0  # saved EMA weights are a working classifier
    state = load_training_state(run)
    kept = state["task"]["ema"]  # the checkpoint holds the EMA a resume continues from
    assert all(torch.equal(kept[k], v) for k, v in ema.state_dict().items())
    scales = sorted({g["lr_scale"] for g in state["optimizer"]["param_groups"]})  # --layer-decay 0.75, 2 layers
    assert scales == pytest.approx([0.75**3, 0.75**2, 0.75, 1.0])
    # the same run resumed for one more epoch: the EMA comes back from the checkpoint
    assert crate("train", "--resume", run, "--max-steps", "16") == 0
    assert not torch.equal(load_model(run / "model_ema").layers[0].attn.qkv.weight, ema.layers[0].attn.qkv.weight)


def test_a_deit_run_too_short_for_its_ema_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert crate("train", *TINY_RUN, "--recipe", "deit", "--epochs", "1", "--max-steps", "3", "--batch-size", "64",
                 "--out", tmp_path / "deit", *ARCH) == 0  # fmt: skip
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: the weight EMA (ema=0.99996) keeps 100% of the initial weights after the run's 3 steps, so the "
        "EMA model will be close to the untrained one; for a run this short use ema=0.2154 or lower, or ema=0 to "
        "turn it off"
    ]
    assert crate("train", *TINY_RUN, "--ema", "0.2", "--max-steps", "3", "--out", tmp_path / "short", *ARCH) == 0
    assert "warning:" not in capsys.readouterr().err  # 0.2^3 of the initial weights: the average warms up


def test_crate_eval_lars_probe_and_bad_recipe(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run, options = tmp_path / "run", tmp_path / "options.yaml"
    options.write_text("recipe: deit\nlr: 0.002\nmixup: 0.5\n")  # defaults < recipe < --config < flags
    assert crate("train", *TINY_RUN, "--config", options, "--epochs", "1", "--max-steps", "4", "--mixup", "0.3",
                 "--ema", "0", "--out", run, *ARCH) == 0  # fmt: skip
    cfg = read_run_config(run).flat()  # config.yaml's options by name
    assert (cfg["recipe"], cfg["lr"], cfg["mixup"], cfg["ema"]) == ("deit", 0.002, 0.3, 0.0)
    assert (cfg["cutmix"], cfg["random_erasing"], cfg["drop_path"], cfg["weight_decay"]) == (1.0, 0.25, 0.1, 0.05)
    assert (cfg["epochs"], cfg["batch_size"]) == (1, 64)  # the recipe's 300 and 1024 overridden by the flags
    assert crate("eval", run, "--linear-probe", "--probe", "lars", "--out", tmp_path / "ev") == 0
    report = json.loads((tmp_path / "ev" / "eval.json").read_text())["linear_probe"]
    assert report["protocol"] == "lars" and 0.0 <= report["acc"] <= 1.0
    assert "add --linear-probe" in one_line_error(capsys, "eval", run, "--probe", "sgd")
    (tmp_path / "bad.yaml").write_text("recipe: nope\n")
    assert "unknown recipe 'nope'" in one_line_error(capsys, "train", "--config", tmp_path / "bad.yaml")
