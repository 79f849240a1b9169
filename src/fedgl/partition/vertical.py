"""Feature-level (vertical) partitioning, as in GLASU's experiments on single-graph datasets.

Every client sees all nodes but only its own non-overlapping block of feature columns and its own
random subgraph (each undirected edge kept with probability ``edge_keep``, independently per
client; GLASU Appendix D.1 keeps 80%). Blocks are ceil(F/M) columns with the remainder on the last
client, matching the GLASU authors' data code.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch_geometric.data import Data

from fedgl.errors import PartitionError
from fedgl.partition.shards import (
    PartitionStats,
    VerticalPartition,
    VerticalShard,
    check_num_clients,
    count_labels,
    graph_tensors,
    pair_keep_mask,
)

BLOCKS = ("contiguous", "random")


def partition_vertical(
    data: Data,
    num_clients: int,
    *,
    blocks: str = "contiguous",
    edge_keep: float = 0.8,
    seed: int = 0,
    label_holder: int | None = None,
) -> VerticalPartition:
    """Give each of ``num_clients`` clients a feature block and an edge sample of ``data``.

    ``blocks="random"`` draws each block as a random sorted column subset; ``label_holder`` makes
    that one client the only holder of ``y`` (None: every client holds it).
    """
    graph = graph_tensors(data)
    _check(graph.num_features, num_clients, blocks, edge_keep, label_holder)
    generator = torch.Generator().manual_seed(seed)
    column_blocks = _feature_blocks(graph.num_features, num_clients, blocks, generator)
    num_nodes = graph.num_nodes
    holds_labels = [label_holder is None or m == label_holder for m in range(num_clients)]
    shards = [
        VerticalShard(
            client=m,
            columns=columns,
            x=graph.x[:, columns],
            edge_index=graph.edge_index[:, pair_keep_mask(graph.edge_index, num_nodes, edge_keep, generator)],
            y=graph.y.clone() if holds_labels[m] else None,
            train_mask=graph.train_mask.clone(),
            val_mask=graph.val_mask.clone(),
            test_mask=graph.test_mask.clone(),
        )
        for m, columns in enumerate(column_blocks)
    ]
    counts = count_labels(torch.zeros(num_nodes, dtype=torch.long), graph.y, 1, graph.num_classes)
    stats = PartitionStats(
        kind="vertical",
        parties=[f"client {m}" for m in range(num_clients)],
        num_nodes=num_nodes,
        num_edges=graph.num_edges,
        num_classes=graph.num_classes,
        nodes=[num_nodes] * num_clients,
        features=[shard.num_features for shard in shards],
        intra_edges=[int(shard.edge_index.size(1)) for shard in shards],
        cross_edges=[0] * num_clients,
        label_counts=counts * torch.tensor(holds_labels, dtype=torch.long)[:, None],
        train=[int(graph.train_mask.sum())] * num_clients,
        val=[int(graph.val_mask.sum())] * num_clients,
        test=[int(graph.test_mask.sum())] * num_clients,
    )
    return VerticalPartition(
        shards=shards,
        num_nodes=num_nodes,
        num_classes=graph.num_classes,
        label_holder=label_holder,
        stats=stats,
    )


def _check(num_features: int, num_clients: int, blocks: str, edge_keep: float, label_holder: int | None) -> None:
    """One line naming the first setting a vertical partition cannot be made with."""
    check_num_clients(num_clients, num_features, "feature columns")
    if blocks not in BLOCKS:
        raise PartitionError(f"unknown feature blocks {blocks!r}; allowed: {', '.join(BLOCKS)}")
    if not 0.0 < edge_keep <= 1.0:
        raise PartitionError(f"edge_keep must be in (0, 1], got {edge_keep}")
    if label_holder is not None and not (
        isinstance(label_holder, int) and not isinstance(label_holder, bool) and 0 <= label_holder < num_clients
    ):
        raise PartitionError(
            f"label_holder must be None or a client index in [0, {num_clients - 1}], got {label_holder!r}"
        )


def _feature_blocks(num_features: int, num_clients: int, blocks: str, generator: torch.Generator) -> list[Tensor]:
    """ceil(F/M) columns per client, the remainder on the last; each block sorted."""
    width = math.ceil(num_features / num_clients)
    if width * (num_clients - 1) >= num_features:
        usable = math.ceil(num_features / width)
        raise PartitionError(
            f"blocks of ceil(F/M)={width} columns cover all F={num_features} features with {usable} "
            f"clients, leaving {num_clients - usable} client(s) empty; use at most {usable} clients"
        )
    order = torch.arange(num_features) if blocks == "contiguous" else torch.randperm(num_features, generator=generator)
    return [chunk.sort().values for chunk in torch.split(order, width)]
