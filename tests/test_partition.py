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

METHODS = ["metis", "louvain", "dirichlet", "random", "stratified"]


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


def _check_horizontal(data: Data, part: HorizontalPartition, num_clients: int, members: torch.Tensor | None = None
                      ) -> None:
    """Disjoint cover of the client nodes (``members``, default all), a routing table with -1 exactly
    for the other nodes, and every edge among client nodes accounted for exactly once."""
    n = data.num_nodes
    members = torch.ones(n, dtype=torch.bool) if members is None else members
    assert part.num_clients == num_clients and part.num_nodes == n
    all_nodes = torch.cat([shard.nodes for shard in part.shards])
    assert torch.equal(torch.sort(all_nodes).values, members.nonzero().flatten())
    assert torch.equal(part.owner >= 0, members) and torch.equal(part.local_index >= 0, members)
    assert bool((part.owner[~members] == -1).all()) and bool((part.local_index[~members] == -1).all())
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
    among = data.edge_index[:, members[data.edge_index[0]] & members[data.edge_index[1]]]
    intra_total = sum(int(s.edge_index.size(1)) for s in part.shards)
    cross_total = sum(int(s.cross_edges.size(1)) for s in part.shards)
    assert intra_total + cross_total == among.size(1)
    assert torch.equal(_keys(torch.cat(recovered, dim=1), n), _keys(among, n))
    stats = part.stats
    assert stats.nodes == [s.num_nodes for s in part.shards]
    assert stats.intra_edges == [int(s.edge_index.size(1)) for s in part.shards]
    assert stats.cross_edges == [int(s.cross_edges.size(1)) for s in part.shards]
    assert int(stats.label_counts.sum()) == int(members.sum())
    assert sum(stats.train) == int((data.train_mask & members).sum())
    assert stats.held_out == int((~members).sum())


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
    if method in ("dirichlet", "random", "stratified"):
        assert not torch.equal(first.owner, partition_horizontal(cora, 10, method, seed=8).owner)


@pytest.mark.parametrize("method", ["dirichlet", "dirichlet-client"])
def test_dirichlet_alpha_controls_label_skew(cora: Data, method: str) -> None:
    entropy = {
        alpha: partition_horizontal(cora, 10, method, alpha=alpha, seed=0).stats.summary()["mean_label_entropy"]
        for alpha in (0.1, 1.0, 100.0)
    }
    uniform = partition_horizontal(cora, 10, "random", seed=0).stats.summary()["mean_label_entropy"]
    assert entropy[0.1] < entropy[1.0] < entropy[100.0]
    assert entropy[0.1] < 0.6 * math.log(7)
    assert entropy[100.0] > 0.9 * uniform


def test_dirichlet_client_draws_each_clients_mix_not_each_classs_spread(cora: Data) -> None:
    """The two label skews differ in what they make uneven: per class (the paper's), a class piles
    up at a few clients, so client sizes spread widely; per client (the authors' code's), every
    client draws a class mix and classes are shared out by those weights, so sizes stay closer."""
    spread = {}
    for method in ("dirichlet", "dirichlet-client"):
        owner = partition_horizontal(cora, 10, method, alpha=0.1, seed=0).owner
        sizes = torch.bincount(owner[owner >= 0], minlength=10).float()
        spread[method] = float(sizes.std() / sizes.mean())
    assert spread["dirichlet-client"] < spread["dirichlet"]


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


def _masked(data: Data, train: int, val: int = 0) -> Data:
    """``data`` with the first ``train`` nodes for training, the next ``val`` for validation."""
    index = torch.arange(data.num_nodes)
    masked = data.clone()
    masked.train_mask, masked.val_mask = index < train, (index >= train) & (index < train + val)
    masked.test_mask = index >= train + val
    return masked


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
        (lambda d: partition_horizontal(d, 2, "spectral"), "allowed: metis, louvain, dirichlet, dirichlet-client, random, stratified"),
        (lambda d: partition_horizontal(d, 2, cross_edge_drop=1.0), "cross_edge_drop must be in [0, 1), got 1.0"),
        (lambda d: partition_horizontal(d, 2, client_nodes="test"), "unknown client_nodes 'test'; allowed: all, train"),
        (lambda d: partition_horizontal(_masked(d, train=0), 2, client_nodes="train"),
         "client_nodes='train' selects no node: the data has no training nodes"),
        (lambda d: partition_horizontal(_masked(d, train=5), 6, "stratified", client_nodes="train"),
         "num_clients=6 is more than the 5 training nodes"),
        (lambda d: partition_horizontal(_masked(d, train=5, val=3), 9, client_nodes="train+val"),
         "num_clients=9 is more than the 8 training and validation nodes"),
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


# ---- FedAAS's setting: clients own a subset of the nodes, stratified shards, the server shard -----------
CLIENT_NODES = {"train": lambda d: d.train_mask, "train+val": lambda d: d.train_mask | d.val_mask,
                "non-test": lambda d: ~d.test_mask}


