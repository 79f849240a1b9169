"""Partitioners: every shard holds exactly its share of the graph, nothing more, reproducibly."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from fedgl.errors import PartitionError
from fedgl.partition import (
    HorizontalPartition,
    HorizontalShard,
    partition_horizontal,
    partition_node_level,
    partition_vertical,
)

METHODS = ["metis", "louvain", "dirichlet", "random"]


@pytest.fixture(scope="module")
def cora(tmp_path_factory: pytest.TempPathFactory) -> Data:
    root = os.environ.get("FEDGL_DATA_ROOT")
    if not root:
        pytest.skip("FEDGL_DATA_ROOT is not set; Cora tests need the shared datasets folder")
    from torch_geometric.datasets import Planetoid

    mirror = tmp_path_factory.mktemp("planetoid")
    (mirror / "Cora").mkdir()
    (mirror / "Cora" / "raw").symlink_to(Path(root) / "planetoid" / "Cora" / "raw")
    dataset = Planetoid(root=str(mirror), name="Cora")
    data = dataset[0]
    data.num_classes = dataset.num_classes
    return data


def _graph(
    edge_index: torch.Tensor, num_nodes: int, num_features: int = 8, num_classes: int = 3, seed: int = 0
) -> Data:
    generator = torch.Generator().manual_seed(seed)
    split = torch.rand(num_nodes, generator=generator)
    data = Data(
        x=torch.randn(num_nodes, num_features, generator=generator),
        y=torch.randint(num_classes, (num_nodes,), generator=generator),
        edge_index=edge_index,
        train_mask=split < 0.3,
        val_mask=(split >= 0.3) & (split < 0.5),
        test_mask=split >= 0.5,
    )
    data.num_classes = num_classes
    return data


def _sbm(num_nodes: int = 150, blocks: int = 3, p_in: float = 0.15, p_out: float = 0.01, seed: int = 0) -> Data:
    """Undirected stochastic block model, coalesced, without self loops."""
    generator = torch.Generator().manual_seed(seed)
    block = torch.arange(num_nodes) * blocks // num_nodes
    prob = torch.where(block[:, None] == block[None, :], p_in, p_out)
    upper = torch.triu(torch.rand(num_nodes, num_nodes, generator=generator) < prob, diagonal=1)
    adjacency = upper | upper.t()
    return _graph(adjacency.nonzero().t().contiguous(), num_nodes, seed=seed)


def _keys(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    return torch.sort(edge_index[0] * num_nodes + edge_index[1]).values


def _is_symmetric(edge_index: torch.Tensor, num_nodes: int) -> bool:
    return torch.equal(_keys(edge_index, num_nodes), _keys(edge_index.flip(0), num_nodes))


def _check_horizontal(data: Data, part: HorizontalPartition, num_clients: int) -> None:
    """Disjoint cover, consistent routing table, and every edge accounted for exactly once."""
    n = data.num_nodes
    assert part.num_clients == num_clients and part.num_nodes == n
    all_nodes = torch.cat([shard.nodes for shard in part.shards])
    assert torch.equal(torch.sort(all_nodes).values, torch.arange(n))
    recovered = []
    for m, shard in enumerate(part.shards):
        assert shard.client == m and shard.num_nodes > 0
        assert torch.equal(shard.nodes, torch.sort(shard.nodes).values)
        assert bool((part.owner[shard.nodes] == m).all())
        assert torch.equal(part.local_index[shard.nodes], torch.arange(shard.num_nodes))
        for key in ("x", "y", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(getattr(shard, key), getattr(data, key)[shard.nodes])
        # Intra edges are local ids; cross edges pair an own node with a remote node's global id.
        assert shard.edge_index.dtype == torch.long and shard.cross_edges.dtype == torch.long
        assert bool((shard.edge_index < shard.num_nodes).all())
        recovered.append(shard.nodes[shard.edge_index])
        own, remote = shard.nodes[shard.cross_edges[0]], shard.cross_edges[1]
        assert bool((part.owner[remote] != m).all())
        recovered.append(torch.stack([remote, own]))
    intra_total = sum(int(s.edge_index.size(1)) for s in part.shards)
    cross_total = sum(int(s.cross_edges.size(1)) for s in part.shards)
    assert intra_total + cross_total == data.num_edges
    assert torch.equal(_keys(torch.cat(recovered, dim=1), n), _keys(data.edge_index, n))
    stats = part.stats
    assert stats.nodes == [s.num_nodes for s in part.shards]
    assert stats.intra_edges == [int(s.edge_index.size(1)) for s in part.shards]
    assert stats.cross_edges == [int(s.cross_edges.size(1)) for s in part.shards]
    assert int(stats.label_counts.sum()) == n
    assert sum(stats.train) == int(data.train_mask.sum())


@pytest.mark.parametrize("method", METHODS)
def test_horizontal_cora_covers_graph(cora: Data, method: str) -> None:
    part = partition_horizontal(cora, 10, method, seed=0)
    _check_horizontal(cora, part, 10)
    assert part.method == method


@pytest.mark.parametrize("method", METHODS)
def test_horizontal_synthetic_covers_graph(method: str) -> None:
    data = _sbm()
    _check_horizontal(data, partition_horizontal(data, 4, method, seed=3), 4)


def test_shards_carry_no_remote_data() -> None:
    part = partition_horizontal(_sbm(), 3, "random", seed=0)
    assert {f.name for f in dataclasses.fields(HorizontalShard)} == {
        "client", "nodes", "x", "y", "train_mask", "val_mask", "test_mask", "edge_index", "cross_edges",
    }
    for shard in part.shards:
        assert shard.x.size(0) == shard.num_nodes
        assert shard.cross_edges.size(0) == 2
        assert not bool(torch.isin(shard.cross_edges[1], shard.nodes).any())


def test_metis_cuts_far_fewer_edges_than_random(cora: Data) -> None:
    metis = partition_horizontal(cora, 10, "metis", seed=0).stats.summary()
    louvain = partition_horizontal(cora, 10, "louvain", seed=0).stats.summary()
    random = partition_horizontal(cora, 10, "random", seed=0).stats.summary()
    assert metis["cross_edge_fraction"] < 0.2
    assert louvain["cross_edge_fraction"] < 0.2
    assert random["cross_edge_fraction"] > 0.8  # about 1 - 1/M of the edges are cut
    assert metis["cross_edges"] * 4 < random["cross_edges"]
    assert random["max_nodes"] - random["min_nodes"] <= 1


@pytest.mark.parametrize("method", METHODS)
def test_horizontal_is_seeded(cora: Data, method: str) -> None:
    first = partition_horizontal(cora, 10, method, seed=7, edge_drop=0.2)
    again = partition_horizontal(cora, 10, method, seed=7, edge_drop=0.2)
    assert torch.equal(first.owner, again.owner)
    for a, b in zip(first.shards, again.shards):
        assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.cross_edges, b.cross_edges)
    if method in ("dirichlet", "random"):
        assert not torch.equal(first.owner, partition_horizontal(cora, 10, method, seed=8).owner)


def test_dirichlet_alpha_controls_label_skew(cora: Data) -> None:
    entropy = {
        alpha: partition_horizontal(cora, 10, "dirichlet", alpha=alpha, seed=0).stats.summary()["mean_label_entropy"]
        for alpha in (0.1, 1.0, 100.0)
    }
    uniform = partition_horizontal(cora, 10, "random", seed=0).stats.summary()["mean_label_entropy"]
    assert entropy[0.1] < entropy[1.0] < entropy[100.0]
    assert entropy[0.1] < 0.6 * math.log(7)
    assert entropy[100.0] > 0.9 * uniform


def test_edge_drop_keeps_fraction_symmetrically(cora: Data) -> None:
    full = partition_horizontal(cora, 4, "metis", seed=0)
    dropped = partition_horizontal(cora, 4, "metis", seed=0, edge_drop=0.3)
    assert torch.equal(full.owner, dropped.owner)
    kept = sum(dropped.stats.intra_edges) / sum(full.stats.intra_edges)
    assert abs(kept - 0.7) < 0.03
    for a, b in zip(full.shards, dropped.shards):
        assert _is_symmetric(b.edge_index, b.num_nodes)
        assert bool(torch.isin(_keys(b.edge_index, b.num_nodes), _keys(a.edge_index, a.num_nodes)).all())
        assert torch.equal(a.cross_edges, b.cross_edges)  # only intra-client edges are dropped


def test_directed_graph_entries_are_kept_once() -> None:
    generator = torch.Generator().manual_seed(1)
    n = 60
    edges = torch.randint(n, (2, 400), generator=generator)
    edges = edges[:, edges[0] != edges[1]]
    edges = torch.unique(edges[0] * n + edges[1])
    data = _graph(torch.stack([edges // n, edges % n]), n)
    for method in METHODS:
        _check_horizontal(data, partition_horizontal(data, 3, method, seed=0), 3)
    dropped = partition_horizontal(data, 3, "random", seed=0, edge_drop=0.5)
    for shard in dropped.shards:  # no reverse edge is ever invented
        global_edges = shard.nodes[shard.edge_index]
        assert bool(torch.isin(_keys(global_edges, n), _keys(data.edge_index, n)).all())


def test_louvain_splits_communities_so_no_client_is_empty() -> None:
    # Two dense cliques: Louvain finds two communities, but five clients are asked for.
    block = torch.arange(40) // 20
    adjacency = (block[:, None] == block[None, :]) & ~torch.eye(40, dtype=torch.bool)
    data = _graph(adjacency.nonzero().t().contiguous(), 40)
    part = partition_horizontal(data, 5, "louvain", seed=0)
    _check_horizontal(data, part, 5)
    assert min(part.stats.nodes) >= 4


@pytest.mark.parametrize("blocks", ["contiguous", "random"])
def test_vertical_cora_blocks_and_edges(cora: Data, blocks: str) -> None:
    n, f = cora.num_nodes, cora.num_features
    part = partition_vertical(cora, 3, blocks=blocks, edge_keep=0.8, seed=0)
    columns = [shard.columns for shard in part.shards]
    assert [c.numel() for c in columns] == [478, 478, 477]  # ceil(1433 / 3), remainder last
    assert torch.equal(torch.sort(torch.cat(columns)).values, torch.arange(f))
    if blocks == "contiguous":
        assert torch.equal(columns[1], torch.arange(478, 956))
    edge_sets = []
    for shard in part.shards:
        assert torch.equal(shard.columns, torch.sort(shard.columns).values)
        assert torch.equal(shard.x, cora.x[:, shard.columns])
        assert torch.equal(shard.y, cora.y) and torch.equal(shard.train_mask, cora.train_mask)
        keys = _keys(shard.edge_index, n)
        assert abs(keys.numel() / cora.num_edges - 0.8) < 0.03
        assert _is_symmetric(shard.edge_index, n)
        assert bool(torch.isin(keys, _keys(cora.edge_index, n)).all())
        edge_sets.append(keys)
    assert not torch.equal(edge_sets[0], edge_sets[1])
    assert part.stats.features == [478, 478, 477]
    assert part.stats.intra_edges == [k.numel() for k in edge_sets]


def test_vertical_ten_clients_remainder_block(cora: Data) -> None:
    part = partition_vertical(cora, 10, blocks="random", seed=1)
    assert part.stats.features == [144] * 9 + [137]


def test_vertical_is_seeded() -> None:
    data = _sbm()
    first = partition_vertical(data, 2, blocks="random", seed=5)
    again = partition_vertical(data, 2, blocks="random", seed=5)
    other = partition_vertical(data, 2, blocks="random", seed=6)
    for a, b in zip(first.shards, again.shards):
        assert torch.equal(a.columns, b.columns) and torch.equal(a.edge_index, b.edge_index)
    assert not torch.equal(first.shards[0].edge_index, other.shards[0].edge_index)


def test_vertical_label_holder() -> None:
    data = _sbm()
    part = partition_vertical(data, 3, label_holder=1)
    assert part.label_holder == 1
    assert part.shards[0].y is None and part.shards[2].y is None
    assert torch.equal(part.shards[1].y, data.y)
    assert part.stats.label_counts.sum(dim=1).tolist() == [0, data.num_nodes, 0]


def test_vertical_single_client_is_the_whole_graph(cora: Data) -> None:
    part = partition_vertical(cora, 1, edge_keep=1.0, seed=3)
    (shard,) = part.shards
    assert torch.equal(shard.x, cora.x)
    assert torch.equal(shard.edge_index, cora.edge_index)
    assert torch.equal(shard.y, cora.y)
    for key in ("train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(shard, key), getattr(cora, key))


def test_node_level_server_holds_only_train_labels(cora: Data) -> None:
    part = partition_node_level(cora)
    assert torch.equal(part.user_x, cora.x)
    assert torch.equal(part.edge_index, cora.edge_index)
    assert torch.equal(part.y_train[cora.train_mask], cora.y[cora.train_mask])
    assert bool((part.y_train[~cora.train_mask] == -1).all())
    assert not any(hasattr(part, key) for key in ("y", "val_mask", "test_mask"))
    assert part.stats.label_counts[1].tolist() == [20] * 7  # Planetoid public split
    assert part.stats.train == [0, 140]


def test_stats_rows_and_summary_are_json_ready() -> None:
    data = _sbm()
    for stats in (
        partition_horizontal(data, 3, "metis").stats,
        partition_vertical(data, 2).stats,
        partition_node_level(data).stats,
    ):
        rows = stats.to_rows()
        assert len(rows) == len(stats.parties)
        assert {"party", "nodes", "features", "intra_edges", "cross_edges", "labels", "train"} <= set(rows[0])
        json.dumps(rows)
        json.dumps(stats.summary())
    summary = partition_horizontal(data, 3, "random").stats.summary()
    assert summary["intra_edges"] + summary["cross_edges"] == data.num_edges
    assert summary["cross_edge_fraction"] == summary["cross_edges"] / data.num_edges


def _path(n: int) -> Data:
    forward = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
    return _graph(torch.cat([forward, forward.flip(0)], dim=1), n)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda d: partition_horizontal(d, 0), "num_clients must be an integer >= 1, got 0"),
        (lambda d: partition_horizontal(d, 31), "num_clients=31 is more than the 30 nodes"),
        (lambda d: partition_vertical(d, 9), "num_clients=9 is more than the 8 feature columns"),
        (lambda d: partition_vertical(d, 6), "ceil(F/M)=2 columns cover all F=8 features with 4 clients"),
        (lambda d: partition_vertical(d, 2, edge_keep=0.0), "edge_keep must be in (0, 1], got 0.0"),
        (lambda d: partition_vertical(d, 2, edge_keep=1.5), "edge_keep must be in (0, 1], got 1.5"),
        (lambda d: partition_horizontal(d, 2, edge_drop=1.0), "edge_drop must be in [0, 1), got 1.0"),
        (lambda d: partition_horizontal(d, 2, edge_drop=-0.1), "edge_drop must be in [0, 1), got -0.1"),
        (lambda d: partition_horizontal(d, 2, "dirichlet", alpha=0.0), "alpha must be > 0, got 0.0"),
        (lambda d: partition_horizontal(d, 2, "spectral"), "allowed: metis, louvain, dirichlet, random"),
        (lambda d: partition_vertical(d, 2, blocks="diagonal"), "allowed: contiguous, random"),
        (lambda d: partition_vertical(d, 3, label_holder=3), "a client index in [0, 2], got 3"),
        (lambda d: partition_horizontal(d, 20, "metis"), "METIS returned"),
        (lambda d: partition_horizontal(d, 30, "dirichlet", alpha=0.01), "dirichlet with alpha=0.01 left some"),
        (lambda d: partition_node_level(Data(x=d.x, y=d.y.float(), edge_index=d.edge_index)), "data.y must be a long"),
    ],
)
def test_errors_are_one_line_and_informative(build, message: str) -> None:
    with pytest.raises(PartitionError) as info:
        build(_path(30))
    text = str(info.value)
    assert message in text and "\n" not in text
