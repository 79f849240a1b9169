"""Subgraph-level (horizontal) partitioning: each client owns a disjoint set of nodes.

Clients keep their intra-client edges and learn only the ids of neighbours across the cut; the
server keeps the node -> client routing table so it can relay cross-client requests (the setting of
Swift-FedGNN, FedAAS and LLCG). The assignment methods span the usual experimental range: METIS
(few cut edges, as in Swift-FedGNN), Louvain communities, Dirichlet label skew, uniform random
(many cut edges) and stratified (FedAAS's iid "shards": every class split equally).

``client_nodes`` says which nodes clients own: all of them; every node but the test nodes (FedAAS's
default: the paper keeps its test set at the server); or (the FedAAS authors' code) the training, or
training and validation, nodes. The others are held out at the server and every edge touching them is
absent from the client shards.
"""

from __future__ import annotations

from functools import partial

import heapq
import math
from collections.abc import Callable

import numpy as np
import pymetis
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import remove_self_loops, subgraph, to_undirected

from fedgl.errors import PartitionError
from fedgl.partition.shards import (
    GraphTensors,
    HorizontalPartition,
    HorizontalShard,
    PartitionStats,
    ServerShard,
    check_num_clients,
    count_labels,
    count_per_group,
    graph_tensors,
    pair_draws,
)

# Dirichlet draws that leave a client empty are redrawn (as in common non-IID benchmarks) at most
# this many times before the settings are reported as infeasible.
_MAX_DIRICHLET_DRAWS = 100
# Louvain communities larger than this multiple of the mean client size are cut into pieces.
_LOUVAIN_CAP = 1.5

# What one edge-drop draw decides: a node pair (both directions), or each direction on its own.
DROP_UNITS = ("pair", "entry")

# The nodes clients may own (``client_nodes``), and their name in messages.
_CLIENT_NODES: dict[str, tuple[Callable[[GraphTensors], Tensor], str]] = {
    "all": (lambda g: torch.ones(g.num_nodes, dtype=torch.bool), "nodes"),
    "train": (lambda g: g.train_mask, "training nodes"),
    "train+val": (lambda g: g.train_mask | g.val_mask, "training and validation nodes"),
    "non-test": (lambda g: ~g.test_mask, "nodes outside the test split"),
}


def partition_horizontal(
    data: Data,
    num_clients: int,
    method: str = "metis",
    *,
    seed: int = 0,
    alpha: float = 0.5,
    edge_drop: float = 0.0,
    cross_edge_drop: float = 0.0,
    client_nodes: str = "all",
    drop_unit: str = "pair",
) -> HorizontalPartition:
    """Split the client nodes of ``data`` (``client_nodes``: all, train, train+val, non-test) among
    ``num_clients`` clients; nodes left out get ``owner == -1`` and go to the server shard.

    ``alpha`` is the Dirichlet concentration (method "dirichlet"). ``edge_drop`` removes each
    undirected intra-client edge with that probability, ``cross_edge_drop`` each undirected
    cross-client edge. ``drop_unit`` says what one seeded draw decides: ``pair`` (both directions
    together) or ``entry`` (each direction on its own; the pair stays while either direction does, so
    a drop p removes a pair with probability p², as a per-entry drop then symmetrised would).
    """
    graph = graph_tensors(data)
    if client_nodes not in _CLIENT_NODES:
        raise PartitionError(f"unknown client_nodes {client_nodes!r}; allowed: {', '.join(_CLIENT_NODES)}")
    select, unit = _CLIENT_NODES[client_nodes]
    members = select(graph).nonzero().flatten()
    if client_nodes != "all" and members.numel() == 0:
        raise PartitionError(f"client_nodes={client_nodes!r} selects no node: the data has no {unit}")
    check_num_clients(num_clients, members.numel(), unit)
    if method not in _ASSIGNERS:
        raise PartitionError(f"unknown horizontal method {method!r}; allowed: {', '.join(_ASSIGNERS)}")
    for name, value in (("edge_drop", edge_drop), ("cross_edge_drop", cross_edge_drop)):
        if not 0.0 <= value < 1.0:
            raise PartitionError(f"{name} must be in [0, 1), got {value}")
    if not alpha > 0:
        raise PartitionError(f"alpha must be > 0, got {alpha}")
    if drop_unit not in DROP_UNITS:
        raise PartitionError(f"unknown drop_unit {drop_unit!r}; allowed: {', '.join(DROP_UNITS)}")
    edge_index, y = graph.edge_index, graph.y
    if client_nodes != "all":  # the assigners see the subgraph induced by the client nodes, relabelled
        edge_index = subgraph(members, edge_index, relabel_nodes=True, num_nodes=graph.num_nodes)[0]
        y = y[members]
    assigned = torch.as_tensor(_ASSIGNERS[method](edge_index, y, num_clients, seed, alpha), dtype=torch.long)
    empty = (torch.bincount(assigned, minlength=num_clients) == 0).nonzero().flatten().tolist()
    if empty:
        raise PartitionError(f"method {method!r} left client(s) {empty} without nodes; use fewer clients")
    owner = torch.full((graph.num_nodes,), -1, dtype=torch.long)
    owner[members] = assigned
    return _build(graph, owner, num_clients, method, (edge_drop, cross_edge_drop, drop_unit), seed)


