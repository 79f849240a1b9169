"""Split first layer for node-level federated learning (nFedGNN, CNFGNN).

A GNN layer written as encoding-then-message-passing (nFedGNN, Appendix B) splits cleanly between
parties: the Update ``x_i W_i`` runs on user i, the aggregation over neighbours and every later
layer on the server, which holds the topology. This module holds both halves:

* ``UserFeatures`` / ``BatchedOptimizer``: the whole user population as batched tensors. User i's
  weight matters only through ``x_i W_i``, so a row of ``W_i`` for a feature that is zero in
  ``x_i`` never changes anything user i sends; each user therefore keeps the rows of its own
  non-zero features (its *support*), stored back to back for all users as one ``[nnz, D]``
  tensor. This is exact (Adam is element-wise, so the kept entries evolve as in a dense ``W_i``)
  and costs ``nnz * D`` floats instead of ``N * F * D`` (PubMed: 63 MB instead of 631 MB for GCN,
  before the optimiser's two moment buffers).
* ``SplitGCN`` / ``SplitGAT``: the server side, taking the users' latent vectors ``[N, D]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.nn import GATConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import add_self_loops, remove_self_loops, softmax

from ..errors import ConfigError
from ..optim import BETAS, EPS, adam_update
from .graph import SparseOperator, dropout

SPLIT_MODELS = ("gcn", "gat")


# ---- the user population ---------------------------------------------------------------------------
@dataclass
class UserFeatures:
    """Every user's non-zero features, sorted by user: entry k is ``x[row[k], col[k]] = val[k]``."""

    row: Tensor
    col: Tensor
    val: Tensor
    num_users: int
    num_features: int

    @classmethod
    def from_dense(cls, x: Tensor, normalize: bool) -> "UserFeatures":
        """``normalize`` divides each user's vector by its sum (Kipf & Welling's preprocessing), a
        purely local step each user can take on its own data."""
        if normalize:
            total = x.sum(dim=1, keepdim=True)
            x = x / torch.where(total == 0, torch.ones_like(total), total)
        row, col = x.nonzero(as_tuple=True)
        return cls(row, col, x[row, col], x.size(0), x.size(1))

    def entries(self, users: Tensor | None) -> Tensor | None:
        """Indices of the listed users' entries (None: every user, every entry); ``users`` ascending."""
        if users is None:
            return None
        if users.numel() > 1 and not bool((users[1:] > users[:-1]).all()):
            raise ValueError("user ids must be strictly increasing")
        member = torch.zeros(self.num_users, dtype=torch.bool)
        member[users] = True
        return member[self.row].nonzero().squeeze(1)

    def positions(self, users: Tensor | None, idx: Tensor | None) -> Tensor:
        """For each selected entry, the position of its user in ``users`` (its row in a message)."""
        if users is None:
            return self.row
        pos = torch.full((self.num_users,), -1, dtype=torch.long)
        pos[users] = torch.arange(users.numel())
        return pos[self.row[idx]]


def pick(t: Tensor, idx: Tensor | None) -> Tensor:
    return t if idx is None else t[idx]


def glorot_bound(fan_in: int, fan_out: int) -> float:
    return math.sqrt(6.0 / (fan_in + fan_out))


def init_support_weights(features: UserFeatures, dim: int, shared: bool, generator: torch.Generator | None = None
                         ) -> tuple[Tensor, Tensor | None]:
    """Glorot-uniform first-layer weights on every user's support.

    ``shared``: every user starts from one dense ``[F, D]`` matrix (returned too); otherwise each
    user draws its own, as separately initialised local models would.
    """
    if shared:
        dense = shared_start(features.num_features, dim, generator)
        return dense[features.col].clone(), dense
    bound = glorot_bound(features.num_features, dim)
    return (torch.rand(features.col.numel(), dim, generator=generator) * 2 - 1) * bound, None


