"""Issue classes 1-3 of bad options, each made impossible by one mechanism and walked over every option:

1. an option that cannot apply (``--momentum`` with ``--optimizer adamw``, ``--crop-scale`` with ``--augment
   translate``, ``label_smoothing`` in a language model's run) is refused, from Python, a flag and a file
   (``config.check_applicable``, from each field's ``applies`` declaration; every field states one);
2. a config value of the wrong kind is a one-line error naming its key (``train.config.nest_options``, which every
   flag, file and keyword goes through, types every value);
3. a ``--config`` key that the command has no option for is refused, not recorded and left unread
   (``cli.options.given_options``)."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest
import yaml
from clitools import crate, one_line_error
from optionvalues import default, given, other_value

from crate_transformer.cli import build_parser, command_parser
from crate_transformer.config_utils import (
    ALWAYS,
    OBSERVED,
    ON,
    applies_where,
    field_types,
    fields_applicability,
    option_name,
)
from crate_transformer.errors import OptionError
from crate_transformer.train.config import (
    GROUPS,
    OWNERS,
    AugmentationOptions,
    OptimOptions,
    TrainConfig,
    _where,
    load_config,
    nest_options,
)
from crate_transformer.train.rundir import read_run_config

TRAINING = ("train", "finetune", "pretrain", "train-lm", "finetune-text")
TOP = [f for f in dataclasses.fields(TrainConfig) if f.name not in GROUPS]


def _fields() -> list[tuple[str | None, dataclasses.Field]]:
    """(group or None, field) for every training option."""
    return [(None, f) for f in TOP] + [(g, f) for g, cls in GROUPS.items() for f in dataclasses.fields(cls)]


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
    accepted = _command_options(command)
    flat = {option_name(f): (g, f) for g, f in _fields() if g is not None}
    unread = sorted(k for k in flat if k not in accepted)
    assert command == "train" or unread, "every training command but train leaves some options out"
    argv = [command, "mae"] if command == "pretrain" else [command]
    for key in unread:
        group, f = flat[key]
        value = other_value(f, field_types(GROUPS[group])[f.name])
        file = tmp_path / f"{key}.yaml"
        file.write_text(yaml.safe_dump({key: value}))
        err = one_line_error(capsys, *argv, "--config", file, "--max-steps", 1, "--out", tmp_path / "never")
        assert f"sets {key}:" in err and "does not read" in err, (key, err)
        assert not (tmp_path / "never").exists()


# --------------------------------------------------------------------------- class 1: options that cannot apply
CONFIGS = [TrainConfig, *GROUPS.values()]


def f_cls(group: str | None) -> type:
    return TrainConfig if group is None else GROUPS[group]


CONDITIONAL = [(g, f) for g, f in _fields() if not isinstance(fields_applicability(f_cls(g))[f.name], str)]


def test_every_config_class_states_where_each_field_applies():
    """Every field of every config (the training groups, the tasks' options, the model configs, the data record,
    the layer) has an applicability statement: ALWAYS / OBSERVED, or a condition on fields it can see."""
    from crate_transformer.layers.config import LayerConfig
    from crate_transformer.models.dino import DINOHeadConfig
    from crate_transformer.models.registry import config_classes
    from crate_transformer.models.spec import DataSpec
    from crate_transformer.train.task import TASKS, make_task

    options = [make_task(name).Options for name in TASKS]
    classes = [
        *CONFIGS,
        *[o for o in options if o is not None],
        DataSpec,
        LayerConfig,
        DINOHeadConfig,
        *config_classes(),
    ]
    assert len(classes) >= 18
    undeclared = [f"{c.__name__}.{n}" for c in classes for n, a in fields_applicability(c).items() if a is None]
    assert not undeclared, undeclared
    for cls in classes:
        visible = set(OWNERS) if cls in CONFIGS else {f.name for f in dataclasses.fields(cls)}
        for name, applies in fields_applicability(cls).items():
            if isinstance(applies, str):
                assert applies in (ALWAYS, OBSERVED), (cls, name, applies)
                continue
            for alternative in [applies] if isinstance(applies, dict) else applies:
                assert alternative and set(alternative) <= visible, (cls, name, alternative)
                assert all(v == ON or (isinstance(v, tuple) and v) for v in alternative.values()), (name, alternative)
    assert len(CONDITIONAL) >= 20, [f.name for _, f in CONDITIONAL]


def _outside(key: str, applies: object) -> object:
    """A value of field ``key`` under which no alternative of ``applies`` naming it holds."""
    from crate_transformer.train.task import TASKS

    alternatives = [applies] if isinstance(applies, dict) else list(applies)
    allowed = [v for alt in alternatives for k, v in alt.items() if k == key]
    if ON in allowed:
        return None if key == "init_from" else 0.0
    f = next(g for g in dataclasses.fields(OWNERS[key]) if g.name == key)
    candidates = f.metadata.get("choices") or tuple(TASKS)
    return next(c for c in candidates if c != "auto" and all(c not in a for a in allowed))


def _context(alternatives: list[dict], given: dict) -> dict:
    """Values that make every alternative false with the option ``given`` set (``augment='auto'`` picks a kind
    that reads an augmentation setting given), each by one of its fields (the task's last: the command stays)."""
    context: dict = {}
    for alt in alternatives:
        values, _, seen = _where(_layout({**given, **context}))
        if applies_where(alt, {**values, **seen}) is False:
            continue
        key = next((k for k in alt if k != "task"), "task")
        context[key] = _outside(key, alternatives)
    return context


def _inside(key: str, allowed: object) -> object:
    return {"init_from": "ckpt.pt", "mixup": 0.8, "cutmix": 1.0}[key] if allowed == ON else allowed[0]


def _layout(values: dict) -> dict:
    """Flat field names → the nested layout of a config file (a group's options under the group)."""
    out: dict = {}
    for name, value in values.items():
        group = next((g for g, c in GROUPS.items() if c is OWNERS[name]), None)
        if group is None:
            out[name] = value
        else:
            out.setdefault(group, {})[name] = value
    return out


def _argv(values: dict) -> list[str]:
    argv = []
    for name, value in values.items():
        flag = "--" + option_name(next(g for g in dataclasses.fields(OWNERS[name]) if g.name == name)).replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else flag.replace("--", "--no-", 1))
        elif value is not None:
            argv += [flag, *([str(v) for v in value] if isinstance(value, list) else [str(value)])]
    return argv


