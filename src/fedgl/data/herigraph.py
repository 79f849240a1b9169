"""HeriGraph cities (Suzhou, Venice, Amsterdam; GLASU's §5.1) from fedgl's own one-file format.

No PyG loader exists and the Heri-Graphs release is a set of city CSV tables, so fedgl reads one
``numpy`` archive per city, ``herigraph/<City>/raw/<city>.npz``, with the arrays ``x`` (float,
[N, F]: the visual features), ``y`` (int, [N]: the heritage attribute 0-8, -1 where the post has no
valid label) and ``temporal``, ``social``, ``spatial`` (int, [2, E]: each subgraph's edges as node
positions). ``load_dataset`` gives the union of the three subgraphs (GLASU's server and centralized
graph); the processed file also keeps each edge's subgraph as ``edge_type`` (0 temporal, 1 social,
2 spatial) for a partition that hands one subgraph to each client.

GLASU draws 20% of each class for training and 50% for testing; the shipped split here does the same
once, from a fixed seed, with the remaining 30% of each class for validation. Unlabelled posts are in
no split, so other splits are refused (``load_dataset``).
"""

from __future__ import annotations

import os.path as osp

import numpy as np
import torch
from torch_geometric.data import Data, InMemoryDataset

CITIES = ("Suzhou", "Venice", "Amsterdam")
SUBGRAPHS = ("temporal", "social", "spatial")
SHARES = (0.2, 0.3, 0.5)
"""Train, validation and test share of each class in the shipped split."""
SPLIT_SEED = 0


def herigraph_file(city: str) -> str:
    return f"raw/{city.lower()}.npz"


def shipped_split(y: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each class's labelled nodes in a fixed random order, cut at ``SHARES`` (truncated per class)."""
    order = torch.randperm(y.numel(), generator=torch.Generator().manual_seed(SPLIT_SEED))
    order = order[y[order] >= 0]
    order = order[torch.argsort(y[order], stable=True)]
    counts = torch.bincount(y[order])
    rank = torch.full_like(y, -1)
    rank[order] = torch.arange(order.numel()) - (torch.cumsum(counts, 0) - counts)[y[order]]
    cuts = torch.cumsum(torch.tensor((0.0, *SHARES), dtype=torch.float64), 0)
    bounds = (cuts * counts[:, None]).long()[y.clamp(min=0)]
    return tuple((y >= 0) & (rank >= bounds[:, i]) & (rank < bounds[:, i + 1]) for i in range(len(SHARES)))


class HeriGraph(InMemoryDataset):
    """One city: the union graph, its visual features and attribute labels, the shipped split."""

    def __init__(self, root: str, name: str) -> None:
        self.name = name
        super().__init__(root)
        self.load(self.processed_paths[0])

    @property
    def raw_dir(self) -> str:
        return osp.join(self.root, self.name, "raw")

    @property
    def processed_dir(self) -> str:
        return osp.join(self.root, self.name, "processed")

    @property
    def raw_file_names(self) -> list[str]:
        return [osp.basename(herigraph_file(self.name))]

    @property
    def processed_file_names(self) -> str:
        return "data.pt"

    def download(self) -> None:
        raise FileNotFoundError(f"HeriGraph has no download; write {osp.join(self.raw_dir, self.raw_file_names[0])} "
                                "in fedgl's format (docs: README, Datasets)")

    def process(self) -> None:
        with np.load(osp.join(self.raw_dir, self.raw_file_names[0])) as archive:
            x = torch.from_numpy(np.asarray(archive["x"], dtype=np.float32))
            y = torch.from_numpy(np.asarray(archive["y"], dtype=np.int64)).view(-1)
            edges = [torch.from_numpy(np.asarray(archive[key], dtype=np.int64)).view(2, -1) for key in SUBGRAPHS]
        if y.numel() != x.size(0):
            raise ValueError(f"y has {y.numel()} entries for {x.size(0)} feature rows")
        if any(e.numel() and (int(e.min()) < 0 or int(e.max()) >= x.size(0)) for e in edges):
            raise ValueError(f"an edge list names a node outside 0..{x.size(0) - 1}")
        edge_type = torch.cat([torch.full((e.size(1),), kind, dtype=torch.long) for kind, e in enumerate(edges)])
        train, val, test = shipped_split(y)
        data = Data(x=x, y=y, edge_index=torch.cat(edges, dim=1), edge_type=edge_type,
                    train_mask=train, val_mask=val, test_mask=test)
        self.save([data], self.processed_paths[0])
