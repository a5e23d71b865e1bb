"""Two image folders nobody tuned the defaults for, written as class-per-folder PNGs (docs/finetuning.md):

* ``digits``: scikit-learn's 1,797 handwritten digits (8x8 grey-scale, 10 classes), as ``crate`` reads any folder;
* ``photos``: 32x32 colour patches of six photographs that install with scikit-learn and scikit-image (no
  download), one class per photograph: the patches of a class come from the left three quarters of its photograph
  for training and from the right quarter for the test split (``train/`` and ``test/`` folders), so no test patch
  overlaps a training one.

    python benchmarks/defaults_data.py --out OUT    # writes OUT/digits and OUT/photos
    python benchmarks/defaults_data.py --tiny       # 100 digits, 10 patches a photograph, a temp dir (a test runs it)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from _common import Arguments
from PIL import Image

PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")  # skimage.data; with scikit-learn's china and flower
PATCHES = (320, 80)  # per class: training patches, test patches
SIDE = 32


def write_digits(out: Path, limit: int | None = None) -> int:
    """scikit-learn's digits (values 0-16) as 8-bit grey PNGs, ``out/<digit>/<i>.png`` (the first ``limit``, or
    all); returns the count."""
    from sklearn.datasets import load_digits

    d = load_digits()
    for i, (image, label) in enumerate(zip(d.images[:limit], d.target[:limit])):
        folder = out / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((image * 255 / 16).round().astype(np.uint8), mode="L").save(folder / f"{i:04d}.png")
    return len(d.target[:limit])


def _photos() -> dict[str, np.ndarray]:
    import skimage.data
    from sklearn.datasets import load_sample_images

    photos = {name: getattr(skimage.data, name)() for name in PHOTOS}
    china, flower = load_sample_images().images
    return {**photos, "china": china, "flower": flower}


def write_photos(out: Path, seed: int = 0, patches: tuple[int, int] = PATCHES) -> int:
    """Random square crops (a sixth to a third of the shorter side) resized to 32x32, training crops from the left
    three quarters of each photograph, test crops from the right quarter (``patches``: how many of each, per
    class); returns the count."""
    rng = np.random.default_rng(seed)
    total = 0
    for name, photo in _photos().items():
        h, w = photo.shape[:2]
        cut = int(0.75 * w)
        for split, n, (lo, hi) in (("train", patches[0], (0, cut)), ("test", patches[1], (cut, w))):
            folder = out / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                side = int(rng.integers(min(h, w) // 6, min(min(h, w) // 3, hi - lo) + 1))
                top, left = int(rng.integers(0, h - side + 1)), int(rng.integers(lo, hi - side + 1))
                crop = Image.fromarray(photo[top : top + side, left : left + side, :3])
                crop.resize((SIDE, SIDE), Image.BILINEAR).save(folder / f"{i:04d}.png")
                total += 1
    return total


def main() -> None:
    parser = Arguments(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("defaults_data"), help="folder for digits/ and photos/")
    parser.add_argument("--tiny", action="store_true", help="100 digits, 8 + 2 patches a photograph, a new temp dir")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="defaults_data_")) if args.tiny else args.out
    limit, patches = (100, (8, 2)) if args.tiny else (None, PATCHES)
    print(f"{out / 'digits'}: {write_digits(out / 'digits', limit)} images")
    print(f"{out / 'photos'}: {write_photos(out / 'photos', patches=patches)} images")


if __name__ == "__main__":
    main()
