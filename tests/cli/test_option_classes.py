"""Issue classes 1-3 of bad options, each made impossible by one mechanism and walked over every option:

1. an option that cannot apply (``--momentum`` with ``--optimizer adamw``) is refused, from Python, a flag and a file
   (``Config.check_applicable``, from each field's ``applies`` declaration);
2. a config value of the wrong kind is a one-line error naming its key (``train.config.nest_options``, which every
   flag, file and keyword goes through, types every value);
3. a ``--config`` key that the command has no option for is refused, not recorded and left unread
   (``cli.common.given_options``)."""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import pytest
import yaml
from clitools import one_line_error

from crate_transformer.cli import build_parser, command_parser
from crate_transformer.cli.options import COMMAND_OPTIONS
from crate_transformer.config_utils import field_types, option_name
from crate_transformer.train.config import GROUPS, TrainConfig, nest_options

TRAINING = ("train", "finetune", "pretrain", "train-lm", "finetune-text")
TOP = [f for f in dataclasses.fields(TrainConfig) if f.name not in GROUPS]


def _fields() -> list[tuple[str | None, dataclasses.Field]]:
    """(group or None, field) for every training option."""
    return [(None, f) for f in TOP] + [(g, f) for g, cls in GROUPS.items() for f in dataclasses.fields(cls)]


def _default(f: dataclasses.Field) -> object:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _wrong_kind(tp: object) -> object:
    """A value no rule can read as ``tp``."""
    inner = [a for a in typing.get_args(tp) if a is not type(None)]
    tp = inner[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) and inner else tp
    origin = typing.get_origin(tp) or tp
    if origin in (int, float):
        return "not-a-number"
    if origin is bool:
        return "perhaps"
    if origin is str:
        return {"a": 1}
    if origin in (list, tuple):
        return {"a": 1}
    if origin is dict:
        return "key=value"
    raise AssertionError(f"no wrong value for {tp}")


def _other_value(f: dataclasses.Field, tp: object) -> object:
    """A value of ``f``'s kind other than its default."""
    choices = f.metadata.get("choices")
    if choices:
        return next(c for c in choices if c != _default(f))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    origin, d = typing.get_origin(tp) or tp, _default(f)
    if origin is bool:
        return not d
    if origin is int:
        return (d or 0) + 1
    if origin is float:
        return (d or 0.0) / 2 + 0.25 if (d or 0.0) / 2 + 0.25 != d else 0.1
    if origin in (list, tuple):
        return [0.5, 0.5]
    if origin is dict:
        return {"x": 1}
    return "elsewhere"


# --------------------------------------------------------------------------- class 2: the kind of every value
@pytest.mark.parametrize(("group", "f"), _fields(), ids=lambda x: getattr(x, "name", x))
def test_every_value_of_the_wrong_kind_is_one_line_naming_its_key(group, f):
    tp = field_types(TrainConfig if group is None else GROUPS[group])[f.name]
    if tp in (typing.Any, object) or dataclasses.is_dataclass(tp):
        pytest.skip("takes any value")
    value = _wrong_kind(tp)
    for layout in ({f.name: value}, {group: {f.name: value}} if group else {f.name: value}):
        with pytest.raises(ValueError) as e:
            nest_options(layout)
        msg = str(e.value)
        assert "\n" not in msg and option_name(f) in msg.replace("-", "_"), msg


def test_every_file_value_of_the_wrong_kind_is_named_as_the_files_key(tmp_path, capsys):
    """A ``--config`` value that cannot be read is named as the key the file writes (nested ``optim.lr`` or flat
    ``lr``) with the file, never as the flag it would be: the file is where it is fixed.  Every option, both
    layouts, through the real command."""
    walked = 0
    for group, f in _fields():
        tp = field_types(TrainConfig if group is None else GROUPS[group])[f.name]
        if tp in (typing.Any, object) or dataclasses.is_dataclass(tp):
            continue
        value = _wrong_kind(tp)
        layouts = {option_name(f): {option_name(f): value}} if option_name(f) not in GROUPS else {}  # data: {...}
        if group is not None:  # is the data group
            layouts[f"{group}.{f.name}"] = {group: {f.name: value}}
        for key, layout in layouts.items():
            file = tmp_path / "c.yaml"
            file.write_text(yaml.safe_dump(layout))
            err = one_line_error(capsys, "train", "--config", file, "--print-config")
            assert err.startswith(f"crate train: error: {file}: {key} must be ") and " got " in err, (key, err)
            assert "--" not in err, err  # no flag named
            walked += 1
    assert walked > 60


