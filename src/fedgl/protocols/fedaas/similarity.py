"""Similarity-weighted personalised averaging, for the reconstructed GraphFed baseline.

GraphFed (FedAAS paper's baseline [6]) "adopts personalized subgraph FL with graph data distribution
similarity obtained using inter-subgraph distances"; fedaas.txt gives no formula. fedgl reconstructs
it as FED-PUB does: the server feeds every uploaded model one fixed random probe graph, takes the mean
of its last hidden layer as the model's *functional embedding*, and sends client k the average

    θ_k = Σ_q w_kq n_q θ_q / Σ_q w_kq n_q,   w_kq = exp(-(1 - cos(μ_k, μ_q)) / T).

Everything happens at the server on models it already receives: no message is added, no client data
is touched.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

PROBE_NODES = 100
PROBE_DEGREE = 5


class SimilarityAverager:
    """The probe graph (drawn once from the server's seed) and the mixing of uploaded models."""

    def __init__(self, num_features: int, temperature: float, generator: torch.Generator):
        self.temperature = temperature
        self.x = torch.randn(PROBE_NODES, num_features, generator=generator)
        edges = torch.randint(0, PROBE_NODES, (2, PROBE_NODES * PROBE_DEGREE), generator=generator)
        self.edge_index = edges[:, edges[0] != edges[1]]

    @torch.no_grad()
    def embedding(self, net, state: dict[str, Tensor]) -> Tensor:
        """μ: the mean last hidden layer of ``net`` with ``state`` on the probe graph."""
        net.load_state_dict(state)
        keep = (self.edge_index[0], self.edge_index[1])
        return net.embed(self.x, [keep] * net.num_layers)[-1].mean(0)

    def weights(self, embeddings: Tensor, sizes: Tensor) -> Tensor:
        """[K, Q] row-stochastic mixing weights w_kq n_q / Σ_q w_kq n_q for K requesters, Q uploads."""
        similarity = F.normalize(embeddings, dim=1) @ F.normalize(embeddings, dim=1).t()
        mix = torch.exp(-(1 - similarity) / self.temperature) * sizes.unsqueeze(0)
        return mix / mix.sum(1, keepdim=True)

    @staticmethod
    def mix(states: list[dict[str, Tensor]], weights: Tensor) -> list[dict[str, Tensor]]:
        """One mixed state per row of ``weights``, computed tensor by tensor (peak memory: one
        parameter stacked over the uploads)."""
        out: list[dict[str, Tensor]] = [{} for _ in range(weights.size(0))]
        for key in states[0]:
            stacked = torch.stack([s[key].float() for s in states])
            mixed = torch.tensordot(weights, stacked, dims=1).to(states[0][key].dtype)
            for k, row in enumerate(mixed):
                out[k][key] = row
        return out
