"""Swift-FedGNN (swift-fedgnn.txt, Algorithm 1) and the two schedules it contains as special cases.

Every iteration all clients start from the global parameters and return a stochastic gradient,
which the server averages into one optimiser step. Every ``I`` iterations ``K`` clients, drawn
uniformly by the server, train with their cross-client neighbours (Algorithm 2); all other client
steps use the local subgraph only (Algorithm 3). ``K = 0`` never crosses clients: this is how the
paper's FedSage baseline is run here (same batches, sampling and per-iteration gradient averaging,
so only the cross-client neighbours differ); ``I = 1, K = M`` crosses on every client at every
iteration (FedGNN-G, registered as ``fedgnn-g``).
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch_geometric.data import Data

from ...errors import ConfigError
from .server import CrossClientOptions, CrossClientProtocol


class SwiftOptions(CrossClientOptions):
    I: int = Field(10, ge=1, description="correction frequency: iterations between cross-client iterations")
    K: int = Field(5, ge=0, description="clients sampled for cross-client training in those iterations")


class SwiftFedGNN(CrossClientProtocol):
    name = "swift"
    Options = SwiftOptions

    def setup(self, data: Data) -> None:
        super().setup(data)
        self.period, self.num_cross = self.schedule_parameters()
        if self.num_cross > len(self.clients):
            raise ConfigError(f"protocol.K={self.num_cross} exceeds the {len(self.clients)} clients; "
                              f"use 0 <= K <= partition.num_clients")

    def schedule_parameters(self) -> tuple[int, int]:
        """(I, K) of this run."""
        return self.opts.I, self.opts.K

    def modes(self, t: int) -> list[str]:
        m = len(self.clients)
        modes = ["local"] * m
        if self.num_cross and t % self.period == 0:
            chosen = torch.randperm(m, generator=self.generator)[: self.num_cross] if self.num_cross < m \
                else torch.arange(m)
            for i in chosen.tolist():
                modes[i] = "cross"
        return modes

    def train_round(self, round_index: int) -> dict[str, float]:
        modes = self.modes(round_index - 1)
        return self.iterate(modes) | {"cross_clients": float(modes.count("cross"))}


class FedGNNG(SwiftFedGNN):
    """FedGNN-G: cross-client training on every client at every iteration (Swift with I=1, K=M)."""

    name = "fedgnn-g"
    Options = CrossClientOptions

    def schedule_parameters(self) -> tuple[int, int]:
        return 1, len(self.clients)
