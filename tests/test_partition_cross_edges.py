"""The horizontal partition's ``drop_unit``: an edge drop decided per node pair (the default, as every
run before the option) or per directed entry with a pair kept while either direction is (the reading
of FedAAS's 99% cut that gives its Table 1's ΔE)."""

from __future__ import annotations

import math

import pytest
import torch

from fedgl.config import build_config
from fedgl.config.identity import config_hash
from fedgl.data import load_dataset
from fedgl.errors import ConfigError, PartitionError
from fedgl.partition import HorizontalPartition, horizontal_from_config, partition_horizontal

NUM_CLIENTS = 5


@pytest.fixture(scope="module")
def graph():
    return load_dataset("synthetic", split="ratio:0.6,0.2,0.2", num_nodes=600, num_classes=3, avg_degree=12.0,
                        seed=3)


def cross_pairs(part: HorizontalPartition) -> torch.Tensor:
    """The kept cross-client entries as sorted (source * N + target) keys, in global ids."""
    n = part.num_nodes
    keys = torch.cat([s.cross_edges[1] * n + s.nodes[s.cross_edges[0]] for s in part.shards])
    return torch.sort(keys).values


def symmetric(keys: torch.Tensor, n: int) -> bool:
    return torch.equal(keys, torch.sort((keys % n) * n + keys // n).values)


def expected_entry_kept(graph, part: HorizontalPartition, drop: float, seed: int) -> torch.Tensor:
    """The cross-client keys the option specifies: one draw per direction of each node pair (pairs in
    sorted-key order, from the seed's generator), the pair kept when its smaller draw is below 1 - drop."""
    n = graph.num_nodes
    src, dst = graph.edge_index
    low, high = torch.minimum(src, dst), torch.maximum(src, dst)
    pairs, pair_of_edge = torch.unique(low * n + high, return_inverse=True)
    draws = torch.rand(pairs.numel(), 2, generator=torch.Generator().manual_seed(seed)).amin(1)
    owner = part.owner
    cut = (owner[src] >= 0) & (owner[dst] >= 0) & (owner[src] != owner[dst])
    kept = cut & (draws[pair_of_edge] < 1 - drop)
    return torch.sort(src[kept] * n + dst[kept]).values


def test_entry_unit_keeps_exactly_the_specified_cross_edges(graph) -> None:
    for seed, drop in ((0, 0.7), (5, 0.99)):
        part = partition_horizontal(graph, NUM_CLIENTS, "stratified", seed=seed, cross_edge_drop=drop,
                                    drop_unit="entry")
        kept = cross_pairs(part)
        assert torch.equal(kept, expected_entry_kept(graph, part, drop, seed))
        assert symmetric(kept, graph.num_nodes)
        assert part.stats.summary()["cross_edges"] == kept.numel()


@pytest.mark.parametrize("unit, keep", [("pair", lambda p: 1 - p), ("entry", lambda p: 1 - p * p)])
def test_kept_share_follows_the_unit(graph, unit: str, keep) -> None:
    """Over many node pairs the kept share of cross-client entries is 1 - p (pair) or 1 - p² (entry)."""
    drop = 0.8
    whole = partition_horizontal(graph, NUM_CLIENTS, "stratified", seed=1).stats.summary()["cross_edges"]
    part = partition_horizontal(graph, NUM_CLIENTS, "stratified", seed=1, cross_edge_drop=drop, drop_unit=unit)
    pairs = whole / 2
    kept_pairs = part.stats.summary()["cross_edges"] / 2
    sigma = math.sqrt(pairs * keep(drop) * (1 - keep(drop)))
    assert pairs > 2000 and abs(kept_pairs - pairs * keep(drop)) < 4 * sigma


def test_entry_unit_is_deterministic_for_a_seed_and_leaves_ownership_alone(graph) -> None:
    options = {"seed": 2, "edge_drop": 0.5, "cross_edge_drop": 0.9, "drop_unit": "entry"}
    first = partition_horizontal(graph, NUM_CLIENTS, "stratified", **options)
    again = partition_horizontal(graph, NUM_CLIENTS, "stratified", **options)
    other = partition_horizontal(graph, NUM_CLIENTS, "stratified", **(options | {"seed": 3}))
    plain = partition_horizontal(graph, NUM_CLIENTS, "stratified", seed=2)
    assert torch.equal(cross_pairs(first), cross_pairs(again))
    assert all(torch.equal(a.edge_index, b.edge_index) for a, b in zip(first.shards, again.shards))
    assert not torch.equal(cross_pairs(first), cross_pairs(other))
    assert torch.equal(first.owner, plain.owner)
    assert bool(torch.isin(cross_pairs(first), cross_pairs(plain)).all())


def test_pair_unit_is_the_default_and_draws_as_before(graph) -> None:
    """The default draws one U(0, 1) per pair from the seed's generator, as every earlier run did."""
    options = {"seed": 4, "cross_edge_drop": 0.6}
    default = partition_horizontal(graph, NUM_CLIENTS, "random", **options)
    pair = partition_horizontal(graph, NUM_CLIENTS, "random", drop_unit="pair", **options)
    assert torch.equal(cross_pairs(default), cross_pairs(pair))
    n = graph.num_nodes
    src, dst = graph.edge_index
    pairs, pair_of_edge = torch.unique(torch.minimum(src, dst) * n + torch.maximum(src, dst), return_inverse=True)
    draws = torch.rand(pairs.numel(), generator=torch.Generator().manual_seed(4))[pair_of_edge]
    owner = default.owner
    kept = (owner[src] != owner[dst]) & (draws < 0.4)
    assert torch.equal(cross_pairs(default), torch.sort(src[kept] * n + dst[kept]).values)


def test_config_key_keeps_earlier_hashes_and_reaches_the_partition(graph) -> None:
    base = {"dataset": {"name": "synthetic"}, "protocol": {"name": "fedavg"},
            "partition": {"num_clients": NUM_CLIENTS, "method": "stratified", "cross_edge_drop": 0.9}}
    before = build_config(base)
    pair = build_config(base | {"partition": base["partition"] | {"drop_unit": "pair"}})
    entry = build_config(base | {"partition": base["partition"] | {"drop_unit": "entry"}})
    assert config_hash(before) == config_hash(pair) != config_hash(entry)
    from_config = horizontal_from_config(graph, entry.partition, 0)
    direct = partition_horizontal(graph, NUM_CLIENTS, "stratified", seed=0, cross_edge_drop=0.9, drop_unit="entry")
    assert torch.equal(cross_pairs(from_config), cross_pairs(direct))


def test_unknown_unit_is_refused_in_one_line(graph) -> None:
    with pytest.raises(PartitionError, match=r"^unknown drop_unit 'edge'; allowed: pair, entry$"):
        partition_horizontal(graph, NUM_CLIENTS, "random", drop_unit="edge")
    with pytest.raises(ConfigError, match="drop_unit"):
        build_config({"partition": {"drop_unit": "edge"}})


def test_sparse_task_runs_the_three_protocols_on_the_sparse_partition() -> None:
    from fedgl.bench.core import variant_config
    from fedgl.bench.fedaas import TASKS
    from fedgl.bench.fedaas_table1 import TASKS as TABLE1

    task = TASKS["fedaas-sparse-cs"]
    configs = [variant_config(task, variant, 0, {}) for variant in task.variants]
    assert [c.protocol_name for c in configs] == ["fedaas", "fedcross", "fedaas-pns"]
    for cfg in configs:
        assert (cfg.dataset.name, cfg.partition.method, cfg.partition.num_clients) == ("cs", "stratified", 50)
        assert (cfg.partition.drop_unit, cfg.partition.cross_edge_drop, cfg.partition.edge_drop) == ("entry", 0.99, 0.99)
    assert [v.reference["final_test_accuracy"] for v in task.variants] == [95.32, 93.08, 94.24]
    [sparse] = [v for v in TABLE1["fedaas-table1"].variants if v.label == "cs sparse"]
    table1 = variant_config(TABLE1["fedaas-table1"], sparse, 0, {}).partition
    assert table1 == configs[0].partition and sparse.reference["cross_edges"] == 2020
