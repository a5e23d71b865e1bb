"""The public, top-level API."""


def test_subpackages_are_reachable_from_the_top_level():
    import crate_transformer as ct

    assert callable(ct.analysis.measure) and callable(ct.theory.run_experiment)
    assert callable(ct.data.load_dataset) and callable(ct.train.train)
