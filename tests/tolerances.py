"""The tolerances of the device-generic tests, in one place: ``(rtol, atol)`` of a computation in ``dtype`` on a
device type against its reference (float64 formulas, the official code, the CPU).

On a GPU the reductions run in another order than on the CPU (and fused kernels differ), so float32 and float64
get a looser bound there; bf16 / fp16 carry 8 / 11 mantissa bits.  TF32 is off in tests (torch's default for
matmuls), so float32 on a GPU is float32.
"""

from __future__ import annotations

import torch

TOLERANCES: dict[tuple[torch.dtype, str], tuple[float, float]] = {
    (torch.float64, "cpu"): (1e-10, 1e-10),
    (torch.float64, "cuda"): (1e-9, 1e-9),
    (torch.float32, "cpu"): (1e-5, 1e-5),
    (torch.float32, "cuda"): (1e-4, 1e-4),
    (torch.bfloat16, "cpu"): (2e-2, 2e-2),
    (torch.bfloat16, "cuda"): (2e-2, 2e-2),
    (torch.float16, "cuda"): (2e-3, 2e-3),
}


def tol(dtype: torch.dtype, device: torch.device | str) -> dict[str, float]:
    """``dict(rtol=..., atol=...)`` for ``torch.testing.assert_close`` of a ``dtype`` result on ``device``."""
    rtol, atol = TOLERANCES[(dtype, torch.device(device).type)]
    return {"rtol": rtol, "atol": atol}
