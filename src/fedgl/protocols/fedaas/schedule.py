"""FedAAS's schedules: the synchronisation interval τ from the losses, which steps of a round sync,
the τ₀ grid and the φ rule's draw of picks per segment."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def next_interval(rule: str, losses: list[float], tau: int, tau0: int, tau_min: int) -> int:
    """τ for the next round from the losses F_0, ..., F_t (§5.3).

    paper: ⌈sqrt(F_t / F_0) τ_0⌉ clipped to [τ_min, τ_0]; code: τ is kept after a round that lowered
    the loss, else max(τ_min, min(τ - 1, ⌊sqrt(F_t / F_0) τ_0⌋)), so it never grows."""
    ratio = math.sqrt(max(losses[-1], 0.0) / losses[0]) if losses[0] > 0 else 1.0
    if rule == "paper":
        return min(tau0, max(tau_min, math.ceil(ratio * tau0)))
    if len(losses) > 1 and losses[-1] < losses[-2]:
        return tau
    return max(tau_min, min(tau - 1, int(ratio * tau0)))


def sync_steps(counter: str, tau: int | None, steps: int, count: int) -> tuple[set[int], int]:
    """The round's sync steps (0-based) and the count after it. global: Algorithm 1's count i, carried
    from round to round (i += 1 per step; a sync once i reaches τ, which may have shrunk meanwhile, then
    i = 0); round: the authors' code, steps j ≡ 0 (mod τ) of the round. τ None: no sync."""
    if tau is None:
        return set(), count
    if counter == "round":
        return {j for j in range(steps) if j % tau == 0}, count
    syncs = set()
    for j in range(steps):
        count += 1
        if count >= tau:
            syncs.add(j)
            count = 0
    return syncs, count


GRID = (1, 2, 5, 10)  # the τ_0 candidates of ``tau0: grid`` (spec A7)


def ratio_picks(segment: Tensor, phi: float, generator: torch.Generator, logits: Tensor | None = None) -> Tensor:
    """Which candidates are picked: in every segment (candidates sharing a ``segment`` id) of c of them,
    max(⌊φ c⌋, 1) drawn without replacement with probabilities ∝ exp(logit) (uniform without logits):
    the smallest Exp(1) / exp(logit) keys of each segment (Efraimidis-Spirakis), one sort for all."""
    if segment.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    _, seg, counts = torch.unique(segment, return_inverse=True, return_counts=True)
    quota = torch.floor(phi * counts.double() + 1e-9).long().clamp(min=1)  # 1e-9: φ c exact despite rounding
    keys = torch.empty(segment.numel(), dtype=torch.float64).exponential_(generator=generator).log()
    if logits is not None:
        keys = keys - logits.double()
    order = torch.argsort(keys)
    order = order[torch.argsort(seg[order], stable=True)]
    rank = torch.arange(order.numel()) - (torch.cumsum(counts, 0) - counts)[seg[order]]
    keep = torch.zeros(segment.numel(), dtype=torch.bool)
    keep[order[rank < quota[seg[order]]]] = True
    return keep