COMMANDS = {"classification": ["train"], "lm": ["train-lm"], "text-classification": ["finetune-text"]}


@pytest.mark.parametrize(("group", "f"), CONDITIONAL, ids=lambda x: getattr(x, "name", x))
def test_an_option_given_where_it_cannot_apply_is_refused_everywhere(group, f, tmp_path, capsys):
    """For each declared condition: a context where it does not hold refuses the option from Python, a --config
    file and the flags, in one line naming it (the same command where the context is the command's own; another
    task's command refuses the key as one it has no option for); where it holds, the option is taken."""
    applies = fields_applicability(f_cls(group))[f.name]
    alternatives = [applies] if isinstance(applies, dict) else list(applies)
    value = given(f, f_cls(group))
    companion = {"val_fraction": 0.1} if f.name == "eval_split" else {}  # eval_split='val' needs a val split
    context = {**companion, **_context(alternatives, {f.name: value, **companion})}
    name = option_name(f)
    with pytest.raises(OptionError, match=f"^{name} applies only when .*: drop {name} or "):
        TrainConfig(**{f.name: value, **context})
    holds = {k: _inside(k, v) for k, v in alternatives[0].items()}
    taken = TrainConfig(**{**{k: v for k, v in context.items() if k not in holds}, **holds, f.name: value})
    assert _where(taken.to_dict())[0][f.name] == value  # where it applies it is taken
    command = COMMANDS.get(context.get("task", "classification"), ["pretrain", context.get("task", "mae")])
    own = {k: v for k, v in context.items() if k != "task"}
    file = tmp_path / "c.yaml"
    file.write_text(yaml.safe_dump(_layout({f.name: value, **own})))
    run = ("--max-steps", 1, "--out", tmp_path / "a")
    flag = "--" + name.replace("_", "-")
    # the command's own options: refused by the condition; another's: by the command (it has no such option)
    mine = command == ["train"] and f.name in _command_options("train")
    for argv in (("--config", file), _argv({f.name: value, **own})):
        err = _refusal(capsys, *command, *argv, *run)
        assert flag in err or (argv[0] == "--config" and f"sets {name}:" in err), err
        assert ("applies only when" if mine else _REFUSALS) in err if mine else any(r in err for r in _REFUSALS), err
    assert not (tmp_path / "a").exists()


_REFUSALS = ("applies only when", "does not read", "unrecognized arguments")


