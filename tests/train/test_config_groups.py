"""The training options in groups: nested and flat layouts, ``--print-config``, runs written by earlier releases,
and which training options each command has (those whose conditions can hold for its task)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from clitools import crate, one_line_error
from optionvalues import given

from crate_transformer import cli
from crate_transformer.cli.options import FINETUNING, training_options
from crate_transformer.config_utils import option_name
from crate_transformer.errors import OptionError
from crate_transformer.io import save_state
from crate_transformer.train import TrainConfig
from crate_transformer.train.config import FLAT, GROUPS, OWNERS, flat_options, nest_options
from crate_transformer.train.rundir import load_training_state, read_run_config

TINY = ["--data", "digits", "--image-size", "8", "--threads", "1", "--no-progress", "--eval-every", "0",
        "--measure-every", "0", "--model-args", "dim=16", "depth=1", "heads=2", "patch_size=4"]  # fmt: skip


def _printed(capsys: pytest.CaptureFixture, *argv: object) -> dict:
    capsys.readouterr()
    assert crate(*argv, "--print-config") == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_flat_and_nested_layouts_are_the_same_config() -> None:
    flat = {"lr": 0.01, "data": "digits", "threads": 1, "augment": "none", "out": "r", "model": "vit_mnist"}
    cfg = TrainConfig(**flat)
    assert (cfg.optim.lr, cfg.data.source, cfg.system.threads, cfg.augmentation.augment, cfg.logging.out) == (
        0.01, "digits", 1, "none", "r",
    )  # fmt: skip
    nested = cfg.to_dict()
    assert nested["config_version"] == 2 and nested["optim"]["lr"] == 0.01 and nested["data"]["source"] == "digits"
    assert TrainConfig.from_dict(nested) == cfg == TrainConfig.from_dict(flat) == TrainConfig.from_dict(cfg.flat())
    assert {k: cfg.flat()[k] for k in flat} == flat
    mixed = TrainConfig.from_dict({"optim": {"batch-size": 32}, "epochs": 3, "data": {"source": "digits"}})
    assert (mixed.optim.batch_size, mixed.optim.epochs, mixed.data.source) == (32, 3, "digits")
    # a base keeps what an update does not name, group by group
    assert TrainConfig.from_dict({"optim": {"lr": 0.5}}, cfg).optim == dataclasses.replace(cfg.optim, lr=0.5)
    # every option has exactly one place; the flat names are the flags
    assert len(FLAT) == sum(len(dataclasses.fields(c)) for c in GROUPS.values())
    assert flat_options(nest_options({"lr": "1e-3"})) == {"lr": 1e-3}  # typed where every layout is read


def test_bad_layouts_are_one_line_errors() -> None:
    for d, msg in (
        ({"learning_rate": 3}, r"unknown training option\(s\) \['learning_rate'\]"),
        ({"optim": {"learning_rate": 3}}, r"unknown training option\(s\) \['optim.learning_rate'\]"),
        ({"config_version": 3}, "config_version 3 is newer than this crate_transformer reads"),
        ({"optim": {"lr": "abc"}}, "lr must be a number, got 'abc'"),
        ({"system": {"threads": -1}}, "threads must be a non-negative integer"),
        ({"data": {"eval_split": "val"}}, "val_fraction=0.1"),
    ):
        with pytest.raises(ValueError, match=msg):
            TrainConfig.from_dict(d)


def test_print_config_is_defaults_then_file_then_flags(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "flat.yaml").write_text("lr: 4.0e-3\nepochs: 3\nbatch_size: 64\n")
    out = _printed(capsys, "train", "--config", tmp_path / "flat.yaml", "--epochs", 5, "--out", tmp_path / "run")
    assert not (tmp_path / "run").exists()  # printed, nothing trained or written
    assert out["optim"]["lr"] == 0.004 and out["optim"]["batch_size"] == 64  # the file
    assert out["optim"]["epochs"] == 5  # the flag over the file
    assert out["optim"]["min_lr"] == TrainConfig().optim.min_lr and out["data"]["source"] == "mnist"  # defaults
    assert out["logging"]["out"] == str(tmp_path / "run")
    # the printed YAML is a nested --config file: read back, with a flag into a nested group, it resolves the same
    (tmp_path / "nested.yaml").write_text(yaml.safe_dump(out))
    again = _printed(capsys, "train", "--config", tmp_path / "nested.yaml", "--data", "digits")
    assert again == {**out, "data": {**out["data"], "source": "digits"}}
    # each command prints its own recipe: fine-tuning's, a task's defaults and options
    fine = _printed(capsys, "finetune", "--from", "some/run", "--data", "digits")  # 1,438 images: small-data
    assert (fine["optim"]["lr"], fine["init_from"], fine["model"], fine["recipe"]) == (
        1e-3,
        "some/run",
        None,
        "small-data",
    )
    fine = _printed(capsys, "finetune", "--from", "some/run", "--data", "digits", "--recipe", "crate-paper")
    assert (fine["optim"]["lr"], fine["optim"]["batch_size"], fine["recipe"]) == (5e-5, 512, "crate-paper")
    mae = _printed(capsys, "pretrain", "mae", "--mask-ratio", "0.5", "--config", tmp_path / "flat.yaml")
    assert mae["task"] == "mae" and mae["task_args"] == {"mask_ratio": 0.5} and mae["optim"]["epochs"] == 3
    assert "--mask-ratio must be" in one_line_error(capsys, "pretrain", "mae", "--mask-ratio", "2", "--print-config")
    err = one_line_error(capsys, "train", "--resume", tmp_path, "--print-config")
    assert "config.yaml" in err and "--resume" in err


def _as_earlier_release(run: Path) -> None:
    """Rewrite a run as an earlier release left it: flat options in config.yaml and in the checkpoint."""
    saved = yaml.safe_load((run / "config.yaml").read_text())
    extras = {k: saved.pop(k) for k in ("model_config", "derived")}
    flat = flat_options(saved)
    (run / "config.yaml").write_text(yaml.safe_dump({**flat, **extras}))
    state = load_training_state(run)
    save_state({**state, "train_config": flat}, run / "checkpoints" / "last.pt")  # checksummed as a run writes it


def test_a_run_of_an_earlier_release_still_resumes_evaluates_and_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "run"
    assert crate("train", *TINY, "--epochs", 2, "--max-steps", 3, "--batch-size", 64, "--out", run) == 0
    _as_earlier_release(run)
    assert "lr" in yaml.safe_load((run / "config.yaml").read_text())  # flat, as before the groups
    cfg = read_run_config(run)
    assert (cfg.optim.batch_size, cfg.data.source, cfg.data.image_size) == (64, "digits", 8)
    assert crate("train", "--resume", run, "--max-steps", 5) == 0
    state = load_training_state(run)
    assert state["step"] == 5 and state["train_config"]["optim"]["batch_size"] == 64  # rewritten as version 2
    assert crate("eval", run, "--threads", 1, "--out", tmp_path / "ev") == 0
    assert (tmp_path / "ev" / "eval.json").is_file()


TRAINING_COMMANDS = [("train", "classification"), ("finetune", "classification"), ("pretrain", "mae"),
                     ("pretrain", "dino"), ("pretrain", "simdino"), ("train-lm", "lm"),
                     ("finetune-text", "text-classification")]  # fmt: skip


COMPANIONS = {
    "eval_split": {"val_fraction": 0.1},
    "min_lr": {"lr": 1.0},
}  # what a class's own check across its fields asks beside it


@pytest.mark.parametrize(("command", "task"), TRAINING_COMMANDS)
def test_a_training_command_has_every_option_its_task_reads_and_no_other(command: str, task: str) -> None:
    """No table says which training options a command has: those whose ``applies`` can hold for its task.  Walked
    both ways: each option it leaves out, given alone, is refused by the library too (nothing the task reads is
    out of the command's reach), and each it has is accepted by the library for that task, with what its condition
    needs (the first alternative's values)."""
    sections = training_options(command, task)
    shown = {n for names in sections.values() for n in names}
    assert (sections["top"][0] == "init_from") == (command in FINETUNING), sections["top"]  # --from first
    start = {"task": task, "init_from": "CHECKPOINT" if command in FINETUNING else None}
    checked, fields = 0, {f.name: f for cls in (TrainConfig, *GROUPS.values()) for f in dataclasses.fields(cls)}
    for f in fields.values():
        if f.name in GROUPS or f.metadata.get("by_command") or f.name == "init_from":
            continue  # the checkpoint is the command's choice: train and finetune share a task
        name, value = option_name(f), given(f, OWNERS[f.name])
        if name not in shown:
            with pytest.raises(OptionError, match=rf"^{f.name} applies only when "):
                TrainConfig(**{**start, **COMPANIONS.get(name, {}), name: value})
        else:
            applies = f.metadata.get("applies")
            need = {} if applies is None or isinstance(applies, str) else dict(_first_holding(applies, task, shown))
            need = {k: (given(fields[k], OWNERS[k]) if v == "on" else v[0]) for k, v in need.items() if k != "task"}
            TrainConfig(**{**start, **need, **COMPANIONS.get(name, {}), name: value})
        checked += 1
    assert checked >= 60 and len(shown) > 30


def _first_holding(applies, task, shown):
    """The first alternative of ``applies`` that a run of ``task`` can meet with the options ``shown``."""
    alternatives = [applies] if isinstance(applies, dict) else list(applies)
    return next(a for a in alternatives if all(task in v if k == "task" else k in shown for k, v in a.items())).items()


@pytest.mark.parametrize("command", ["eval", "analyze", "generate", "features"])
def test_report_commands_take_the_system_options(command: str, capsys: pytest.CaptureFixture) -> None:
    from crate_transformer.cli.options import resolve_options

    args = cli.build_parser(command).parse_args([command, "x", "--threads", "2", "--seed", "7", "--device", "cpu"])
    assert (args.seed, args.threads, args.device) == ("7", "2", "cpu")  # one parse mode: the text as given
    resolve_options(args)  # what cli.main does: the command's options class coerces and checks
    assert (args.seed, args.threads, args.device) == (7, 2, "cpu")  # typed, as the command reads them
    defaults = cli.build_parser(command).parse_args([command, "x"])
    assert not {"seed", "device", "threads"} & set(vars(defaults))  # what was given is exactly the namespace
    resolve_options(defaults)
    assert (defaults.seed, defaults.device, defaults.threads) == (0, "auto", 0)  # then the declared defaults
    err = one_line_error(capsys, command, "x", "--seed", "abc")
    assert "--seed must be an integer, got 'abc' (str)" in err, err
    err = one_line_error(capsys, command, "x", "--threads", "-1")  # the range of the training option it copies
    assert "--threads must be a non-negative integer, got -1" in err, err


def test_eval_checks_val_fraction_before_loading_anything(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = one_line_error(capsys, "eval", tmp_path / "missing", "--val-fraction", "1.5")
    assert "--val-fraction must be a finite number in [0, 1), got 1.5" in err


def test_every_option_class_is_a_config_checked_by_one_rule() -> None:
    """The training groups, every task's options, the DINO head's model config and the DataSpec are ``Config``s:
    one coercion, one choice check and one range rule (``config.check_option``), with the same words."""
    from crate_transformer import config_utils
    from crate_transformer.config import Config, check_option
    from crate_transformer.models.dino import DINOHeadConfig
    from crate_transformer.models.spec import DataSpec
    from crate_transformer.train.task import TASKS, make_task

    options = [type(make_task(name)).Options for name in TASKS]
    for cls in (*GROUPS.values(), *[o for o in options if o is not None], DINOHeadConfig, DataSpec):
        assert issubclass(cls, Config), cls
    assert not hasattr(config_utils, "check_ranges")  # the second implementation of the rule is gone
    # choices and ranges of a group: enforced at construction, worded as for any Config
    with pytest.raises(ValueError, match=r"^unknown optimizer 'adam'; choose one of \('adamw', "):
        TrainConfig(optimizer="adam")
    with pytest.raises(ValueError, match=r"^batch_size must be a positive integer, got 0; e.g. batch_size=64$"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match=r"^unknown logger 'tensorbored'; choose one of"):
        TrainConfig(logger=["csv", "tensorbored"])
    # a group changed after it was built is checked again by the config's validate
    cfg = TrainConfig()
    cfg.optim.momentum = 1.5
    with pytest.raises(ValueError, match=r"^momentum must be a finite number in \[0, 1\), got 1.5"):
        cfg.validate()
    with pytest.raises(ValueError, match=r"^unknown recipe 'x'"):
        check_option(TrainConfig, "recipe", "x")
