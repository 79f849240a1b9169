"""Neighbour samplers: structure of the blocks, exact counts, distributions and speed."""

from __future__ import annotations

import time

import pytest
import torch
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import k_hop_subgraph

from fedgl.errors import ConfigError, DataError
from fedgl.sampling import (
    CSR,
    SampledSubgraph,
    full_block,
    full_neighborhood,
    sample_layerwise,
    sample_neighbors,
    sample_weighted,
)

NUM_NODES = 300


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def directed_graph() -> tuple[torch.Tensor, CSR]:
    """Directed graph with varied in-degrees (0 to ~40), no self loops or repeated edges."""
    gen = _generator(0)
    src = torch.randint(0, NUM_NODES, (4000,), generator=gen)
    dst = (torch.rand(4000, generator=gen) ** 2 * NUM_NODES).long()  # skewed in-degrees
    edge_index = torch.stack([src, dst])
    edge_index = edge_index[:, src != dst]
    edge_index = torch.unique(edge_index, dim=1)
    return edge_index, CSR.from_edge_index(edge_index, NUM_NODES)


@pytest.fixture(scope="module")
def seeds() -> torch.Tensor:
    return torch.randperm(NUM_NODES, generator=_generator(1))[:40]


def _global_edges(sub: SampledSubgraph, block_index: int) -> torch.Tensor:
    """Keys ``src * N + dst`` of one block's edges in global ids."""
    block = sub.blocks[block_index]
    src, dst = sub.n_id[block.edge_index[0]], sub.n_id[block.edge_index[1]]
    return src * NUM_NODES + dst


def _check_structure(
    sub: SampledSubgraph, seeds: torch.Tensor, edge_index: torch.Tensor, self_loops: bool = False
) -> None:
    assert torch.equal(sub.n_id[: sub.num_seeds], seeds)
    assert torch.unique(sub.n_id).numel() == sub.n_id.numel()
    assert sub.blocks[-1].num_dst == seeds.numel()
    real = edge_index[0] * NUM_NODES + edge_index[1]
    if self_loops:
        loops = torch.arange(NUM_NODES)
        real = torch.cat([real, loops * NUM_NODES + loops])
    for index, block in enumerate(sub.blocks):
        if index + 1 < len(sub.blocks):
            assert block.num_dst == sub.blocks[index + 1].num_src
        assert block.num_dst <= block.num_src <= sub.n_id.numel()
        src, dst = block.edge_index
        assert src.numel() == 0 or (src.max() < block.num_src and dst.max() < block.num_dst)
        assert torch.all(dst[1:] >= dst[:-1]), "edges must be grouped by destination"
        assert torch.isin(_global_edges(sub, index), real).all(), "sampled a non-edge"
        in_degree = torch.bincount(edge_index[1], minlength=NUM_NODES)
        assert torch.equal(block.src_degree, in_degree[sub.n_id[: block.num_src]])


def test_csr_rows_hold_in_neighbours_without_loops_or_repeats() -> None:
    edge_index = torch.tensor([[1, 2, 2, 3, 0, 0, 4], [0, 0, 0, 0, 2, 0, 4]])
    weight = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    csr = CSR.from_edge_index(edge_index, 5, weight)
    assert csr.rowptr.tolist() == [0, 3, 3, 4, 4, 4]
    assert csr.col.tolist() == [1, 2, 3, 0]  # node 0 receives from 1, 2 (twice), 3; self loops gone
    assert csr.weight.tolist() == [1.0, 5.0, 4.0, 5.0]
    assert csr.degree().tolist() == [3, 0, 1, 0, 0]
    block = full_block(csr)
    assert block.edge_index.tolist() == [[1, 2, 3, 0], [0, 0, 0, 2]]