def _unlabelled(data: Data) -> Data:
    """Half the test nodes moved out of every split, as the nodes a Planetoid split leaves unlabelled."""
    data.test_mask = data.test_mask & (torch.arange(data.num_nodes) % 2 == 0)
    return data


def _intra_and_cross(part: HorizontalPartition) -> tuple[torch.Tensor, torch.Tensor]:
    """Every client's kept intra entries and cross entries (remote -> own), in global ids."""
    intra = torch.cat([s.nodes[s.edge_index] for s in part.shards], dim=1)
    cross = torch.cat([torch.stack([s.cross_edges[1], s.nodes[s.cross_edges[0]]]) for s in part.shards], dim=1)
    return intra, cross


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("client_nodes", list(CLIENT_NODES))
def test_clients_own_exactly_the_client_nodes(method: str, client_nodes: str) -> None:
    data = _unlabelled(_sbm(seed=1))
    members = CLIENT_NODES[client_nodes](data)
    part = partition_horizontal(data, 4, method, seed=2, client_nodes=client_nodes)
    _check_horizontal(data, part, 4, members)
    assert not any(bool(shard.test_mask.any()) for shard in part.shards)
    assert sum(part.stats.test) == 0
    assert sum(part.stats.val) == (0 if client_nodes == "train" else int(data.val_mask.sum()))


@pytest.mark.parametrize("method", METHODS)
def test_train_clients_on_an_all_training_graph_equal_all(method: str) -> None:
    data = _masked(_sbm(), train=150)  # every node trains: the induced-subgraph path must change nothing
    options = {"seed": 1, "edge_drop": 0.3, "cross_edge_drop": 0.2}
    every = partition_horizontal(data, 4, method, **options)
    train = partition_horizontal(data, 4, method, client_nodes="train", **options)
    assert torch.equal(every.owner, train.owner) and train.server_shard is None
    for a, b in zip(every.shards, train.shards):
        assert torch.equal(a.nodes, b.nodes)
        assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.cross_edges, b.cross_edges)


def test_stratified_deals_every_class_within_one() -> None:
    data = _sbm(num_nodes=400, seed=2)
    train_labels = torch.bincount(data.y[data.train_mask], minlength=3)
    for num_clients in (7, 45):  # 45: more clients than some classes have nodes, which is fine
        part = partition_horizontal(data, num_clients, "stratified", seed=5, client_nodes="train")
        counts = torch.stack([torch.bincount(s.y, minlength=3) for s in part.shards])
        assert torch.equal(counts, part.stats.label_counts)
        assert torch.equal(counts.sum(dim=0), train_labels)
        assert bool((counts.max(dim=0).values - counts.min(dim=0).values <= 1).all())
    assert int(train_labels.min()) < 45


def test_edge_drops_are_symmetric_and_each_touches_its_own_kind() -> None:
    data = _sbm(num_nodes=600, seed=3)
    n, src, dst = data.num_nodes, *data.edge_index
    options = {"method": "random", "seed": 4, "client_nodes": "train+val"}
    full = partition_horizontal(data, 4, **options)
    intra0, cross0 = _intra_and_cross(full)
    before = [int((torch.isin(src, s.nodes) & torch.isin(dst, s.nodes)).sum()) for s in full.shards]
    assert full.stats.intra_edges == before and intra0.size(1) > 500
    for edge_drop, cross_edge_drop in ((0.6, 0.0), (0.0, 0.6), (0.6, 0.3)):
        part = partition_horizontal(data, 4, edge_drop=edge_drop, cross_edge_drop=cross_edge_drop, **options)
        assert torch.equal(part.owner, full.owner)
        intra, cross = _intra_and_cross(part)
        for kept, whole, drop in ((intra, intra0, edge_drop), (cross, cross0, cross_edge_drop)):
            assert _is_symmetric(kept, n)
            assert bool(torch.isin(_keys(kept, n), _keys(whole, n)).all())
            assert abs(kept.size(1) / whole.size(1) - (1 - drop)) < 0.06
            if drop == 0:
                assert torch.equal(_keys(kept, n), _keys(whole, n))
        assert part.stats.intra_edges_before_drop == before
        assert part.stats.cross_edges_before_drop == full.stats.cross_edges
        summary = part.stats.summary()
        assert summary["mean_intra_edges"] == intra.size(1) / 4 and summary["cross_edges"] == cross.size(1)
        assert summary["mean_intra_edges_before_drop"] == sum(before) / 4
    again = partition_horizontal(data, 4, edge_drop=0.6, cross_edge_drop=0.3, **options)
    assert all(torch.equal(a, b) for a, b in zip(_intra_and_cross(part), _intra_and_cross(again)))


