"""The plain PyG references the performance suite times fedgl against: the same models in
``torch_geometric.nn`` layers, the same optimiser and the same gradient work, written here without
fedgl (full-graph steps, per-client steps, feature blocks, nFedGNN's penalised objective, mini-batches
sampled in plain torch). Each builder returns one step; it is built and stepped on the device its data
is on. The floors at the end time, in plain torch, the work a round cannot skip while it sends what its
paper sends."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

import torch

from fedgl import device as devices


def fast_dropout(x, training: bool, p: float = 0.5):
    """Inverted dropout by a uniform threshold: torch's Bernoulli dropout is several times slower on
    CPU, which would flatter fedgl's ratios (fedgl drops out the same way). On sparse CSR input only
    the stored values are dropped."""
    if not training:
        return x
    if x.layout == torch.sparse_csr:
        values = x.values()
        return torch.sparse_csr_tensor(x.crow_indices(), x.col_indices(), fast_dropout(values, True, p), x.shape)
    return x * (torch.rand_like(x) >= p) / (1 - p)


def pyg_features(x):
    """Bag-of-words features as a sparse CSR tensor, which PyG's layers multiply as such (as fedgl
    does), so the reference does not pay for the zeros; dense features stay dense."""
    return x.to_sparse_csr() if (x != 0).float().mean() <= 0.25 else x


def first_rows(x, k: int):
    """``x[:k]``, also of sparse CSR rows (which cannot be sliced)."""
    if x.layout == torch.strided:
        return x[:k]
    crow = x.crow_indices()
    end = int(crow[k])
    return torch.sparse_csr_tensor(crow[: k + 1], x.col_indices()[:end], x.values()[:end], (k, x.size(1)))


def pyg_stack(kind: str, dims: list[int], heads: int = 8, head: int | None = None):
    """A plain PyG model: one conv per consecutive pair of ``dims``, dropout before each, ReLU between;
    with ``head`` classes a linear classifier after the last conv (ReLU'd too)."""
    from torch_geometric.nn import GATConv, GCNConv, SAGEConv

    def conv(i: int, a: int, b: int):
        last = i == len(dims) - 2
        if kind == "gcn":
            return GCNConv(a, b, cached=True)
        if kind == "sage":
            return SAGEConv(a, b)
        if kind == "gat":
            return GATConv(a, b if last else b // heads, heads=1 if last else heads)
        if kind == "attention":  # FedAAS's layer: one-head attention over the sampled neighbours + a root weight
            return GATConv(a, b, heads=1, add_self_loops=False)
        raise ValueError(kind)

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList(conv(i, a, b) for i, (a, b) in enumerate(zip(dims, dims[1:])))
            self.roots = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(dims, dims[1:])) \
                if kind == "attention" else None
            self.head = torch.nn.Linear(dims[-1], head) if head else None

        def forward(self, x, edges):
            """``edges``: one edge_index for every layer, or one (edge_index, size) block per layer."""
            for i, layer in enumerate(self.convs):
                x = fast_dropout(x, self.training)
                if isinstance(edges, list):
                    edge_index, size = edges[i]
                    out = layer((x, first_rows(x, size[1])), edge_index, size=size)
                    if self.roots is not None:
                        out = out + self.roots[i](first_rows(x, size[1]))
                else:
                    out = layer(x, edges)
                x = out.relu() if i < len(self.convs) - 1 or self.head is not None else out
            return x if self.head is None else self.head(x)

    return Stack()


def pyg_full_graph_step(model, optimizer, x, edge_index, y, mask) -> None:
    import torch.nn.functional as F

    model.train()
    optimizer.zero_grad()
    F.cross_entropy(model(x, edge_index)[mask], y[mask]).backward()
    optimizer.step()


def laplacian_gcn_step(x, edge_index, y, mask, hidden: int, classes: int, lam: float) -> Callable[[], None]:
    """nFedGNN's objective in plain PyG: a two-layer GCN whose first projection z = W x is exposed (the
    users' latents) and penalised by lam times the mean over edges and self loops of ||z_i - z_j||^2."""
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv
    from torch_geometric.utils import add_self_loops

    project = torch.nn.Linear(x.size(1), hidden, bias=False)
    first, second = GCNConv(hidden, hidden, cached=True), GCNConv(hidden, classes, cached=True)
    first.lin = torch.nn.Identity()  # z is already projected
    params = [*project.parameters(), *first.parameters(), *second.parameters()]
    optimizer = torch.optim.Adam(params, lr=0.01)
    pairs, _ = add_self_loops(edge_index, num_nodes=y.numel())

    def step() -> None:
        optimizer.zero_grad()
        z = project(fast_dropout(x, True))
        h = fast_dropout(first(z, edge_index).relu(), True)
        penalty = (z[pairs[0]] - z[pairs[1]]).pow(2).sum() / pairs.size(1)
        (F.cross_entropy(second(h, edge_index)[mask], y[mask]) + lam * penalty).backward()
        optimizer.step()
    return step


def sample_blocks(rowptr, col, batch, fanouts: list[int], generator) -> tuple:
    """Node-wise uniform sampling without replacement (plain torch): the batch's neighbourhood as
    PyG bipartite blocks, input layer first, on the graph's device. Returns (node ids, blocks)."""
    nodes, blocks, device = batch, [], rowptr.device
    for fanout in reversed(fanouts):  # output layer first
        deg = rowptr[nodes + 1] - rowptr[nodes]
        seg = torch.repeat_interleave(torch.arange(nodes.numel(), device=device), deg)
        entry = rowptr[nodes][seg] + torch.arange(seg.numel(), device=device) - (torch.cumsum(deg, 0) - deg)[seg]
        key = seg.double() + torch.rand(seg.numel(), generator=generator, dtype=torch.float64, device=device)
        order = torch.argsort(key)
        seg, entry = seg[order], entry[order]
        rank = torch.arange(seg.numel(), device=device) - (torch.cumsum(deg, 0) - deg)[seg]
        keep = rank < fanout
        seg, src = seg[keep], col[entry[keep]]
        new = torch.unique(src[~torch.isin(src, nodes)])
        below = torch.cat([nodes, new])
        where = torch.full((int(rowptr.numel()) - 1,), -1, dtype=torch.long, device=device)
        where[below] = torch.arange(below.numel(), device=device)
        blocks.append((torch.stack([where[src], seg]), (below.numel(), nodes.numel())))
        nodes = below
    return nodes, blocks[::-1]


def csr_of(edge_index, num_nodes: int):
    order = torch.argsort(edge_index[1] * num_nodes + edge_index[0])
    dst, src = edge_index[1][order], edge_index[0][order]
    rowptr = torch.cat([torch.zeros(1, dtype=torch.long, device=dst.device),
                        torch.bincount(dst, minlength=num_nodes).cumsum(0)])
    return rowptr, src


class MiniBatchReference:
    """Plain PyG mini-batch training: each of ``steps`` clients draws ``batch`` of its training nodes,
    samples their neighbourhood in the graph it trains on and takes one Adam step per call."""

    def __init__(self, data, kind: str, dims: list[int], clients: list, batch: int, fanouts: list[int],
                 graphs: list | None = None, head: int | None = None, sparse: bool = False):
        self.data, self.clients, self.batch, self.fanouts = data, clients, batch, fanouts
        self.graphs = graphs or [csr_of(data.edge_index, data.num_nodes)] * len(clients)
        self.model = pyg_stack(kind, dims, head=head)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.generator = devices.generator(data.x.device).manual_seed(0)  # where the data is
        x = pyg_features(data.x) if sparse else data.x
        self.coo = x.to_sparse_coo() if x.layout == torch.sparse_csr else None

    def rows(self, nodes):
        """The features of ``nodes``; with ``sparse``, sparse rows for sparse features (as fedgl's are)."""
        return self.data.x[nodes] if self.coo is None else self.coo.index_select(0, nodes).to_sparse_csr()

    def step(self, client: int) -> None:
        import torch.nn.functional as F

        train = self.clients[client]
        batch = train[torch.randperm(train.numel(), generator=self.generator)[: self.batch]]
        rowptr, col = self.graphs[client]
        nodes, blocks = sample_blocks(rowptr, col, batch, self.fanouts, self.generator)
        self.model.train()
        self.optimizer.zero_grad()
        out = self.model(self.rows(nodes), blocks)
        F.cross_entropy(out, self.data.y[batch]).backward()
        self.optimizer.step()


# ---- the overhead group's references -------------------------------------------------------------------
@dataclass
class Graph:
    """A dataset as the runs read it (on the CPU) and its copy where the references compute."""

    data: Any
    dev: Any

    @classmethod
    def on(cls, data, device: torch.device) -> Graph:
        return cls(data, devices.move(data, device))

    @cached_property
    def x(self):
        return pyg_features(self.dev.x)

    @property
    def classes(self) -> int:
        return int(self.data.y.max()) + 1


def full_graph(g: Graph) -> Callable[[], None]:
    """One full-graph epoch of a two-layer GCN of width 64."""
    model = pyg_stack("gcn", [g.data.num_features, 64, g.classes])
    opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    return lambda: pyg_full_graph_step(model, opt, g.x, g.dev.edge_index, g.dev.y, g.dev.train_mask)


def per_client(g: Graph, owner, clients: int = 10, epochs: int = 3) -> Callable[[], None]:
    """``epochs`` full-graph epochs of each client's own GCN on its own subgraph (``owner``: the run's
    partition, on the references' device)."""
    from torch_geometric.utils import subgraph

    steps = []
    for k in range(clients):
        nodes = (owner == k).nonzero().flatten()
        edges, _ = subgraph(nodes, g.dev.edge_index, relabel_nodes=True, num_nodes=g.data.num_nodes)
        model = pyg_stack("gcn", [g.data.num_features, 64, g.classes])
        opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
        steps.append((model, opt, pyg_features(g.dev.x[nodes]), edges, g.dev.y[nodes], g.dev.train_mask[nodes]))
    return lambda: [pyg_full_graph_step(*s) for s in steps for _ in range(epochs)]


def feature_blocks(g: Graph, blocks: int = 3) -> Callable[[], None]:
    """Per block of features, a full-graph pass of two GCN layers and a linear head over that block."""
    steps = []
    for cols in torch.arange(g.data.num_features).chunk(blocks):
        model = pyg_stack("gcn", [cols.numel(), 64, 64])
        head = torch.nn.Linear(64, g.classes)
        opt = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=0.01)
        steps.append((model, head, opt, pyg_features(g.dev.x[:, cols].contiguous())))
    mask = g.dev.train_mask

    def step() -> None:
        for model, head, opt, x in steps:
            model.train()
            opt.zero_grad()
            h = fast_dropout(model(x, g.dev.edge_index).relu(), True)
            torch.nn.functional.cross_entropy(head(h)[mask], g.dev.y[mask]).backward()
            opt.step()
    return step


