"""Partitioners that cut one graph into the private shards of the parties of a federation."""

from fedgl.partition.horizontal import partition_horizontal
from fedgl.partition.node_level import partition_node_level
from fedgl.partition.shards import (
    HorizontalPartition,
    HorizontalShard,
    NodeLevelPartition,
    PartitionStats,
    VerticalPartition,
    VerticalShard,
)
from fedgl.partition.vertical import partition_vertical

__all__ = [
    "HorizontalPartition",
    "HorizontalShard",
    "NodeLevelPartition",
    "PartitionStats",
    "VerticalPartition",
    "VerticalShard",
    "partition_horizontal",
    "partition_node_level",
    "partition_vertical",
]