@pytest.mark.parametrize("client_nodes", list(CLIENT_NODES))
def test_server_shard_holds_the_held_out_nodes_and_the_edges_among_them(client_nodes: str) -> None:
    data = _unlabelled(_sbm(seed=1))
    n, src, dst = data.num_nodes, *data.edge_index
    part = partition_horizontal(data, 3, "stratified", seed=0, client_nodes=client_nodes, edge_drop=0.5,
                                cross_edge_drop=0.5)
    held = ~CLIENT_NODES[client_nodes](data)
    server = part.server_shard
    assert torch.equal(server.nodes, held.nonzero().flatten())
    assert torch.equal(server.nodes, (part.owner == -1).nonzero().flatten())
    for key in ("x", "y", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(getattr(server, key), getattr(data, key)[server.nodes])
    among = data.edge_index[:, held[src] & held[dst]]  # all of them: the drops are the clients'
    assert among.size(1) > 0 and bool((server.edge_index < server.num_nodes).all())
    assert torch.equal(_keys(server.nodes[server.edge_index], n), _keys(among, n))
    assert part.stats.summary()["held_out_nodes"] == server.num_nodes
    assert partition_horizontal(data, 3, "stratified", seed=0).server_shard is None


@pytest.mark.parametrize(("name", "split", "paper_vk"), [("cs", "ratio:0.8,0.1,0.1", 293), ("pubmed", "full", 364),
                                                           ("computers", "ratio-floor:0.8,0.1,0.1", 219)])
def test_fedaas_table1_client_sizes(data_root: Path, name: str, split: str, paper_vk: int) -> None:
    """V_k of FedAAS's Table 1: 50 stratified clients holding training nodes only."""
    from fedgl.data import load_dataset

    data = load_dataset(name, str(data_root), split=split)
    part = partition_horizontal(data, 50, "stratified", seed=0, client_nodes="train", edge_drop=0.99)
    summary = part.stats.summary()
    assert summary["mean_nodes"] == int(data.train_mask.sum()) / 50
    assert abs(summary["mean_nodes"] - paper_vk) <= 1
    assert summary["held_out_nodes"] == int((~data.train_mask).sum())


def test_table1_bench_reports_partition_statistics_without_training(tmp_path: Path) -> None:
    from fedgl.bench.core import run_task, within
    from fedgl.bench.fedaas_table1 import TASKS
    from fedgl.data import load_dataset

    task = TASKS["fedaas-table1"]
    synthetic = {"dataset.name": "synthetic", "dataset.split": "ratio:0.5,0.25,0.25", "dataset.options":
                 {"num_nodes": 600, "num_features": 8}}
    result = run_task(task, tmp_path, seeds=2, only=["pubmed"], overrides=synthetic)
    vk = [partition_horizontal(load_dataset("synthetic", split="ratio:0.5,0.25,0.25", seed=seed, num_nodes=600,
                                            num_features=8), 50, "stratified", seed=seed, client_nodes="train",
                               edge_drop=0.99).stats.summary()["mean_nodes"] for seed in (0, 1)]
    (row,) = result["rows"]
    assert row["mean_nodes"]["mean"] == sum(vk) / 2 and row["mean_nodes"]["paper"] == 364
    assert row["mean_nodes"]["pass"] is False  # 6 nodes per client, not PubMed's 364
    table = (tmp_path / "table.md").read_text()
    assert "| V_k | V_k (paper) | V_k within ±1 |" in table and "| fail |" in table
    assert sorted(p.name for p in (tmp_path / "runs" / "pubmed-seed0").iterdir()) == ["config.yaml", "finished", "summary.json"]

    def untouched(cfg):
        raise AssertionError("a finished run with the same config is reused")

    run_task(dataclasses.replace(task, compute=untouched), tmp_path, seeds=2, only=["pubmed"], overrides=synthetic)
    assert within({"mean": 293.3, "paper": 293}, 1.0) and not within({"mean": 220.04, "paper": 219}, 1.0)
    assert within({"mean": 1.0, "paper": None}, 1.0) is None


def test_table1_single_neighbour_shares_match_a_count_over_the_edges() -> None:
    """The shares of one-node (target, owner) pairs and one-neighbour nodes, counted edge by edge."""
    from collections import Counter

    from fedgl.bench.fedaas_table1 import single_neighbour_shares

    g = torch.Generator().manual_seed(3)
    edges = torch.randint(0, 120, (2, 300), generator=g)
    edges = torch.cat([edges, edges.flip(0)], 1)
    data = Data(x=torch.randn(120, 4), y=torch.randint(0, 3, (120,), generator=g), edge_index=edges,
                train_mask=torch.rand(120, generator=g) < 0.7)
    data.val_mask = ~data.train_mask
    data.test_mask = torch.zeros(120, dtype=torch.bool)
    part = partition_horizontal(data, 6, "random", seed=1, client_nodes="train")
    owner = part.owner.tolist()
    pairs, targets = Counter(), Counter()
    for u, v in {(int(u), int(v)) for u, v in edges.t()}:  # u -> v: v aggregates u
        if owner[u] >= 0 and owner[v] >= 0 and owner[u] != owner[v]:
            pairs[(v, owner[u])] += 1
            targets[v] += 1
    shares = single_neighbour_shares(part)
    assert pairs and 0 < shares["single_node_pairs"] < 100
    assert shares["single_node_pairs"] == pytest.approx(100 * sum(c == 1 for c in pairs.values()) / len(pairs))
    assert shares["single_neighbour_nodes"] == pytest.approx(
        100 * sum(c == 1 for c in targets.values()) / len(targets))
