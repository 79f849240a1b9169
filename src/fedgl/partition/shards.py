"""What each party receives from a partitioner, and the statistics that describe a split.

These dataclasses are the privacy boundary: a party object is built from exactly one shard, so
anything a party may not know (another client's features, the owner of a remote node, held-out
labels) is simply absent from its shard. The input checks and the symmetric edge sampler live here
because every partitioner shares them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from fedgl.errors import PartitionError


@dataclass(frozen=True, eq=False)
class PartitionStats:
    """Per-party sizes of a split: one entry per party in every list, one row per party in
    ``label_counts`` ([P, C]; zero rows for parties that hold no labels).

    ``intra_edges`` counts the directed edge entries a party holds with both endpoints known to it;
    ``cross_edges`` counts entries pointing to nodes held by another party (ids only). Horizontal
    splits also record both counts before their edge drops (``*_before_drop``; None elsewhere) and
    ``held_out``, the nodes no party owns (kept by the server).
    """

    kind: str
    parties: list[str]
    num_nodes: int
    num_edges: int
    num_classes: int
    nodes: list[int]
    features: list[int]
    intra_edges: list[int]
    cross_edges: list[int]
    label_counts: Tensor
    train: list[int]
    val: list[int]
    test: list[int]
    intra_edges_before_drop: list[int] | None = None
    cross_edges_before_drop: list[int] | None = None
    held_out: int = 0

    def to_rows(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per party, for tables and result files."""
        labels = self.label_counts.tolist()
        before = {"intra_edges_before_drop": self.intra_edges_before_drop,
                  "cross_edges_before_drop": self.cross_edges_before_drop}
        optional = {key: values for key, values in before.items() if values is not None}
        return [
            {
                "party": self.parties[p],
                "nodes": self.nodes[p],
                "features": self.features[p],
                "intra_edges": self.intra_edges[p],
                "cross_edges": self.cross_edges[p],
                **{key: values[p] for key, values in optional.items()},
                "train": self.train[p],
                "val": self.val[p],
                "test": self.test[p],
                "labels": labels[p],
            }
            for p in range(len(self.parties))
        ]

    def label_entropy(self) -> Tensor:
        """Entropy (nats) of each party's label distribution; NaN for a party without labels.

        Low values mean label skew: ``log(num_classes)`` is a uniform mix, 0 a single class.
        """
        counts = self.label_counts.double()
        totals = counts.sum(dim=1, keepdim=True)
        probs = counts / totals
        terms = torch.where(probs > 0, -probs * probs.clamp_min(1e-300).log(), torch.zeros_like(probs))
        return torch.where(totals.squeeze(1) > 0, terms.sum(dim=1), torch.full_like(totals.squeeze(1), math.nan))

    def summary(self) -> dict[str, Any]:
        """Totals and balance figures of the split as plain numbers.

        ``mean_nodes`` and ``mean_intra_edges`` are the per-party means (FedAAS's V_k and E_k);
        ``cross_edges`` is the total of kept cross-party entries (its ΔE).
        """
        entropy = self.label_entropy()
        labelled = entropy[~entropy.isnan()]
        intra, cross = sum(self.intra_edges), sum(self.cross_edges)
        parties = len(self.parties)
        summary = {
            "kind": self.kind,
            "parties": parties,
            "num_nodes": self.num_nodes,
            "num_edges": self.num_edges,
            "num_classes": self.num_classes,
            "intra_edges": intra,
            "cross_edges": cross,
            "cross_edge_fraction": cross / self.num_edges if self.num_edges else 0.0,
            "held_out_nodes": self.held_out,
            "min_nodes": min(self.nodes),
            "max_nodes": max(self.nodes),
            "mean_nodes": sum(self.nodes) / parties,
            "mean_intra_edges": intra / parties,
            "min_features": min(self.features),
            "max_features": max(self.features),
            "mean_label_entropy": float(labelled.mean()) if labelled.numel() else math.nan,
        }
        if self.intra_edges_before_drop is not None:
            summary["mean_intra_edges_before_drop"] = sum(self.intra_edges_before_drop) / parties
        if self.cross_edges_before_drop is not None:
            summary["cross_edges_before_drop"] = sum(self.cross_edges_before_drop)
        return summary


@dataclass(frozen=True, eq=False)
class NodeShard:
    """A set of nodes (global ids ``nodes``) with their features, labels and masks, and edges
    among them in local ids."""

    nodes: Tensor
    x: Tensor
    y: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    edge_index: Tensor

    @property
    def num_nodes(self) -> int:
        return int(self.nodes.numel())


@dataclass(frozen=True, eq=False)
class ServerShard(NodeShard):
    """The nodes no client owns (e.g. validation and test nodes when clients hold training nodes
    only), placed at the server with the edges among them (no edge drop; edges to client nodes are
    absent). FedAAS's server computes its own loss here."""


@dataclass(frozen=True, eq=False)
class HorizontalShard(NodeShard):
    """One client's private subgraph: its own nodes with all their features and labels.

    ``edge_index`` holds intra-client edges in local indices. ``cross_edges`` holds one column
    ``(local id of own node, global id of a remote in-neighbour)`` per kept entry
    ``(remote -> own)`` whose source another client owns: the client knows those neighbours
    exist, not their data or owner. Edges to nodes no client owns are absent.
    """

    client: int
    cross_edges: Tensor


@dataclass(frozen=True, eq=False)
class HorizontalPartition:
    """All clients' shards plus the routing table (``owner``, ``local_index``) kept by the server.

    Nodes owned by no client have ``owner == local_index == -1`` and sit in ``server_shard``
    (None when every node is owned).
    """

    shards: list[HorizontalShard]
    owner: Tensor
    local_index: Tensor
    num_nodes: int
    num_classes: int
    method: str
    stats: PartitionStats
    server_shard: ServerShard | None = None

    @property
    def num_clients(self) -> int:
        return len(self.shards)


