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
