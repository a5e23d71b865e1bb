"""One decoder of a PIL image to its 8-bit picture, for every path an image takes (training folders, streamed
samples, ``image_transform`` for ``eval`` and ``analyze --images``).

The picture is upright: an EXIF ``Orientation`` tag (what a phone camera writes instead of rotating the pixels of a
JPEG) is applied first, with ``PIL.ImageOps.exif_transpose``, as every image viewer shows the file.

Every PIL mode is decoded to what it shows, scaled into 0…255, never clipped: PIL's own ``convert("L")`` clips
16-bit and 32-bit samples at 255 (a 16-bit greyscale PNG becomes almost all white) and float samples likewise.

==========================  =====================================================================================
mode                        picture
==========================  =====================================================================================
``1``, ``L``, ``LA``, ``La``  greyscale, 8-bit as is (``1``: 0 or 255; the alpha channel dropped)
``I;16`` ``I;16B/L/N``       greyscale, ``round(v · 255 / 65535)``
``I``                       greyscale, 32-bit integer samples of a 16-bit file (PNG, TIFF): ``round(v · 255 / 65535)``;
                            a sample outside 0…65535 is a one-line error (no scale fits every image)
``F``                       greyscale, float samples in [0, 1]: ``round(v · 255)``; outside [0, 1] or not finite is a
                            one-line error
any other (``P``, ``PA``,   colour: PIL's ``convert("RGB")`` (palette looked up, CMYK / YCbCr / LAB / HSV converted
``RGB``, ``RGBA``, ``CMYK``,  to sRGB, the alpha channel dropped); these conversions do not clip
``YCbCr``, ``LAB``, ``HSV``)
==========================  =====================================================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["GRAY_MODES", "picture", "upright"]

# the modes whose picture is one channel: 8-bit ones PIL converts exactly, and the wide ones scaled below
GRAY_MODES = ("1", "L", "LA", "La", "I", "I;16", "I;16B", "I;16L", "I;16N", "F")
_SIXTEEN_BIT = 65535


_ORIENTATION = 0x0112  # the EXIF tag: 1 upright, 2-8 the mirrorings and rotations a viewer applies


def upright(im: Any) -> Any:
    """``im`` as a viewer shows it: its EXIF orientation applied (``PIL.ImageOps.exif_transpose``, which also drops
    the tag); an image without one (or upright: 1) is returned as is, without a copy."""
    if im.getexif().get(_ORIENTATION, 1) in (1, None):
        return im
    from PIL import ImageOps

    return ImageOps.exif_transpose(im)


def picture(im: Any) -> tuple[np.ndarray, bool]:
    """The 8-bit picture of the PIL image ``im``, upright (:func:`upright`) → ``(HW or HWC uint8 array, is
    greyscale)`` (see the module's table; a ``ValueError`` for samples no fixed scale maps, naming their range)."""
    im = upright(im)
    mode = im.mode
    if mode not in GRAY_MODES:
        return np.array(im.convert("RGB"), dtype=np.uint8), False
    if mode in ("1", "L", "LA", "La"):  # La (grey premultiplied by alpha): back to LA first, as PIL converts it
        return np.array((im.convert("LA") if mode == "La" else im).convert("L"), dtype=np.uint8), True
    a = np.asarray(im).astype(np.float64)
    lo, hi = (float(a.min()), float(a.max())) if a.size else (0.0, 0.0)
    if mode == "F":
        if not (np.isfinite(a).all() and lo >= 0.0 and hi <= 1.0):
            raise ValueError(
                f"float samples span [{lo:.4g}, {hi:.4g}], outside [0, 1]; save the image with 8- or 16-bit samples"
            )
        scale = 255.0
    else:
        if lo < 0 or hi > _SIXTEEN_BIT:
            raise ValueError(
                f"32-bit samples span [{lo:.0f}, {hi:.0f}], outside the 16-bit range 0…{_SIXTEEN_BIT}; save the image "
                "with 8- or 16-bit samples"
            )
        scale = 255.0 / _SIXTEEN_BIT
    return np.rint(a * scale).astype(np.uint8), True
