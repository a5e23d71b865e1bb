"""Defaults that fit the data, said out loud (issue 49 §2): the augmentation ``auto`` chooses from the images'
channels, size and number, the recipe ``crate finetune`` chooses from the data's size, the header lines that say
which and why, config.yaml recording the choice, and the one-line warning of a run still near chance after its
first epoch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tiny
import torch
import yaml
from clitools import crate, warnings_shown
from PIL import Image

from crate_transformer.io import save_state
from crate_transformer.train import FINETUNE_DEFAULTS, TrainConfig
from crate_transformer.train.recipes import (
    RECIPES,
    SMALL_DATA,
    chance_level,
    changed_settings,
    choose_augmentation,
    choose_mae_augmentation,
    finetune_recipe,
    near_chance,
    recipe_options,
)
from crate_transformer.train.rundir import load_training_state

TINY = tiny.TRAIN_CLI


def _run(path: Path) -> tuple[dict, list[dict]]:
    saved = yaml.safe_load((path / "config.yaml").read_text())
    records = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return saved, records


def _folder(root: Path, channels: int, classes: int = 3, per_class: int = 10, size: int = 8) -> Path:
    """A class-per-folder set of PNGs with a learnable brightness / colour cue per class."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            img = rng.integers(0, 60, (size, size, channels), dtype=np.uint8)
            img[..., c % channels] += 60 * (c + 1)
            Image.fromarray(img[..., 0] if channels == 1 else img).save(root / f"c{c}" / f"{i}.png")
    return root


# --------------------------------------------------------------------------- the choices
def test_auto_augmentation_shifts_grey_images_and_crops_colour_ones() -> None:
    grey = choose_augmentation(channels=1, num_images=1442, finetune=False)
    assert grey.value == "translate" and "1,442 grey-scale" in grey.reason and "flip" in grey.reason
    assert choose_augmentation(channels=1, num_images=10**6, finetune=True).value == "translate"  # never flipped
    assert choose_augmentation(channels=3, num_images=1920, finetune=False).value == "crop-flip"
    assert choose_augmentation(channels=3, num_images=1920, finetune=True).value == "crop-flip"  # small: no RandAugment
    big = choose_augmentation(channels=3, num_images=SMALL_DATA, finetune=True)
    assert big.value == "randaugment" and "transfer" in big.reason
    assert choose_augmentation(channels=3, num_images=SMALL_DATA, finetune=True, recipe="small-data").value == (
        "crop-flip"
    )
    assert choose_augmentation(channels=3, num_images=SMALL_DATA - 1, finetune=True).value == "crop-flip"


def test_auto_augmentation_reads_the_settings_given() -> None:
    """A setting only some augmentations read, given with ``auto``, picks one that reads it (not one that would
    ignore it): a crop scale on grey digits is a crop, RandAugment's n is RandAugment."""
    assert changed_settings(TrainConfig().augmentation) == ()
    cfg = TrainConfig(crop_scale=0.5, hflip=False)
    assert changed_settings(cfg.augmentation) == ("crop_scale", "hflip")
    chosen = choose_augmentation(channels=1, num_images=100, finetune=False, changed=("crop_scale", "hflip"))
    assert chosen.value == "crop-flip" and "crop_scale, hflip" in chosen.reason
    assert choose_augmentation(channels=1, num_images=100, finetune=False, changed=("randaugment_n",)).value == (
        "randaugment"
    )
    assert choose_augmentation(channels=3, num_images=100, finetune=False, changed=("translate",)).value == "translate"
    assert choose_mae_augmentation(1).value == "none" and choose_mae_augmentation(3).value == "crop-flip"


def test_finetune_recipe_by_data_size() -> None:
    assert finetune_recipe(1442).value == "small-data" and "1,442 training images" in finetune_recipe(1442).reason
    assert finetune_recipe(SMALL_DATA - 1).value == "small-data"
    assert finetune_recipe(SMALL_DATA).value == "" and finetune_recipe(None).value == ""
    small = recipe_options("small-data", finetune=True)
    assert small["lr"] == 1e-3 and "augment" not in small  # the augmentation stays the data's choice
    # the small-data fine-tuning differs from the transfer defaults in its learning rate (and floor) only
    same = {k: v for k, v in FINETUNE_DEFAULTS.items() if k not in ("lr", "min_lr", "batch_size")}
    assert {k: small[k] for k in same} == same
    # its training values are the training defaults, named
    defaults = TrainConfig().flat()
    assert all(defaults[k] == v for k, v in RECIPES["small-data"].train.items())