def shared_start(num_features: int, dim: int, generator: torch.Generator | None = None) -> Tensor:
    """The one Glorot-uniform ``[F, D]`` matrix every user starts from under ``user_init: shared``."""
    bound = glorot_bound(num_features, dim)
    return (torch.rand(num_features, dim, generator=generator) * 2 - 1) * bound


def project(features: UserFeatures, weight: Tensor, idx: Tensor | None, pos: Tensor, scale: Tensor | None,
            rows: int) -> Tensor:
    """Latent vectors ``x_i W_i`` of the selected users, as ``[rows, D]``: row i sums user i's feature
    values times its own weight rows (``pos`` is non-decreasing), one weighted sum-bag per user
    (twice as fast as the equivalent CSR product on PubMed's 19,717 users)."""
    val = pick(features.val, idx)
    if scale is not None:
        val = val * scale
    return F.embedding_bag(torch.arange(val.numel()), pick(weight, idx), bag_offsets(pos, rows), mode="sum",
                           per_sample_weights=val)


def bag_offsets(pos: Tensor, rows: int) -> Tensor:
    """Where each of ``rows`` bags starts among entries sorted by bag (``pos`` non-decreasing)."""
    offsets = torch.zeros(rows, dtype=torch.long)
    offsets[1:] = torch.bincount(pos, minlength=rows).cumsum(0)[:-1]
    return offsets


def support_gradient(features: UserFeatures, grad: Tensor, idx: Tensor | None, pos: Tensor,
                     scale: Tensor | None, out: Tensor | None = None) -> Tensor:
    """d(loss)/d(W_i) on the support, from d(loss)/d(latent_i): the outer product ``x_i g_i^T``
    (written into ``out`` when given)."""
    val = pick(features.val, idx)
    if scale is not None:
        val = val * scale
    return torch.index_select(grad, 0, pos, out=out).mul_(val.unsqueeze(1))


def scratch() -> Callable[[int, int, torch.dtype], Tensor]:
    """``get(rows, cols, dtype)``: a ``[rows, cols]`` tensor on storage reused from call to call.

    The users' gradient on their supports is hundreds of MB on PubMed; allocated afresh, it is returned
    to the operating system and faulted back in every round (measured: 0.65 against 0.42 s per nFedGNN
    GAT round of all PubMed users). Being a function, it is left out of checkpoints."""
    held: list[Tensor] = []

    def get(rows: int, cols: int, dtype: torch.dtype) -> Tensor:
        if not held or held[0].numel() < rows * cols or held[0].dtype != dtype:
            held[:] = [torch.empty(rows * cols, dtype=dtype)]
        return held[0][: rows * cols].view(rows, cols)

    return get


