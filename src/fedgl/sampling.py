"""Neighbour sampling on a CSR graph with vectorised torch ops.

pyg-lib and torch-sparse are unavailable, so sampling is written with plain tensor ops: every
layer handles all its destination nodes at once (Floyd's algorithm run for all nodes in step, or
one sort of packed random keys), never looping over nodes. All samplers return the same
``SampledSubgraph`` of bipartite ``Block``s, laid out so PyG bipartite convolutions can consume
them directly: block ``b`` maps ``x_src = h[:b.num_src]`` to ``b.num_dst`` outputs and its
destination nodes are the first ``num_dst`` source nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fedgl import device as devices
from fedgl.errors import ConfigError, DataError

__all__ = [
    "CSR",
    "Block",
    "SampledSubgraph",
    "full_block",
    "full_neighborhood",
    "sample_layerwise",
    "sample_neighbors",
    "sample_weighted",
]


@dataclass(frozen=True, eq=False)
class CSR:
    """In-neighbour lists: row ``v`` holds the sources of the edges ``u -> v``.

    Rows are targets because message passing ``src -> dst`` aggregates over the in-neighbours of
    ``dst``; sampling row ``v`` therefore samples exactly the messages ``v`` receives.
    ``weight`` (optional) is aligned with ``col``.
    """

    rowptr: Tensor
    col: Tensor
    num_nodes: int
    weight: Tensor | None = None

    @classmethod
    def from_edge_index(
        cls, edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None = None
    ) -> CSR:
        """Build from a ``[2, E]`` (source, target) edge list.

        Self loops are dropped (every backbone adds a node's own contribution explicitly) and
        repeated edges are merged, summing their weights; columns are sorted within each row.
        """
        if not isinstance(num_nodes, int) or num_nodes < 0:
            raise DataError(f"num_nodes must be a non-negative int, got {num_nodes!r}")
        if edge_index.dim() != 2 or edge_index.size(0) != 2 or edge_index.is_floating_point():
            raise DataError(
                f"edge_index must be an integer tensor of shape [2, E], got {tuple(edge_index.shape)}"
            )
        edge_index = edge_index.long()
        if edge_index.numel() and (edge_index.min() < 0 or edge_index.max() >= num_nodes):
            raise DataError(f"edge_index holds node ids outside [0, {num_nodes})")
        if edge_weight is not None and edge_weight.shape != (edge_index.size(1),):
            raise DataError(
                f"edge_weight must have shape [{edge_index.size(1)}], got {tuple(edge_weight.shape)}"
            )
        src, dst = edge_index
        loop_free = src != dst
        src, dst = src[loop_free], dst[loop_free]
        key = dst * num_nodes + src
        key, order = torch.sort(key)
        key, inverse = torch.unique_consecutive(key, return_inverse=True)
        weight = None
        if edge_weight is not None:
            weight = edge_weight[loop_free][order]
            weight = weight.new_zeros(key.numel()).index_add_(0, inverse, weight)
        row = torch.div(key, max(num_nodes, 1), rounding_mode="floor")
        rowptr = _exclusive_cumsum(torch.bincount(row, minlength=num_nodes), total=True)
        return cls(rowptr, key - row * num_nodes, num_nodes, weight)

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    def degree(self) -> Tensor:
        """In-degree of every node (self loops excluded)."""
        return self.rowptr.diff()


@dataclass(frozen=True, eq=False)
class Block:
    """One layer's bipartite graph.

    ``edge_index[0]`` are source positions in ``[0, num_src)``, ``edge_index[1]`` destination
    positions in ``[0, num_dst)``, grouped by destination in ascending order. Destination ``i``
    is source ``i``, so a PyG bipartite conv is called as
    ``conv((x_src, x_src[:num_dst]), edge_index, size=(num_src, num_dst))``.
    ``src_degree`` is each source node's in-degree in the sampled graph (what degree-normalised
    layers need); ``edge_weight``, when set, is the aggregation weight of each edge (importance
    sampling) and replaces a layer's own normalisation.
    """

    edge_index: Tensor
    num_src: int
    num_dst: int
    src_degree: Tensor
    edge_weight: Tensor | None = None

    @property
    def size(self) -> tuple[int, int]:
        return self.num_src, self.num_dst


@dataclass(frozen=True, eq=False)
class SampledSubgraph:
    """Computation graph of a mini-batch.

    ``n_id`` lists the global ids of every node touched, seeds first; each block's source nodes
    are a prefix of ``n_id``. ``blocks[0]`` is the input layer and consumes ``x[n_id]``; the last
    block outputs the ``num_seeds`` seed rows.
    """

    n_id: Tensor
    blocks: list[Block]
    num_seeds: int


# A layer selector maps (current nodes, layer setting) to the sampled edges into them:
# (global source ids, local destination positions grouped ascending, optional edge weights).
_Selection = tuple[Tensor, Tensor, Tensor | None]
_Selector = Callable[[Tensor, int], _Selection]


def sample_neighbors(
    csr: CSR,
    seeds: Tensor,
    fanouts: Sequence[int],
    generator: torch.Generator,
    replace: bool = False,
) -> SampledSubgraph:
    """Uniform node-wise (GraphSAGE) sampling.

    ``fanouts[0]`` applies to the layer nearest the seeds; ``-1`` takes every neighbour. Without
    replacement each destination gets exactly ``min(fanout, degree)`` distinct neighbours, drawn
    for all nodes at once with Floyd's algorithm (cost grows with ``fanout²`` per node, not with
    the degree); with replacement it gets ``fanout`` independent draws (none if it has no
    neighbours).
    """
    _check_layers(fanouts, "fanouts", allow_all=True)

    def select(nodes: Tensor, fanout: int) -> _Selection:
        if fanout < 0:
            pos, row, _ = _candidate_edges(csr, nodes)
        elif replace:
            pos, row = _draw_with_replacement(csr, nodes, fanout, generator)
        else:
            pos, row = _draw_without_replacement(csr, nodes, fanout, generator)
        return _take(csr.col, pos), row, None

    return _grow(csr, seeds, fanouts, select)


def full_neighborhood(csr: CSR, seeds: Tensor, num_layers: int) -> SampledSubgraph:
    """Every in-neighbour on every layer: the exact ``num_layers``-hop computation graph."""
    if not isinstance(num_layers, int) or num_layers < 1:
        raise ConfigError(f"num_layers must be an int >= 1, got {num_layers!r}")
    return sample_neighbors(csr, seeds, [-1] * num_layers, devices.generator(seeds.device))  # draws nothing


def sample_weighted(
    csr: CSR,
    seeds: Tensor,
    fanouts: Sequence[int],
    weights: Tensor,
    generator: torch.Generator,
) -> SampledSubgraph:
    """Node-wise sampling without replacement, edges picked with probability proportional to weight.

    ``weights`` is aligned with ``csr.col`` (e.g. ``csr.weight`` or attention scores). Each row keeps
    the ``fanout`` edges with the smallest ``Exp(1) / weight`` keys, which is successive weighted
    sampling without replacement (Efraimidis-Spirakis). Zero-weight edges are never picked, so a
    node gets ``min(fanout, #positive-weight in-edges)`` neighbours; ``-1`` keeps all of those.
    """
    _check_layers(fanouts, "fanouts", allow_all=True)
    if weights.shape != (csr.num_edges,) or not weights.is_floating_point():
        raise ConfigError(f"weights must be a float tensor of shape [{csr.num_edges}] aligned with csr.col")
    if not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
        raise ConfigError("weights must be finite and non-negative")

    def select(nodes: Tensor, fanout: int) -> _Selection:
        pos, row, _ = _candidate_edges(csr, nodes)
        positive = torch.nonzero(_take(weights, pos) > 0).view(-1)
        pos, row = _take(pos, positive), _take(row, positive)
        if fanout >= 0:
            keep = _weighted_subset(row, nodes.numel(), fanout, _take(weights, pos), generator)
            pos, row = _take(pos, keep), _take(row, keep)
        return _take(csr.col, pos), row, None

    return _grow(csr, seeds, fanouts, select)


def sample_layerwise(
    csr: CSR, seeds: Tensor, layer_sizes: Sequence[int], generator: torch.Generator
) -> SampledSubgraph:
    """Layer-wise importance sampling (FastGCN, restricted to the current layer's neighbourhood).

    For the normalised adjacency ``Â = D^-1/2 (A + I) D^-1/2`` (``D`` = in-degree + 1) each layer
    draws ``layer_sizes[l]`` source nodes i.i.d. with ``q(u) ∝ Σ_v Â[v, u]²`` over the layer's
    destination rows (the squared column norm, as in LADIES). Edges to drawn nodes get weight
    ``c_u · Â[v, u] / (s · q(u))`` (``c_u`` = times ``u`` was drawn, ``s`` = draws), so
    ``Σ_u w_vu h_u`` is an unbiased estimate of ``(Â h)_v``. Self loops are candidates too; the
    weights live in ``Block.edge_weight``. Edge weights in ``csr`` are not used.
    """
    _check_layers(layer_sizes, "layer_sizes", allow_all=False)
    degree = csr.degree().to(torch.float32) + 1.0

    def select(nodes: Tensor, size: int) -> _Selection:
        pos, row, _ = _candidate_edges(csr, nodes)
        num_dst = nodes.numel()
        src = torch.cat([_take(csr.col, pos), nodes])
        dst = torch.cat([row, torch.arange(num_dst)])
        a_hat = (_take(degree, _take(nodes, dst)) * _take(degree, src)).rsqrt()
        candidates, inverse = torch.unique(src, return_inverse=True)
        q = torch.zeros(candidates.numel()).index_add_(0, inverse, a_hat.square())
        q = q / q.sum()
        draws = torch.multinomial(q, size, replacement=True, generator=generator)
        hits = _take(torch.bincount(draws, minlength=candidates.numel()), inverse)
        keep = torch.nonzero(hits > 0).view(-1)
        src, dst, inverse = _take(src, keep), _take(dst, keep), _take(inverse, keep)
        weight = _take(hits, keep) * _take(a_hat, keep) / (size * _take(q, inverse))
        order = torch.argsort(dst, stable=True)
        return _take(src, order), _take(dst, order), _take(weight, order)

    return _grow(csr, seeds, layer_sizes, select)


def full_block(csr: CSR) -> Block:
    """The whole graph as one block: every node is a destination with all its in-edges."""
    dst = torch.repeat_interleave(torch.arange(csr.num_nodes), csr.degree())
    return Block(
        edge_index=torch.stack([csr.col, dst]),
        num_src=csr.num_nodes,
        num_dst=csr.num_nodes,
        src_degree=csr.degree(),
    )


def _grow(csr: CSR, seeds: Tensor, settings: Sequence[int], select: _Selector) -> SampledSubgraph:
    """Expand from the seeds one layer at a time, appending new nodes (ascending id) to ``n_id``.

    New nodes are found by marking a global position map, which costs O(num_nodes) per layer
    instead of a sort of all sampled edges.
    """
    n_id = _check_seeds(csr, seeds)
    position = torch.full((csr.num_nodes,), -1, dtype=torch.long)
    position[n_id] = torch.arange(n_id.numel())
    blocks_outward: list[tuple[Tensor, int, int, Tensor | None]] = []
    for setting in settings:
        num_dst = n_id.numel()
        src, dst, weight = select(n_id, setting)
        known = _take(position, src)
        position.index_copy_(0, src, torch.where(known < 0, -2, known))
        new = torch.nonzero(position == -2).view(-1)
        position.index_copy_(0, new, torch.arange(num_dst, num_dst + new.numel()))
        n_id = torch.cat([n_id, new])
        edge_index = torch.stack([_take(position, src), dst])
        blocks_outward.append((edge_index, n_id.numel(), num_dst, weight))
    degree = _take(csr.degree(), n_id)
    blocks = [
        Block(edge_index, num_src, num_dst, degree[:num_src], weight)
        for edge_index, num_src, num_dst, weight in reversed(blocks_outward)
    ]
    return SampledSubgraph(n_id=n_id, blocks=blocks, num_seeds=seeds.numel())


def _candidate_edges(csr: CSR, nodes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """All in-edges of ``nodes``: CSR positions, local row of each (ascending) and row counts."""
    start, counts = _rows(csr, nodes)
    row = torch.repeat_interleave(torch.arange(nodes.numel()), counts)
    shift = start - _exclusive_cumsum(counts)
    return torch.arange(row.numel()) + _take(shift, row), row, counts


def _weighted_subset(
    row: Tensor, num_rows: int, k: int, weight: Tensor, generator: torch.Generator
) -> Tensor:
    """Indices (ascending) of the ``k`` candidates per row with the smallest ``Exp(1) / weight`` keys.

    Rows with at most ``k`` candidates are kept whole and draw no keys. For the others, the
    non-negative float32 keys are reinterpreted as int32 (order-preserving) and packed under the
    row id into one int64, so a single sort ranks the candidates of every row at once.
    """
    counts = torch.bincount(row, minlength=num_rows)
    crowded = torch.nonzero(_take(counts, row) > k).view(-1)
    if crowded.numel() == 0:
        return torch.arange(row.numel())
    crowded_row = _take(row, crowded)
    keys = torch.empty(crowded.numel()).exponential_(generator=generator) / _take(weight, crowded)
    packed = (crowded_row << 32) | keys.float().view(torch.int32).long()
    order = torch.argsort(packed)
    crowded_counts = torch.bincount(crowded_row, minlength=num_rows)
    rank = torch.arange(order.numel()) - _take(_exclusive_cumsum(crowded_counts), _take(crowded_row, order))
    order = _take(crowded, order)
    keep = torch.ones(row.numel(), dtype=torch.bool)
    keep[crowded] = False
    keep[order[rank < k]] = True
    return torch.nonzero(keep).view(-1)


def _draw_without_replacement(
    csr: CSR, nodes: Tensor, fanout: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """CSR positions of ``min(fanout, degree)`` distinct uniform in-edges per node, rows ascending."""
    start, counts = _rows(csr, nodes)
    taken = counts.clamp(max=fanout)
    first = _exclusive_cumsum(taken)
    row = torch.repeat_interleave(torch.arange(nodes.numel()), taken)
    offset = torch.arange(row.numel()) - _take(first, row)
    crowded = torch.nonzero(counts > fanout).view(-1)
    if crowded.numel():
        slots = _take(first, crowded)[:, None] + torch.arange(fanout)
        chosen = _floyd(_take(counts, crowded), fanout, generator)
        offset.index_copy_(0, slots.view(-1), chosen.reshape(-1))
    return _take(start, row) + offset, row


def _floyd(sizes: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """For each size ``n > k``, a uniform ``k``-subset of ``range(n)``, as a ``[len, k]`` tensor.

    Floyd's algorithm: step ``i`` draws ``t`` uniform in ``[0, j]`` with ``j = n - k + i`` and takes
    ``t``, or ``j`` if ``t`` was already taken. The loop runs over the ``k`` steps, each step over
    all rows at once.
    """
    uniform = torch.rand(k, sizes.numel(), generator=generator, dtype=torch.float64)
    chosen = torch.empty(k, sizes.numel(), dtype=torch.long)
    for i in range(k):
        upper = sizes - k + i
        draw = torch.minimum((uniform[i] * (upper + 1)).long(), upper)
        taken = (chosen[:i] == draw).any(dim=0)
        chosen[i] = torch.where(taken, upper, draw)
    return chosen.t()


def _draw_with_replacement(
    csr: CSR, nodes: Tensor, fanout: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    start, counts = _rows(csr, nodes)
    rows = torch.nonzero(counts > 0).view(-1)
    start, counts = _take(start, rows)[:, None], _take(counts, rows)[:, None]
    uniform = torch.rand(rows.numel(), fanout, generator=generator, dtype=torch.float64)
    offset = torch.minimum((uniform * counts).long(), counts - 1)
    return (start + offset).view(-1), rows.repeat_interleave(fanout)


def _rows(csr: CSR, nodes: Tensor) -> tuple[Tensor, Tensor]:
    """First CSR position and length of each node's row."""
    start = _take(csr.rowptr, nodes)
    return start, _take(csr.rowptr, nodes + 1) - start


def _take(values: Tensor, index: Tensor) -> Tensor:
    """``values[index]`` for a 1-D index; ``index_select`` is several times faster on CPU."""
    return values.index_select(0, index)


def _exclusive_cumsum(counts: Tensor, total: bool = False) -> Tensor:
    """``[0, c0, c0+c1, ...]``; with ``total`` the grand total is appended (a CSR row pointer)."""
    out = torch.zeros(counts.numel() + 1, dtype=torch.long)
    torch.cumsum(counts, 0, out=out[1:])
    return out if total else out[:-1]


def _check_seeds(csr: CSR, seeds: Tensor) -> Tensor:
    if seeds.dim() != 1 or seeds.is_floating_point() or seeds.dtype == torch.bool:
        raise ConfigError(f"seeds must be a 1-D integer tensor of node ids, got {seeds.dtype} {tuple(seeds.shape)}")
    seeds = seeds.long()
    if seeds.numel() == 0:
        raise ConfigError("seeds must not be empty")
    if seeds.min() < 0 or seeds.max() >= csr.num_nodes:
        raise ConfigError(f"seeds must be node ids in [0, {csr.num_nodes})")
    if torch.unique(seeds).numel() != seeds.numel():
        raise ConfigError("seeds must not contain duplicates")
    return seeds


def _check_layers(values: Sequence[int], what: str, allow_all: bool) -> None:
    allowed = "ints >= 1 or -1 (all neighbours)" if allow_all else "ints >= 1"
    if len(values) == 0:
        raise ConfigError(f"{what} must list one entry per layer ({allowed}), got none")
    for value in values:
        if not isinstance(value, int) or not (value >= 1 or (allow_all and value == -1)):
            raise ConfigError(f"{what} entries must be {allowed}, got {value!r}")
