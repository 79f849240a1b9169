"""An owner's partial sums per (target, owner) pair (Eq. 5), from the rows it holds.

Sparse feature rows stay sparse: their stored entries are added straight into the sums of the pairs
that are sent, pick by pick in pick order, so each sum is the one adding the dense rows gives, bit for
bit (an absent entry would add +0, which leaves a sum that starts at +0 unchanged), without making
the picks' dense rows (8,415 floats each on Coauthor Physics) nor the sums of withheld pairs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...models import select_rows
from ...models.graph import csr_tensor


def entry_rows(rows: Tensor) -> Tensor:
    """The row of every stored entry of a CSR matrix."""
    crow = rows.crow_indices()
    return torch.repeat_interleave(torch.arange(rows.size(0), device=crow.device), crow.diff())


def picked_rows(h: Tensor, src: Tensor, scale: Tensor | None, dense: bool) -> Tensor:
    """Rows ``src`` of ``h``, each scaled by its ``scale`` (GCN's source half; None: unscaled); sparse
    rows stay sparse unless ``dense``."""
    rows = select_rows(h, src)
    if rows.layout != torch.strided and dense:
        rows = rows.to_dense()
    if scale is None:
        return rows
    if rows.layout == torch.strided:
        return rows * scale
    scaled = rows.values() * scale.squeeze(1)[entry_rows(rows)]  # each entry as the dense product gives it
    return csr_tensor(rows.crow_indices(), rows.col_indices(), scaled, tuple(rows.shape))


def nonzero_rows(rows: Tensor) -> Tensor:
    """Which rows hold a non-zero value."""
    if rows.layout == torch.strided:
        return (rows != 0).any(1)
    present = entry_rows(rows)[rows.values() != 0]
    return torch.bincount(present, minlength=rows.size(0)) > 0


def pair_sums(rows: Tensor, pair: Tensor, keep: Tensor) -> Tensor:
    """The sum of the rows of every pair in ``keep`` (a flag per pair), in pair order; ``pair``: the
    pair of every row. Each sum adds its rows in row order, as ``index_add_`` over all pairs does."""
    slot = torch.cumsum(keep, 0) - 1  # a kept pair's row in the result
    width, count = rows.size(1), int(slot[-1]) + 1 if slot.numel() else 0
    if rows.layout == torch.strided:
        if bool(keep.all()):
            return rows.new_zeros(count, width).index_add_(0, pair, rows)
        inside = keep[pair]
        return rows.new_zeros(count, width).index_add_(0, slot[pair[inside]], rows[inside])
    values, row = rows.values(), entry_rows(rows)
    inside = keep[pair[row]]
    flat = slot[pair[row[inside]]] * width + rows.col_indices()[inside]
    return values.new_zeros(count * width).index_add_(0, flat, values[inside]).view(count, width)
