"""``errors.short_repr``: a value as a one-line message shows it, whole when it is short, else cut at the limit, and
never written out whole on the way (reprlib's limits: a nested alias bomb or a million-item set costs what the first
items cost)."""

from __future__ import annotations

import yaml

from crate_transformer.errors import SHORT, short_repr


def test_a_short_value_is_its_repr():
    for value in (1, 2.5, None, True, "lr", [1, 2, 3], (1,), ("a", [2.0, None]), {"dim": 64}, b"ab", {3}):
        assert short_repr(value) == repr(value)


def test_a_long_value_is_cut_at_the_limit_and_says_so():
    """Cut at the limit (``…``) or after a container's first items (reprlib's ``...``), its start as ``repr``'s."""
    for value in ("x" * 10_000, list(range(10_000)), {i: str(i) for i in range(1000)}, b"y" * 10**6):
        shown = short_repr(value)
        assert len(shown) <= SHORT and (shown.endswith("…") or shown.endswith("...]") or shown.endswith("...}"))
        assert repr(value).startswith(shown.split("...")[0].removesuffix("…"))
    assert short_repr("x" * 100) == "'" + "x" * (SHORT - 2) + "…"
    assert len(short_repr(list(range(100)), limit=20)) == 20


def test_a_value_too_big_to_write_is_shown_from_its_first_items():
    # eight levels of ten aliases: 10**8 strings to anything that writes the value whole
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = yaml.safe_load("\n".join(lines))
    shown = short_repr(bomb)
    assert shown.startswith("{'l0': ['x', 'x',") and len(shown) == SHORT
    assert short_repr(set(range(10**6))).startswith("{0, 1, 2, 3,")
    loop: list = []
    loop.append(loop)
    assert short_repr(loop) == "[[[[...]]]]"
