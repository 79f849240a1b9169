"""Datasets for fedgl: real benchmarks read through PyG and synthetic CSBM graphs.

``load_dataset`` returns one normalised ``Data`` object whatever the source, so the rest of
the library never deals with PyG's per-dataset quirks (2-D mask stacks, sparse features,
self loops, read-only data folders).
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any

from torch_geometric.data import Data

from fedgl.data.registry import (
    DATASETS,
    SYNTHETIC,
    DatasetSpec,
    DatasetStatus,
    canonical_name,
    dataset_names,
    dataset_status,
    read_graph,
    resolve_data_root,
)
from fedgl.data.splits import check_split_sizes, parse_split, split_masks
from fedgl.data.synthetic import make_csbm
from fedgl.errors import DataError

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "DatasetStatus",
    "check_dataset",
    "dataset_names",
    "dataset_status",
    "load_data",
    "load_dataset",
    "make_csbm",
    "resolve_data_root",
]

_CACHE_SIZE = 4
_CACHE_MAX_BYTES = 256 * 2**20
_graphs: OrderedDict[tuple[Any, ...], Data] = OrderedDict()
"""Recently loaded small graphs (before splitting), so repeated loads in one process are cheap.
Larger graphs are re-read from the processed files instead of holding a second copy."""

_SYNTHETIC_OPTIONS = tuple(p for p in inspect.signature(make_csbm).parameters if p != "seed")


def _graph(name: str, root: str | None, cache_dir: str | None, seed: int,
           options: dict[str, Any]) -> tuple[Data, bool]:
    """The unsplit graph and whether it is shared with the cache (so must be copied)."""
    if name == SYNTHETIC:
        unknown = sorted(set(options) - set(_SYNTHETIC_OPTIONS))
        if unknown:
            raise DataError(f"unknown synthetic option(s) {', '.join(unknown)}; allowed: "
                            f"{', '.join(_SYNTHETIC_OPTIONS)}")
        key: tuple[Any, ...] = (name, seed, repr(sorted(options.items())))
    else:
        if options:
            raise DataError(f"option(s) {', '.join(sorted(options))} only apply to "
                            f"'{SYNTHETIC}', not {name!r}")
        root = resolve_data_root(root)
        key = (name, root)
    if key in _graphs:
        _graphs.move_to_end(key)
        return _graphs[key], True
    graph = (make_csbm(**options, seed=seed) if name == SYNTHETIC
             else read_graph(name, root, cache_dir))
    if graph.x.numel() * graph.x.element_size() > _CACHE_MAX_BYTES:
        return graph, False
    _graphs[key] = graph
    while len(_graphs) > _CACHE_SIZE:
        _graphs.popitem(last=False)
    return graph, True


def load_dataset(name: str, root: str | None = None, *, split: str = "default", seed: int = 0,
                 cache_dir: str | None = None, train_per_class: int = 20, num_val: int = 500,
                 num_test: int = 1000, **synthetic_options: Any) -> Data:
    """Load a dataset as ``Data`` with x, y, edge_index, 1-D bool masks, name, num_classes.

    ``root`` is the data root (else ``$FEDGL_DATA_ROOT``, else the default download folder),
    ``cache_dir`` where processed files go (else ``$FEDGL_CACHE``, else ``~/.cache/fedgl``).
    ``split`` is one of ``'default'``, ``'public[:i]'``/``'geom-gcn[:i]'``, ``'random'``
    (``train_per_class``/``num_val``/``num_test``), ``'full'``, ``'ratio:a,b,c'`` or
    ``'ratio-floor:a,b,c'`` (per-class cuts truncated, not rounded); ``seed``
    fixes every random split and, for ``'synthetic'``, the graph itself. Keyword options
    beyond these go to :func:`make_csbm` and are only valid for ``'synthetic'``.
    The returned tensors are copies, so callers may modify them freely.
    """
    name = canonical_name(name)
    request = parse_split(split)
    check_split_sizes(train_per_class=train_per_class, num_val=num_val, num_test=num_test)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise DataError(f"seed must be an integer, got {seed!r}")
    graph, shared = _graph(name, root, cache_dir, seed, synthetic_options)
    fixed = ((graph.train_mask, graph.val_mask, graph.test_mask)
             if "train_mask" in graph else None)
    if request.kind not in ("fixed", "default") and bool((graph.y < 0).any()):
        raise DataError(f"dataset {name!r} has {int((graph.y < 0).sum())} unlabelled nodes (label -1); only "
                        f"its shipped split ('default' or 'public') leaves them out, not {split!r}")
    spec = DATASETS.get(name)
    train, val, test = split_masks(
        graph.y, request, seed=seed, dataset=name, fixed=fixed,
        fixed_name=spec.fixed_split if spec else None, train_per_class=train_per_class,
        num_val=num_val, num_test=num_test)
    x, y, edge_index = graph.x, graph.y, graph.edge_index
    if shared:
        x, y, edge_index = x.clone(), y.clone(), edge_index.clone()
    return Data(x=x, y=y, edge_index=edge_index, train_mask=train, val_mask=val,
                test_mask=test, name=name, num_classes=int(y.max()) + 1)


def load_data(cfg) -> Data:
    """The dataset a run's config names (its ``dataset`` section, split with the run's ``seed``)."""
    d = cfg.dataset
    return load_dataset(d.name, d.data_root, split=d.split, seed=cfg.seed, **d.options)


def check_dataset(name: str, root: str | None = None) -> dict[str, Any]:
    """Load a dataset with its default split and report its sizes (raises DataError if absent)."""
    data = load_dataset(name, root)
    return {
        "name": data.name,
        "nodes": data.num_nodes,
        "edges": data.num_edges,
        "features": data.num_features,
        "classes": data.num_classes,
        "train": int(data.train_mask.sum()),
        "val": int(data.val_mask.sum()),
        "test": int(data.test_mask.sum()),
    }