def test_near_chance_thresholds() -> None:
    assert chance_level(torch.tensor([0, 0, 0, 1])) == 0.75
    assert chance_level(torch.arange(10).repeat(5)) == pytest.approx(0.1)
    assert near_chance(0.18, 0.1) and not near_chance(0.19, 0.1)  # 10 classes: below 19%
    assert near_chance(0.54, 0.5) and not near_chance(0.56, 0.5)  # 2 classes: below 55%
    assert near_chance(0.0019, 0.001) and not near_chance(0.0021, 0.001)  # 1000 classes: below 0.2%


# --------------------------------------------------------------------------- said in the header, recorded
def test_train_on_grey_digits_chooses_shifts_says_why_and_records_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "run"
    assert crate("train", *TINY, "--epochs", "1", "--max-steps", "3", "--out", run) == 0
    err = capsys.readouterr().err
    assert "  recipe: the training defaults (adamw lr 0.004" in err
    line = next(line for line in err.splitlines() if line.startswith("  augmentation "))
    assert line.startswith("  augmentation translate: 1,438 grey-scale training images") and "flip" in line
    saved, _ = _run(run)
    assert saved["augmentation"]["augment"] == "translate"  # what took effect, not 'auto'
    assert saved["derived"]["chosen"][1] == line.strip()
    # the recorded config reproduces the run: read back, it chooses nothing
    assert (
        TrainConfig.from_dict(
            {k: v for k, v in saved.items() if k not in ("model_config", "derived")}
        ).augmentation.augment
        == "translate"
    )