def laplacian(g: Graph, lam: float) -> Callable[[], None]:
    """nFedGNN's objective: ``laplacian_gcn_step`` with GCN 64 and the run's ``lam``."""
    return laplacian_gcn_step(g.x, g.dev.edge_index, g.dev.y, g.dev.train_mask, 64, g.classes, lam)


@dataclass
class HorizontalSplit:
    """A graph's METIS clients as the mini-batch references sample them: each client's training nodes,
    the CSR of the intra-client edges (a client sampling alone) and of the whole graph (a client
    sampling across clients), on the references' device."""

    train: list
    local: tuple
    whole: tuple

    @classmethod
    def of(cls, g: Graph, clients: int = 10) -> HorizontalSplit:
        from fedgl.partition import partition_horizontal

        return cls.of_owner(g, partition_horizontal(g.data, clients, "metis", seed=0).owner)  # the runs' own

    @classmethod
    def of_owner(cls, g: Graph, owner) -> HorizontalSplit:
        """The split of a run's partition, ``owner``: every node's client (any other value: no client's)."""
        data, device = g.data, g.dev.x.device
        train = [((owner == k) & data.train_mask).nonzero().flatten() for k in range(int(owner.max()) + 1)]
        intra = data.edge_index[:, owner[data.edge_index[0]] == owner[data.edge_index[1]]]
        return cls(devices.move(train, device), devices.move(csr_of(intra, data.num_nodes), device),
                   devices.move(csr_of(data.edge_index, data.num_nodes), device))


