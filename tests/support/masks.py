"""Looking at masked payloads: a masked int64 value is uniform, so its top bits fall evenly into bins."""

from __future__ import annotations

import numpy as np
import torch


def top_bits(values: torch.Tensor, bits: int = 4) -> np.ndarray:
    """The ``bits`` most significant bits of int64 values, as unsigned bins."""
    return ((values.flatten() >> (64 - bits)) & (2**bits - 1)).numpy()
