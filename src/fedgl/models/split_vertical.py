"""The split GNN of vertical federated graph learning (GLASU), as it runs inside one client.

Every client holds a full stack of GNN sub-layers over its own feature block and its own edges; the
server only aggregates the clients' outputs (mean or concatenation) at chosen layers and holds no
parameters. This module is the client's half: its graph in CSR form, the per-layer neighbourhood
sampler, the bipartite blocks a sub-layer runs on (output rows are the nodes of level l+1, input
columns the nodes of level l), the backbones, the aggregation algebra (Agg, Extract and the local
combine that stands in for server aggregation during stale updates) and a forward pass that can stop
at every aggregation level to wait for the server.

Node sets are nested: the nodes of level l+1 always come first in level l (or are found through a
position map where a server union reordered them), so residual and initial-residual rows are gathers,
never loops. Levels run from 0 (input features) to L (the mini-batch).
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterator

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from torch_geometric.utils import softmax

from .. import device as devices
from ..errors import ConfigError
from .graph import SparseOperator, TransposePlan, csr_tensor, dropout
from ..sampling import CSR, sample_neighbors

BACKBONES = ("gcn", "gat", "gcnii", "gcnres")
_BACKBONE_OPTIONS = {"gcn": {}, "gat": {"heads": 4}, "gcnii": {"alpha": 0.1, "theta": 0.5},
                     "gcnres": {"mu": 0.5, "batch_norm": True}}


# ---- a client's graph ------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ClientGraph:
    """One client's edges as in-neighbour lists (CSR over targets) with GCN weights of its own graph.

    ``weight`` holds D^-1/2 (A + I) D^-1/2 for every listed edge and ``self_weight`` its diagonal,
    with degrees counted on this client's edges only, so the rows of a full-neighbourhood block equal
    the client's full-graph GCN rows exactly. ``use_graph=False`` makes every client graph the
    identity (conventional vertical FL, no neighbour aggregation).
    """

    num_nodes: int
    rowptr: Tensor
    col: Tensor
    deg: Tensor
    weight: Tensor
    self_weight: Tensor
    neighbour_weight: Tensor  # sum of ``weight`` over each row
    use_graph: bool = True

    def neighbours(self, targets: Tensor) -> tuple[Tensor, Tensor]:
        """(position of the target in ``targets``, CSR entry) for every in-edge of every target."""
        counts = self.deg[targets]
        seg = torch.repeat_interleave(torch.arange(targets.numel()), counts)
        first = torch.cumsum(counts, 0) - counts
        entry = self.rowptr[targets][seg] + torch.arange(seg.numel()) - first[seg]
        return seg, entry


def client_graph(edge_index: Tensor, num_nodes: int, use_graph: bool = True) -> ClientGraph:
    if not use_graph:
        edge_index = edge_index.new_zeros(2, 0)
    src, dst = edge_index
    keep = src != dst
    key = torch.unique(dst[keep] * num_nodes + src[keep])  # sorted by target, then source
    dst, src = key // num_nodes, key % num_nodes
    deg = torch.bincount(dst, minlength=num_nodes)
    rowptr = torch.cat([deg.new_zeros(1), torch.cumsum(deg, 0)])
    inv = (deg + 1).double().rsqrt()
    weight = (inv[dst] * inv[src]).float()
    neighbour = torch.zeros(num_nodes, dtype=torch.float64).index_add_(0, dst, inv[dst] * inv[src]).float()
    return ClientGraph(num_nodes, rowptr, src, deg, weight, (inv * inv).float(), neighbour, use_graph)


# ---- features ------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class FeatureRows:
    """Rows of a client's feature block: dense, or CSR pieces when the block is sparse (bag-of-words
    blocks are about 1% nonzero), so the input layer costs O(nonzeros) (:func:`linear_in`).

    The backward pass of the input layer multiplies by the transposed rows. Its index structure is
    built once for the client's whole block (one sort) and, for a selection of nodes, restricted from
    it in O(nonzeros) without sorting; ``cache`` holds it, shared by the dropped-out copies.
    """

    dense: Tensor | None
    crow: Tensor | None = None
    col: Tensor | None = None
    val: Tensor | None = None
    parent: "FeatureRows | None" = None  # the rows these were selected from (sparse only)
    nodes: Tensor | None = None  # which of the parent's rows, in order
    cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def select(self, nodes: Tensor) -> "FeatureRows":
        if self.dense is not None:
            return FeatureRows(self.dense[nodes])
        counts = self.crow[nodes + 1] - self.crow[nodes]
        crow = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        seg = torch.repeat_interleave(torch.arange(nodes.numel()), counts)
        entry = torch.arange(seg.numel()) + (self.crow[nodes] - crow[:-1])[seg]
        return FeatureRows(None, crow, self.col[entry], self.val[entry], self, nodes)

    def dropout(self, p: float, training: bool) -> "FeatureRows":
        """Dropout on the entries (on a sparse block, zeros stay zero either way)."""
        if self.dense is not None:
            return FeatureRows(dropout(self.dense, p, training))
        if not training or p == 0.0:
            return self
        return FeatureRows(None, self.crow, self.col, dropout(self.val, p, training), self.parent, self.nodes,
                           self.cache)

    @property
    def num_columns(self) -> int:
        return self.parent.num_columns if self.parent is not None else self.cache["num_columns"]

    def transpose_plan(self) -> TransposePlan:
        """The CSR structure of these rows' transpose (computed on first use, then cached)."""
        if "plan" not in self.cache:
            self.cache["plan"] = (self._restricted_plan() if self.parent is not None
                                  else TransposePlan.of(self.matrix()))
        return self.cache["plan"]

    def _restricted_plan(self) -> TransposePlan:
        """The parent's transpose with only the selected nodes' entries, columns renumbered to their
        positions in the selection; falls back to sorting when the selection repeats a node."""
        parent, nodes = self.parent, self.nodes  # made in backward, where no default device applies
        where = torch.full((parent.crow.numel() - 1,), -1, dtype=torch.long, device=nodes.device)
        rank = torch.arange(nodes.numel(), device=nodes.device)
        where[nodes] = rank
        if not torch.equal(where[nodes], rank):
            return TransposePlan.of(self.matrix())
        up = parent.transpose_plan()
        position = where[up.col]
        keep = position >= 0
        kept = torch.cat([keep.new_zeros(1, dtype=torch.long), torch.cumsum(keep, 0)])
        col = position[keep]
        node = up.col[keep]
        perm = self.crow[col] + up.perm[keep] - parent.crow[node]
        return TransposePlan(kept[up.crow], col, perm)

    def matrix(self) -> Tensor:
        return csr_tensor(self.crow, self.col, self.val, (self.crow.numel() - 1, self.num_columns))

    def operator(self) -> SparseOperator:
        """These rows as a CSR operator whose backward uses the cached transpose structure."""
        return SparseOperator(self.matrix(), self.transpose_plan)


