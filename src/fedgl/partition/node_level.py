"""Node-level partitioning (nFedGNN): every node is a user holding only its own feature vector.

The server knows the topology and the labels of the training nodes; the users' features never
reach it. Validation and test labels are left out on purpose, so that no party can train on them:
the evaluation harness keeps ground truth separately.
"""

from __future__ import annotations

import torch
from torch_geometric.data import Data

from fedgl.partition.shards import NodeLevelPartition, PartitionStats, count_labels, graph_tensors


def partition_node_level(data: Data) -> NodeLevelPartition:
    """Split ``data`` into the user population's features and the server's graph and train labels."""
    graph = graph_tensors(data)
    num_nodes, num_classes = graph.num_nodes, graph.num_classes
    y_train = torch.where(graph.train_mask, graph.y, torch.full_like(graph.y, -1))
    num_train = int(graph.train_mask.sum())
    server_labels = count_labels(torch.zeros(num_nodes, dtype=torch.long), y_train, 1, num_classes)
    stats = PartitionStats(
        kind="node_level",
        parties=["users", "server"],
        num_nodes=num_nodes,
        num_edges=graph.num_edges,
        num_classes=num_classes,
        nodes=[num_nodes, num_nodes],
        features=[graph.num_features, 0],
        intra_edges=[0, graph.num_edges],
        cross_edges=[0, 0],
        label_counts=torch.cat([torch.zeros_like(server_labels), server_labels]),
        train=[0, num_train],
        val=[0, 0],
        test=[0, 0],
    )
    return NodeLevelPartition(
        user_x=graph.x.clone(),
        edge_index=graph.edge_index.clone(),
        num_nodes=num_nodes,
        num_classes=num_classes,
        train_mask=graph.train_mask.clone(),
        y_train=y_train,
        stats=stats,
    )
