"""Differential privacy as one layer: a party's ``PrivateRelease`` and the server's ``Accountant``.

A party clips what it releases and adds Gaussian noise of std ``noise_multiplier`` times the bound
it clipped to, from its own ``NoiseStream`` (operating-system keyed; ``privacy.noise``). The server
steps one ``DPAccountant`` per release: it charges every unit (node or client) whose data the release
may carry with ``multiple``, the release's L2 sensitivity to that unit over the noise's bound. For
Gaussian noise, Rényi DP composes as the sum of the squared multiples, so a unit's whole history is
one number (its load) and epsilon is that of one Gaussian event of noise multiplier
``noise_multiplier / sqrt(load)`` for the most loaded unit, from Google's ``dp-accounting`` RDP
accountant.

The adversary is the server: it chooses who takes part and sees who did, so no amplification by
sampling is claimed; a round is a full release for every party that took part. Counts (rows per sum,
training nodes) cross in the clear, so adding or removing a record is visible: the guarantee is for
substituting one record, whose clipped contribution moves by twice the bound (``SUBSTITUTION``).
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ConfigError
from .config import DPConfig
from .noise import NoiseStream

# A substituted record moves a clipped row from one point of the C-ball to another: at most 2 C.
SUBSTITUTION = 2.0


def clip(rows: Tensor, max_norm: float | Tensor) -> Tensor:
    """Each row scaled down to L2 norm at most ``max_norm`` (rows already inside are unchanged; a
    ``[k, 1]`` tensor gives each row its own bound)."""
    norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    return rows * (max_norm / norms.clamp_min(max_norm))


class PrivateRelease:
    """A party's Gaussian mechanism: clip to ``max_norm``, add noise scaled to the bound, from the
    party's own noise stream (``seed`` is read only with ``replayable_noise``, a test switch)."""

    def __init__(self, dp: DPConfig, seed: int):
        self.dp = dp
        self.noise = NoiseStream.from_seed(seed) if dp.replayable_noise else NoiseStream.fresh()

    @property
    def max_norm(self) -> float:
        return self.dp.max_norm

    def clip(self, rows: Tensor, bound: float | Tensor | None = None) -> Tensor:
        return clip(rows, self.dp.max_norm if bound is None else bound)

    def noised(self, values: Tensor, bound: float | None = None) -> Tensor:
        """``values`` plus N(0, (noise_multiplier * bound)^2) per coordinate (bound: ``max_norm``)."""
        scale = self.dp.noise_multiplier * (self.dp.max_norm if bound is None else bound)
        return values + self.noise.normal(values.shape, values.dtype, values.device) * scale

    def __call__(self, rows: Tensor) -> Tensor:
        """Every row of ``rows`` clipped to ``max_norm``, then noised."""
        return self.noised(self.clip(rows))

    def update(self, trained: Tensor, start: Tensor) -> Tensor:
        """``start`` plus the clipped, noised update ``trained - start`` (rows: one update each)."""
        return start + self(trained - start)


@dataclass(frozen=True)
class Guarantee:
    """What a protocol's epsilon is stated for, written into the run's summary beside it."""

    adjacency: str  # which datasets are neighbours: one node's data, one client's whole data, ...
    sensitivity: str  # how a release's sensitivity to that unit is bounded
    threat: str = ("an honest-but-curious server that chooses which parties take part and sees who did: "
                   "no amplification by sampling")


# What each protocol family's epsilon is stated for (docs/privacy.md).
CLIENT_UPDATES = Guarantee(
    adjacency="client-level: one client's whole local data replaced by other data of the same size",
    sensitivity="substitution: a clipped model update moves by at most 2 max_norm; one release per round the "
                "client took part in")
NODE_EXCHANGE = Guarantee(
    adjacency="node-level: one node's features and label replaced; the graph and the routing are not protected",
    sensitivity="substitution, owner-wide for computed rows: a sum holding a node's raw row moves by at most "
                "2 max_norm (charged to that node); a sum of n rows computed from neighbours or a model moves by "
                "at most 2 n max_norm (charged to every node of its owner); a client's model or gradient upload "
                "by 2 max_norm (charged to every node of the client)")
USER_ROWS = Guarantee(
    adjacency="node-level: one user's feature row replaced; the users and the graph are known to the server",
    sensitivity="substitution: a user's clipped latent (CNFGNN: and weight update) moves by at most 2 max_norm; "
                "one release per round the user took part in and per scoring")
VERTICAL_ROWS = Guarantee(
    adjacency="node-level: one node's features (every block) and label replaced; the graph is not protected",
    sensitivity="substitution, whole release: a client's n clipped rows, computed by its locally trained model "
                "from neighbours, move by at most 2 sqrt(n) max_norm in L2 (every row may carry any node)")


def release_rows(releases: list[PrivateRelease], rows: Tensor) -> Tensor:
    """Row i of ``rows`` released by ``releases[i]`` (clients in one group, each with its own stream)."""
    return torch.cat([release(row.unsqueeze(0)) for release, row in zip(releases, rows)])


