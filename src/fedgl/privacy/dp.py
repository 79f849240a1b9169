"""Differential privacy as one layer: a party's ``PrivateRelease`` and the server's ``DPAccountant``.

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

import logging
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
        self.dp = dp  # configuration: never taken from a checkpoint, which could lower the noise
        self.noise = NoiseStream.from_seed(seed) if dp.replayable_noise else NoiseStream.fresh()

    @property
    def noise_multiplier(self) -> float:
        return self.dp.noise_multiplier

    @property
    def max_norm(self) -> float:
        return self.dp.max_norm

    def clip(self, rows: Tensor, bound: float | Tensor | None = None) -> Tensor:
        return clip(rows, self.max_norm if bound is None else bound)

    def noised(self, values: Tensor, bound: float | None = None) -> Tensor:
        """``values`` plus N(0, (noise_multiplier * bound)^2) per coordinate (bound: ``max_norm``)."""
        scale = self.noise_multiplier * (self.max_norm if bound is None else bound)
        return values + self.noise.normal(values.shape, values.dtype, values.device) * scale

    def __call__(self, rows: Tensor) -> Tensor:
        """Every row of ``rows`` clipped to ``max_norm``, then noised."""
        return self.noised(self.clip(rows))


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
    It holds plain numbers and tensors only, so a checkpoint or a deployed server's state file keeps it
    whole; ``state``/``load_state``: the loads per part."""

    def __init__(self, dp: DPConfig, owner: Tensor, guarantee: Guarantee, parts: tuple[str, ...] = ("release",)):
        _dp_accounting()  # fail at setup, not after the first round
        self.noise_multiplier, self.delta, self.replayable = dp.noise_multiplier, dp.delta, dp.replayable_noise
        self.guarantee, self.owner = guarantee, owner.long()
        clients = int(self.owner.max()) + 1 if self.owner.numel() else 0
        self.nodes = {p: torch.zeros(self.owner.numel(), dtype=torch.float64) for p in parts}
        self.clients = {p: torch.zeros(clients, dtype=torch.float64) for p in parts}

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
        return gaussian_epsilon(self.noise_multiplier, float(load.max()) if load.numel() else 0.0, self.delta)

    def epsilons(self) -> dict[str, float]:
        """``epsilon`` over every part, and ``epsilon_<part>`` for each when there are several."""
        parts = tuple(self.nodes)
        alone = {f"epsilon_{p}": self.epsilon((p,)) for p in parts} if len(parts) > 1 else {}
        return {"epsilon": self.epsilon()} | alone

    def summary(self) -> dict[str, float | str]:
        """Epsilon with what it is stated for: the summary's DP fields."""
        noise = ("replayable from the seed: noise not private (tests only)" if self.replayable else
                 "each party's own ChaCha20 stream keyed by the operating system")
        return self.epsilons() | {"delta": self.delta, "dp_adjacency": self.guarantee.adjacency,
                                  "dp_sensitivity": self.guarantee.sensitivity,
                                  "dp_threat_model": self.guarantee.threat, "dp_noise": noise}

    def state(self) -> dict[str, dict[str, Tensor]]:
        return {"nodes": {p: v.clone() for p, v in self.nodes.items()},
                "clients": {p: v.clone() for p, v in self.clients.items()}}

    def load_state(self, state: dict[str, dict[str, Tensor]]) -> None:
        self.nodes = {p: v.clone() for p, v in state["nodes"].items()}
        self.clients = {p: v.clone() for p, v in state["clients"].items()}

