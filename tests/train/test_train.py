"""``crate train | finetune | eval``: run directories, exact resume after SIGKILL, Ctrl-C, DDP, fine-tuning, eval.

Every run here is tiny (digits at 8x8, d=32, one layer) so the whole file stays well under a minute of CPU.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tiny
import torch
from clitools import crate, one_line_error
from PIL import Image

from crate_transformer import cli
from crate_transformer.data import load_dataset
from crate_transformer.io import load_pickle
from crate_transformer.loading.official import native_to_official
from crate_transformer.loading.pipeline import from_pretrained, load_model
from crate_transformer.models.registry import create_model
from crate_transformer.train import TrainConfig, WarmupCosine, load_config, train

ARCH = tiny.kv(tiny.TRAIN_ARCH)
TINY = tiny.TRAIN_CLI  # --model-args last


def crate_cmd(*argv: str) -> list[str]:
    return [sys.executable, "-m", "crate_transformer.cli", *map(str, argv)]


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run / "model" / "model.safetensors")


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process ended (rc {proc.returncode}) before the condition held:\n{err[-2000:]}")
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("timed out waiting for the training subprocess")


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small CRATE trained on the digits: options from a YAML file, some overridden on the command line."""
    base = tmp_path_factory.mktemp("pretrained")
    (base / "cfg.yaml").write_text("epochs: 99\nlr: 0.004\nbatch_size: 64\nwarmup_epochs: 0.5\nlabel_smoothing: 0.0\n")
    args = ["--epochs", 6, "--augment", "none", "--log-every", 5, "--out", base / "run"]
    rc = crate("train", "--config", base / "cfg.yaml", *args, *TINY)
    assert rc == 0
    return base / "run"


# --------------------------------------------------------------------------- config and schedule
def test_warmup_cosine_schedule() -> None:
    s = WarmupCosine(warmup_steps=10, total_steps=110, min_ratio=0.01)
    assert s(0) == pytest.approx(0.1) and s(9) == pytest.approx(1.0) and s(10) == pytest.approx(1.0)
    assert s(60) == pytest.approx(0.01 + 0.99 * 0.5)  # half way through the cosine
    assert s(110) == pytest.approx(0.01) and s(500) == pytest.approx(0.01)
    decay = [s(i) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))


def test_config_validation_and_files(tmp_path: Path) -> None:
    for bad, msg in (
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"lr": 1e-3, "min_lr": 1e-2}, "min_lr <= lr"),
        ({"optimizer": "adagrad"}, "unknown optimizer"),  # sgd, lars and lamb exist (test_recipes)
        ({"label_smoothing": 1.0}, "label_smoothing"),
        ({"eval_split": "val"}, "val_fraction=0.1"),
        ({"betas": [0.9]}, "betas must be two numbers"),
    ):
        with pytest.raises(ValueError, match=msg):
            TrainConfig(**bad)
    (tmp_path / "c.json").write_text(json.dumps({"lr": 0.01, "model-args": {"dim": 64}}))
    cfg = load_config(tmp_path / "c.json")
    assert (cfg.optim.lr, cfg.model_args, cfg.optim.epochs) == (0.01, {"dim": 64}, TrainConfig().optim.epochs)
    (tmp_path / "bad.yaml").write_text("lr: 0.1\nlearning_rate: 3\n")
    with pytest.raises(ValueError, match=r"unknown training option\(s\) \['learning_rate'\]"):
        load_config(tmp_path / "bad.yaml")