def features(x: Tensor, max_density: float = 0.25) -> FeatureRows:
    """All rows of ``x``, stored sparsely when at most ``max_density`` of its entries are nonzero."""
    x = x.float()
    if x.numel() and (x != 0).float().mean() <= max_density:
        with _quiet():
            csr = x.to_sparse_csr()
        return FeatureRows(None, csr.crow_indices(), csr.col_indices(), csr.values(), cache={"num_columns": x.size(1)})
    return FeatureRows(x)


def linear_in(rows: FeatureRows, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """rows @ weight.T (+ bias); on sparse rows a product over the nonzeros with a contiguous
    transposed weight, whose backward multiplies by the cached transpose of the rows."""
    if rows.dense is not None:
        return F.linear(rows.dense, weight, bias)
    out = rows.operator() @ weight.t()
    return out if bias is None else out + bias


# ---- sampling ------------------------------------------------------------------------------------
def sample_below(graph: ClientGraph, targets: Tensor, fanout: int, method: str) -> Tensor:
    """The node set one level below ``targets``: the targets first, then sampled in-neighbours.

    ``layerwise`` (the paper's Algorithm 2) draws ``fanout * len(targets)`` nodes uniformly without
    replacement from the union of the targets' neighbours; ``nodewise`` (the authors' code,
    GraphSAGE-style, via :func:`fedgl.sampling.sample_neighbors`) draws up to ``fanout`` neighbours per
    target; ``full`` keeps every neighbour. Draws come from the calling party's RNG stream.
    """
    if not graph.use_graph:
        return targets
    if method == "nodewise":
        generator = devices.generator(targets.device).manual_seed(int(torch.randint(2**62, (1,))))
        csr = CSR(graph.rowptr, graph.col, graph.num_nodes)
        return sample_neighbors(csr, targets, [fanout], generator).n_id
    seg, entry = graph.neighbours(targets)
    mark = torch.zeros(graph.num_nodes, dtype=torch.bool)
    mark[graph.col[entry]] = True
    mark[targets] = False
    cand = mark.nonzero().flatten()  # the targets' neighbours outside the targets, ascending
    if method == "layerwise":
        take = min(fanout * targets.numel(), cand.numel())
        cand = cand[torch.randperm(cand.numel())[:take]].sort().values
    return torch.cat([targets, cand])


def positions(nodes: Tensor, within: Tensor, num_nodes: int) -> Tensor:
    """Where each of ``nodes`` sits in ``within`` (every node must be present)."""
    where = torch.full((num_nodes,), -1, dtype=torch.long)
    where[within] = torch.arange(within.numel())
    return where[nodes]


# ---- blocks --------------------------------------------------------------------------------------
@contextmanager
def _quiet() -> Iterator[None]:
    """Silence torch's notices that sparse CSR is beta and that invariant checks are off."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse", category=UserWarning)
        yield


@dataclass(frozen=True, eq=False)
class SublayerGraph:
    """One sub-layer's bipartite graph: ``row`` indexes output nodes, ``col`` input nodes (self loops
    included), ``out_pos`` the position of every output node among the inputs."""

    num_out: int
    num_in: int
    row: Tensor
    col: Tensor
    weight: Tensor
    out_pos: Tensor

    @cached_property
    def operator(self) -> SparseOperator:
        """The block as a CSR operator; its transpose is built on first backward. A block holds no
        repeated pair, so one sort by (row, column) gives the coalesced matrix (the same arrays, so the
        same sums) without building a COO tensor first."""
        order = torch.argsort(self.row * self.num_in + self.col)
        return SparseOperator.from_edges(self.row[order], self.col[order], self.weight[order], self.num_out,
                                         self.num_in)

    def propagate(self, h: Tensor) -> Tensor:
        """Weighted sum over each output node's in-neighbours: A_block @ h."""
        return self.operator @ h

    @property
    def edge_index(self) -> Tensor:
        """Source -> target pairs in PyG's convention (for attention layers)."""
        return torch.stack([self.col, self.row])