@pytest.mark.parametrize("replace", [False, True])
def test_uniform_samples_are_real_edges_with_exact_counts(directed_graph, seeds, replace: bool) -> None:
    edge_index, csr = directed_graph
    fanouts = [5, 3]
    sub = sample_neighbors(csr, seeds, fanouts, _generator(2), replace=replace)
    _check_structure(sub, seeds, edge_index)
    for block, fanout in zip(reversed(sub.blocks), fanouts):
        degree = block.src_degree[: block.num_dst]
        received = torch.bincount(block.edge_index[1], minlength=block.num_dst)
        expected = torch.where(degree > 0, fanout, 0) if replace else degree.clamp(max=fanout)
        assert torch.equal(received, expected)
        if not replace:
            keys = block.edge_index[0] * block.num_dst + block.edge_index[1]
            assert torch.unique(keys).numel() == keys.numel(), "duplicate (src, dst) pair"


def test_full_fanout_matches_k_hop_subgraph(directed_graph, seeds) -> None:
    edge_index, csr = directed_graph
    for hops in (1, 2):
        sub = full_neighborhood(csr, seeds, hops)
        expected, _, _, _ = k_hop_subgraph(seeds, hops, edge_index, num_nodes=NUM_NODES, flow="source_to_target")
        assert torch.equal(torch.sort(sub.n_id).values, expected)
        _check_structure(sub, seeds, edge_index)
        for block in sub.blocks:  # every in-edge of every destination
            received = torch.bincount(block.edge_index[1], minlength=block.num_dst)
            assert torch.equal(received, block.src_degree[: block.num_dst])
    full = full_neighborhood(csr, seeds, 2)
    all_fanouts = sample_neighbors(csr, seeds, [-1, -1], _generator(5))
    assert all(torch.equal(a.edge_index, b.edge_index) for a, b in zip(full.blocks, all_fanouts.blocks))


def test_blocks_feed_pyg_bipartite_convs(directed_graph, seeds) -> None:
    """PyG's SAGEConv on full-neighbourhood blocks reproduces its full-graph output at the seeds."""
    edge_index, csr = directed_graph
    torch.manual_seed(0)
    convs = [SAGEConv(8, 16), SAGEConv(16, 4)]
    x = torch.randn(NUM_NODES, 8)
    full = convs[1](convs[0](x, edge_index).relu(), edge_index)
    sub = full_neighborhood(csr, seeds, 2)
    h = x[sub.n_id]
    for index, (conv, block) in enumerate(zip(convs, sub.blocks)):
        h = conv((h, h[: block.num_dst]), block.edge_index, size=block.size)
        h = h.relu() if index == 0 else h
    assert torch.allclose(h, full[seeds], atol=1e-5)


@pytest.mark.parametrize("sampler", ["uniform", "replace", "weighted", "layerwise"])
def test_sampling_is_reproducible_and_seed_dependent(directed_graph, seeds, sampler: str) -> None:
    _, csr = directed_graph
    weights = torch.rand(csr.num_edges, generator=_generator(3))

    def run(seed: int) -> SampledSubgraph:
        gen = _generator(seed)
        if sampler == "weighted":
            return sample_weighted(csr, seeds, [4, 4], weights, gen)
        if sampler == "layerwise":
            return sample_layerwise(csr, seeds, [30, 60], gen)
        return sample_neighbors(csr, seeds, [4, 4], gen, replace=sampler == "replace")

    def signature(sub: SampledSubgraph) -> list[torch.Tensor]:
        return [sub.n_id] + [block.edge_index for block in sub.blocks]

    first, again, other = signature(run(7)), signature(run(7)), signature(run(8))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert any(a.shape != b.shape or not torch.equal(a, b) for a, b in zip(first, other))


def _star_forest(num_stars: int, leaves: int) -> tuple[CSR, torch.Tensor]:
    """``num_stars`` disjoint stars; centre ``c`` receives from leaves ``c + 1 .. c + leaves``."""
    centres = torch.arange(num_stars) * (leaves + 1)
    src = (centres[:, None] + torch.arange(1, leaves + 1)).reshape(-1)
    dst = centres.repeat_interleave(leaves)
    return CSR.from_edge_index(torch.stack([src, dst]), num_stars * (leaves + 1)), centres