def _dp_accounting():
    try:
        import dp_accounting
        from dp_accounting import rdp
    except ImportError:
        raise ConfigError("privacy.dp needs the dp-accounting package: pip install 'fedgl[privacy]'") from None
    return dp_accounting, rdp


def gaussian_epsilon(noise_multiplier: float, load: float, delta: float) -> float:
    """Epsilon at ``delta`` of Gaussian releases whose squared sensitivities, in units of the noise's
    bound, add up to ``load`` (one release of sensitivity equal to the bound: load 1)."""
    if load <= 0:
        return 0.0
    dpa, rdp = _dp_accounting()
    accountant = rdp.RdpAccountant()
    absl = logging.getLogger("absl")  # it warns per fractional RDP order it skips
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        accountant.compose(dpa.GaussianDpEvent(noise_multiplier / load ** 0.5))
        return float(accountant.get_epsilon(delta))
    finally:
        absl.setLevel(level)


class DPAccountant:
    """The server's account of what the releases cost each unit. ``owner[u]`` is the client holding
    unit u (client-level accounting: ``owner`` is ``arange(clients)``); a release charges listed
    units (``charge(nodes=...)``) or every unit of listed clients (``charge(clients=...)``), each under
    a ``part`` (e.g. model uploads and exchanged embeddings) reported apart as ``epsilon_<part>``.
    State: the loads per part (checkpointed)."""

    def __init__(self, dp: DPConfig, owner: Tensor, guarantee: Guarantee, parts: tuple[str, ...] = ("release",)):
        _dp_accounting()  # fail at setup, not after the first round
        self.dp, self.guarantee, self.owner = dp, guarantee, owner.long()
        clients = int(self.owner.max()) + 1 if self.owner.numel() else 0
        self.nodes = {p: torch.zeros(self.owner.numel(), dtype=torch.float64) for p in parts}
        self.clients = {p: torch.zeros(clients, dtype=torch.float64) for p in parts}

    @property
    def delta(self) -> float:
        return self.dp.delta

    def charge(self, part: str | None = None, nodes: Tensor | None = None, clients: Tensor | None = None,
               multiple: float | Tensor = SUBSTITUTION) -> None:
        """One release per entry of ``nodes`` (units) or ``clients`` (all their units), repeated for
        several; ``multiple``: the release's sensitivity to that unit over the noise's bound, one for
        all or one per entry."""
        part = part or next(iter(self.nodes))
        for ids, load in ((nodes, self.nodes[part]), (clients, self.clients[part])):
            if ids is not None:
                square = torch.as_tensor(multiple, dtype=torch.float64) ** 2
                load.index_add_(0, ids.long().cpu(), square.cpu().expand(ids.numel()))

    def load(self, parts: tuple[str, ...] | None = None) -> Tensor:
        """Every unit's load: its own releases plus its client's, over ``parts`` (None: all)."""
        total = torch.zeros(self.owner.numel(), dtype=torch.float64)
        for part in parts or tuple(self.nodes):
            total += self.nodes[part] + self.clients[part][self.owner]
        return total

    def epsilon(self, parts: tuple[str, ...] | None = None) -> float:
        """Epsilon at ``delta`` of the most loaded unit."""
        load = self.load(parts)
        return gaussian_epsilon(self.dp.noise_multiplier, float(load.max()) if load.numel() else 0.0, self.dp.delta)

    def epsilons(self) -> dict[str, float]:
        """``epsilon`` over every part, and ``epsilon_<part>`` for each when there are several."""
        parts = tuple(self.nodes)
        alone = {f"epsilon_{p}": self.epsilon((p,)) for p in parts} if len(parts) > 1 else {}
        return {"epsilon": self.epsilon()} | alone

    def summary(self) -> dict[str, float | str]:
        """Epsilon with what it is stated for: the summary's DP fields."""
        noise = ("replayable from the seed: noise not private (tests only)" if self.dp.replayable_noise else
                 "each party's own ChaCha20 stream keyed by the operating system")
        return self.epsilons() | {"delta": self.dp.delta, "dp_adjacency": self.guarantee.adjacency,
                                  "dp_sensitivity": self.guarantee.sensitivity,
                                  "dp_threat_model": self.guarantee.threat, "dp_noise": noise}

    def state_dict(self) -> dict[str, dict[str, Tensor]]:
        return {"nodes": {p: v.clone() for p, v in self.nodes.items()},
                "clients": {p: v.clone() for p, v in self.clients.items()}}

    def load_state_dict(self, state: dict[str, dict[str, Tensor]]) -> None:
        self.nodes = {p: v.clone() for p, v in state["nodes"].items()}
        self.clients = {p: v.clone() for p, v in state["clients"].items()}


# ---- the previous API, used by the protocols until they move to PrivateRelease/DPAccountant ----
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
