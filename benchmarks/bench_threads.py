"""Training steps/s with threads = auto, 1 and 2, on an idle machine and beside one competing busy process.

Each measurement is a fresh process (the thread count and OpenMP's wait policy are fixed per process) running
the default ``crate train`` step (crate_mnist, batch 128 of 28x28 images, AdamW) for a fixed time.  The busy
process is a pure-Python spin loop, the "other job" of a shared machine.  Prints steps/s (best of the interleaved
rounds), the threads auto chose, ratios to 2 threads with torch's OpenMP default on the idle machine measured
in the same run, and the 1-minute load average after each row (it includes the measured process).
Not a test.

    python benchmarks/bench_threads.py                # about 2 minutes
    python benchmarks/bench_threads.py --rounds 1     # quicker, noisier
    python benchmarks/bench_threads.py --tiny         # d = 32, one layer, batch 8, 0.05 s a row (a slow test runs it)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _common import POSITIVE, Arguments, Range

# (row name, --threads, environment): auto and 1 as `crate` runs them; 2 with libgomp's own default wait (spin,
# then sleep) and with OMP_WAIT_POLICY=PASSIVE (sleep at once: frees the core, costs a wake-up per parallel region)
SETTINGS = [
    ("auto", "auto", {}),
    ("1", "1", {}),
    ("2, torch's OpenMP default", "2", {}),
    ("2, OMP_WAIT_POLICY=PASSIVE", "2", {"OMP_WAIT_POLICY": "PASSIVE"}),
]


def worker(threads: str, seconds: float, tiny: bool = False) -> None:
    """One measurement: steps/s of the default training step, after two warm-up steps."""
    import torch

    from crate_transformer.models.registry import create_model
    from crate_transformer.train.threads import set_threads

    n = set_threads(0 if threads == "auto" else int(threads))
    torch.manual_seed(0)
    model = create_model("crate_mnist", **(dict(dim=32, depth=1, heads=2) if tiny else {}))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = 8 if tiny else 128
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def step() -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(1 if tiny else 2):  # warm-up
        step()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds or steps < (1 if tiny else 3):
        step()
        steps += 1
    print(json.dumps({"threads": n, "steps_per_s": steps / (time.perf_counter() - start)}))


def measure(threads: str, env: dict, seconds: float, tiny: bool = False) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY")}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", threads, "--seconds", str(seconds), *(["--tiny"] if tiny else [])],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {**json.loads(out.strip().splitlines()[-1]), "load": os.getloadavg()[0]}


def main() -> None:
    p = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--seconds", type=float, range=Range(0, lo_open=True), default=4.0, help="timed seconds per measurement"
    )
    p.add_argument("--rounds", type=int, range=POSITIVE, default=2, help="interleaved rounds; the best round is shown")
    p.add_argument("--tiny", action="store_true", help="d = 32, one layer, batch 8, one round of 0.05 s (seconds)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.tiny:
        args.seconds, args.rounds = 0.05, 1
    if args.worker:
        return worker(args.worker, args.seconds, args.tiny)
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}, {os.cpu_count()} CPUs")
    rows = []
    for machine in ("idle", "busy"):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if machine == "busy" else None
        try:
            time.sleep(1.0 if busy else 0.0)  # the spinner is running before auto looks
            for _ in range(args.rounds):  # interleaved, so a change in the other agents' load hits every setting
                for name, threads, env in SETTINGS:
                    rows.append({"machine": machine, "setting": name, **measure(threads, env, args.seconds, args.tiny)})
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["machine"], r["setting"])
        if key not in best or r["steps_per_s"] > best[key]["steps_per_s"]:
            best[key] = r
    ref = best[("idle", SETTINGS[2][0])]["steps_per_s"]
    print("| machine | --threads | threads used | steps/s | / idle, 2, torch default | load (1 min) |")
    print("|---|---|---|---|---|---|")
    for r in best.values():
        rate = r["steps_per_s"]
        print(f"| {r['machine']} | {r['setting']} | {r['threads']} | {rate:.2f} | {rate / ref:.2f} | {r['load']:.2f} |")
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