class OffsetWeights:
    """Every user's weight as the shared start plus one offset row: ``W_i = c_i W0 + 1 o_i^T`` on its support.

    With one shared start, Adam and decoupled decay, a row of ``W_i`` for a feature of value ``x`` steps by
    ``m / (sqrt(v) + eps / x)`` with ``m, v`` the moments of the latent's gradient ``g_i``: the same vector on
    every row (exactly for binary features, up to Adam's eps otherwise), while the decay shrinks start and
    steps alike (a negative value turns its row's step around). So ``W_i`` stays ``c_i W0`` plus
    ``sign(x_ij) o_i`` on each support row, and a user keeps ``x_i W0``, ``c_i`` and ``o_i`` with Adam's
    moments for ``o_i``: ``N x D`` floats where the rows cost ``nnz x D`` (Amazon Computers at ``D = 256``:
    15 GB against 0.1 GB), and ``x_i W_i = c_i x_i W0 + (sum_j |x_ij|) o_i``.
    """

    def __init__(self, features: UserFeatures, dim: int, kind: str, lr: float, weight_decay: float,
                 generator: torch.Generator | None = None):
        if kind != "adam":
            raise ConfigError("protocol.user_state offset needs train.optimizer adam (an SGD step on a row scales "
                              "with its feature value, so the rows drift apart); set protocol.user_state: rows")
        n = features.num_users
        start = shared_start(features.num_features, dim, generator)
        self.base = F.embedding_bag(features.col, start, bag_offsets(features.row, n), mode="sum",
                                    per_sample_weights=features.val)  # x_i W0, without an [nnz, D] copy
        # a row steps by sign(x_ij) times the offset's step, so its value x_ij weighs the offset by |x_ij|
        self.mass = torch.zeros(n).index_add_(0, features.row, features.val.abs()).unsqueeze(1)
        self.shrink = torch.ones(n, 1)  # c_i: the start's share left by the decay
        self.offset = torch.zeros(n, dim)
        self.decay = 1 - lr * weight_decay
        self.optimizer = BatchedOptimizer(self.offset, torch.arange(n), n, kind, lr, weight_decay, decoupled=True)

    def latents(self, users: Tensor | None) -> Tensor:
        """``x_i W_i`` of the listed users (all if None), in their order."""
        return pick(self.shrink, users) * pick(self.base, users) + pick(self.mass, users) * pick(self.offset, users)

    def step(self, grad: Tensor, users: Tensor | None) -> None:
        """One Adam step of each listed user's offset on the gradient of its latent (consumed)."""
        self.optimizer.step(self.offset, grad, users, users)
        if users is None:
            self.shrink.mul_(self.decay)
        else:
            self.shrink.index_copy_(0, users, self.shrink[users] * self.decay)

    def nbytes(self) -> int:
        tensors = (self.base, self.mass, self.shrink, self.offset)
        return sum(t.element_size() * t.numel() for t in tensors) + self.optimizer.nbytes()


class BatchedOptimizer:
    """Adam or SGD over rows owned by many users, each user with its own step count.

    Each row follows ``torch.optim.Adam``/``SGD`` exactly, so a user's weights evolve as if it ran its
    own optimiser; only participating users' rows and step counts change in a round. Weight decay is
    ``decoupled`` (AdamW: every step shrinks the rows by ``lr * weight_decay``, whatever the gradient's
    scale) or coupled (L2 added to the gradient before Adam's normalisation; the same for SGD).
    """

    def __init__(self, param: Tensor, owner: Tensor, num_owners: int, kind: str, lr: float, weight_decay: float,
                 decoupled: bool = True):
        self.kind, self.lr, self.weight_decay = kind, lr, weight_decay
        self.decoupled = decoupled
        self.owner = owner
        self.steps = torch.zeros(num_owners, dtype=torch.long)
        self.exp_avg = torch.zeros_like(param) if kind == "adam" else None
        self.exp_avg_sq = torch.zeros_like(param) if kind == "adam" else None

    def step(self, param: Tensor, grad: Tensor, idx: Tensor | None, owners: Tensor | None) -> None:
        """Update ``param[idx]`` (all rows if None) whose owners ``owners`` (all if None) take a step.

        ``grad`` is consumed (updated in place)."""
        if idx is None and self.kind == "adam" and bool((self.steps == self.steps[0]).all()):
            # every user at the same step (full participation): one fused pass is the same update
            step = torch.tensor(float(self.steps[0]))
            self.steps += 1
            adam_update([param], [grad], [self.exp_avg], [self.exp_avg_sq], [step], lr=self.lr,
                        weight_decay=self.weight_decay, decoupled=self.decoupled)
            return
        if owners is None:
            self.steps += 1
        else:
            self.steps[owners] += 1
        p = pick(param, idx)
        g = grad
        if self.weight_decay and self.decoupled:
            p.mul_(1 - self.lr * self.weight_decay)
        elif self.weight_decay:
            g = grad.add_(p, alpha=self.weight_decay)
        if self.kind == "sgd":
            p.add_(g, alpha=-self.lr)
        else:
            beta1, beta2 = BETAS
            t = self.steps.double()
            step_size = (self.lr / (1 - beta1**t)).float()[pick(self.owner, idx)].unsqueeze(1)
            correction = (1 - beta2**t).sqrt().float()[pick(self.owner, idx)].unsqueeze(1)
            m = pick(self.exp_avg, idx).lerp_(g, 1 - beta1)
            v = pick(self.exp_avg_sq, idx).mul_(beta2).addcmul_(g, g, value=1 - beta2)
            p.sub_(g.copy_(v).sqrt_().div_(correction).add_(EPS).reciprocal_().mul_(m).mul_(step_size))
            if idx is not None:
                self.exp_avg.index_copy_(0, idx, m)
                self.exp_avg_sq.index_copy_(0, idx, v)
        if idx is not None:
            param.index_copy_(0, idx, p)

    def nbytes(self) -> int:
        buffers = [self.steps] + [b for b in (self.exp_avg, self.exp_avg_sq) if b is not None]
        return sum(b.element_size() * b.numel() for b in buffers)