def test_help_lists_every_option_with_its_default(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        crate("train", "--help-all")
    assert e.value.code == 0
    out = capsys.readouterr().out
    for name in ("--optimizer", "--lr", "--weight-decay", "--batch-size", "--epochs", "--warmup-epochs",
                 "--label-smoothing", "--grad-clip", "--amp", "--compile", "--seed", "--deterministic",
                 "--resume", "--config", "--checkpoint-every", "--augment", "--val-fraction"):  # fmt: skip
        assert name in out
    assert out.count("(default:") >= 35
    with pytest.raises(SystemExit):
        crate("train", "--help")  # the options used first, with their defaults; the others named by --help-all
    out = capsys.readouterr().out
    for name in ("--optimizer", "--lr", "--weight-decay", "--batch-size", "--epochs", "--resume", "--config"):
        assert name in out
    assert "--label-smoothing" not in out and "more options: crate train --help-all" in out
    assert out.count("(default:") >= 15


def test_default_job_is_crate_mnist_p4_under_1m_params_on_a_grid_of_4_pixel_patches() -> None:
    from crate_transformer.cli.options import given_options

    args = cli.build_parser("train").parse_args(["train"])
    assert given_options(args) == {}  # no flag given: nothing overrides the defaults
    cfg = TrainConfig.from_dict(given_options(args))
    assert cfg == TrainConfig() and (cfg.model, cfg.data.source) == ("crate_mnist_p4", "mnist")
    model = create_model(cfg.model)
    assert model.num_params() < 1_000_000
    # patches of 4 px on the 24 px digits: a 6x6 grid, fine enough for maps that follow a stroke (docs/results.md)
    assert (model.config.patch_size, model.config.image_size, model.config.grid) == (4, 24, 6)
    o = cfg.optim  # the recipe docs/results.md measured: 3 seeds, >= 98.0% mean
    assert (o.lr, o.batch_size, o.weight_decay, o.label_smoothing, o.epochs) == (4e-3, 64, 0.01, 0.05, 40)


def test_bad_input_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "empty").mkdir()
    for argv, msg in (
        (["train", "--data", tmp_path / "missing"], "data folder not found"),
        (["train", "--batch-size", "0"], "--batch-size must be a positive integer"),
        (["train", "--model-args", "dimm=3"], "unknown model argument(s) ['dimm']"),
        (["train", "--config", tmp_path / "none.yaml"], "config file not found"),
        (["train", "--resume", tmp_path / "empty"], "nothing to resume"),
        (["train", "--model", "crate_mnst"], "did you mean crate_mnist"),
        (["train", *TINY, "--batch-size", "4096", "--out", tmp_path / "r"], "lower --batch-size"),
        (["finetune", "--data", "digits"], "needs --from"),
    ):
        err = one_line_error(capsys, *argv)
        assert msg in err, err