def _assign_metis(edge_index: Tensor, y: Tensor, num_clients: int, seed: int, alpha: float) -> np.ndarray:
    """METIS k-way cut of the undirected, loop-free version of the graph."""
    num_nodes = y.numel()
    if num_clients == 1:
        return np.zeros(num_nodes, dtype=np.int64)
    undirected = to_undirected(remove_self_loops(edge_index)[0], num_nodes=num_nodes)
    row, col = undirected.numpy()
    xadj = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=num_nodes), out=xadj[1:])
    options = pymetis.Options()
    options.seed = seed
    _, parts = pymetis.part_graph(num_clients, adjacency=pymetis.CSRAdjacency(xadj, col), options=options)
    owner = np.asarray(parts, dtype=np.int64)
    empty = int((np.bincount(owner, minlength=num_clients) == 0).sum())
    if empty:
        raise PartitionError(
            f"METIS returned {empty} empty part(s) for num_clients={num_clients} on {num_nodes} nodes; "
            "use fewer clients or method='louvain' or 'random'"
        )
    return owner


def _assign_louvain(edge_index: Tensor, y: Tensor, num_clients: int, seed: int, alpha: float) -> np.ndarray:
    """Louvain communities packed into clients, largest first onto the least-loaded client."""
    import networkx as nx  # 0.15 s to import: only runs that partition by Louvain pay it

    num_nodes = y.numel()
    nx_graph = nx.Graph()
    nx_graph.add_nodes_from(range(num_nodes))
    nx_graph.add_edges_from(edge_index.t().tolist())
    communities = nx.community.louvain_communities(nx_graph, seed=seed)
    members = np.concatenate([np.fromiter(c, dtype=np.int64, count=len(c)) for c in communities])
    community = np.empty(num_nodes, dtype=np.int64)
    community[members] = np.repeat(np.arange(len(communities)), [len(c) for c in communities])
    piece = _cut_large_groups(community, math.ceil(_LOUVAIN_CAP * num_nodes / num_clients))
    piece = _split_until(piece, num_clients)
    return _pack(np.bincount(piece), num_clients)[piece]