def _leaf_counts(sub: SampledSubgraph, leaves: int) -> torch.Tensor:
    block = sub.blocks[0]
    leaf = sub.n_id[block.edge_index[0]] - sub.n_id[block.edge_index[1]] - 1
    return torch.bincount(leaf, minlength=leaves)


@pytest.mark.parametrize("replace", [False, True])
def test_uniform_sampling_is_uniform_over_neighbours(replace: bool) -> None:
    leaves, fanout = 20, 5
    csr, centres = _star_forest(600, leaves)
    gen = _generator(11)
    counts = sum(_leaf_counts(sample_neighbors(csr, centres, [fanout], gen, replace=replace), leaves) for _ in range(5))
    expected = 5 * centres.numel() * fanout / leaves
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 43.8  # 19 degrees of freedom, p = 0.001


def test_weighted_sampling_follows_the_weights() -> None:
    leaves = 10
    csr, centres = _star_forest(2000, leaves)
    weight_of_leaf = torch.arange(leaves, dtype=torch.float32)  # leaf 0 has weight 0: never picked
    weights = weight_of_leaf.repeat(centres.numel())
    gen = _generator(12)
    sub = sample_weighted(csr, centres, [1], weights, gen)
    counts = _leaf_counts(sub, leaves)
    assert counts[0] == 0
    expected = centres.numel() * weight_of_leaf / weight_of_leaf.sum()
    chi_square = float(((counts[1:] - expected[1:]) ** 2 / expected[1:]).sum())
    assert chi_square < 27.9  # 8 degrees of freedom, p = 0.001
    # Without replacement, larger fanouts still favour heavy edges and never repeat or pick zeros.
    sub = sample_weighted(csr, centres, [4], weights, gen)
    counts = _leaf_counts(sub, leaves)
    assert counts[0] == 0 and torch.all(counts[2:] >= counts[1:-1])
    assert torch.equal(torch.bincount(sub.blocks[0].edge_index[1]), torch.full((centres.numel(),), 4))
    all_positive = sample_weighted(csr, centres, [-1], weights, gen)
    assert all_positive.blocks[0].edge_index.size(1) == centres.numel() * (leaves - 1)


def test_weighted_sampling_keeps_structure(directed_graph, seeds) -> None:
    edge_index, csr = directed_graph
    weights = torch.rand(csr.num_edges, generator=_generator(4))
    weights[::3] = 0.0
    sub = sample_weighted(csr, seeds, [6, 3], weights, _generator(5))
    _check_structure(sub, seeds, edge_index)
    row_of_edge = torch.repeat_interleave(torch.arange(NUM_NODES), csr.degree())
    positive_degree = torch.zeros(NUM_NODES, dtype=torch.long).index_add_(0, row_of_edge, (weights > 0).long())
    for block, fanout in zip(reversed(sub.blocks), [6, 3]):
        received = torch.bincount(block.edge_index[1], minlength=block.num_dst)
        assert torch.equal(received, positive_degree[sub.n_id[: block.num_dst]].clamp(max=fanout))


