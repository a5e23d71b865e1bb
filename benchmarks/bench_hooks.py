"""The cost of the hook points when nothing is hooked: forward time of this checkout against the last commit without
them (the parent of the commit that added ``layers/hooks.py``), the two interleaved.

    python benchmarks/bench_hooks.py                  # 8 rounds, each side a fresh process per round (a few minutes)
    python benchmarks/bench_hooks.py --baseline REF   # against another commit
    python benchmarks/bench_hooks.py --tiny           # tiny models, 2 rounds: keeps the script alive (a test runs it)

The baseline's ``src/`` is extracted with ``git archive`` into a temporary folder; each round runs one process per
side (the order alternating between rounds, so that a drift in the machine's load hits both alike), which builds the
same models from the same seed and times each row's forward (the median of ``--repeats`` calls after a warm-up), in
eval mode inside ``evaluating`` and ``torch.inference_mode``.  A row's figure is the median over the rounds; the
ratio is this checkout's over the baseline's (1.00x: no cost), with the 1-minute load average beside it.  Benchmarks
are not tests: absolute numbers depend on the machine and its load; the ratio is measured side by side.

A second block times the same models in one process with their hook points in place and stripped out (swapped
for identities), interleaved round by round on one thread's CPU time: the cost of the hook points alone, without
the other commits between the baseline and this checkout and without the noise of two processes.  The ``hooked``
column times the same rows here with a hook attached (``run_with_cache`` of one value per layer), for
scale.  A last block bounds the cost from below the noise of a loaded machine: the machinery a forward runs with
nothing hooked — per layer one unhooked ``HookPoint`` call (``z_half``), the hook key's read (``_hook_state.guard``)
and the attention's ``hooked(pattern)`` test — timed alone over many calls, times the number of layers, against the
forward's time measured in the same process just before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import POSITIVE, Arguments

ROOT = Path(__file__).resolve().parents[1]
# (label, model, overrides, input): images (batch, size) or token ids (batch, length)
ROWS = [
    ("CRATE-T 32/4 b1", "crate_tiny", {"image_size": 32, "patch_size": 4, "num_classes": 10}, ("image", 1, 32)),
    ("CRATE-T 32/4 b32", "crate_tiny", {"image_size": 32, "patch_size": 4, "num_classes": 10}, ("image", 32, 32)),
    ("CRATE-GPT mini 64 tok", "crate_gpt_mini", {"block_size": 64}, ("ids", 1, 64)),
    ("GPT mini 64 tok", "gpt_mini", {"block_size": 64}, ("ids", 1, 64)),
]
TINY = {"dim": 32, "depth": 2, "heads": 2}

# what each side's process runs: argv[1] the rows as JSON, argv[2] repeats, argv[3] "hooked" or "plain"
CHILD = r"""
import json, statistics, sys, time
import torch
import crate_transformer as ct
from crate_transformer.layers import evaluating
rows, repeats, mode = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
out = {}
for label, name, over, (kind, b, n) in rows:
    model = ct.create_model(name, **over).eval()
    x = torch.randn(b, 3, n, n) if kind == "image" else torch.randint(0, model.config.vocab_size, (b, n))
    names = [f"layers.{i}.z_half" for i in range(model.config.depth)]
    run = (lambda: model.run_with_cache(x, names=names)) if mode == "hooked" else (lambda: model(x))
    with evaluating(model), torch.inference_mode():
        run()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
    out[label] = statistics.median(times)
print(json.dumps(out))
"""


def baseline_src(ref: str | None, into: Path) -> tuple[str, Path]:
    """The baseline commit (``ref``, or the parent of the commit that added the hook points) and its ``src/``."""
    if ref is None:
        added = subprocess.run(
            ["git", "log", "--diff-filter=A", "--format=%H", "--", "src/crate_transformer/layers/hooks.py"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        if not added:
            raise SystemExit("no commit adds src/crate_transformer/layers/hooks.py here; pass --baseline REF")
        ref = added[-1] + "^"
    sha = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, capture_output=True, text=True, check=True)
    archive = subprocess.run(["git", "archive", ref, "src"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return sha.stdout.strip(), into / "src"


def side(src: Path, rows: list, repeats: int, mode: str = "plain") -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(rows), str(repeats), mode],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"the timing process for {src} failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _built(name: str, over: dict, kind: str, b: int, n: int) -> tuple:
    """A row's model (eval mode) and its input: images (b, 3, n, n) or token ids (b, n), as the timing child makes."""
    import torch

    import crate_transformer as ct

    model = ct.create_model(name, **over).eval()
    return model, torch.randn(b, 3, n, n) if kind == "image" else torch.randint(0, model.config.vocab_size, (b, n))


