"""What every horizontal cross-client client holds: its shard, laid out for sampling across clients.

Shared by the Swift-FedGNN family (``client.py``) and FedAAS. A client holds its nodes'
features and labels and its intra-client edges, plus the global ids of its nodes' remote
in-neighbours, never their data nor their owner. Remote in-neighbours become columns ``n, n+1, ...``
of ``full_csr`` (rows past ``n`` stay empty), so one weighted or uniform draw over ``full_csr``
picks local and remote neighbours together; ``local_csr`` is the subgraph without them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ... import device as devices
from ...comm import Party
from ...config import ModelConfig
from ...models import as_model_input, make_model
from ...sampling import CSR, sample_neighbors

FEATURE_DENSITY = 0.1  # feature matrices sparser than this are computed on as sparse rows


class HorizontalClient(Party):
    def __init__(self, name: str, seed: int, shard: Any, model: ModelConfig, num_features: int, num_classes: int):
        super().__init__(name, seed)
        self.model = make_model(model, num_features, num_classes)
        self.x = shard.x.float()
        self.features = as_model_input(self.x, FEATURE_DENSITY)
        self.y = shard.y
        self.global_ids = shard.nodes
        self.train_mask = shard.train_mask
        self.train_idx = shard.train_mask.nonzero().flatten()
        n = shard.num_nodes
        self.generator = devices.generator().manual_seed(seed)  # draws where the graph is
        self.local_csr = CSR.from_edge_index(shard.edge_index, n)
        self.remote_ids, remote_col = torch.unique(shard.cross_edges[1], return_inverse=True)
        cross = torch.stack([remote_col + n, shard.cross_edges[0]])
        self.full_csr = CSR.from_edge_index(torch.cat([shard.edge_index, cross], 1), n + self.remote_ids.numel())


def sample_hop(csr: CSR, seeds: Tensor, fanout: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Up to ``fanout`` distinct in-neighbours of each seed (``-1``: all of them), as
    (position of the seed in ``seeds``, neighbour column) per pick."""
    if seeds.numel() == 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    sub = sample_neighbors(csr, seeds, [fanout], generator)
    src, dst = sub.blocks[0].edge_index
    return dst, sub.n_id[src]