def _normalised_adjacency(edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
    adj = torch.zeros(num_nodes, num_nodes)
    adj[edge_index[1], edge_index[0]] = 1.0
    adj += torch.eye(num_nodes)
    norm = adj.sum(1).rsqrt()
    return norm[:, None] * adj * norm[None, :]


def test_layerwise_weights_give_unbiased_aggregation() -> None:
    """Monte Carlo mean of ``sum_u w_vu h_u`` matches ``(Â h)_v`` within a few standard errors."""
    gen = _generator(21)
    num_nodes = 30
    edge_index = torch.randint(0, num_nodes, (2, 120), generator=gen)
    edge_index = torch.unique(edge_index[:, edge_index[0] != edge_index[1]], dim=1)
    csr = CSR.from_edge_index(edge_index, num_nodes)
    seeds = torch.tensor([0, 4, 9, 17])
    h = torch.randn(num_nodes, 3, generator=gen)
    exact = (_normalised_adjacency(edge_index, num_nodes) @ h)[seeds]
    estimates = []
    for _ in range(400):
        sub = sample_layerwise(csr, seeds, [8], gen)
        block = sub.blocks[0]
        src, dst = block.edge_index
        message = block.edge_weight[:, None] * h[sub.n_id[src]]
        estimates.append(torch.zeros(block.num_dst, 3).index_add_(0, dst, message))
    estimates = torch.stack(estimates)
    standard_error = estimates.std(0) / len(estimates) ** 0.5
    assert torch.all((estimates.mean(0) - exact).abs() <= 4.0 * standard_error + 1e-4)
    assert float(standard_error.max()) < 0.1 * float(exact.abs().max())  # the check has power


def test_layerwise_blocks_are_well_formed(directed_graph, seeds) -> None:
    edge_index, csr = directed_graph
    sub = sample_layerwise(csr, seeds, [50, 100], _generator(6))
    _check_structure(sub, seeds, edge_index, self_loops=True)
    for block, size in zip(reversed(sub.blocks), [50, 100]):
        assert block.edge_weight is not None and block.edge_weight.shape == (block.edge_index.size(1),)
        assert torch.all(block.edge_weight > 0)
        assert block.num_src - block.num_dst <= size


def test_sampling_100k_nodes_is_fast() -> None:
    """Single-threaded (as a per-process worker would run): on a shared 2-core machine OpenMP
    barriers, not the algorithm, dominate multi-threaded timings of these small kernels."""
    gen = _generator(31)
    num_nodes, num_edges = 100_000, 1_000_000
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
    csr = CSR.from_edge_index(torch.cat([edge_index, edge_index.flip(0)], 1), num_nodes)
    seeds = torch.randperm(num_nodes, generator=gen)[:1024]
    best = float("inf")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(3):
            start = time.perf_counter()
            sub = sample_neighbors(csr, seeds, [15, 10], gen)
            best = min(best, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    assert sub.blocks[-1].edge_index.size(1) == int(csr.degree()[seeds].clamp(max=15).sum())
    assert best < 1.0, f"sampling took {best:.3f} s"


@pytest.mark.parametrize("fanouts", [[], [0], [-2], [3, 1.5]])
def test_bad_fanouts_are_rejected(directed_graph, seeds, fanouts) -> None:
    with pytest.raises(ConfigError, match="fanouts"):
        sample_neighbors(directed_graph[1], seeds, fanouts, _generator(0))


def test_bad_inputs_are_rejected(directed_graph, seeds) -> None:
    _, csr = directed_graph
    with pytest.raises(ConfigError, match="duplicates"):
        sample_neighbors(csr, torch.tensor([1, 1]), [2], _generator(0))
    with pytest.raises(ConfigError, match="node ids"):
        sample_neighbors(csr, torch.tensor([NUM_NODES]), [2], _generator(0))
    with pytest.raises(ConfigError, match="layer_sizes"):
        sample_layerwise(csr, seeds, [-1], _generator(0))
    with pytest.raises(ConfigError, match="non-negative"):
        sample_weighted(csr, seeds, [2], -torch.ones(csr.num_edges), _generator(0))
    with pytest.raises(ConfigError, match="shape"):
        sample_weighted(csr, seeds, [2], torch.ones(3), _generator(0))
    with pytest.raises(DataError, match="outside"):
        CSR.from_edge_index(torch.tensor([[0], [5]]), 5)
    with pytest.raises(DataError, match=r"\[2, E\]"):
        CSR.from_edge_index(torch.zeros(3, 4, dtype=torch.long), 5)
