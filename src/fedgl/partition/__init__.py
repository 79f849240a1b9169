"""Partitioners that cut one graph into the private shards of the parties of a federation."""

from torch_geometric.data import Data

from fedgl.partition.horizontal import partition_horizontal
from fedgl.partition.node_level import partition_node_level
from fedgl.partition.shards import (
    HorizontalPartition,
    HorizontalShard,
    NodeLevelPartition,
    PartitionStats,
    ServerShard,
    VerticalPartition,
    VerticalShard,
)
from fedgl.partition.vertical import partition_vertical


def horizontal_from_config(data: Data, p, seed: int) -> HorizontalPartition:
    """The horizontal partition a run's ``partition`` section ``p`` describes, read by field name:
    partitioning imports nothing from the config layer above it."""
    return partition_horizontal(data, p.num_clients, p.method, seed=seed, alpha=p.alpha, edge_drop=p.edge_drop,
                                cross_edge_drop=p.cross_edge_drop, client_nodes=p.client_nodes,
                                drop_unit=p.drop_unit)


__all__ = [
    "HorizontalPartition",
    "HorizontalShard",
    "NodeLevelPartition",
    "PartitionStats",
    "ServerShard",
    "VerticalPartition",
    "VerticalShard",
    "horizontal_from_config",
    "partition_horizontal",
    "partition_node_level",
    "partition_vertical",
]