def machinery(rows: list, repeats: int) -> None:
    """The per-forward cost of the unhooked machinery (the module docstring's last block), here."""
    import time

    import torch

    from crate_transformer.layers import _hook_state, evaluating
    from crate_transformer.layers.hooks import HookPoint, hooked

    def per_call(fn, n: int = 20000) -> float:
        fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n

    point, x = HookPoint(), torch.zeros(1)
    cost = per_call(lambda: point(x)) + per_call(_hook_state.guard) + per_call(lambda: hooked(point))
    print(f"\nUnhooked machinery: {cost * 1e6:.2f} us per layer (HookPoint call + key read + pattern test)")
    print(f"{'row':24s} {'forward':>9s} {'layers':>6s} {'machinery':>9s} {'share':>7s}")
    torch.manual_seed(0)
    for label, name, over, (kind, b, n) in rows:
        model, inp = _built(name, over, kind, b, n)
        with evaluating(model), torch.inference_mode():
            fwd = statistics.median(per_call(lambda m=model, i=inp: m(i), 1) for _ in range(repeats))
        depth = model.config.depth
        print(f"{label:24s} {fwd * 1e3:9.3f} {depth:6d} {depth * cost * 1e3:9.4f} {depth * cost / fwd:7.2%}")


def stripped(rows: list, rounds: int, repeats: int) -> None:
    """The same models in this process with and without their hook points, interleaved (the module docstring's
    second block): each round times every row once with the ``HookPoint`` modules in place and once with them
    swapped for ``nn.Identity``, ``_hook_state.guard`` a no-op and the pattern never hooked, on one thread's CPU
    time (``time.thread_time``: what another job on the machine takes is not counted)."""
    import time

    import torch

    from crate_transformer.layers import _hook_state, attention, block, evaluating
    from crate_transformer.layers.hooks import HookPoint

    guard, is_hooked = _hook_state.guard, attention.hooked
    points = {}  # (model, parent, name) -> the HookPoint taken out

    def strip(model: torch.nn.Module, on: bool) -> None:
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if on and isinstance(child, HookPoint):
                    points[id(model), id(parent), name] = child
                    setattr(parent, name, torch.nn.Identity())
                elif not on and (id(model), id(parent), name) in points:
                    setattr(parent, name, points.pop((id(model), id(parent), name)))
        block._hook_state.guard = (lambda: None) if on else guard
        attention.hooked = (lambda point: False) if on else is_hooked

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print(f"\nIn this process, 1 thread, CPU ms per call (median of {rounds} interleaved rounds of {repeats})")
    print(f"{'row':24s} {'stripped':>9s} {'ours':>9s} {'ratio':>7s} {'load':>5s}")
    torch.manual_seed(0)
    for label, name, over, (kind, b, n) in rows:
        model, inp = _built(name, over, kind, b, n)
        times: dict[bool, list[float]] = {False: [], True: []}
        with evaluating(model), torch.inference_mode():
            for r in range(rounds):
                for on in (True, False) if r % 2 == 0 else (False, True):
                    strip(model, on)
                    model(inp)
                    t = time.thread_time()
                    for _ in range(repeats):
                        model(inp)
                    times[on].append((time.thread_time() - t) / repeats)
        strip(model, False)
        s, o = (statistics.median(times[k]) * 1e3 for k in (True, False))
        print(f"{label:24s} {s:9.3f} {o:9.3f} {o / s:6.3f}x {os.getloadavg()[0]:5.1f}")
    torch.set_num_threads(threads)


def main() -> None:
    p = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", default=None, help="the commit to compare against (default: before the hooks)")
    p.add_argument("--rounds", type=int, range=POSITIVE, default=8)
    p.add_argument("--repeats", type=int, range=POSITIVE, default=30)
    p.add_argument("--tiny", action="store_true", help="tiny models, 2 rounds of 3 calls (a smoke check)")
    a = p.parse_args()
    rows = [(lab, name, {**over, **(TINY if a.tiny else {})}, inp) for lab, name, over, inp in ROWS]
    rounds, repeats = (2, 3) if a.tiny else (a.rounds, a.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        sha, base = baseline_src(a.baseline, Path(tmp))
        ours = ROOT / "src"
        runs: dict[str, list[dict[str, float]]] = {"base": [], "ours": []}
        for r in range(rounds):
            order = [("base", base), ("ours", ours)]
            for key, src in order if r % 2 == 0 else order[::-1]:
                runs[key].append(side(src, rows, repeats))
    hooked = side(ROOT / "src", rows, repeats, "hooked")
    load = f"{os.getloadavg()[0]:.1f}"
    print(f"\nForward, eval mode, ms per call (median of {rounds} rounds of {repeats}); baseline {sha}")
    print(f"{'row':24s} {'baseline':>9s} {'ours':>9s} {'ratio':>7s} {'hooked':>9s} {'load':>5s}")
    for label, *_ in rows:
        b = statistics.median(run[label] for run in runs["base"]) * 1e3
        o = statistics.median(run[label] for run in runs["ours"]) * 1e3
        print(f"{label:24s} {b:9.3f} {o:9.3f} {o / b:6.3f}x {hooked[label] * 1e3:9.3f} {load:>5s}")
    stripped(rows, rounds, repeats)
    machinery(rows, repeats)


if __name__ == "__main__":
    main()
