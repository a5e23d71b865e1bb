"""Private: the number that tells ``torch.compile`` whether hooks are attached.

Dynamo does not guard on a module's hook dictionaries (``torch._dynamo.config.skip_nnmodule_hook_guards`` is on by
default), so a step compiled before an intervention was attached would be replayed without it — silently, the
edit ignored.  Every layer's forward reads :data:`key` (:func:`guard`), and Dynamo guards on the value it read:
:data:`key` is 0 while no hook of :mod:`crate_transformer.models.hooks` is attached (the graph compiled without
hooks is reused, at no cost), and a number never used before each time the set of attached hooks changes (the
step is traced again, with the hooks).  Reading a module attribute costs tens of nanoseconds in eager mode.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

key = 0  # 0: no hooks attached; otherwise a fresh number per change of the attached hooks
_live = 0  # hook sessions attached now (interventions and caches may nest)
_fresh = itertools.count(1)


def guard() -> None:
    """Read :data:`key` where Dynamo sees it: called at the top of each layer's forward, so that a graph compiled
    through the layer is guarded on the hooks attached when it was traced."""
    if key:
        return


@contextmanager
def armed() -> Iterator[None]:
    """Within the block a hook session is attached: :data:`key` is fresh on entry and on exit (0 once none is
    left), so whatever was compiled before or inside is not reused across the change."""
    global key, _live
    _live += 1
    key = next(_fresh)
    try:
        yield
    finally:
        _live -= 1
        key = next(_fresh) if _live else 0
