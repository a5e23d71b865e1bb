"""One declaration for every option: every field of every option class — the model configs of the registry, the
data record, the layer settings, the training groups and top-level options, every task's options — is made by
``config_utils.option`` (its help, choices and range declared with it), and no class keeps a second table of choices
or ranges; one layout: a flat (version 1) mapping becomes the nested one through ``train.config.upgrade_v1``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from crate_transformer.config import Config, check_option
from crate_transformer.config_utils import Range, fields_applicability, option, override
from crate_transformer.layers import LayerConfig
from crate_transformer.models import _registry
from crate_transformer.models.dino import DINOHeadConfig
from crate_transformer.models.spec import DataSpec
from crate_transformer.train.config import (
    FLAT,
    GROUPS,
    OptimOptions,
    TrainConfig,
    nest_options,
    read_options_file,
    upgrade_v1,
)
from crate_transformer.train.task import TASKS, make_task


def _option_classes() -> list[type]:
    tasks = [make_task(name).Options for name in TASKS]
    found = [*_registry.config_classes(), DataSpec, LayerConfig, DINOHeadConfig, *GROUPS.values(), *tasks]
    return list(dict.fromkeys(c for c in found if c is not None))


CLASSES = _option_classes()


def declared(f: dataclasses.Field) -> bool:
    """Whether field ``f`` was declared through ``option()``: it carries its help."""
    return "help" in f.metadata


def test_the_walk_covers_every_kind_of_option_class() -> None:
    names = {c.__name__ for c in CLASSES}
    expected = {"ModelConfig", "MAEConfig", "LMConfig", "AlphaConfig", "ToSTConfig", "ToSTLMConfig", "DataSpec"}
    assert expected | {"LayerConfig", "OptimOptions", "LoggingOptions", "MAEOptions", "LMOptions"} <= names, names
    assert {"DINOOptions", "TextOptions"} <= names, names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_field_is_declared_through_option(cls: type) -> None:
    undeclared = [f.name for f in dataclasses.fields(cls) if not declared(f)]
    assert not undeclared, f"{cls.__name__} fields not declared with option(): {undeclared}"
    for f in dataclasses.fields(cls):
        assert isinstance(f.metadata["help"], str) and f.metadata["help"].strip(), (cls.__name__, f.name)
        assert isinstance(f.metadata.get("range", Range()), Range), (cls.__name__, f.name)
        assert isinstance(f.metadata.get("choices", ()), tuple), (cls.__name__, f.name)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_no_class_keeps_a_second_table_of_choices_or_ranges(cls: type) -> None:
    for klass in cls.__mro__:
        assert "CHOICES" not in vars(klass) and "RULES" not in vars(klass), klass.__name__


def test_training_top_level_options_are_declared() -> None:
    top = [f for f in dataclasses.fields(TrainConfig) if f.name not in GROUPS]
    assert top and all(declared(f) for f in top), [f.name for f in top if not declared(f)]
    assert not {"CHOICES", "RULES"} & set(vars(TrainConfig))


def test_a_declared_range_and_choice_are_the_only_rule() -> None:
    """check_option reads the field's declaration: a ranged field refuses out-of-range values with the range's
    words, a field with choices names them; a class attribute named like the old tables changes nothing."""

    @dataclasses.dataclass
    class Probe(Config):
        CHOICES = {"mode": ("x",)}  # no longer read: the declaration below is the one rule
        RULES = {"rate": Range(0, 0.5)}
        rate: float = option(0.5, "a rate", range=Range(0, 1, hi_open=True))
        mode: str = option("a", "a mode", choices=("a", "b"))

    assert Probe(rate=0.9, mode="b").rate == 0.9  # the old tables would have refused both
    with pytest.raises(ValueError, match=r"rate must be a finite number in \[0, 1\), got 1\.0"):
        Probe(rate=1.0)
    with pytest.raises(ValueError, match=r"unknown mode 'c'; choose one of \('a', 'b'\)"):
        check_option(Probe, "mode", "c")


def test_override_keeps_the_declaration_and_changes_the_default() -> None:
    from crate_transformer.models.alpha import AlphaConfig
    from crate_transformer.models.mae import MAEConfig

    base = {f.name: f for f in dataclasses.fields(LayerConfig)}["lambd"]
    mae = {f.name: f for f in dataclasses.fields(MAEConfig)}["lambd"]
    assert (base.default, mae.default) == (0.1, 0.5)
    assert dict(mae.metadata) == dict(base.metadata)  # help and range kept
    with pytest.raises(ValueError, match="lambd must be a finite number >= 0"):
        MAEConfig(lambd=-1.0)
    arch = {f.name: f for f in dataclasses.fields(AlphaConfig)}["arch"]
    assert arch.default == "crate_alpha" and arch.metadata["choices"] == ("crate_alpha",)
    with pytest.raises(ValueError, match="declares no option 'nope'"):
        override(LayerConfig, "nope", 1)


def test_option_carries_free_form_command_line_entries_unread() -> None:
    f = option(3, "a count", range=Range(0, integer=True), level="advanced", commands=("train",))
    assert dict(f.metadata) == {
        "help": "a count",
        "range": Range(0, integer=True),
        "level": "advanced",
        "commands": ("train",),
    }
    assert dict(option("", "a path", path=True, fixed="mask_ratio").metadata) == {
        "help": "a path",
        "path": True,
        "fixed": "mask_ratio",
    }  # keywords left unset are not in the metadata (the command line asks `"choices" in meta`)


def test_fields_applicability_reads_off_each_options_scope() -> None:
    where = fields_applicability(OptimOptions)
    assert where["momentum"] == {"optimizer": ("sgd", "lars")}
    assert where["betas"] == {"optimizer": ("adamw", "lion", "lamb")}
    assert where["lr"] == "always" and set(where) == {f.name for f in dataclasses.fields(OptimOptions)}


def test_upgrade_v1_is_the_one_flat_to_nested_conversion(tmp_path: Path) -> None:
    flat = {"config_version": 1, "lr": 0.01, "data": "digits", "log-every": 5, "model": "crate_mnist_p4"}
    nested = {
        "optim": {"lr": 0.01},
        "data": {"source": "digits"},
        "logging": {"log_every": 5},
        "model": "crate_mnist_p4",
    }
    assert upgrade_v1(flat) == nested
    assert upgrade_v1({"config_version": 2, **nested}) == nested  # the current layout passes unchanged
    assert upgrade_v1({"optim": {"lr": 0.1}, "lr": 0.2}) == {"optim": {"lr": 0.2}}  # mixed: the later key wins
    assert upgrade_v1({"task_args": {"text_columns": ["a"]}}) == {"task_args": {}, "data": {"text_columns": ["a"]}}
    with pytest.raises(ValueError, match="config_version 3 is newer"):
        upgrade_v1({"config_version": 3})
    with pytest.raises(ValueError, match="augmentation is a group of options, not one value"):
        upgrade_v1({"augmentation": "crop-flip", "augment": "none"})  # refused as it is met, not merged into
    assert set(FLAT) >= {"lr", "data", "log_every"} and FLAT["data"] == ("data", "source")
    path = tmp_path / "flat.yaml"
    path.write_text(yaml.safe_dump(flat))
    assert read_options_file(path) == nested  # the file's reader hands on the nested layout only
    assert TrainConfig.from_dict(read_options_file(path)).to_dict() == TrainConfig(**flat).to_dict()
    assert nest_options(flat)["optim"] == {"lr": 0.01}
