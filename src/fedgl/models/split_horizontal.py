"""The backbone's layers split across the parties holding a target's neighbours (horizontal FL).

GraphSAGE, GIN and GCN aggregate element-wise, and the map they apply to the neighbour aggregate is
linear, so it is applied to each party's rows or partial sums before they are added (``neigh``) and a
layer is completed from a node's own input and the sum and count of its neighbours' (``update``).
GCN's normalisation D^-1/2 (A + I) D^-1/2 splits between the two ends of an edge (``source_scale``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .backbones import Backbone
from .graph import feature_linear, select_rows

# Element-wise aggregators: mean (GraphSAGE), sum (GIN), degree-normalised sum (GCN).
SPLITTABLE = ("sage", "gin", "gcn")


def first_linear(model: Backbone, layer: int) -> nn.Linear:
    """The linear map layer ``layer`` applies to its neighbour aggregate (its owner/target split)."""
    conv = model.layers[layer]
    return {"sage": lambda: conv.lin_l, "gin": lambda: conv.nn[0], "gcn": lambda: conv.lin}[model.name]()


def source_scale(model: Backbone, degree: Tensor) -> Tensor | None:
    """GCN's source half of D^-1/2 (A + I) D^-1/2: a node's row is scaled by (deg + 1)^-1/2 by its
    owner (who knows the node's in-degree) before it is summed; None for the other backbones."""
    return (degree + 1).rsqrt().unsqueeze(1) if model.name == "gcn" else None


def neigh(model: Backbone, layer: int, h: Tensor) -> Tensor:
    """The bias-free linear map GraphSAGE, GIN and GCN apply to the neighbour aggregate of layer
    ``layer``. It is linear, so it is applied to each party's rows or partial sums before adding."""
    return feature_linear(h, first_linear(model, layer).weight)


def update(model: Backbone, layer: int, h_self: Tensor, neigh_sum: Tensor, neigh_count: Tensor,
           degree: Tensor | None = None) -> Tensor:
    """Layer ``layer`` (as the backbone's own layer computes it) from the nodes' own (dropped-out)
    inputs and the sum, through ``neigh``, and count of their neighbours' inputs. GCN also needs the
    nodes' in-degrees: its target half scales the (source-scaled) sum by (deg + 1)^-1/2 and by
    deg / count, so a sampled sum estimates the full one and all neighbours give the exact layer."""
    conv = model.layers[layer]
    if model.name == "sage":
        out = neigh_sum / neigh_count.clamp(min=1).unsqueeze(1) + conv.lin_l.bias + \
            feature_linear(h_self, conv.lin_r.weight)
    elif model.name == "gcn":
        d = degree.unsqueeze(1)
        out = neigh_sum * (d / neigh_count.clamp(min=1).unsqueeze(1) / (d + 1).sqrt()) + \
            neigh(model, layer, h_self) / (d + 1) + conv.bias
    else:
        bias = conv.nn[0].bias
        out = conv.nn[2](F.relu(neigh_sum + (1 + conv.eps) * neigh(model, layer, h_self) + bias))
    return model.activation(out) if layer < model.num_layers - 1 else out


def block_layer(model: Backbone, layer: int, h_in: Tensor, n_dst: int, src: Tensor, dst: Tensor,
                extra_rows: Tensor | None = None, extra_sum: Tensor | None = None,
                extra_count: Tensor | None = None, degree: Tensor | None = None) -> Tensor:
    """Layer ``layer`` for the first ``n_dst`` rows of ``h_in`` (the layer's input, after dropout)
    from edges src -> dst (positions), plus partial sums of input rows (and their row counts)
    received from other parties for rows ``extra_rows``; ``degree``: in-degrees of ``h_in``'s rows
    (GCN only; received sums come source-scaled). Sparse input rows are projected only where picked:
    each projected row is its own sum, so the picked rows are the ones projecting every row gives."""
    rows, row_degree = h_in, degree
    if h_in.layout != torch.strided:
        picked, src = torch.unique(src, return_inverse=True)
        rows, row_degree = select_rows(h_in, picked), None if degree is None else degree[picked]
    projected = neigh(model, layer, rows)
    if model.name == "gcn":
        projected = projected * source_scale(model, row_degree)
    total = torch.zeros(n_dst, projected.size(1)).index_add(0, dst, projected[src])
    count = torch.bincount(dst, minlength=n_dst).float()
    if extra_rows is not None and extra_rows.numel():
        total = total.index_add(0, extra_rows, neigh(model, layer, extra_sum))
        count = count.index_add(0, extra_rows, extra_count.float())
    own = h_in[:n_dst] if h_in.layout == torch.strided else select_rows(h_in, torch.arange(n_dst))
    return update(model, layer, own, total, count, None if degree is None else degree[:n_dst])