# --------------------------------------------------------------------------- a full run
def test_run_directory_contract(pretrained: Path) -> None:
    run = pretrained
    import yaml

    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["optim"]["lr"] == 0.004 and resolved["optim"]["batch_size"] == 64  # from the file
    assert resolved["optim"]["epochs"] == 6  # the command line wins over the file
    assert resolved["model_config"]["dim"] == 32 and resolved["derived"]["steps_per_epoch"] == 1438 // 64

    records = _records(run)
    assert all({"step", "epoch", "split"} <= r.keys() for r in records)
    train_r = [r for r in records if r["split"] == "train"]
    test_r = [r for r in records if r["split"] == "test"]
    assert [r["step"] for r in train_r][:3] == [5, 10, 15] and len(test_r) == 6  # 5 epoch evals + the final one
    assert train_r[-1]["loss"] < train_r[0]["loss"] - 0.5
    assert test_r[-1].get("final") and test_r[-1]["acc"] > 0.5  # chance is 0.1
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    for key in ("model_config", "model", "optimizer", "scheduler", "scaler", "rng", "data", "step", "epoch"):
        assert key in state
    assert {"torch", "numpy", "python"} <= state["rng"][0].keys()
    assert state["step"] == 6 * (1438 // 64) and state["data"] == {**state["data"], "epoch": 6, "batch": 0}
    # the one resolver loads all three forms, and they agree
    m_dir, m_run, m_state = load_model(run / "model"), load_model(run), load_model(run / "checkpoints" / "last.pt")
    for k, v in m_dir.state_dict().items():
        assert torch.equal(v, m_run.state_dict()[k]) and torch.equal(v, m_state.state_dict()[k])
    assert m_dir.config.data.classes == [str(i) for i in range(10)]


def test_eval_matches_an_independent_computation(pretrained: Path, capsys: pytest.CaptureFixture) -> None:
    from sklearn.metrics import confusion_matrix

    out = pretrained / "ev"
    assert crate("eval", pretrained, "--out", out) == 0  # --data defaults to the data it was trained on
    report = json.loads((out / "eval.json").read_text())
    assert (out / "confusion.png").read_bytes()[:4] == b"\x89PNG" and (out / "confusion.png").stat().st_size > 5000

    model = from_pretrained(pretrained / "model").eval()
    norm = model.config.data
    test = load_dataset("digits", "test")
    x = (test.images.float() / 255 - norm.mean[0]) / norm.std[0]
    with torch.no_grad():
        logits = model(x).numpy()
    y = test.labels.numpy()
    pred = logits.argmax(1)
    assert report["num_samples"] == len(y) == 359
    assert report["top1"] == pytest.approx((pred == y).mean(), abs=1e-12)
    top5 = (np.argsort(-logits, 1)[:, :5] == y[:, None]).any(1).mean()
    assert report["top5"] == pytest.approx(top5, abs=1e-12) and report["top5"] >= report["top1"]
    cm = confusion_matrix(y, pred, labels=range(10))
    assert report["confusion"] == cm.tolist()
    assert report["per_class"] == pytest.approx((cm.diagonal() / cm.sum(1)).tolist())
    final = [r for r in _records(pretrained) if r.get("final")][0]
    assert final["acc"] == pytest.approx(report["top1"], abs=1e-9)  # training's final test accuracy agrees
    printed = capsys.readouterr().out
    assert f"top-1 {100 * report['top1']:.2f}%" in printed and "confusion matrix:" in printed


# --------------------------------------------------------------------------- resume, Ctrl-C
@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_is_bitwise_identical(tmp_path: Path) -> None:
    # dropout and translations make the run consume the RNG: the resume must restore it exactly
    args = [*TINY, "dropout=0.1", "--epochs", "6", "--batch-size", "32", "--deterministic", "--checkpoint-every", "5"]
    assert crate("train", *args, "--out", tmp_path / "ref") == 0

    killed = tmp_path / "killed"
    ckpt = killed / "checkpoints" / "last.pt"
    proc = subprocess.Popen(crate_cmd("train", *args, "--out", killed), env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    _wait_for(ckpt.exists, proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    state = load_pickle(ckpt)
    total = 6 * (1438 // 32)
    assert 0 < state["step"] < total and state["data"]["batch"] != 0  # killed mid-epoch, work left to redo
    assert not (killed / "model").exists()

    assert crate("train", "--resume", killed, "--threads", "1") == 0
    ref, resumed = _weights(tmp_path / "ref"), _weights(killed)
    assert ref.keys() == resumed.keys()
    for k in ref:
        assert torch.equal(ref[k], resumed[k]), k
    # the log has no duplicated steps from the work redone after the checkpoint
    steps = [r["step"] for r in _records(killed) if r["split"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == total


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(crate_cmd("train", *TINY, "--epochs", "500", "--log-every", "1", "--out", run),
                            env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    metrics = run / "metrics.jsonl"
    # three training records (a step-0 measure record may come first)
    _wait_for(lambda: metrics.exists() and metrics.read_text().count('"split": "train"') >= 3, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    state = load_pickle(run / "checkpoints" / "last.pt")
    logged = max(r["step"] for r in _records(run))
    assert state["reason"] == "interrupted" and state["step"] >= logged >= 3  # written by the interrupt itself
    saved = f"checkpoint saved to {run / 'checkpoints' / 'last.pt'}\n"  # the engine's line, then the CLI's
    assert f"{saved}continue with: crate train --resume {run}\n" in err, err[-2000:]
    model = load_model(run / "checkpoints" / "last.pt")  # a usable model already
    assert model.config.num_classes == 10


# --------------------------------------------------------------------------- distributed
@pytest.mark.slow
def test_torchrun_two_processes_match_one_process(tmp_path: Path, torchrun) -> None:
    args = [*TINY, "--augment", "none", "--epochs", "1", "--max-steps", "12", "--log-every", "1", "--batch-size", "64"]
    proc = torchrun("train", *args, "--out", tmp_path / "ddp")
    assert crate("train", *args, "--out", tmp_path / "single") == 0  # runs while torchrun starts up
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert out.count("final test accuracy") == 1  # rank-0-only output
    import yaml

    derived = yaml.safe_load((tmp_path / "ddp" / "config.yaml").read_text())["derived"]
    assert derived["world_size"] == 2 and derived["local_batch"] == 32
    single = [r["loss"] for r in _records(tmp_path / "single") if r["split"] == "train"]
    ddp = [r["loss"] for r in _records(tmp_path / "ddp") if r["split"] == "train"]
    assert len(single) == len(ddp) == 12
    assert single[0] != single[-1]
    np.testing.assert_allclose(ddp, single, rtol=1e-4, atol=1e-5)
    w1, w2 = _weights(tmp_path / "single"), _weights(tmp_path / "ddp")
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-3


# --------------------------------------------------------------------------- fine-tuning
def _rgb_folder(root: Path, classes: int = 3, per_class: int = 10, size: int = 12) -> Path:
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            img = rng.integers(0, 60, (size, size, 3), dtype=np.uint8)
            img[:, :, c] += 150  # a learnable colour cue
            Image.fromarray(img).save(root / f"class{c}" / f"{i}.png")
    return root


def test_finetune_from_pretrained_dir_new_classes_and_size(pretrained: Path, tmp_path: Path) -> None:
    data = _rgb_folder(tmp_path / "colours")
    out = tmp_path / "ft"
    rc = crate("finetune", "--from", pretrained / "model", "--data", data, "--image-size", "16", "--epochs", "3",
               "--batch-size", "8", "--lr", "1e-3", "--threads", "1", "--no-progress", "--out", out)  # fmt: skip
    assert rc == 0
    src, ft = from_pretrained(pretrained / "model"), from_pretrained(out / "model")
    assert (ft.config.num_classes, ft.config.image_size, ft.config.in_chans) == (3, 16, 1)  # grey model: data converted
    assert ft.pos_embed.shape == (1, 1 + 4 * 4, 32) and src.pos_embed.shape == (1, 1 + 2 * 2, 32)
    assert ft.config.data.classes == ["class0", "class1", "class2"]
    changed = [k for k, v in src.state_dict().items() if k in ft.state_dict() and k != "pos_embed"
               and v.shape == ft.state_dict()[k].shape and not torch.equal(v, ft.state_dict()[k])]  # fmt: skip
    assert "layers.0.ista.weight" in changed and "patch_embed.1.weight" in changed  # all weights trained
    import yaml

    saved = yaml.safe_load((out / "config.yaml").read_text())
    # 30 colour images: the small-data recipe (its lr overridden by --lr) with crops and flips, no RandAugment
    assert (saved["recipe"], saved["optim"]["lr"]) == ("small-data", 1e-3)
    assert saved["derived"]["augment"] == saved["augmentation"]["augment"] == "crop-flip"


def test_finetune_from_official_state_dict(pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    src = from_pretrained(pretrained / "model")
    official = {"state_dict": {"module." + k: v for k, v in native_to_official(src.state_dict()).items()}}
    torch.save(official, tmp_path / "official.pth")
    assert crate("finetune", "--from", tmp_path / "official.pth", "--data", "digits") == 2
    assert "which does not store its architecture; pass --model crate_" in capsys.readouterr().err
    steps, lr = 4, 5e-5
    rc = crate("finetune", "--from", tmp_path / "official.pth", "--model", "crate_mnist", "--model-args", *ARCH,
               "image_size=8", "--data", "digits", "--max-steps", steps, "--lr", lr, "--threads", "1",
               "--no-progress", "--out", tmp_path / "ft")  # fmt: skip
    assert rc == 0
    ft = from_pretrained(tmp_path / "ft" / "model")
    assert ft.config.num_classes == 10 and ft.config.image_size == 8
    body = [k for k in src.state_dict() if not k.startswith("head.")]
    drift = max((src.state_dict()[k] - ft.state_dict()[k]).abs().max().item() for k in body)
    assert 0 < drift <= steps * lr * 1.01  # started from the official weights (Adam moves each by <= lr per step)
    head_gap = (src.state_dict()["head.1.weight"] - ft.state_dict()["head.1.weight"]).abs().max().item()
    assert head_gap > 10 * steps * lr  # the head was re-initialised


def test_eval_rejects_a_class_count_mismatch(pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = _rgb_folder(tmp_path / "colours", per_class=5, size=8)
    assert crate("eval", pretrained, "--data", data, "--out", tmp_path / "ev") == 2
    err = capsys.readouterr().err.strip()
    assert "predicts 10 classes but the data has 3" in err and "crate finetune" in err


# --------------------------------------------------------------------------- options and hooks
def test_vit_with_lion_and_hooks(tmp_path: Path) -> None:
    seen = []

    def hook(ctx):
        seen.append(ctx.step)
        if ctx.step % 2 == 0:
            with torch.no_grad():
                acc = (ctx.model(ctx.fixed_batch[0]).argmax(-1) == ctx.fixed_batch[1]).float().mean().item()
            return [{"step": ctx.step, "epoch": ctx.epoch, "split": "hook", "fixed_batch_acc": acc}]
        return None

    cfg = TrainConfig(model="vit_mnist", model_args=dict(dim=32, depth=1, heads=2, patch_size=4), data="digits",
                      image_size=8, optimizer="lion", lr=1e-4, weight_decay=0.5, epochs=1, max_steps=5,
                      progress=False, out=str(tmp_path / "vit"), threads=1)  # fmt: skip
    result = train(cfg, hooks=[hook])
    assert seen == [0, 1, 2, 3, 4, 5] and not result["interrupted"] and math.isfinite(result["test_acc"])
    hooked = [r for r in _records(tmp_path / "vit") if r["split"] == "hook"]
    assert [r["step"] for r in hooked] == [0, 2, 4]
    state = load_pickle(tmp_path / "vit" / "checkpoints" / "last.pt")
    assert state["model_config"]["arch"] == "vit" and "exp_avg" in next(iter(state["optimizer"]["state"].values()))
    assert crate("train", "--out", tmp_path / "vit", *TINY) == 2  # refuses to overwrite a run


def test_measure_every_records_layerwise_numbers_during_training(tmp_path: Path) -> None:
    """`--measure-every N`: R^c and sparsity per layer at step 0 (random init), every N steps and at the end."""
    from crate_transformer.analysis import measure
    from crate_transformer.data import normalize
    from crate_transformer.train import prepare_batch

    run = tmp_path / "m"
    arch = ["dim=32", "depth=2", "heads=2", "patch_size=4"]
    argv = ["--epochs", 2, "--batch-size", 128, "--measure-every", 11]  # 11 steps an epoch
    assert crate("train", *argv, "--out", run, *TINY[: -len(ARCH)], *arch) == 0
    meas = [r for r in _records(run) if r["split"] == "measure"]
    assert sorted({r["step"] for r in meas}) == [0, 11, 22] and len(meas) == 3 * 2
    assert all(0.0 <= r["nonzero"] <= 1.0 and math.isfinite(r["rc_in"]) for r in meas)
    assert (run / "measure.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the last record is the measurement of the final model on the fixed batch (first 64 test images)
    model = load_model(run).eval()
    norm = model.config.data
    test = load_dataset("digits", "test", image_size=8)
    x = prepare_batch(test.images[:64], device=torch.device("cpu"), image_size=8, channels=1,
                      mean=norm.mean, std=norm.std)  # fmt: skip
    torch.testing.assert_close(x, normalize(test.images[:64].float() / 255, norm.mean, norm.std))
    want = measure(model, x, normalize=None, progress=False).to_records()
    got = sorted((r for r in meas if r["step"] == 22), key=lambda r: r["layer"])
    for g, w in zip(got, want):
        assert g["rc_in"] == pytest.approx(w["rc_in"], rel=1e-5) and g["nonzero"] == pytest.approx(w["nonzero"])


def test_top_k_is_printed_only_when_k_is_below_the_number_of_classes():
    from crate_transformer.train.evaluation import EvalResult

    def result(n_cls: int) -> EvalResult:
        k = min(5, n_cls)
        return EvalResult(
            0.5, 1.0 if k == n_cls else 0.9, 1.0, 10, [0.5] * n_cls, [], [str(i) for i in range(n_cls)], k
        )

    three, ten = result(3), result(10)
    assert not three.has_top_k and three.top_k_text() == ""  # top-3 of 3 classes is always 100%
    assert ten.has_top_k and ten.top_k_text() == ", top-5 90.00%"