# ---- the server side ---------------------------------------------------------------------------------
@dataclass
class ServerGraph:
    """The topology as the server's layers use it: edges with self loops, and GCN weights on them.

    ``gcn`` is ``D^-1/2 (A + I) D^-1/2`` as a CSR operator (its transpose kept for the backward pass),
    rebuilt wherever the graph is moved: ten times as fast as a gather and ``index_add_`` over the
    edges, which writes an ``[edges, D]`` copy (Coauthor CS at ``D = 256``: 1.24 s against 0.13 s for
    one product and its gradient)."""

    src: Tensor
    dst: Tensor
    gcn_weight: Tensor
    num_nodes: int
    gcn: SparseOperator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        order = torch.argsort(self.dst, stable=True)
        self.gcn = SparseOperator.from_edges(self.dst[order], self.src[order], self.gcn_weight[order],
                                             self.num_nodes, self.num_nodes)

    @property
    def edge_index(self) -> Tensor:
        return torch.stack([self.src, self.dst])


def prepare_server_graph(edge_index: Tensor, num_nodes: int) -> ServerGraph:
    """Self loops added once; GCN's symmetric normalisation ``D^-1/2 (A + I) D^-1/2`` as in ``GCNConv``."""
    looped, _ = add_self_loops(remove_self_loops(edge_index)[0], num_nodes=num_nodes)
    _, weight = gcn_norm(looped, None, num_nodes, add_self_loops=False)
    return ServerGraph(looped[0], looped[1], weight, num_nodes)


class SplitGCN(nn.Module):
    """GCN whose first layer starts at the aggregation: ``Â Z + b``, then standard GCN layers."""

    def __init__(self, latent_dim: int, hidden: int, out_dim: int, num_layers: int, dropout: float):
        super().__init__()
        self.dropout = dropout
        self.bias0 = nn.Parameter(torch.zeros(latent_dim))
        dims = [latent_dim] + [hidden] * (num_layers - 2) + [out_dim] if num_layers > 1 else []
        self.lins = nn.ModuleList(nn.Linear(a, b, bias=False) for a, b in zip(dims[:-1], dims[1:]))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(b)) for b in dims[1:])
        for lin in self.lins:
            nn.init.xavier_uniform_(lin.weight)

    def forward(self, z: Tensor, graph: ServerGraph) -> Tensor:
        h = graph.gcn @ z + self.bias0
        for lin, bias in zip(self.lins, self.biases):
            h = dropout(F.relu(h), self.dropout, self.training)
            h = graph.gcn @ lin(h) + bias
        return h


