"""Loose image files for ``crate analyze --images DIR`` (a folder of images without classes).

``data.load_dataset`` needs class subfolders; this reads every image under a folder (recursively,
sorted by path), converts it to the model's channel count and centre-crops/resizes it to a square.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..data import IMAGE_EXTENSIONS, match_channels

__all__ = ["load_image_folder"]


def load_image_folder(
    folder: str | Path, image_size: int, channels: int, limit: int | None = None
) -> tuple[Tensor, list[str]]:
    """All images under ``folder`` as ``[0, 1]`` floats ``(N, channels, image_size, image_size)`` + their paths.

    Each image is resized so that its shorter side is ``image_size`` and centre-cropped; grey images
    are repeated to RGB and RGB images converted to grey (luma) to match ``channels``.  ``limit``
    keeps the first images in sorted path order.  Raises a one-line ValueError for a missing folder,
    a folder without images, or an unreadable file.
    """
    from PIL import Image, UnidentifiedImageError

    root = Path(folder).expanduser()
    if not root.exists():
        raise ValueError(f"image folder not found: {folder}")
    if not root.is_dir():
        raise ValueError(f"{folder} is a file, not a folder; pass a folder of images with --images")
    if not isinstance(image_size, int) or image_size <= 0:
        raise ValueError(f"image_size must be a positive integer, got {image_size!r}")
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_EXTENSIONS
    )
    if not files:
        raise ValueError(f"no images found in {folder} (looked for {', '.join(IMAGE_EXTENSIONS)} files, recursively)")
    if limit is not None:
        files = files[:limit]
    out = []
    for path in files:
        try:
            with Image.open(path) as im:
                im.load()
                gray = im.mode in ("1", "L", "I", "I;16", "F", "LA")
                arr = np.array(im.convert("L" if gray else "RGB"), dtype=np.uint8)
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
            raise ValueError(f"cannot read image {path} ({type(e).__name__}); fix or remove the file") from None
        t = torch.from_numpy(np.ascontiguousarray(arr))
        t = t.unsqueeze(0) if t.dim() == 2 else t.permute(2, 0, 1)
        out.append(_square(match_channels(t, channels).float() / 255.0, image_size))
    return torch.stack(out), [str(p) for p in files]


def _square(t: Tensor, size: int) -> Tensor:
    """Shorter side → ``size`` (antialiased bilinear), then centre crop to ``size × size``."""
    h, w = t.shape[1:]
    scale = size / min(h, w)
    nh, nw = max(size, round(h * scale)), max(size, round(w * scale))
    if (nh, nw) != (h, w):
        t = F.interpolate(t[None], size=(nh, nw), mode="bilinear", antialias=True, align_corners=False)[0]
    top, left = (nh - size) // 2, (nw - size) // 2
    return t[:, top : top + size, left : left + size].clamp(0, 1).contiguous()