def make_block(graph: ClientGraph, out_nodes: Tensor, in_nodes: Tensor, adjacency: str) -> SublayerGraph:
    """The block from ``in_nodes`` (level l) to ``out_nodes`` (level l+1) on the client's edges.

    Every client edge between an output and an input node is kept (Eq. 2 of the paper). ``scaled``
    takes the client's full-graph GCN weights and rescales each row's neighbour part so it sums as in
    the full graph (a row with all its neighbours present is left untouched); ``induced`` normalises
    inside the subgraph induced by ``in_nodes`` with self-loop weight 2, as the authors' code does.
    """
    n_out, n_in, n = out_nodes.numel(), in_nodes.numel(), graph.num_nodes
    where = torch.full((n,), -1, dtype=torch.long)
    where[in_nodes] = torch.arange(n_in)
    out_pos = where[out_nodes]
    if adjacency == "induced":
        seg, entry = graph.neighbours(in_nodes)
        src = where[graph.col[entry]]
        inside = src >= 0
        seg, src = seg[inside], src[inside]
        deg = torch.bincount(seg, minlength=n_in).float() + 2.0
        inv = deg.rsqrt()
        row_of = torch.full((n_in,), -1, dtype=torch.long)
        row_of[out_pos] = torch.arange(n_out)
        rows = row_of[seg]
        mine = rows >= 0
        row, col = rows[mine], src[mine]
        weight = inv[seg[mine]] * inv[col]
        self_weight = 2.0 / deg[out_pos]
    else:
        seg, entry = graph.neighbours(out_nodes)
        src = where[graph.col[entry]]
        inside = src >= 0
        row, col, weight = seg[inside], src[inside], graph.weight[entry[inside]]
        kept = torch.bincount(row, minlength=n_out)
        total = torch.zeros(n_out).index_add_(0, row, weight)
        scale = torch.where(total > 0, graph.neighbour_weight[out_nodes] / total.clamp_min(1e-30), 0.0)
        scale = torch.where(kept == graph.deg[out_nodes], 1.0, scale)
        weight = weight * scale[row]
        self_weight = graph.self_weight[out_nodes]
    ones = torch.arange(n_out)
    return SublayerGraph(n_out, n_in, torch.cat([row, ones]), torch.cat([col, out_pos]),
                 torch.cat([weight, self_weight]), out_pos)


