"""The scaled matmul's epilogue as docs/techniques/gemm.md states it, in float32 numpy (each
step one rounding), for the tests that check lowbit's outputs bit for bit against it."""

from __future__ import annotations

from typing import Optional

import numpy as np

F32 = np.float32


def scaled(acc: np.ndarray, sa: Optional[np.ndarray], sb: Optional[np.ndarray],
           bias: Optional[np.ndarray]) -> np.ndarray:
    """float32 values before the output's rounding: scalar scales (one or none per operand) as
    one factor, acc * (sa * sb); per-row scales B's first, (acc * sb[n]) * sa[m]; then + bias.
    acc is an (M, N) array (int64 sums convert to float32 nearest-even), sa has 1 or M
    elements, sb 1 or N, bias N; None for none."""
    v = np.asarray(acc).astype(F32)
    sa = None if sa is None else np.asarray(sa, F32)
    sb = None if sb is None else np.asarray(sb, F32)
    if (sa is None or sa.size <= 1) and (sb is None or sb.size <= 1):
        s = F32(1) if sa is None else sa.reshape(())
        if sb is not None:
            s = F32(s * sb.reshape(()))
        if sa is not None or sb is not None:
            v = v * s
    else:
        if sb is not None:
            v = v * (sb.reshape(1, -1) if sb.size > 1 else sb.reshape(()))
        if sa is not None:
            v = v * (sa.reshape(-1, 1) if sa.size > 1 else sa.reshape(()))
    if bias is not None:
        v = v + np.asarray(bias).astype(F32)
    return v