def test_a_file_value_out_of_its_range_or_choices_is_named_as_the_files_key(tmp_path, capsys):
    """Ranges, choices and model arguments of a file too (issue 48's example first); the same value given as a
    flag still names the flag."""
    cases = [
        ('optim: {lr: "fast"}', "optim.lr must be a number, got 'fast' (str); e.g. 0.004"),
        ("data: {val_fraction: 2}", "data.val_fraction must be a finite number in [0, 1), got 2.0; e.g. 0.0"),
        ("min-lr: -1", "min-lr must be a finite number >= 0, got -1.0; e.g. 1e-05"),
        ("optim: {optimizer: adamx}", "optim.optimizer: unknown optimizer 'adamx'; choose one of ("),
        ("epochs: 0", "epochs must be a positive integer, got 0; e.g. 40"),
        ("model_args: {dim: big}", "model_args.dim must be an integer, got 'big' (str); e.g. 384"),
        ('model_args: "dim=32"', "model_args must be a mapping (dict), got 'dim=32' (str)"),
    ]
    file = tmp_path / "config.yaml"
    for text, said in cases:
        file.write_text(text + "\n")
        for command in ("train", "train-lm"):
            err = one_line_error(capsys, command, "--config", file, "--print-config")
            assert err.startswith(f"crate {command}: error: {file}: {said}"), (text, err)
    err = one_line_error(capsys, "train", "--lr", "fast", "--print-config")
    assert err == "crate train: error: --lr must be a number, got 'fast' (str); e.g. --lr 0.004", err


# --------------------------------------------------------------------------- class 3: keys no option reads
def _command_options(command: str) -> set[str]:
    argv = [command, "mae"] if command == "pretrain" else [command]
    parser = build_parser(command)
    args, _ = parser.parse_known_args(argv)
    return {a.dest for a in command_parser(parser, args)._actions}


@pytest.mark.parametrize("command", TRAINING)
def test_every_file_key_the_command_does_not_read_is_refused(command, tmp_path, capsys):
    assert command in COMMAND_OPTIONS
    accepted = _command_options(command)
    flat = {option_name(f): (g, f) for g, f in _fields() if g is not None}
    unread = sorted(k for k in flat if k not in accepted)
    assert command == "train" or unread, "every training command but train leaves some options out"
    argv = [command, "mae"] if command == "pretrain" else [command]
    for key in unread:
        group, f = flat[key]
        value = _other_value(f, field_types(GROUPS[group])[f.name])
        file = tmp_path / f"{key}.yaml"
        file.write_text(yaml.safe_dump({key: value}))
        err = one_line_error(capsys, *argv, "--config", file, "--max-steps", 1, "--out", tmp_path / "never")
        assert f"sets {key}:" in err and "does not read" in err, (key, err)
        assert not (tmp_path / "never").exists()


# --------------------------------------------------------------------------- class 1: options that cannot apply
APPLIES = [(g, f) for g, f in _fields() if f.metadata.get("applies")]


def test_conditional_options_declare_where_they_apply():
    assert {f.name for _, f in APPLIES} >= {"momentum", "betas"}


@pytest.mark.parametrize(("group", "f"), APPLIES, ids=lambda x: getattr(x, "name", x))
def test_an_option_given_where_it_cannot_apply_is_refused_everywhere(group, f, tmp_path, capsys):
    cls = GROUPS[group]
    value = _other_value(f, field_types(cls)[f.name])
    for other, allowed in f.metadata["applies"].items():
        controller = next(g for g in dataclasses.fields(cls) if g.name == other)
        elsewhere = next(c for c in controller.metadata["choices"] if c not in allowed)
        with pytest.raises(ValueError, match=f"applies only with {other}"):  # Python
            TrainConfig(**{f.name: value, other: elsewhere}).validate()
        for allowed_value in allowed:  # where it applies it is taken
            TrainConfig(**{f.name: value, other: allowed_value}).validate()
        flag_value = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        flag, other_flag = "--" + option_name(f).replace("_", "-"), "--" + other.replace("_", "-")
        given = (flag, *flag_value, other_flag, elsewhere, "--max-steps", 1, "--out", tmp_path / "a")
        one_line_error(capsys, "train", *given, match=f"{flag} applies only with")
        file = tmp_path / "c.yaml"
        file.write_text(yaml.safe_dump({group: {f.name: value, other: elsewhere}}))
        given = ("--config", file, "--max-steps", 1, "--out", tmp_path / "b")
        one_line_error(capsys, "train", *given, match="applies only with")
        assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_default_of_a_conditional_option_never_refuses():
    TrainConfig(optimizer="adamw").validate()
    TrainConfig(optimizer="sgd").validate()
    assert Path  # the module's imports are used


PATHS = [(g, f) for g, f in _fields() if f.metadata.get("path")]


def test_path_options_are_declared():
    assert {f.name for _, f in PATHS} >= {"out", "init_from"}


@pytest.mark.parametrize(("group", "f"), PATHS, ids=lambda x: getattr(x, "name", x))
def test_every_path_option_refuses_an_empty_path(group, f, tmp_path, capsys):
    for blank in ("", "  "):
        with pytest.raises(ValueError, match="empty path"):
            TrainConfig(**{f.name: blank})
        file = tmp_path / "c.yaml"
        file.write_text(yaml.safe_dump({f.name: blank}))
        with pytest.raises(ValueError, match="empty path"):
            nest_options({group: {f.name: blank}} if group else {f.name: blank})
    if f.name == "out":
        one_line_error(capsys, "train", "--out", "", "--max-steps", 1, match="--out is an empty path")
