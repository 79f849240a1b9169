"""OGB node-property datasets (ogbn-arxiv, ogbn-products) read from OGB's own folder layout.

The ``ogb`` package is not needed: its raw files are gzipped CSV (one row per edge, node or split
index), which numpy reads. The folder is the one OGB's zip unpacks to and ``PygNodePropPredDataset``
reads, so a folder made by either works here:
``<root>/ogbn_<name>/raw/{edge,node-feat,node-label,num-node-list,num-edge-list}.csv.gz`` and
``<root>/ogbn_<name>/split/<split>/{train,valid,test}.csv.gz``.
"""

from __future__ import annotations

import os
import os.path as osp
import shutil

import numpy as np
import torch
from torch_geometric.data import Data, InMemoryDataset, download_url, extract_zip

URL = "http://snap.stanford.edu/ogb/data/nodeproppred/{}.zip"
SPLITS = {"ogbn-arxiv": "time", "ogbn-products": "sales_ranking"}
"""Each dataset's split folder under ``split/``."""
RAW = ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz", "num-node-list.csv.gz", "num-edge-list.csv.gz")
PARTS = ("train", "valid", "test")


def ogb_files(name: str) -> tuple[str, ...]:
    """The files a dataset's folder must hold, relative to it."""
    return (*(f"raw/{file}" for file in RAW), *(f"split/{SPLITS[name]}/{part}.csv.gz" for part in PARTS))


def _read(path: str, dtype: type) -> np.ndarray:
    return np.loadtxt(path, delimiter=",", dtype=dtype, ndmin=2)


class OgbNodeDataset(InMemoryDataset):
    """One OGB node-classification graph: float features, one label per node, the shipped split as
    ``train_mask``/``val_mask``/``test_mask``; edges as the files list them (``edge.csv.gz``)."""

    def __init__(self, root: str, name: str) -> None:
        self.name = name
        self.folder = osp.join(root, name.replace("-", "_"))
        super().__init__(root)
        self.load(self.processed_paths[0])

    @property
    def raw_dir(self) -> str:
        return osp.join(self.folder, "raw")

    @property
    def processed_dir(self) -> str:
        return osp.join(self.folder, "processed")

    @property
    def raw_file_names(self) -> list[str]:
        return list(RAW)

    @property
    def processed_file_names(self) -> str:
        return "data.pt"

    def download(self) -> None:
        """OGB's zip unpacks to ``<short name>/``, moved to the folder OGB's own loader uses."""
        short = self.name.removeprefix("ogbn-")
        path = download_url(URL.format(short), self.root)
        extract_zip(path, self.root)
        os.unlink(path)
        shutil.rmtree(self.folder, ignore_errors=True)
        shutil.move(osp.join(self.root, short), self.folder)

    def process(self) -> None:
        num_nodes = int(_read(osp.join(self.raw_dir, "num-node-list.csv.gz"), np.int64)[0, 0])
        num_edges = int(_read(osp.join(self.raw_dir, "num-edge-list.csv.gz"), np.int64)[0, 0])
        edges = _read(osp.join(self.raw_dir, "edge.csv.gz"), np.int64)
        x = _read(osp.join(self.raw_dir, "node-feat.csv.gz"), np.float32)
        y = _read(osp.join(self.raw_dir, "node-label.csv.gz"), np.int64)
        for file, rows, expected in (("edge", len(edges), num_edges), ("node-feat", len(x), num_nodes),
                                     ("node-label", len(y), num_nodes)):
            if rows != expected:
                raise ValueError(f"{file}.csv.gz has {rows} rows where the count files say {expected}")
        data = Data(x=torch.from_numpy(x), y=torch.from_numpy(y).view(-1),
                    edge_index=torch.from_numpy(edges).t().contiguous())
        folder = osp.join(self.folder, "split", SPLITS[self.name])
        for part, key in zip(PARTS, ("train_mask", "val_mask", "test_mask")):
            mask = torch.zeros(num_nodes, dtype=torch.bool)
            mask[torch.from_numpy(_read(osp.join(folder, f"{part}.csv.gz"), np.int64)).view(-1)] = True
            data[key] = mask
        self.save([data], self.processed_paths[0])