def _cut_large_groups(group: np.ndarray, cap: int) -> np.ndarray:
    """Relabel nodes so every group has at most ``cap`` members, cutting big groups into
    near-equal runs of consecutive node ids."""
    sizes = np.bincount(group)
    order = np.argsort(group, kind="stable")
    starts = np.cumsum(sizes) - sizes
    rank = np.empty_like(group)
    rank[order] = np.arange(group.size) - starts[group[order]]
    pieces = -(-sizes // cap)
    offsets = np.cumsum(pieces) - pieces
    return offsets[group] + rank * pieces[group] // sizes[group]


def _split_until(group: np.ndarray, count: int) -> np.ndarray:
    """Halve the largest group until there are at least ``count`` groups, so no client stays empty."""
    group = group.copy()
    while group.max() + 1 < count:
        sizes = np.bincount(group)
        largest = int(sizes.argmax())
        members = np.flatnonzero(group == largest)
        group[members[members.size // 2 :]] = sizes.size
    return group


def _pack(sizes: np.ndarray, num_bins: int) -> np.ndarray:
    """Greedy size-ordered bin packing: each group (largest first) goes to the lightest bin.

    The loop runs over communities (tens to hundreds on citation graphs), not over nodes.
    """
    order = np.argsort(-sizes, kind="stable")
    bins = [(0, b) for b in range(num_bins)]
    assignment = np.empty(sizes.size, dtype=np.int64)
    for group in order.tolist():
        load, target = heapq.heappop(bins)
        assignment[group] = target
        heapq.heappush(bins, (load + int(sizes[group]), target))
    return assignment


def _by_class(label: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The nodes grouped by class, in a random order within each class."""
    shuffled = rng.permutation(label.size)
    return shuffled[np.argsort(label[shuffled], kind="stable")]


def _per_class(rng: np.random.Generator, num_classes: int, num_clients: int, alpha: float) -> np.ndarray:
    """The paper's label skew (FedAAS §7.1): each class's shares over clients ~ Dir(alpha)."""
    return rng.dirichlet(np.full(num_clients, alpha), size=num_classes)


def _per_client(rng: np.random.Generator, num_classes: int, num_clients: int, alpha: float) -> np.ndarray:
    """The FedAAS authors' code's label skew: each client's class mix ~ Dir(alpha), and every class is
    split over clients in proportion to their weights for it."""
    mix = rng.dirichlet(np.full(num_classes, alpha), size=num_clients)
    return (mix / mix.sum(0)).T


def _assign_dirichlet(edge_index: Tensor, y: Tensor, num_clients: int, seed: int, alpha: float,
                      draw: Callable[..., np.ndarray] = _per_class) -> np.ndarray:
    """Label skew: each class is split among clients in Dirichlet proportions (``draw``: [classes, clients])."""
    _, label = np.unique(y.numpy(), return_inverse=True)
    class_sizes = np.bincount(label)
    class_starts = np.cumsum(class_sizes) - class_sizes
    rng = np.random.default_rng(seed)
    for _ in range(_MAX_DIRICHLET_DRAWS):
        order = _by_class(label, rng)
        proportions = draw(rng, class_sizes.size, num_clients, alpha)
        bounds = np.rint(np.cumsum(proportions, axis=1) * class_sizes[:, None]).astype(np.int64)
        bounds[:, -1] = class_sizes
        # Shifted by each class's start, all bounds form one sorted array, so a single search
        # finds every node's client: position p in class c falls in client #(bounds_c <= p).
        flat = (bounds + class_starts[:, None]).ravel()
        positions = np.arange(label.size)
        owner = np.empty(label.size, dtype=np.int64)
        owner[order] = np.searchsorted(flat, positions, side="right") - label[order] * num_clients
        if np.bincount(owner, minlength=num_clients).min() > 0:
            return owner
    raise PartitionError(
        f"dirichlet with alpha={alpha} left some of the {num_clients} clients without nodes in "
        f"{_MAX_DIRICHLET_DRAWS} draws; use a larger alpha or fewer clients"
    )


def _assign_random(edge_index: Tensor, y: Tensor, num_clients: int, seed: int, alpha: float) -> np.ndarray:
    """IID assignment with client sizes differing by at most one."""
    num_nodes = y.numel()
    owner = np.empty(num_nodes, dtype=np.int64)
    owner[np.random.default_rng(seed).permutation(num_nodes)] = np.arange(num_nodes) * num_clients // num_nodes
    return owner


def _assign_stratified(edge_index: Tensor, y: Tensor, num_clients: int, seed: int, alpha: float) -> np.ndarray:
    """IID "shards" (FedAAS): each class, shuffled, is cut into equal shares, one per client, and
    its remainder goes to distinct random clients, so a client's count of a class is within one of
    every other client's."""
    _, label = np.unique(y.numpy(), return_inverse=True)
    rng = np.random.default_rng(seed)
    order = _by_class(label, rng)
    sizes = np.bincount(label)
    rank = np.empty_like(label)
    rank[order] = np.arange(label.size) - (np.cumsum(sizes) - sizes)[label[order]]
    even = (sizes // num_clients * num_clients)[label]  # ranks below this are dealt round-robin
    remainder_clients = rng.permuted(np.tile(np.arange(num_clients), (sizes.size, 1)), axis=1)
    owner = rank % num_clients
    extra = rank >= even
    owner[extra] = remainder_clients[label[extra], rank[extra] - even[extra]]
    return owner


_ASSIGNERS: dict[str, Callable[[Tensor, Tensor, int, int, float], np.ndarray]] = {
    "metis": _assign_metis,
    "louvain": _assign_louvain,
    "dirichlet": _assign_dirichlet,
    "dirichlet-client": partial(_assign_dirichlet, draw=_per_client),
    "random": _assign_random,
    "stratified": _assign_stratified,
}


def _build(
    graph: GraphTensors, owner: Tensor, num_clients: int, method: str, drops: tuple[float, float, str], seed: int,
) -> HorizontalPartition:
    """Cut the graph tensors along ``owner`` (-1: held out) into per-client shards, the server
    shard and the server's routing table; ``drops`` is (edge_drop, cross_edge_drop, drop_unit)."""
    num_nodes = graph.num_nodes
    owned = (owner >= 0).nonzero().flatten()
    owned_owner = owner[owned]
    sizes = torch.bincount(owned_owner, minlength=num_clients)
    nodes_by_client = owned[torch.argsort(owned_owner, stable=True)]
    starts = torch.cumsum(sizes, 0) - sizes
    local_index = torch.full((num_nodes,), -1, dtype=torch.long)
    local_index[nodes_by_client] = torch.arange(owned.numel()) - starts[owner[nodes_by_client]]

    intra_local, intra_counts, cross, cross_counts, before_drop = _cut_edges(
        graph, owner, local_index, num_clients, drops, seed)
    size_list = sizes.tolist()
    node_chunks = torch.split(nodes_by_client, size_list)
    intra_chunks = torch.split(intra_local, intra_counts.tolist(), dim=1)
    cross_chunks = torch.split(cross, cross_counts.tolist(), dim=1)
    shards = [
        HorizontalShard(
            client=m,
            nodes=nodes.clone(),
            x=graph.x[nodes],
            y=graph.y[nodes],
            train_mask=graph.train_mask[nodes],
            val_mask=graph.val_mask[nodes],
            test_mask=graph.test_mask[nodes],
            edge_index=intra_chunks[m].clone(),
            cross_edges=cross_chunks[m].clone(),
        )
        for m, nodes in enumerate(node_chunks)
    ]
    held_out = (owner < 0).nonzero().flatten()
    stats = PartitionStats(
        kind="horizontal",
        parties=[f"client {m}" for m in range(num_clients)],
        num_nodes=num_nodes,
        num_edges=graph.num_edges,
        num_classes=graph.num_classes,
        nodes=size_list,
        features=[graph.num_features] * num_clients,
        intra_edges=intra_counts.tolist(),
        cross_edges=cross_counts.tolist(),
        label_counts=count_labels(owned_owner, graph.y[owned], num_clients, graph.num_classes),
        train=count_per_group(owned_owner, num_clients, graph.train_mask[owned]),
        val=count_per_group(owned_owner, num_clients, graph.val_mask[owned]),
        test=count_per_group(owned_owner, num_clients, graph.test_mask[owned]),
        intra_edges_before_drop=before_drop[0],
        cross_edges_before_drop=before_drop[1],
        held_out=held_out.numel(),
    )
    return HorizontalPartition(shards=shards, owner=owner, local_index=local_index, num_nodes=num_nodes,
                               num_classes=graph.num_classes, method=method, stats=stats,
                               server_shard=_server_shard(graph, held_out) if held_out.numel() else None)


def _cut_edges(graph: GraphTensors, owner: Tensor, local_index: Tensor, num_clients: int,
               drops: tuple[float, float, str], seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor, tuple[list, list]]:
    """The kept intra-client edges in local ids grouped by client, the kept cut entries (target's local
    id, source's global id) grouped by the target's owner, their counts per client, and both counts per
    client before the drop."""
    num_nodes = graph.num_nodes
    src, dst = graph.edge_index
    both_owned = (owner[src] >= 0) & (owner[dst] >= 0)
    intra = both_owned & (owner[src] == owner[dst])
    cut_mask = both_owned & (owner[src] != owner[dst])
    edge_drop, cross_edge_drop, drop_unit = drops
    kept, cut_kept = intra, cut_mask
    if edge_drop > 0 or cross_edge_drop > 0:
        draws = pair_draws(graph.edge_index, num_nodes, torch.Generator().manual_seed(seed),
                           per_entry=drop_unit == "entry")
        kept = intra & (draws < 1.0 - edge_drop)
        cut_kept = cut_mask & (draws < 1.0 - cross_edge_drop)
    intra_edges = graph.edge_index[:, kept]
    intra_owner = owner[intra_edges[0]]
    intra_local = local_index[intra_edges[:, torch.argsort(intra_owner, stable=True)]]

    # A cut entry (remote -> own) is recorded at the owner of its target, the node that aggregates it.
    cut = graph.edge_index[:, cut_kept]
    cut_owner = owner[cut[1]]
    by_node = torch.argsort(cut[1] * num_nodes + cut[0])
    cut_order = by_node[torch.argsort(cut_owner[by_node], stable=True)]
    cross = torch.stack([local_index[cut[1, cut_order]], cut[0, cut_order]])
    before_drop = (torch.bincount(owner[src[intra]], minlength=num_clients).tolist(),
                   torch.bincount(owner[dst[cut_mask]], minlength=num_clients).tolist())
    return (intra_local, torch.bincount(intra_owner, minlength=num_clients), cross,
            torch.bincount(cut_owner, minlength=num_clients), before_drop)


def _server_shard(graph: GraphTensors, nodes: Tensor) -> ServerShard:
    """The held-out nodes (sorted global ids) with every edge among them, in local ids."""
    edge_index = subgraph(nodes, graph.edge_index, relabel_nodes=True, num_nodes=graph.num_nodes)[0]
    return ServerShard(
        nodes=nodes,
        x=graph.x[nodes],
        y=graph.y[nodes],
        train_mask=graph.train_mask[nodes],
        val_mask=graph.val_mask[nodes],
        test_mask=graph.test_mask[nodes],
        edge_index=edge_index,
    )