def sampled(g: Graph, split: HorizontalSplit, cross: int) -> Callable[[], None]:
    """GraphSAGE 256, batch 256, fan-outs 15/10 on every client; the first ``cross`` clients sample their
    neighbours in the whole graph, the others in their own edges."""
    clients = len(split.train)
    graphs = [split.whole] * cross + [split.local] * (clients - cross)
    ref = MiniBatchReference(g.dev, "sage", [g.data.num_features, 256, g.classes], split.train, 256, [15, 10], graphs)
    return lambda: [ref.step(k) for k in range(clients)]


def attention(g: Graph, split: HorizontalSplit, batches: int = 10, sparse: bool = False) -> Callable[[], None]:
    """FedAAS's work: two attention layers (256, 128) with root weights and a linear head, ``batches``
    mini-batches per client over its training nodes, fan-outs 10/10 in the whole graph (``sparse``:
    bag-of-words features as sparse rows)."""
    clients = len(split.train)
    ref = MiniBatchReference(g.dev, "attention", [g.data.num_features, 256, 128], split.train, 0, [10, 10],
                             [split.whole] * clients, head=g.classes, sparse=sparse)
    sizes = [max(1, -(-t.numel() // batches)) for t in split.train]

    def step() -> None:
        for k in range(clients):
            ref.batch = sizes[k]
            for _ in range(batches):
                ref.step(k)
    return step


# ---- floors: the work a round cannot skip while it sends what the paper sends ---------------------------
def upload_floor(users: int, features: int, hidden: int) -> float:
    """Seconds to fill and sum CNFGNN's uploads of a round (messages of at most 1 GiB: ``message_mb``)."""
    per_message = max(1, 2**30 // (4 * features * hidden))
    common = torch.rand(features * hidden)
    storage = torch.zeros(min(users, per_message), features * hidden)
    start = time.perf_counter()
    for first in range(0, users, per_message):
        rows = storage[: min(per_message, users - first)]
        rows.copy_(common.expand_as(rows))
        rows.sum(0)
    return time.perf_counter() - start


def dense_sums_floor(up: int, down: int, width: int, hidden: int, messages: int = 20) -> float:
    """Seconds to write ``up`` bytes of float rows ``width`` wide (in ``messages`` parts), add each row
    into one of the ``down`` bytes of per-target rows, and multiply those by a ``hidden`` x ``width``
    layer forward and for its weight's gradient: FedGNN-G's first layer over sums of feature rows. The
    storage is made and faulted in before the clock starts, as FedGNN-G's owners and server keep theirs."""
    rows, targets = up // (4 * width), down // (4 * width)
    generator = torch.Generator().manual_seed(0)
    target_of = torch.randint(targets, (rows,), generator=generator)
    weight, grad_out = torch.randn(hidden, width, generator=generator), torch.randn(targets, hidden)
    part = -(-rows // messages)
    storage, block = torch.zeros(part, width), torch.zeros(targets, width)  # made once, as the parties keep theirs
    start = time.perf_counter()
    block.zero_()
    for first in range(0, rows, part):
        sums = storage[: min(part, rows - first)].zero_()
        sums[:, 0] = 1.0  # an owner's entries, added into its zeroed sums
        block.index_add_(0, target_of[first:first + part], sums)
    torch.nn.functional.linear(block, weight)
    grad_out.t().mm(block)
    return time.perf_counter() - start
