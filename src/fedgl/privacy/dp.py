"""Differential privacy of client updates: the Gaussian mechanism with per-message clipping.

A client clips its model update (its trained model minus the global model it received) to L2 norm
``max_norm`` and adds N(0, (noise_multiplier * max_norm)^2) to every coordinate before the update
leaves it. Each message is then a Gaussian mechanism of noise multiplier ``noise_multiplier`` on the
client's data (add/remove of the client's data changes the clipped update by at most ``max_norm``).
The privacy budget is tracked by Google's ``dp-accounting`` RDP accountant: one Gaussian event per
round, Poisson-subsampled at the round's client sampling rate when clients are sampled.

Swift's exchanged embeddings use the same mechanism per partial sum (``clip`` every row, add
``gaussian`` noise to the sum), as do FedAAS's exchanged partials and GLASU's representations;
``ReleaseAccountant`` counts the releases each node's row went into and reports epsilon for the node
with the most (FedAAS composes it with the rounds of model uploads).
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import ConfigError
from .config import DPConfig


def clip(updates: Tensor, max_norm: float | Tensor) -> Tensor:
    """Each row scaled down to L2 norm at most ``max_norm`` (rows already inside are unchanged; a
    ``[k, 1]`` tensor gives each row its own bound)."""
    norms = torch.linalg.vector_norm(updates, dim=1, keepdim=True)
    return updates * (max_norm / norms.clamp_min(max_norm))


def privatize(updates: Tensor, dp: DPConfig, generators: Sequence[torch.Generator | None]) -> Tensor:
    """Clip every row of ``updates`` (``[k, P]``) and add its Gaussian noise, drawn for row i from
    ``generators[i]`` (None: torch's default generator, i.e. the party's own random state)."""
    noise = torch.stack([torch.randn(updates.size(1), generator=g, dtype=updates.dtype,
                                     device=None if g is None else g.device) for g in generators]).to(updates.device)
    return clip(updates, dp.max_norm) + noise * (dp.noise_multiplier * dp.max_norm)


def gaussian(sums: Tensor, dp: DPConfig, generator: torch.Generator | None = None,
             sensitivity: float | None = None) -> Tensor:
    """``sums`` plus N(0, (noise_multiplier * sensitivity)^2) per coordinate (sensitivity: ``max_norm``
    unless given), from ``generator`` (None: torch's default, the party's own random state)."""
    scale = dp.noise_multiplier * (dp.max_norm if sensitivity is None else sensitivity)
    noise = torch.randn(sums.shape, dtype=sums.dtype, generator=generator,
                        device=None if generator is None else generator.device)
    return sums + noise.to(sums.device) * scale


def noise_generator(seed: int) -> torch.Generator:
    """A party's stream for DP noise, apart from its sampling and dropout draws, so a run with noise
    makes the same draws as without it."""
    digest = hashlib.sha256(f"fedgl dp noise {seed}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)


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

    def most(self) -> int:
        """The largest number of releases any node's row went into."""
        return int(self.releases.max()) if self.releases.numel() else 0

    def epsilon(self, rounds: Sequence[float] = ()) -> float:
        """Epsilon of the most released node, composed with ``rounds``: the sampling rates of further
        Gaussian events (of the same noise multiplier) every node's data went into."""
        events = [*rounds, *[1.0] * self.most()]
        return epsilon(self.noise_multiplier, events, self.delta) if events else 0.0
