"""Does streaming keep up with the model?  CRATE-T (224 px) training steps fed from a JPEG folder.

For each DataLoader worker count the script trains ``crate_tiny`` for ``--steps`` steps on a
:class:`StreamingImageFolder` (PIL decode + resize to 224 in the workers, then crop-flip augmentation,
normalisation, forward, backward, AdamW step) and, in the same run, the same steps on the same batches
already decoded in memory (model only).  ``e2e / model`` near 1 means decoding is hidden behind compute.
The folder is generated: ``--images`` JPEGs of photo-like sizes (256×256 to 500×375), 4 classes.  Not a test.

    python benchmarks/bench_data_loading.py                       # 256 JPEGs, batch 32, 6 timed steps
    python benchmarks/bench_data_loading.py --steps 3 --workers 0 2
    python benchmarks/bench_data_loading.py --tiny                # seconds: 12 JPEGs at 32 px (a test runs it)
"""

from __future__ import annotations

import io
import itertools
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from _common import NON_NEGATIVE, POSITIVE, Arguments

from crate_transformer.data import StreamingImageFolder, build_augmentation
from crate_transformer.models.registry import create_model
from crate_transformer.train import prepare_batch

SIZES = [(256, 256), (500, 375), (375, 500), (320, 240), (400, 300)]


def make_folder(root: Path, n: int, classes: int = 4, seed: int = 0) -> Path:
    """``n`` JPEGs with smooth, photo-like content (so the files have realistic sizes), quality 90."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for i in range(n):
        w, h = SIZES[i % len(SIZES)]
        low = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        img = Image.fromarray(low).resize((w, h), Image.BICUBIC)
        noisy = np.asarray(img, dtype=np.int16) + rng.integers(-12, 13, (h, w, 3))
        buf = io.BytesIO()
        Image.fromarray(noisy.clip(0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        d = root / f"class{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:05d}.jpg").write_bytes(buf.getvalue())
    return root


class Step:
    """One training step of CRATE-T exactly as the engine runs it (augment, normalise, fwd, bwd, AdamW)."""

    def __init__(self, source: StreamingImageFolder, size: int) -> None:
        torch.manual_seed(0)
        self.model = create_model("crate_tiny", num_classes=source.num_classes, image_size=size)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.augment = build_augmentation("crop-flip", size)
        self.mean, self.std, self.size = source.mean, source.std, size

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        x = prepare_batch(images, device=torch.device("cpu"), image_size=self.size, channels=3,
                          mean=self.mean, std=self.std, augment=self.augment)  # fmt: skip
        loss = F.cross_entropy(self.model(x), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def timed(batches, step: Step, steps: int) -> float:  # noqa: ANN001
    """Images/s over ``steps`` steps after one warm-up step (the clock includes waiting for data)."""
    it = iter(batches)
    step(*next(it))  # warm-up: first-touch allocations, worker start-up
    n, t0 = 0, time.perf_counter()
    for _ in range(steps):
        images, labels = next(it)
        step(images, labels)
        n += len(labels)
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = Arguments(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, range=POSITIVE, default=256)
    p.add_argument("--batch-size", type=int, range=POSITIVE, default=32)
    p.add_argument(
        "--steps", type=int, range=POSITIVE, default=6, help="timed steps per configuration (after one warm-up)"
    )
    p.add_argument("--workers", type=int, range=NON_NEGATIVE, nargs="+", default=[0, 1, 2])
    p.add_argument("--image-size", type=int, range=POSITIVE, default=224)
    p.add_argument(
        "--threads",
        type=int,
        range=NON_NEGATIVE,
        default=0,
        help="torch threads of the training process (0: all cores)",
    )
    p.add_argument("--folder", default=None, help="reuse this JPEG folder instead of generating one")
    p.add_argument("--tiny", action="store_true", help="12 JPEGs, batch 4, 2 steps at 32 px, workers 0 and 1")
    args = p.parse_args()
    if args.tiny:
        args.images, args.batch_size, args.steps, args.image_size, args.workers = 12, 4, 2, 32, [0, 1]
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.images < args.batch_size * (args.steps + 1):
        raise SystemExit(f"--images must be at least batch-size x (steps + 1) = {args.batch_size * (args.steps + 1)}")

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        root = Path(args.folder) if args.folder else make_folder(Path(tmp) / "jpegs", args.images)
        mb = sum(f.stat().st_size for f in root.rglob("*.jpg")) / 2**20
        print(f"{args.images} JPEGs ({mb:.1f} MB, {time.perf_counter() - t0:.1f} s to write) in {root}")
        print(f"CPU cores: {os.cpu_count()}, torch threads: {torch.get_num_threads()}, "
              f"load average before: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")  # fmt: skip
        rows = []
        ref_batches = None
        for workers in args.workers:
            src = StreamingImageFolder.open(root, "train", image_size=args.image_size, num_workers=workers)
            src_batches = src.batches(args.batch_size)
            e2e = timed(src_batches, Step(src, args.image_size), args.steps)
            if ref_batches is None:  # the same batches, decoded once, for the model-only rate
                ref_batches = list(itertools.islice(src.batches(args.batch_size), args.steps + 1))
            model = timed(ref_batches, Step(src, args.image_size), args.steps)
            rows.append((workers, e2e, model))
            print(f"  workers={workers}: e2e {e2e:.1f} img/s, model only {model:.1f} img/s", flush=True)
        print(f"\nCRATE-T {args.image_size}px, batch {args.batch_size}, {args.steps} timed steps, "
              f"load average after: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")  # fmt: skip
        print("| workers | end-to-end img/s | model-only img/s | e2e / model |")
        print("|---:|---:|---:|---:|")
        for workers, e2e, model in rows:
            print(f"| {workers} | {e2e:.1f} | {model:.1f} | {e2e / model:.2f} |")


if __name__ == "__main__":
    main()
