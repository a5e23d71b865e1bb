"""The public, top-level API."""

import tiny
import torch


def test_subpackages_are_reachable_from_the_top_level_and_work_from_there():
    import crate_transformer as ct
    from crate_transformer.analysis.measure import measure
    from crate_transformer.data import load_dataset
    from crate_transformer.theory.runner import run_experiment
    from crate_transformer.train.loop import train

    # the top-level names are the implementations themselves, not stand-ins
    assert (ct.analysis.measure, ct.data.load_dataset) == (measure, load_dataset)
    assert (ct.theory.run_experiment, ct.train.train) == (run_experiment, train)

    # the digits split into all of scikit-learn's 1797 8x8 images, 10 classes
    train_set, test_set = ct.data.load_dataset("digits", "train"), ct.data.load_dataset("digits", "test")
    assert len(train_set) + len(test_set) == 1797 and len(test_set) == 359
    image, label = test_set[0]
    assert image.shape == (1, 8, 8) and 0 <= int(label) < 10

    # one row per layer, one value per image and layer
    model = ct.create_model("crate_tiny", **tiny.DIGITS)
    table = ct.analysis.measure(model, torch.rand(4, 1, 8, 8), normalize=None, progress=False)
    rows = table.to_records()
    assert len(rows) == tiny.DIGITS["depth"] and all(r["n_samples"] == 4 for r in rows)
    assert all(v.shape == (4, tiny.DIGITS["depth"]) for v in table.values.values())
    assert all(0 <= r["nonzero"] <= 1 for r in rows)

    # an experiment by name: the exact mixture score (215) matches autograd
    report = ct.theory.run_experiment("tweedie", quick=True, progress_bar=False, n=16, sigmas=(0.01, 0.1))
    assert report["experiment"] == "tweedie" and report["config"]["n"] == 16
    assert max(report["results"]["score_vs_autograd"]) < 1e-8 and report["checks"][0]["holds"]


def test_every_family_is_exported_and_on_the_api_reference():
    """Each registered family's model and config class is ``ct.<Name>`` (in ``ct.__all__`` and its module's
    ``__all__``, which the API reference renders), and its module is on an API page of the site's nav; the loaders
    of the public API are exported."""
    import importlib
    from pathlib import Path

    import yaml

    import crate_transformer as ct
    from crate_transformer.models import _registry

    root = Path(__file__).resolve().parents[1]
    nav = str(yaml.safe_load((root / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    pages = [p for p in (root / "docs" / "api").glob("*.md") if f"api/{p.name}" in nav]
    rendered = {line.split()[1] for p in pages for line in p.read_text().splitlines() if line.startswith(":::")}
    assert len(_registry._ARCHS) >= 9
    for arch, info in _registry._ARCHS.items():
        for cls in (info.model_class, info.config_class):
            assert cls.__name__ in ct.__all__ and getattr(ct, cls.__name__) is cls, (arch, cls.__name__)
            assert cls.__name__ in importlib.import_module(cls.__module__).__all__, (arch, cls.__name__)
            assert cls.__module__ in rendered, (arch, cls.__module__)
    for name in ("create_model", "list_models", "from_pretrained", "load_model", "from_official", "list_pretrained"):
        assert name in ct.__all__ and callable(getattr(ct, name)), name
