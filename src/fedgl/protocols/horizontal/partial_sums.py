"""An owner's partial sums per (target, owner) pair (Eq. 5), from the rows it holds.

Sparse feature rows stay sparse: their stored entries are added straight into the sums of the pairs
that are sent, pick by pick in pick order, so each sum is the one adding the dense rows gives, bit for
bit (an absent entry would add +0, which leaves a sum that starts at +0 unchanged), without making
the picks' rows (8,415 floats each on Coauthor Physics, dense or sparse) nor the sums of withheld pairs.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ...models import select_rows


def entry_rows(rows: Tensor) -> Tensor:
    """The row of every stored entry of a CSR matrix."""
    crow = rows.crow_indices()
    return torch.repeat_interleave(torch.arange(rows.size(0), device=crow.device), crow.diff())


def pick_sums(h: Tensor, src: Tensor, scale: Tensor | None, pair: Tensor, fewest: int, every: bool,
              clip: Callable[[Tensor], Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """Each pair's sum of its picked rows ``h[src]`` (``pair``: the pair of every pick), each row scaled by
    its ``scale`` (GCN's source half; None: unscaled) and, when given, clipped (DP), and the rows summed
    per pair: 0 for a pair withheld because fewer than ``fewest`` of its rows are non-zero as summed.
    The sums of every pair when ``every`` (noise and masks cover them all), else of the pairs sent. Each
    sum adds its rows in pick order onto a zero row, as ``index_add_`` over all pairs does."""
    size = torch.bincount(pair, minlength=int(pair.max()) + 1)
    if h.layout != torch.strided and clip is None:
        return _sparse_sums(h, src, scale, pair, size, fewest, every), size
    rows = select_rows(h, src)
    rows = rows.to_dense() if rows.layout != torch.strided else rows
    rows = rows if scale is None else rows * scale
    rows = rows if clip is None else clip(rows)
    if fewest > 1:
        _withhold(size, pair, (rows != 0).any(1), fewest)
    return pair_sums(rows, pair, torch.ones_like(size, dtype=torch.bool) if every else size > 0), size


def _withhold(size: Tensor, pair: Tensor, nonzero: Tensor, fewest: int) -> None:
    """Set to 0 the size of every pair with fewer than ``fewest`` picks whose rows are non-zero."""
    size[torch.bincount(pair, weights=nonzero.double(), minlength=size.numel()) < fewest] = 0


def _sparse_sums(h: Tensor, src: Tensor, scale: Tensor | None, pair: Tensor, size: Tensor, fewest: int,
                 every: bool) -> Tensor:
    """``pick_sums`` of a CSR ``h`` without making any row dense: whether a row is non-zero as summed is
    read from its stored entries (scaled as summed), and only the entries of the pairs summed are
    scaled and added, pick by pick, straight into the sums."""
    crow, col, values = h.crow_indices(), h.col_indices(), h.values()
    if fewest > 1:
        row = entry_rows(h)
        row_scale = values.new_ones(h.size(0)).index_copy_(0, src, scale.squeeze(1)) if scale is not None else None
        scaled = values if row_scale is None else values * row_scale[row]  # each entry as the sum adds it
        _withhold(size, pair, (torch.bincount(row[scaled != 0], minlength=h.size(0)) > 0)[src], fewest)
    keep = torch.ones_like(size, dtype=torch.bool) if every else size > 0
    slot = torch.cumsum(keep, 0) - 1  # a kept pair's row in the result
    kept = keep[pair]
    start = crow[src[kept]]
    count = crow[src[kept] + 1] - start
    pick = torch.repeat_interleave(torch.arange(count.numel()), count)  # the kept pick of every entry summed
    pos = torch.arange(pick.numel()) + (start - (torch.cumsum(count, 0) - count))[pick]
    added = values[pos] if scale is None else values[pos] * scale.squeeze(1)[kept][pick]
    width, rows = h.size(1), int(keep.sum())
    flat = slot[pair[kept]][pick] * width + col[pos]
    return values.new_zeros(rows * width).index_add_(0, flat, added).view(rows, width)


def pair_sums(rows: Tensor, pair: Tensor, keep: Tensor) -> Tensor:
    """The sum of the dense rows of every pair in ``keep`` (a flag per pair), in pair order; ``pair``: the
    pair of every row. Each sum adds its rows in row order, as ``index_add_`` over all pairs does."""
    slot = torch.cumsum(keep, 0) - 1  # a kept pair's row in the result
    width, count = rows.size(1), int(slot[-1]) + 1 if slot.numel() else 0
    if bool(keep.all()):
        return rows.new_zeros(count, width).index_add_(0, pair, rows)
    inside = keep[pair]
    return rows.new_zeros(count, width).index_add_(0, slot[pair[inside]], rows[inside])
