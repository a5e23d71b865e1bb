"""The model built from its saved config is the model that was trained (issue: ToST's drop path).

The engine changes a built model's drop path rates (``set_drop_path``, before fine-tuning); a resumed run and
``from_pretrained`` rebuild the model from the config it recorded.  For every family whose config has a drop path,
the two must give every block the same rate: walked over the registered families, not a list of cases."""

from __future__ import annotations

import pytest
import tiny
import torch

import crate_transformer as ct
from crate_transformer.layers import DropPath, set_drop_path
from crate_transformer.models import _registry


def _rates(model: torch.nn.Module) -> dict[str, float]:
    return {name: m.p for name, m in model.named_modules() if isinstance(m, DropPath)}


def _families_with_drop_path() -> dict[str, object]:
    """Every registered model class (built from its config alone) whose config has a drop path rate."""
    registered = {a.model_class for a in _registry._ARCHS.values()}
    return {
        name: build
        for name, build in tiny.family_builders().items()
        if type(model := build()) in registered and hasattr(model.config, "drop_path")
    }


FAMILIES = _families_with_drop_path()


def test_the_walk_covers_the_image_encoders():
    assert {"crate", "vit", "crate_mae", "crate_alpha", "tost"} <= set(FAMILIES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_set_drop_path_gives_the_rates_the_saved_config_rebuilds(family, tmp_path):
    model = FAMILIES[family]()
    set_drop_path(model, 0.3)
    assert model.config.drop_path == 0.3
    trained = _rates(model)
    assert trained and max(trained.values()) == pytest.approx(0.3)
    rebuilt = type(model)(model.config)  # what a resume builds from the recorded config
    assert _rates(rebuilt) == trained
    model.save_pretrained(tmp_path / "m")
    loaded = ct.from_pretrained(tmp_path / "m")  # what from_pretrained builds
    assert _rates(loaded) == trained
    assert [type(m).__name__ for m in loaded.modules()] == [type(m).__name__ for m in model.modules()]


def test_set_drop_path_refuses_a_model_without_the_setting():
    lm = tiny.family_builders()["crate_gpt"]()
    with pytest.raises(ValueError, match="no drop_path setting"):
        set_drop_path(lm, 0.1)


REGISTERED = {a.model_class for a in _registry._ARCHS.values()}


@pytest.mark.parametrize("family", sorted(tiny.family_builders()))
@pytest.mark.parametrize("pool", [None, "avg", "token", "last"])
def test_reset_classifier_takes_timms_signature_in_every_family(family, pool):
    """timm's ``reset_classifier(num_classes, global_pool)``, positionally: a family applies the pooling or refuses it
    in one line naming the pooling; a model without a classifier says so; never a TypeError."""
    model = tiny.family_builders()[family]()
    if type(model) not in REGISTERED:
        pytest.skip("not a registered model class")
    try:
        model.reset_classifier(3, pool)
    except ValueError as e:
        assert "\n" not in str(e)
        assert any(w in str(e) for w in ("pool", "classifier", "num_labels")), str(e)  # names what cannot apply
        return
    if hasattr(model.config, "num_classes"):
        assert model.config.num_classes == 3
        assert model(tiny.family_inputs(model)).shape[-1] == 3


def test_tost_pools_by_its_class_token_and_refuses_avg_in_one_line():
    model = tiny.family_builders()["tost"]()
    model.reset_classifier(5, "token")
    assert model(tiny.family_inputs(model)).shape[-1] == 5
    with pytest.raises(ValueError, match="global_pool='avg'"):
        model.reset_classifier(5, "avg")
