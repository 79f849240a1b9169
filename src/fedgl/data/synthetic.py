"""Contextual stochastic block model graphs with controllable homophily.

Synthetic graphs let experiments sweep homophily and size (up to millions of nodes) without
any files. Edges are sampled in one vectorised pass: a uniform source, then with probability
``homophily`` a uniform destination of the same class, otherwise one of another class.
"""

from __future__ import annotations

import math

import torch
from torch_geometric.data import Data

from fedgl.errors import DataError


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise DataError(f"make_csbm: {message}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def make_csbm(num_nodes: int = 2000, num_classes: int = 4, num_features: int = 64,
              avg_degree: float = 10, homophily: float = 0.8, feature_signal: float = 1.0,
              seed: int = 0) -> Data:
    """Sample a contextual SBM graph.

    Classes are balanced and randomly assigned. About ``num_nodes * avg_degree / 2``
    undirected edges are drawn, deduplicated, stripped of self loops and symmetrised, so
    the mean degree is close to ``avg_degree`` and the fraction of same-class edges close to
    ``homophily``. Features are the class mean (a random unit direction scaled by
    ``feature_signal``) plus standard Gaussian noise.
    """
    _check(_is_int(num_classes) and num_classes >= 2,
           f"num_classes must be an integer >= 2, got {num_classes!r}")
    _check(_is_int(num_nodes) and num_nodes >= num_classes,
           f"num_nodes must be an integer >= num_classes ({num_classes}), got {num_nodes!r}")
    _check(_is_int(num_features) and num_features >= 1,
           f"num_features must be an integer >= 1, got {num_features!r}")
    _check(_is_number(avg_degree) and 0 < avg_degree < num_nodes,
           f"avg_degree must be in (0, num_nodes), got {avg_degree!r}")
    _check(_is_number(homophily) and 0 <= homophily <= 1,
           f"homophily must be in [0, 1], got {homophily!r}")
    _check(_is_number(feature_signal) and feature_signal >= 0,
           f"feature_signal must be >= 0, got {feature_signal!r}")
    _check(_is_int(seed), f"seed must be an integer, got {seed!r}")

    generator = torch.Generator().manual_seed(seed)
    y = (torch.arange(num_nodes) % num_classes)[torch.randperm(num_nodes, generator=generator)]
    by_class = torch.argsort(y, stable=True)
    counts = torch.bincount(y, minlength=num_classes)
    starts = torch.cumsum(counts, 0) - counts

    num_draws = max(1, round(num_nodes * avg_degree / 2))
    src = torch.randint(num_nodes, (num_draws,), generator=generator)
    same = torch.rand(num_draws, generator=generator) < homophily
    shift = torch.randint(1, num_classes, (num_draws,), generator=generator)
    dst_class = torch.where(same, y[src], (y[src] + shift) % num_classes)
    offset = torch.rand(num_draws, generator=generator, dtype=torch.float64) * counts[dst_class]
    dst = by_class[starts[dst_class] + offset.long()]
    keep = src != dst
    src, dst = src[keep], dst[keep]
    # One sort of row-major keys dedupes, symmetrises and coalesces (faster than to_undirected).
    keys = torch.unique(torch.cat([src * num_nodes + dst, dst * num_nodes + src]))
    edge_index = torch.stack([keys // num_nodes, keys % num_nodes])

    directions = torch.randn(num_classes, num_features, generator=generator)
    means = feature_signal * directions / directions.norm(dim=1, keepdim=True)
    x = means[y] + torch.randn(num_nodes, num_features, generator=generator)
    return Data(x=x, y=y, edge_index=edge_index, name="synthetic", num_classes=num_classes)