@dataclass(eq=False)
class BatchPlan:
    """A client's node sets for levels 0..L and the blocks between them, for one mini-batch."""

    sets: list[Tensor]
    blocks: list[SublayerGraph]
    num_nodes: int
    _rows: dict[tuple[int, int], Tensor] = field(default_factory=dict, repr=False)

    def rows(self, level: int, within: int) -> Tensor:
        """Positions of level ``level``'s nodes among level ``within``'s (``within`` < ``level``)."""
        if level == within + 1:
            return self.blocks[within].out_pos
        key = (level, within)
        if key not in self._rows:
            self._rows[key] = positions(self.sets[level], self.sets[within], self.num_nodes)
        return self._rows[key]


def make_plan(graph: ClientGraph, sets: list[Tensor], adjacency: str) -> BatchPlan:
    blocks = [make_block(graph, sets[level + 1], sets[level], adjacency) for level in range(len(sets) - 1)]
    return BatchPlan(sets, blocks, graph.num_nodes)


def full_plan(graph: ClientGraph, num_layers: int, adjacency: str) -> BatchPlan:
    """Every node at every level, every edge in every block: inference on the whole graph."""
    everyone = torch.arange(graph.num_nodes)
    block = make_block(graph, everyone, everyone, adjacency)
    return BatchPlan([everyone] * (num_layers + 1), [block] * num_layers, graph.num_nodes)


# ---- aggregation ---------------------------------------------------------------------------------
def aggregate(parts: list[Tensor], how: str) -> Tensor:
    """The server's parameter-free Agg over the clients' outputs H_m^+. The mean is summed in client
    order without stacking the parts first (the same bits as ``stack(parts).mean(0)`` up to 17
    clients, where torch's reduction is sequential too; a third of its time on Coauthor CS)."""
    if how != "mean":
        return torch.cat(parts, dim=1)
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total / len(parts)


def extract(h: Tensor, own: Tensor, m: int, num_clients: int, how: str) -> Tensor:
    """H_{-m}: what the aggregate holds besides client m's own contribution."""
    if how == "mean":
        return h - own / num_clients
    width = own.size(1)
    return torch.cat([h[:, : m * width], torch.zeros_like(own), h[:, (m + 1) * width:]], dim=1)


def combine(rest: Tensor, own: Tensor, m: int, num_clients: int, how: str) -> Tensor:
    """Agg(H_{-m}, H_m^+): the local stand-in for server aggregation; gradients reach ``own`` only."""
    if how == "mean":
        return rest + own / num_clients
    width = own.size(1)
    return torch.cat([rest[:, : m * width], own, rest[:, (m + 1) * width:]], dim=1)


