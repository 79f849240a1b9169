"""Differential privacy of client updates: the Gaussian mechanism with per-message clipping.

A client clips its model update (its trained model minus the global model it received) to L2 norm
``max_norm`` and adds N(0, (noise_multiplier * max_norm)^2) to every coordinate before the update
leaves it. Each message is then a Gaussian mechanism of noise multiplier ``noise_multiplier`` on the
client's data (add/remove of the client's data changes the clipped update by at most ``max_norm``).
The privacy budget is tracked by Google's ``dp-accounting`` RDP accountant: one Gaussian event per
round, Poisson-subsampled at the round's client sampling rate when clients are sampled.

Swift's exchanged embeddings use the same mechanism per partial sum (``clip`` every row, add
``gaussian`` noise to the sum); ``ReleaseAccountant`` counts the releases each node's row went into and
reports epsilon for the node with the most.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import ConfigError
from .config import DPConfig


def clip(updates: Tensor, max_norm: float) -> Tensor:
    """Each row scaled down to L2 norm at most ``max_norm`` (rows already inside are unchanged)."""
    norms = torch.linalg.vector_norm(updates, dim=1, keepdim=True)
    return updates * (max_norm / norms.clamp_min(max_norm))


def privatize(updates: Tensor, dp: DPConfig, generators: Sequence[torch.Generator | None]) -> Tensor:
    """Clip every row of ``updates`` (``[k, P]``) and add its Gaussian noise, drawn for row i from
    ``generators[i]`` (None: torch's default generator, i.e. the party's own random state)."""
    noise = torch.stack([torch.randn(updates.size(1), generator=g, dtype=updates.dtype) for g in generators])
    return clip(updates, dp.max_norm) + noise * (dp.noise_multiplier * dp.max_norm)


def gaussian(sums: Tensor, dp: DPConfig) -> Tensor:
    """``sums`` plus N(0, (noise_multiplier * max_norm)^2) per coordinate, from torch's default
    generator (the party's own random state)."""
    return sums + torch.randn(sums.shape, dtype=sums.dtype) * (dp.noise_multiplier * dp.max_norm)


def _dp_accounting():
    try:
        import dp_accounting
        from dp_accounting import rdp
    except ImportError:
        raise ConfigError("privacy.dp needs the dp-accounting package: pip install 'fedgl[privacy]'") from None
    return dp_accounting, rdp


class Accountant:
    """The (epsilon, delta) spent so far: the sampling rate of every round a release was made in,
    composed by ``dp_accounting``'s RDP accountant. Its state is the list of rates (checkpointed)."""

    def __init__(self, dp: DPConfig):
        _dp_accounting()  # fail at setup, not after the first round
        self.noise_multiplier = dp.noise_multiplier
        self.delta = dp.delta
        self.rates: list[float] = []

    def step(self, sampling_rate: float) -> None:
        """Record one round in which each client took part with probability ``sampling_rate``."""
        self.rates.append(float(sampling_rate))

    def epsilon(self) -> float:
        return epsilon(self.noise_multiplier, self.rates, self.delta)


def epsilon(noise_multiplier: float, rates: Sequence[float], delta: float) -> float:
    """Epsilon at ``delta`` after one Gaussian release per entry of ``rates`` (its sampling rate)."""
    dpa, rdp = _dp_accounting()
    accountant = rdp.RdpAccountant()
    absl = logging.getLogger("absl")  # it warns per fractional RDP order it skips
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        for rate, count in Counter(rates).items():
            event = dpa.GaussianDpEvent(noise_multiplier)
            accountant.compose(event if rate >= 1 else dpa.PoissonSampledDpEvent(rate, event), count)
    finally:
        absl.setLevel(level)
    return float(accountant.get_epsilon(delta))


class ReleaseAccountant:
    """Epsilon per node row: every noised sum holding a node's (clipped) row is one Gaussian release
    for that node, of sensitivity ``max_norm`` (add/remove of the row). Releases compose, so epsilon is
    that of the node whose row went into the most of them. State: the per-node counts (checkpointed)."""

    def __init__(self, dp: DPConfig, num_nodes: int):
        _dp_accounting()  # fail at setup, not after the first round
        self.noise_multiplier = dp.noise_multiplier
        self.delta = dp.delta
        self.releases = torch.zeros(num_nodes, dtype=torch.long)

    def record(self, nodes: Tensor) -> None:
        """One release for each entry of ``nodes`` (global ids, repeated for several releases)."""
        self.releases += torch.bincount(nodes, minlength=self.releases.numel())

    def epsilon(self) -> float:
        most = int(self.releases.max()) if self.releases.numel() else 0
        return epsilon(self.noise_multiplier, [1.0] * most, self.delta) if most else 0.0
