"""A model field given where the model built does not read it is refused (``models._registry.build``): the build
records the config fields its layers read, so no family keeps a table.  Walked over every field of one tiny model
of every family; each refusal is checked against the model built with the field changed and the check bypassed —
same weights, same outputs (the field was inert) — and each field accepted is one the build read."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest
import torch

import crate_transformer as ct
from crate_transformer.config_utils import OBSERVED, default_of, field_types, fields_applicability
from crate_transformer.errors import OptionError
from crate_transformer.models._registry import arch_info, build, model_config, model_fields
from crate_transformer.models.contract import LANGUAGE_MODEL

IMG = dict(image_size=16, patch_size=4, in_chans=1, dim=32, depth=2, heads=4)
LM = dict(dim=32, depth=2, heads=4, block_size=8, vocab_size=50)
FAMILIES = {
    "crate_mnist": {**IMG, "num_classes": 5},
    "crate_mhsa_mnist": {**IMG, "num_classes": 5},
    "crate_alpha_mnist": {**IMG, "num_classes": 5},
    "crate_alpha_base16": {**IMG, "num_classes": 5},
    "vit_mnist": {**IMG, "num_classes": 5},
    "crate_mae_mnist": IMG,
    "crate_gpt_mini": LM,
    "gpt_mini": LM,
    "crate_bert_mini": LM,
    "tost_mnist": {**IMG, "num_classes": 5},
    "tost_gpt_mini": LM,
}
REFUSED = "applies only where the model built reads it"


def _others(f: dataclasses.Field, tp: object) -> list:
    """Values of field ``f`` other than its default (each choice; a changed number or flag)."""
    d = default_of(f)
    if f.metadata.get("choices"):
        return [c for c in f.metadata["choices"] if c != d]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if tp is bool:
        return [not d]
    if tp is int:
        return [2 * d if d else 2]
    if tp is float:
        return [d / 2 if d else 0.1]
    return []


def _outputs(model: torch.nn.Module, config: object) -> list[torch.Tensor]:
    torch.manual_seed(1)
    if config.kind == LANGUAGE_MODEL:
        x = torch.randint(0, config.vocab_size, (2, config.block_size))
    else:
        x = torch.randn(2, config.in_chans, config.image_size, config.image_size)
    out = model.eval()(x)
    return [t for t in (out if isinstance(out, tuple) else [out]) if isinstance(t, torch.Tensor)]


def _inert(name: str, base: dict, field: str, value: object) -> bool:
    """Whether the model built with ``field=value`` (the check bypassed) has the weights and outputs of the one
    built without it."""
    torch.manual_seed(0)
    plain = build(model_config(name, **base))
    config = model_config(name, **base, **{field: value})
    del config.__dict__["_given"]
    torch.manual_seed(0)
    changed = arch_info(getattr(config, "arch", None)).build(config)
    a, b = plain.state_dict(), changed.state_dict()
    same = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return same and all(torch.equal(x, y) for x, y in zip(_outputs(plain, config), _outputs(changed, config)))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_field_a_build_never_reads_is_refused_and_was_inert(name):
    base = FAMILIES[name]
    cls = type(model_config(name))
    where = fields_applicability(cls)
    refused, taken = [], []
    for f in dataclasses.fields(cls):
        if f.name in base or where[f.name] is None:
            continue
        for value in _others(f, field_types(cls)[f.name])[:2]:
            try:
                config = model_config(name, **base, **{f.name: value})
            except ValueError:
                continue  # a combination the config itself refuses
            try:
                build(config)
            except OptionError as e:
                if REFUSED not in str(e):
                    raise
                assert str(e).startswith(f"{f.name} applies only where") and "\n" not in str(e), e
                assert where[f.name] == OBSERVED
                assert _inert(name, base, f.name, value), (
                    f"{name}: {f.name}={value!r} was refused but changes the model"
                )
                refused.append(f.name)
            except ValueError:
                continue  # refused by the family for another reason (a combination it cannot build)
            else:
                taken.append(f.name)
    assert taken, name
    assert set(taken).isdisjoint(refused) or name, (taken, refused)


def test_the_issues_examples_are_refused_and_the_fields_read_are_taken():
    with pytest.raises(OptionError, match=f"^eta {REFUSED}, and crate_mnist \\(layers 'mssa \\+ mlp'\\) never"):
        ct.create_model("crate_mnist", mlp="mlp", eta=0.5)
    with pytest.raises(OptionError, match=f"^scale_scores {REFUSED}"):
        ct.create_model("crate_mnist", attention="tssa", scale_scores=False)
    with pytest.raises(OptionError, match=f"^eta {REFUSED}"):
        ct.create_model("vit_mnist", eta=0.5)  # the ViT baseline's layers are fixed: MHSA + MLP
    assert ct.create_model("crate_mnist", **FAMILIES["crate_mnist"], eta=0.5).config.eta == 0.5
    assert ct.create_model("crate_mnist", **FAMILIES["crate_mnist"], mlp="mlp", mlp_ratio=2.0).config.mlp_ratio == 2.0


def test_an_unknown_field_lists_the_fields_the_chosen_model_reads():
    with pytest.raises(
        OptionError, match=r"unknown override\(s\) \['dimm'\] for 'crate_mnist' \(did you mean dim\?\)"
    ) as e:
        ct.create_model("crate_mnist", dimm=64)
    listed = str(e.value).split("crate_mnist reads: ")[1].split(", ")
    assert {"dim", "eta", "lambd", "depth"} <= set(listed) and "mlp_ratio" not in listed and "gelu" not in listed
    assert set(listed) == set(model_fields("crate_mnist"))


def test_a_saved_config_with_unread_fields_still_builds():
    config = model_config("crate_mnist", **FAMILIES["crate_mnist"])
    stored = dataclasses.replace(config, mlp="mlp", eta=0.5)  # as config.json holds it: no override remembered
    assert build(type(config).from_dict(stored.to_dict())).config.eta == 0.5


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_field_written_at_its_default_where_the_build_never_reads_it_is_refused(name):
    """Written is given, whatever the value: ``create_model(name, eta=0.1)`` (the default) for a model that never
    reads eta is refused as eta=0.5 is, while a field the model reads is taken at its default too."""
    base = FAMILIES[name]
    cls = type(model_config(name, **base))
    where, read = fields_applicability(cls), set(model_fields(name))
    plain = model_config(name, **base)
    refused = taken = 0
    for f in dataclasses.fields(cls):
        if f.name in base or where[f.name] != OBSERVED:
            continue
        value = getattr(plain, f.name)  # the value the model has anyway: given, it changes nothing
        if f.name in read:
            ct.create_model(name, **base, **{f.name: value})
            taken += 1
            continue
        with pytest.raises(OptionError, match=f"^{f.name} {REFUSED}"):
            ct.create_model(name, **base, **{f.name: value})
        refused += 1
    assert taken, name


def test_crate_train_refuses_a_model_arg_written_at_its_default_where_it_cannot_apply(tmp_path, capsys):
    from crate_transformer.cli import main

    argv = ["train", "--model", "crate_mnist", "--model-args", "mlp=mlp", "eta=0.1", "--max-steps", "1"]
    assert main([*argv, "--no-progress", "--out", str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err
    assert "eta applies only where the model built reads it" in err and not (tmp_path / "run").exists()