def _task_conditions() -> list[tuple[str, dataclasses.Field]]:
    """(task, field) for every task option whose condition names only fields of its own options class."""
    from crate_transformer.train.task import TASKS, make_task

    out = []
    for name in TASKS:
        cls = make_task(name).Options
        own = {f.name for f in dataclasses.fields(cls)} if cls is not None else set()
        for f in dataclasses.fields(cls) if cls is not None else ():
            applies = fields_applicability(cls)[f.name]
            alternatives = [] if isinstance(applies, str) else [applies] if isinstance(applies, dict) else applies
            if alternatives and all(set(alt) <= own for alt in alternatives):
                out.append((name, f))
    return out


@pytest.mark.parametrize(("task", "f"), _task_conditions(), ids=lambda x: getattr(x, "name", x))
def test_a_task_option_given_at_its_default_where_it_cannot_apply_is_refused(task, f):
    """Issue 48 for the tasks' options: given at its default value where its condition fails, it is refused as
    any other value is (``Task.check_options``, which every flag, file and keyword of ``task_args`` goes through)."""
    from crate_transformer.train.task import make_task

    t = make_task(task)
    applies = fields_applicability(t.Options)[f.name]
    context: dict = {}
    for alt in [applies] if isinstance(applies, dict) else applies:
        key, allowed = next(iter(alt.items()))
        field = next(g for g in dataclasses.fields(t.Options) if g.name == key)
        candidates = field.metadata.get("choices") or (default(field),)  # tokenizer: no choices, "byte" by default
        context[key] = False if allowed == ON else next(c for c in candidates if c not in allowed)
    assert t.check_options(context) == context  # the context alone is valid
    with pytest.raises(OptionError, match=f"^{f.name} applies only when"):
        t.check_options({**context, f.name: default(f)})


def test_a_group_given_whole_is_judged_by_value() -> None:
    """A group given as its dataclass holds every field of it, read or not: only those away from their default
    count as given (momentum 0.9 under adamw passes; 0.5 is refused by the group's own check)."""
    assert TrainConfig(optim=OptimOptions(lr=0.1)).optim == OptimOptions(lr=0.1)
    with pytest.raises(OptionError, match="momentum applies only when optimizer is sgd / lars"):
        TrainConfig(optim=OptimOptions(momentum=0.5))
    with pytest.raises(OptionError, match="momentum applies only when optimizer is sgd / lars"):
        TrainConfig(optim=OptimOptions(), momentum=0.9)  # named on its own: given


@pytest.mark.parametrize(("group", "f"), CONDITIONAL, ids=lambda x: getattr(x, "name", x))
def test_an_option_given_at_its_default_where_it_cannot_apply_is_refused(group, f, tmp_path, capsys):
    """Issue 48: "given" is what the user wrote, not a value away from the default.  For each declared condition,
    the option given at its default value in a context where the condition fails is refused from Python (keywords,
    ``from_dict``), a --config file and the flags; a record of every option (``to_dict``, ``flat()``: it holds the
    option at its default, read or not) still reads back."""
    applies = fields_applicability(f_cls(group))[f.name]
    alternatives = [applies] if isinstance(applies, dict) else list(applies)
    value = default(f)
    context = _context(alternatives, {f.name: value})
    name = option_name(f)
    refused = f"^{name} applies only when .*: drop {name} or "
    with pytest.raises(OptionError, match=refused):
        TrainConfig(**{f.name: value, **context})
    with pytest.raises(OptionError, match=refused):
        TrainConfig.from_dict(_layout({f.name: value, **context}))
    record = TrainConfig(**context)
    assert _where(record.to_dict())[0][f.name] == value  # the record holds it, at its default
    assert TrainConfig.from_dict(record.to_dict()) == record == TrainConfig.from_dict(record.flat())
    command = COMMANDS.get(context.get("task", "classification"), ["pretrain", context.get("task", "mae")])
    own = {k: v for k, v in context.items() if k != "task"}
    file = tmp_path / "c.yaml"
    file.write_text(yaml.safe_dump(_layout({f.name: value, **own})))
    run = ("--max-steps", 1, "--out", tmp_path / "a")
    mine = command == ["train"] and f.name in _command_options("train")
    writable = value not in (None, [])  # a flag cannot spell an empty list or None
    for argv in (("--config", file), *([_argv({f.name: value, **own})] if writable else [])):
        err = _refusal(capsys, *command, *argv, *run)
        assert ("applies only when" in err) if mine else any(r in err for r in _REFUSALS), (argv, err)
    assert not (tmp_path / "a").exists()