@dataclass(frozen=True, eq=False)
class VerticalShard:
    """One client's view of every node: a block of feature columns and its own sample of edges
    (global ids). ``y`` is None when another client holds the labels."""

    client: int
    columns: Tensor
    x: Tensor
    edge_index: Tensor
    y: Tensor | None
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor

    @property
    def num_features(self) -> int:
        return int(self.columns.numel())


@dataclass(frozen=True, eq=False)
class VerticalPartition:
    """All clients' feature blocks; ``label_holder`` is None when every client holds the labels."""

    shards: list[VerticalShard]
    num_nodes: int
    num_classes: int
    label_holder: int | None
    stats: PartitionStats

    @property
    def num_clients(self) -> int:
        return len(self.shards)


@dataclass(frozen=True, eq=False)
class NodeLevelPartition:
    """One user per node. ``user_x`` row i belongs to user i; the server holds the topology and
    only the training labels (``y_train`` is -1 off ``train_mask``)."""

    user_x: Tensor
    edge_index: Tensor
    num_nodes: int
    num_classes: int
    train_mask: Tensor
    y_train: Tensor
    stats: PartitionStats


@dataclass(frozen=True, eq=False)
class GraphTensors:
    """The validated tensors of an input graph."""

    x: Tensor
    y: Tensor
    edge_index: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    num_classes: int

    @property
    def num_nodes(self) -> int:
        return int(self.x.size(0))

    @property
    def num_features(self) -> int:
        return int(self.x.size(1))

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.size(1))


def graph_tensors(data: Data) -> GraphTensors:
    """Check the input graph once so partitioners can index it without further guards."""
    x, y, edge_index = (getattr(data, key, None) for key in ("x", "y", "edge_index"))
    if not isinstance(x, Tensor) or x.dim() != 2 or x.is_sparse:
        raise PartitionError(f"data.x must be a dense 2-D tensor [N, F], got {_describe(x)}")
    num_nodes = x.size(0)
    if not isinstance(y, Tensor) or y.dim() != 1 or y.numel() != num_nodes or y.dtype != torch.long:
        raise PartitionError(f"data.y must be a long tensor of shape [{num_nodes}], got {_describe(y)}")
    if (
        not isinstance(edge_index, Tensor)
        or edge_index.dim() != 2
        or edge_index.size(0) != 2
        or edge_index.dtype != torch.long
    ):
        raise PartitionError(f"data.edge_index must be a long tensor [2, E], got {_describe(edge_index)}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise PartitionError(f"data.edge_index has node ids outside [0, {num_nodes})")
    masks = []
    for key in ("train_mask", "val_mask", "test_mask"):
        mask = getattr(data, key, None)
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != (num_nodes,):
            raise PartitionError(f"data.{key} must be a 1-D bool tensor of shape [{num_nodes}], got {_describe(mask)}")
        masks.append(mask)
    num_classes = getattr(data, "num_classes", None)
    if num_classes is None:
        num_classes = int(y.max()) + 1 if y.numel() else 0
    return GraphTensors(x, y, edge_index, *masks, num_classes=int(num_classes))


def _describe(value: object) -> str:
    if isinstance(value, Tensor):
        return f"{value.dtype} tensor of shape {list(value.shape)}"
    return type(value).__name__


def check_num_clients(num_clients: int, available: int, unit: str) -> None:
    """Every client needs at least one of ``unit`` (nodes, feature columns)."""
    if isinstance(num_clients, bool) or not isinstance(num_clients, int) or num_clients < 1:
        raise PartitionError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    if num_clients > available:
        raise PartitionError(
            f"num_clients={num_clients} is more than the {available} {unit} available; "
            f"use at most {available} clients"
        )


def pair_draws(edge_index: Tensor, num_nodes: int, generator: torch.Generator, per_entry: bool = False) -> Tensor:
    """One U(0, 1) draw per unordered node pair, repeated on each of its entries (both directions).

    Thresholding the draws keeps an undirected graph undirected and never adds a reverse edge to a
    directed one. Draws are indexed by the sorted pair keys, so they do not depend on edge order.
    ``per_entry``: each direction of a pair draws on its own and the pair takes the smaller draw, so a
    threshold keeps the pair while either direction would be kept.
    """
    low = torch.minimum(edge_index[0], edge_index[1])
    high = torch.maximum(edge_index[0], edge_index[1])
    keys, pair_of_edge = torch.unique(low * num_nodes + high, return_inverse=True)
    if per_entry:
        return torch.rand(keys.numel(), 2, generator=generator).amin(dim=1)[pair_of_edge]
    return torch.rand(keys.numel(), generator=generator)[pair_of_edge]


def pair_keep_mask(edge_index: Tensor, num_nodes: int, keep_prob: float, generator: torch.Generator) -> Tensor:
    """Keep each unordered node pair with probability ``keep_prob``; both directions share one draw."""
    return pair_draws(edge_index, num_nodes, generator) < keep_prob


def count_labels(group: Tensor, y: Tensor, num_groups: int, num_classes: int) -> Tensor:
    """[num_groups, num_classes] label histogram per group; labels outside [0, C) are not counted."""
    valid = (y >= 0) & (y < num_classes)
    flat = group[valid] * num_classes + y[valid]
    return torch.bincount(flat, minlength=num_groups * num_classes).view(num_groups, num_classes)


def count_per_group(group: Tensor, num_groups: int, mask: Tensor | None = None) -> list[int]:
    """How many entries fall in each group (optionally only where ``mask`` is set)."""
    selected = group if mask is None else group[mask]
    return torch.bincount(selected, minlength=num_groups).tolist()