class SplitGAT(nn.Module):
    """GAT whose first layer receives per-head projections ``x'_{i,l}`` and does the attention.

    Layer 1: ``ELU(concat_l sum_j alpha^l_ij x'_{j,l} + b)``, with ``alpha^l`` from the server's
    attention vectors (Appendix D, Eq. 9). Later layers are ``GATConv``; the last has one head, as
    in the original Cora GAT.
    """

    def __init__(self, heads: int, head_dim: int, hidden: int, out_dim: int, num_layers: int, dropout: float):
        super().__init__()
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout
        bound = glorot_bound(heads, head_dim)
        self.att_src = nn.Parameter((torch.rand(heads, head_dim) * 2 - 1) * bound)
        self.att_dst = nn.Parameter((torch.rand(heads, head_dim) * 2 - 1) * bound)
        self.bias0 = nn.Parameter(torch.zeros(heads * head_dim))
        width = heads * head_dim
        self.convs = nn.ModuleList(
            [GATConv(width, hidden // heads, heads=heads, dropout=dropout) for _ in range(num_layers - 2)]
            + [GATConv(width, out_dim, heads=1, concat=False, dropout=dropout)]
        )

    def forward(self, z: Tensor, graph: ServerGraph) -> Tensor:
        h = z.view(-1, self.heads, self.head_dim)
        score = (h * self.att_src).sum(-1)[graph.src] + (h * self.att_dst).sum(-1)[graph.dst]
        alpha = softmax(F.leaky_relu(score, 0.2), graph.dst, num_nodes=graph.num_nodes)
        alpha = dropout(alpha, self.dropout, self.training)
        h = torch.zeros_like(h).index_add_(0, graph.dst, alpha.unsqueeze(-1) * h[graph.src])
        h = F.elu(h.reshape(h.size(0), -1) + self.bias0)
        for i, conv in enumerate(self.convs):
            h = conv(dropout(h, self.dropout, self.training), graph.edge_index)
            if i < len(self.convs) - 1:
                h = F.elu(h)
        return h


@dataclass(frozen=True)
class SplitShape:
    """Sizes of a split model: the latent each user sends (``heads`` blocks of ``head_dim``)."""

    name: str
    heads: int
    head_dim: int
    hidden: int
    out_dim: int
    num_layers: int
    dropout: float

    @property
    def latent_dim(self) -> int:
        return self.heads * self.head_dim


def split_shape(name: str, hidden: int, out_dim: int, num_layers: int, dropout: float, options: dict) -> SplitShape:
    """Validate a model config for splitting. As for the centralized backbones, ``hidden`` is a layer's
    total width (GAT: ``heads`` heads of ``hidden // heads``); each user sends ``hidden`` values."""
    name = name.lower()
    if name not in SPLIT_MODELS:
        raise ConfigError(f"model.name {name!r} cannot be split per user; allowed: {', '.join(SPLIT_MODELS)}")
    allowed = {"heads"} if name == "gat" else set()
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"model.options {', '.join(unknown)} not supported by split {name}; "
                          f"allowed: {', '.join(sorted(allowed)) or 'none'}")
    if name == "gcn":
        return SplitShape(name, 1, hidden if num_layers > 1 else out_dim, hidden, out_dim, num_layers, dropout)
    heads = options.get("heads", 8)
    if not isinstance(heads, int) or heads < 1 or hidden % heads:
        raise ConfigError(f"model.options.heads must be an integer >= 1 dividing model.hidden={hidden} (got {heads!r})")
    if num_layers < 2:
        raise ConfigError(f"split gat needs model.layers >= 2 (got {num_layers})")
    return SplitShape(name, heads, hidden // heads, hidden, out_dim, num_layers, dropout)


def build_server_model(shape: SplitShape) -> nn.Module:
    if shape.name == "gcn":
        return SplitGCN(shape.latent_dim, shape.hidden, shape.out_dim, shape.num_layers, shape.dropout)
    return SplitGAT(shape.heads, shape.head_dim, shape.hidden, shape.out_dim, shape.num_layers, shape.dropout)


def laplacian_penalty(z: Tensor, graph: ServerGraph, heads: int, per_head: bool) -> Tensor:
    """Eq. 6: mean over neighbour pairs (self included in the count) of ``||z_i - z_j||^2``.

    ``per_head=False`` first averages a multi-head latent over its heads (the second variant of
    Appendix D); per head, the head terms add up, i.e. the distance of the concatenated latents.
    """
    if not per_head and heads > 1:
        z = z.view(z.size(0), heads, -1).mean(1)
    diff = z[graph.src] - z[graph.dst]
    return diff.pow(2).sum() / graph.src.numel()