def test_a_run_that_recorded_auto_resumes_with_the_rule_it_started_with(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A run of an earlier release recorded augment 'auto' (resolved then by the data's name: crop-flip for a folder)
    and resumes with that rule, not today's choice (translate for grey-scale), so a resumed run is the run it was."""
    data = _folder(tmp_path / "grey", channels=1)
    run = tmp_path / "run"
    argv = ["--data", data, "--image-size", "8", "--threads", "1", "--no-progress", "--batch-size", "8",
            "--model-args", *tiny.kv(tiny.TRAIN_ARCH)]  # fmt: skip
    assert crate("train", *argv, "--epochs", "2", "--max-steps", "3", "--out", run) == 0
    assert _run(run)[0]["augmentation"]["augment"] == "translate"  # today's choice for grey-scale images
    state = load_training_state(run)
    old = {**state["train_config"], "augmentation": {**state["train_config"]["augmentation"], "augment": "auto"}}
    save_state({**state, "train_config": old}, run / "checkpoints" / "last.pt")  # as an earlier release saved it
    capsys.readouterr()
    assert crate("train", "--resume", run, "--max-steps", "4", "--no-progress") == 0
    assert "  augmentation crop-flip: the rule the run started with" in capsys.readouterr().err
    assert _run(run)[0]["augmentation"]["augment"] == "crop-flip"


def test_train_on_colour_images_chooses_crop_flip(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = _folder(tmp_path / "colour", channels=3)
    run = tmp_path / "run"
    argv = [
        "--data",
        data,
        "--image-size",
        "8",
        "--threads",
        "1",
        "--no-progress",
        "--model-args",
        *tiny.kv(tiny.TRAIN_ARCH),
    ]
    assert crate("train", *argv, "--epochs", "1", "--max-steps", "2", "--batch-size", "8", "--out", run) == 0
    assert "  augmentation crop-flip: 24 3-channel training images" in capsys.readouterr().err
    assert _run(run)[0]["augmentation"]["augment"] == "crop-flip"


def test_finetune_on_a_small_folder_uses_the_small_data_recipe(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = tmp_path / "base"
    assert crate("train", *TINY, "--epochs", "1", "--max-steps", "2", "--out", base) == 0
    data = _folder(tmp_path / "grey", channels=1)
    ft = tmp_path / "ft"
    common = ["--from", base, "--data", data, "--threads", "1", "--no-progress", "--epochs", "1", "--batch-size", "8"]
    capsys.readouterr()
    assert crate("finetune", *common, "--max-steps", "2", "--out", ft) == 0
    err = capsys.readouterr().err
    assert "  recipe small-data (adamw lr 0.001" in err and "24 training images, fewer than 20,000" in err
    assert "  augmentation translate: 24 grey-scale training images" in err
    saved, _ = _run(ft)
    assert (saved["recipe"], saved["optim"]["lr"], saved["augmentation"]["augment"]) == (
        "small-data",
        1e-3,
        "translate",
    )
    # what the user gives wins: an lr over the recipe, a named recipe instead of the choice
    assert crate("finetune", *common, "--max-steps", "1", "--lr", "5e-5", "--out", tmp_path / "lr") == 0
    assert _run(tmp_path / "lr")[0]["optim"]["lr"] == 5e-5
    assert crate("finetune", *common, "--max-steps", "1", "--recipe", "crate-paper", "--out", tmp_path / "paper") == 0
    saved = _run(tmp_path / "paper")[0]
    assert (saved["recipe"], saved["optim"]["lr"]) == ("crate-paper", 5e-5)
    assert "recipe crate-paper (adamw lr 5e-05" in capsys.readouterr().err
    # --print-config shows the choice before anything runs
    assert crate("finetune", "--from", base, "--data", data, "--print-config") == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["recipe"], printed["optim"]["lr"]) == ("small-data", 1e-3)


def test_pretrain_headers_say_what_they_chose(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    common = ["--data", "digits", "--threads", "1", "--no-progress", "--epochs", "1", "--max-steps", "1",
              "--model-args", *tiny.SSL_ARCH]  # fmt: skip
    assert crate("pretrain", "mae", *common, "--no-probe", "--no-recognition", "--figure-images", "0",
                 "--out", tmp_path / "mae") == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "  recipe: the mae task's defaults (" in err
    assert "  augmentation none: grey-scale images: the masking is the regulariser" in err
    assert _run(tmp_path / "mae")[0]["task_args"]["augmentation"] == "none"
    dino_args = ["--out-dim", "32", "--hidden-dim", "16", "--bottleneck-dim", "8"]
    assert crate("pretrain", "dino", *common, *dino_args, "--out", tmp_path / "dino") == 0
    err = capsys.readouterr().err
    assert "  recipe: the dino task's defaults (" in err
    assert "  augmentation: DINO multi-crop, preset digits: views 2x8px, flip p=0 (no flips" in err


# --------------------------------------------------------------------------- near chance after the first epoch
def test_a_run_near_chance_after_its_first_epoch_says_so_and_names_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """lr ~0 cannot move the untrained network off chance: one warning line naming flags, and the check's record
    at the last step of the first epoch (after a half-epoch warm-up); with the default two-epoch warm-up the check
    waits for the end of epoch 2."""
    run = tmp_path / "flat"
    with warnings_shown():
        assert crate("train", *TINY, "--epochs", "2", "--warmup-epochs", "0.5", "--lr", "1e-9", "--min-lr", "0",
                     "--augment", "crop-flip", "--out", run) == 0  # fmt: skip
    lines = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith("crate train: warning: training accuracy ") and "after the first epoch" in lines[0]
    assert "--lr" in lines[0] and "--augment translate" in lines[0] and "--epochs" in lines[0]
    saved, records = _run(run)
    check = next(r for r in records if r["split"] == "chance_check")
    assert check["step"] == saved["derived"]["steps_per_epoch"] and check["near_chance"] is True
    assert near_chance(check["train_acc"], check["chance"])
    with warnings_shown():
        assert crate("train", *TINY, "--epochs", "3", "--lr", "1e-9", "--min-lr", "0", "--out", tmp_path / "w2") == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(lines) == 1 and "after epoch 2, the first after the warm-up," in lines[0]
    assert "--augment" not in lines[0].split("try")[1]  # translate already: no augmentation to drop
    saved, records = _run(tmp_path / "w2")
    assert next(r for r in records if r["split"] == "chance_check")["step"] == 2 * saved["derived"]["steps_per_epoch"]


def test_a_run_that_learns_gets_no_chance_warning(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "learns"
    with warnings_shown():
        assert crate("train", *TINY, "--epochs", "2", "--warmup-epochs", "0.5", "--lr", "2e-2", "--out", run) == 0
    assert "near chance" not in capsys.readouterr().err
    check = next(r for r in _run(run)[1] if r["split"] == "chance_check")
    assert check["near_chance"] is False and check["train_acc"] >= min(2 * check["chance"], 0.1 + 0.9 * check["chance"])