# ---- backbones -----------------------------------------------------------------------------------
def backbone_options(backbone: str, options: dict[str, Any]) -> dict[str, Any]:
    """The backbone's extra settings with defaults filled in; unknown keys are config errors."""
    if backbone not in BACKBONES:
        raise ConfigError(f"model.name {backbone!r} has no split (vertical) version; allowed: {', '.join(BACKBONES)}")
    defaults = _BACKBONE_OPTIONS[backbone]
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        allowed = ", ".join(defaults) or "none"
        raise ConfigError(f"model.options {', '.join(unknown)} not understood by {backbone}; allowed: {allowed}")
    return {**defaults, **options}


def check_width(backbone: str, hidden: int, options: dict[str, Any]) -> None:
    """GAT splits ``hidden`` over its heads, so every sub-layer outputs exactly ``hidden`` columns."""
    heads = options.get("heads", 1)
    if backbone == "gat" and (not isinstance(heads, int) or heads < 1 or hidden % heads):
        raise ConfigError(f"gat needs model.hidden ({hidden}) divisible by model.options.heads ({heads!r})")


class GraphAttention(nn.Module):
    """A GAT layer (Velickovic et al.) on a bipartite block; the same parameters and arithmetic as
    PyG's ``GATConv`` with shared source/target weights, but taking sparse input rows."""

    def __init__(self, in_dim: int, heads: int, channels: int, dropout: float):
        super().__init__()
        self.heads, self.channels, self.dropout = heads, channels, dropout
        self.lin = nn.Linear(in_dim, heads * channels, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, channels))
        self.bias = nn.Parameter(torch.zeros(heads * channels))
        for weight in (self.lin.weight, self.att_src, self.att_dst):
            nn.init.xavier_uniform_(weight)

    def forward(self, h: "FeatureRows | Tensor", block: SublayerGraph) -> Tensor:
        z = _linear(h, self.lin.weight).view(-1, self.heads, self.channels)
        src = (z * self.att_src).sum(-1)
        dst = (z[block.out_pos] * self.att_dst).sum(-1)
        score = F.leaky_relu(src[block.col] + dst[block.row], 0.2)
        alpha = dropout(softmax(score, block.row, num_nodes=block.num_out), self.dropout, self.training)
        out = z.new_zeros(block.num_out, self.heads, self.channels)
        out.index_add_(0, block.row, z[block.col] * alpha[..., None])
        return out.view(block.num_out, -1) + self.bias


def _linear(h: "FeatureRows | Tensor", weight: Tensor) -> Tensor:
    return linear_in(h, weight) if isinstance(h, FeatureRows) else F.linear(h, weight)


def _dropout(h: "FeatureRows | Tensor", p: float, training: bool) -> "FeatureRows | Tensor":
    return h.dropout(p, training) if isinstance(h, FeatureRows) else dropout(h, p, training)