def _refusal(capsys: pytest.CaptureFixture, *argv: object) -> str:
    """``crate ARGV``'s refusal: exit status 2 and its one error line (argparse's own prints its usage first)."""
    capsys.readouterr()
    try:
        rc = crate(*argv)
    except SystemExit as e:  # argparse: an option the command does not have
        rc = e.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and lines and (len(lines) == 1 or lines[0].startswith("usage:")), (argv, lines)
    return lines[-1]


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        (dict(augment="translate", crop_scale=0.5, randaugment_n=5), "crop_scale applies only when .*augment is"),
        (dict(mixup_prob=0.5, mixup_switch_prob=0.2), "mixup_prob applies only when mixup is set, or cutmix is set"),
        (dict(val_fraction=0.2, eval_split="test"), "val_fraction applies only when eval_split is val"),
        (dict(task="lm", label_smoothing=0.3, mixup=0.8), "applies only when task is classification; task is lm"),
        # auto picks the kind that reads the most settings given (a tie: the first, translations): crop_scale unread
        (dict(crop_scale=0.5, translate=0.2), r"augment is auto \('translate' here\)"),
        (dict(momentum=0.5), "momentum applies only when optimizer is sgd / lars; optimizer is adamw"),
    ],
)
def test_the_issues_examples_are_refused(options, refused):
    with pytest.raises(OptionError, match=refused):
        TrainConfig(**options)


def test_the_default_of_a_conditional_option_never_refuses_and_saved_runs_still_load(tmp_path):
    for task in ("classification", "lm", "mae", "dino", "text-classification"):
        TrainConfig(task=task).validate()
    TrainConfig(optimizer="sgd").validate()
    TrainConfig(data="cifar10", crop_scale=0.5, randaugment_n=5, augment="randaugment").validate()
    run = tmp_path / "run"
    run.mkdir()
    saved = {"task": "lm", "mixup": 0.8, "mixup_prob": 0.5, "crop_scale": 0.5, "label_smoothing": 0.3}
    (run / "config.yaml").write_text(yaml.safe_dump(saved))  # a flat file of an earlier release: read, not refused
    cfg = read_run_config(run)
    assert (cfg.task, cfg.augmentation, cfg.optim.label_smoothing) == ("lm", AugmentationOptions(), 0.05)
    base = TrainConfig(mixup=0.8, mixup_prob=0.5)  # a layer below: what cannot apply goes back to its default
    assert TrainConfig.from_dict({"task": "lm"}, base).augmentation == AugmentationOptions()
    with pytest.raises(OptionError, match="mixup_prob applies only when"):
        TrainConfig.from_dict({"task": "lm", "mixup_prob": 0.5}, base)  # given now: refused


PATHS = [(g, f) for g, f in _fields() if f.metadata.get("path")]


def test_path_options_are_declared():
    assert {f.name for _, f in PATHS} >= {"out", "init_from"}


@pytest.mark.parametrize(("group", "f"), PATHS, ids=lambda x: getattr(x, "name", x))
def test_every_path_option_refuses_an_empty_path(group, f, tmp_path, capsys):
    for blank in ("", "  "):
        with pytest.raises(ValueError, match="empty path"):
            TrainConfig(**{f.name: blank})
        with pytest.raises(ValueError, match="empty path"):
            TrainConfig.from_dict({group: {f.name: blank}} if group else {f.name: blank})
        file = tmp_path / "c.yaml"
        file.write_text(yaml.safe_dump({f.name: blank}))
        with pytest.raises(ValueError, match="empty path"):
            load_config(file)
    if f.name == "out":
        one_line_error(capsys, "train", "--out", "", "--max-steps", 1, match="--out is an empty path")


def test_auto_takes_a_setting_only_some_augmentations_read() -> None:
    """``augment='auto'`` with a crop scale given picks a crop (the run's choice, train.recipes): taken, not refused,
    and the effective config records the crop-flip settings it reads."""
    cfg = TrainConfig(crop_scale=0.5)
    assert cfg.augmentation.crop_scale == 0.5 and _where(cfg.to_dict())[2]["augment"] == "crop-flip"
    with pytest.raises(OptionError, match="crop_scale applies only when"):
        TrainConfig(crop_scale=0.5, augment="translate")
