"""GNN backbones (GCN, GraphSAGE, GAT, GCNII, GIN) built from PyG layers.

Each backbone keeps its PyG convolutions in ``layers`` (their parameters, initialisation and
semantics), but GCN, SAGE, GIN and GCNII layers apply the convolution through a prepared
``GraphInput`` instead of ``conv.forward``: features are transformed before aggregating (linear
maps commute with aggregation), so sparse input features meet a sparse-dense product first, and the
normalised adjacency with its transpose is reused rather than rebuilt per call. Tests check each
layer against the PyG layer's own forward. GAT calls ``GATConv.forward`` directly.

Running layers one at a time (e.g. split learning) follows ``forward``::

    h0 = model.encode(x)
    h = h0
    for l in range(model.num_layers):
        h = model.forward_layer(l, h, graph_or_block, h0)
    logits = model.decode(h)

``encode``/``decode`` are the identity except for GCNII's input and output linear layers, and only
GCNII reads ``h0``. Dropout (drawn from torch's global RNG, like ``F.dropout``) precedes every
layer; the activation follows every layer except the last, whose output is the logits (GCNII
activates every layer and gets its logits from ``decode``). ``forward_layer`` also accepts a
``Block``, which it normalises on the fly, so the same loop runs sampled mini-batches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv, GCN2Conv, GCNConv, GINConv, SAGEConv
from torch_geometric.nn import Linear as PygLinear

from fedgl.errors import ConfigError
from fedgl.models.graph import (
    GRAPH_KINDS,
    GraphInput,
    canonical_model_name,
    feature_dropout,
    feature_linear,
    prepare_block,
)
from fedgl.sampling import Block

__all__ = ["GAT", "GCN", "GCNII", "GIN", "Backbone", "GraphSAGE", "MODEL_NAMES", "build_model"]


class Backbone(nn.Module):
    """A stack of message-passing layers usable full-graph, on sampled blocks or layer by layer."""

    name: ClassVar[str]
    defaults: ClassVar[dict[str, Any]] = {}
    activation: ClassVar[Callable[[Tensor], Tensor]] = staticmethod(F.relu)
    activate_last: ClassVar[bool] = False
    layers: nn.ModuleList

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.dropout = dropout

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def graph_kind(self) -> str:
        return GRAPH_KINDS[self.name]

    def encode(self, x: Tensor) -> Tensor:
        """Input stage before layer 0 (identity unless the backbone has an input map)."""
        return x

    def decode(self, h: Tensor) -> Tensor:
        """Output stage after the last layer (identity unless the backbone has an output map)."""
        return h

    def forward(self, x: Tensor, graph: GraphInput) -> Tensor:
        """Logits for every node of a graph prepared by ``prepare_graph(..., self.name)``."""
        if not isinstance(graph, GraphInput):
            raise ConfigError(
                "model(x, graph) needs a GraphInput from prepare_graph; use forward_blocks for sampled blocks"
            )
        h0 = self.encode(x)
        h = h0
        for index in range(self.num_layers):
            h = self.forward_layer(index, h, graph, h0)
        return self.decode(h)

    def forward_blocks(self, x: Tensor, blocks: Sequence[Block]) -> Tensor:
        """Logits for the seeds of a sampled subgraph; ``x`` holds the rows ``x[n_id]``."""
        if len(blocks) != self.num_layers:
            raise ConfigError(f"{self.name} has {self.num_layers} layers but got {len(blocks)} blocks")
        if x.size(0) != blocks[0].num_src:
            raise ConfigError(f"x has {x.size(0)} rows but blocks[0] has {blocks[0].num_src} source nodes")
        h0 = self.encode(x)
        h = h0
        for index, block in enumerate(blocks):
            h = self.forward_layer(index, h, block, h0)
        return self.decode(h)

    def forward_layer(
        self, index: int, h: Tensor, graph: GraphInput | Block, h0: Tensor | None = None
    ) -> Tensor:
        """Layer ``index`` on a graph or block: dropout, convolution, then the activation unless it
        is the last layer (whose output is the logits, or for GCNII the input of ``decode``).

        Returns ``graph.num_dst`` rows computed from ``h``'s first ``graph.num_src`` rows.
        """
        if not 0 <= index < self.num_layers:
            raise ConfigError(f"layer index must be in [0, {self.num_layers}), got {index}")
        h = feature_dropout(h, self.dropout, self.training)
        out = self._convolve(index, h, self._graph_input(graph), h0)
        if index < self.num_layers - 1 or self.activate_last:
            out = self.activation(out)
        return out

    def _convolve(self, index: int, h: Tensor, graph: GraphInput, h0: Tensor | None) -> Tensor:
        raise NotImplementedError

    def _graph_input(self, graph: GraphInput | Block) -> GraphInput:
        if isinstance(graph, Block):
            return prepare_block(graph, self.graph_kind)
        if graph.kind != self.graph_kind:
            raise ConfigError(
                f"graph was prepared for '{graph.kind}' propagation but {self.name} needs "
                f"'{self.graph_kind}'; call prepare_graph(edge_index, num_nodes, '{self.name}')"
            )
        return graph


class GCN(Backbone):
    """Kipf & Welling GCN: ``Â (h W) + b`` with ``Â = D^-1/2 (A + I) D^-1/2``."""

    name = "gcn"

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, dropout: float) -> None:
        super().__init__(dropout)
        self.layers = nn.ModuleList(
            GCNConv(i, o, normalize=False) for i, o in _layer_dims(in_dim, hidden_dim, out_dim, num_layers)
        )

    def _convolve(self, index: int, h: Tensor, graph: GraphInput, h0: Tensor | None) -> Tensor:
        conv = self.layers[index]
        return graph.propagate(feature_linear(h, conv.lin.weight)) + conv.bias


class GraphSAGE(Backbone):
    """GraphSAGE with mean aggregation: ``mean_u(h_u) W_l + b + h_v W_r``."""

    name = "sage"

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, dropout: float) -> None:
        super().__init__(dropout)
        self.layers = nn.ModuleList(
            SAGEConv(i, o, aggr="mean") for i, o in _layer_dims(in_dim, hidden_dim, out_dim, num_layers)
        )

    def _convolve(self, index: int, h: Tensor, graph: GraphInput, h0: Tensor | None) -> Tensor:
        conv = self.layers[index]
        neighbours = graph.propagate(feature_linear(h, conv.lin_l.weight))
        roots = h[: graph.num_dst] if h.layout == torch.strided else h  # sparse rows: slice after
        return neighbours + conv.lin_l.bias + feature_linear(roots, conv.lin_r.weight)[: graph.num_dst]


class GIN(Backbone):
    """GIN (eps = 0): ``MLP((1 + eps) h_v + sum_u h_u)`` with a two-layer MLP per layer."""

    name = "gin"

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, dropout: float) -> None:
        super().__init__(dropout)
        self.layers = nn.ModuleList(
            GINConv(nn.Sequential(nn.Linear(i, hidden_dim), nn.ReLU(), nn.Linear(hidden_dim, o)))
            for i, o in _layer_dims(in_dim, hidden_dim, out_dim, num_layers)
        )

    def _convolve(self, index: int, h: Tensor, graph: GraphInput, h0: Tensor | None) -> Tensor:
        conv = self.layers[index]
        first, last = conv.nn[0], conv.nn[2]
        hw = feature_linear(h, first.weight)
        summed = graph.propagate(hw) + (1 + conv.eps) * hw[: graph.num_dst] + first.bias
        return last(F.relu(summed))


class GAT(Backbone):
    """GAT with ``heads`` attention heads per hidden layer (``hidden_dim`` = total width).

    Hidden layers concatenate ``heads`` heads of ``hidden_dim // heads`` channels; the output layer
    has one head. Attention coefficients get the same dropout as the features; ELU activation.
    """

    name = "gat"
    defaults = {"heads": 8}
    activation = staticmethod(F.elu)

    def __init__(
        self, in_dim: int, hidden_dim: int, out_dim: int, num_layers: int, dropout: float, heads: int
    ) -> None:
        super().__init__(dropout)
        if not isinstance(heads, int) or heads < 1 or hidden_dim % heads:
            raise ConfigError(f"gat heads must be an int >= 1 dividing hidden_dim={hidden_dim}, got {heads!r}")
        self.layers = nn.ModuleList()
        for i, o in _layer_dims(in_dim, hidden_dim, out_dim, num_layers):
            last = len(self.layers) == num_layers - 1
            conv = GATConv(
                i,
                o if last else o // heads,
                heads=1 if last else heads,
                concat=not last,
                dropout=dropout,
                add_self_loops=False,
            )
            conv.lin = _FeatureLinear(i, conv.lin.out_channels, bias=False, weight_initializer="glorot")
            self.layers.append(conv)

    def _convolve(self, index: int, h: Tensor, graph: GraphInput, h0: Tensor | None) -> Tensor:
        return self.layers[index](h, graph.edge_index)[: graph.num_dst]


class GCNII(Backbone):
    """GCNII: input linear map, ``num_layers`` GCN2Conv layers with initial residual, output map.

    Layer ``l`` (1-based) computes ``((1 - alpha) Â h + alpha h0)((1 - beta_l) I + beta_l W_l)`` with
    ``beta_l = log(theta / l + 1)``.
    """

    name = "gcnii"
    defaults = {"alpha": 0.1, "theta": 0.5}
    activate_last = True

    def __init__(
        self,
        in_dim: int,
        hidden_dim: int,
        out_dim: int,
        num_layers: int,
        dropout: float,
        alpha: float,
        theta: float,
    ) -> None:
        super().__init__(dropout)
        if not 0.0 <= alpha <= 1.0:
            raise ConfigError(f"gcnii alpha must be in [0, 1], got {alpha!r}")
        if not theta > 0:
            raise ConfigError(f"gcnii theta must be > 0, got {theta!r}")
        self.input = nn.Linear(in_dim, hidden_dim)
        self.output = nn.Linear(hidden_dim, out_dim)
        self.layers = nn.ModuleList(
            GCN2Conv(hidden_dim, alpha, theta, layer=index + 1, normalize=False) for index in range(num_layers)
        )

    def encode(self, x: Tensor) -> Tensor:
        x = feature_dropout(x, self.dropout, self.training)
        return F.relu(feature_linear(x, self.input.weight, self.input.bias))

    def decode(self, h: Tensor) -> Tensor:
        return self.output(feature_dropout(h, self.dropout, self.training))

    def _convolve(self, index: int, h: Tensor, graph: GraphInput, h0: Tensor | None) -> Tensor:
        if h0 is None:
            raise ConfigError("gcnii layers need h0 = model.encode(x) for the initial residual")
        conv = self.layers[index]
        mixed = (1 - conv.alpha) * graph.propagate(h) + conv.alpha * h0[: graph.num_dst]
        return torch.addmm(mixed, mixed, conv.weight1, beta=1.0 - conv.beta, alpha=conv.beta)


class _FeatureLinear(PygLinear):
    """PyG ``Linear`` that also accepts sparse features (sparse-dense product, no densifying)."""

    def forward(self, x: Tensor) -> Tensor:
        return feature_linear(x, self.weight, self.bias)


_BACKBONES: dict[str, type[Backbone]] = {cls.name: cls for cls in (GCN, GraphSAGE, GAT, GCNII, GIN)}
MODEL_NAMES: tuple[str, ...] = tuple(_BACKBONES)


def build_model(
    name: str,
    in_dim: int,
    hidden_dim: int,
    out_dim: int,
    num_layers: int = 2,
    dropout: float = 0.5,
    *,
    seed: int | None = None,
    **options: Any,
) -> Backbone:
    """Backbone by (case-insensitive) name: gcn, sage/graphsage, gat (``heads``), gcnii (``alpha``,
    ``theta``), gin. With ``seed`` the initial weights come from that seed and the global RNG is
    left untouched; without it they come from the global RNG.
    """
    cls = _BACKBONES[canonical_model_name(name)]
    sizes = {"in_dim": in_dim, "hidden_dim": hidden_dim, "out_dim": out_dim, "num_layers": num_layers}
    for label, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{label} must be an int >= 1, got {value!r}")
    if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ConfigError(f"dropout must be in [0, 1), got {dropout!r}")
    unknown = sorted(set(options) - set(cls.defaults))
    if unknown:
        allowed = ", ".join(cls.defaults) or "none"
        raise ConfigError(f"unknown option(s) {', '.join(unknown)} for {cls.name}; allowed: {allowed}")
    settings = {**cls.defaults, **options}
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        return cls(in_dim, hidden_dim, out_dim, num_layers, dropout, **settings)


def _layer_dims(in_dim: int, hidden_dim: int, out_dim: int, num_layers: int) -> list[tuple[int, int]]:
    dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [out_dim]
    return list(zip(dims[:-1], dims[1:]))