class ClientNet(nn.Module):
    """One client's share of the split GNN: an input projection (GCNII and the residual GCN), L
    sub-layers and, if the client holds labels, its own classifier on H[L].

    With concatenation the input of the layer after an aggregation level (and of the classifier when
    level L is aggregated) is ``num_clients`` times wider; ``wide_levels`` lists those levels. The
    first linear map reads the raw feature rows, sparse or dense.
    """

    def __init__(self, backbone: str, in_dim: int, hidden: int, num_classes: int | None, num_layers: int,
                 dropout: float, options: dict[str, Any], wide_levels: frozenset[int] = frozenset(),
                 num_clients: int = 1):
        super().__init__()
        self.backbone = backbone
        self.dropout = dropout
        self.opts = options
        self.num_layers = num_layers
        projected = backbone in ("gcnii", "gcnres")
        self.project = nn.Linear(in_dim, hidden) if projected else None
        widths = [hidden * (num_clients if level in wide_levels else 1) for level in range(num_layers + 1)]
        widths[0] = hidden if projected else in_dim
        if backbone == "gcn":
            self.lins = nn.ModuleList(nn.Linear(w, hidden, bias=False) for w in widths[:-1])
            self.biases = nn.ParameterList(nn.Parameter(torch.zeros(hidden)) for _ in widths[:-1])
        elif backbone == "gat":
            heads = int(options["heads"])
            self.convs = nn.ModuleList(GraphAttention(w, heads, hidden // heads, dropout) for w in widths[:-1])
        elif backbone == "gcnii":
            self.weights = nn.ParameterList(nn.Parameter(nn.init.xavier_uniform_(torch.empty(w, hidden)))
                                            for w in widths[:-1])
        else:
            self.lins = nn.ModuleList(nn.Linear(w, hidden) for w in widths[:-1])
            self.norms = nn.ModuleList(nn.BatchNorm1d(hidden) if options["batch_norm"] else nn.Identity()
                                       for _ in widths[:-1])
        self.head = nn.Linear(widths[-1], num_classes) if num_classes else None

    def encode(self, x: FeatureRows) -> "FeatureRows | Tensor":
        """Level-0 representation: the projected features, or the raw rows for the first layer."""
        if self.project is None:
            return x
        return F.relu(linear_in(x.dropout(self.dropout, self.training), self.project.weight, self.project.bias))

    def layer(self, l: int, h: "FeatureRows | Tensor", block: SublayerGraph, x0: Tensor | None) -> Tensor:
        """H_m^+[l]: sub-layer ``l`` on the client's block, before any aggregation."""
        h = _dropout(h, self.dropout, self.training)
        if self.backbone == "gcn":
            return F.relu(block.propagate(_linear(h, self.lins[l].weight)) + self.biases[l])
        if self.backbone == "gat":
            return F.elu(self.convs[l](h, block))
        if self.backbone == "gcnii":
            alpha = float(self.opts["alpha"])
            beta = math.log(float(self.opts["theta"]) / (l + 1) + 1)
            out = (1 - alpha) * block.propagate(h) + alpha * x0
            return F.relu(torch.addmm(out, out, self.weights[l], beta=1 - beta, alpha=beta))
        return self.norms[l](F.relu(self.lins[l](block.propagate(h))))

    def skip(self, segment: int, out: Tensor, start: Tensor) -> Tensor:
        """The residual GCN's skip around a segment of layers: mu_b F(H) + (1 - mu_b) H."""
        mu = float(self.opts["mu"]) / (segment + 1)
        return mu * out + (1 - mu) * start

    def classify(self, h: Tensor) -> Tensor:
        return self.head(dropout(h, self.dropout, self.training))


class ForwardPass:
    """A client's forward pass over a plan that pauses at each aggregation level.

    ``run_to(level)`` computes the layers up to ``level`` and returns H_m^+ there; ``resume(h)`` sets
    the (aggregated or locally combined) representation at that level and continues from it. The
    residual GCN's skip spans a segment between two aggregation levels.
    """

    def __init__(self, net: ClientNet, plan: BatchPlan, x: FeatureRows):
        self.net, self.plan, self.x = net, plan, x
        self.h = net.encode(x)
        self.x0 = self.h if net.backbone == "gcnii" else None
        self.level = 0
        self.start = (0, self.h)
        self.segment = 0

    def run_to(self, level: int) -> Tensor:
        plan, h = self.plan, self.h
        for l in range(self.level, level):
            x0 = None if self.x0 is None else self.x0[plan.rows(l + 1, 0)]
            h = self.net.layer(l, h, plan.blocks[l], x0)
        start_level, start_h = self.start
        if self.net.backbone == "gcnres":
            h = self.net.skip(self.segment, h, start_h[plan.rows(level, start_level)])
        self.h, self.level = h, level
        return h

    def resume(self, h: Tensor) -> None:
        self.h = h
        self.start = (self.level, h)
        self.segment += 1


Combiner = Callable[[int, Tensor], Tensor]


def forward_through(net: ClientNet, plan: BatchPlan, x: FeatureRows, levels: list[int], at_level: Combiner) -> Tensor:
    """A full pass to level L, replacing aggregation at each of ``levels`` by ``at_level(level, H_m^+)``."""
    run = ForwardPass(net, plan, x)
    for level in levels:
        run.resume(at_level(level, run.run_to(level)))
    return run.run_to(net.num_layers) if run.level < net.num_layers else run.h
