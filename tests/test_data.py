"""Dataset layer: real datasets load with their published sizes, splits are seeded and
well-formed, data roots stay untouched, missing data fails fast, and CSBM graphs have the
requested homophily."""

from __future__ import annotations

import math
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.utils import coalesce, is_undirected

from fedgl.data import (
    check_dataset,
    dataset_names,
    dataset_status,
    load_dataset,
    make_csbm,
    resolve_data_root,
)
from fedgl.data.splits import parse_split, split_masks
from fedgl.errors import DataError

DATA_ROOT = os.environ.get("FEDGL_DATA_ROOT")
needs_data = pytest.mark.skipif(not DATA_ROOT, reason="FEDGL_DATA_ROOT is not set")

# Counts from the datasets README: nodes, edges, features, classes, default split sizes
# (None: no shipped split, so a stratified 60/20/20 split). The geom-gcn graphs contain 50
# (chameleon) and 140 (squirrel) self loops that load_dataset removes.
README_TABLE = {
    "cora": (2708, 10556, 1433, 7, (140, 500, 1000)),
    "citeseer": (3327, 9104, 3703, 6, (120, 500, 1000)),
    "pubmed": (19717, 88648, 500, 3, (60, 500, 1000)),
    "cs": (18333, 163788, 6805, 15, None),
    "physics": (34493, 495924, 8415, 5, None),
    "computers": (13752, 491722, 767, 10, None),
    "photo": (7650, 238162, 745, 8, None),
    "chameleon": (2277, 36101 - 50, 2325, 5, (1092, 729, 456)),
    "squirrel": (5201, 217073 - 140, 2089, 5, (2496, 1664, 1041)),
}
DIRECTED = {"chameleon", "squirrel"}


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fedgl-cache")


@pytest.fixture(autouse=True)
def isolated_cache(monkeypatch: pytest.MonkeyPatch, session_cache: Path) -> None:
    """Processed files go to one temporary cache per test session, never ~/.cache."""
    monkeypatch.setenv("FEDGL_CACHE", str(session_cache))


def snapshot(root: str | Path) -> dict[str, tuple[int, int]]:
    return {
        os.path.relpath(os.path.join(folder, name), root):
            (os.lstat(os.path.join(folder, name)).st_size,
             os.lstat(os.path.join(folder, name)).st_mtime_ns)
        for folder, dirs, names in os.walk(root) for name in names + dirs
    }


def copy_dataset(relative_dir: str, root: Path) -> Path:
    target = root / relative_dir
    shutil.copytree(Path(DATA_ROOT, relative_dir), target)
    return target


def assert_disjoint(data) -> None:
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask])
    assert int(masks.sum(0).max()) <= 1


# --- real datasets -------------------------------------------------------------------------

@needs_data
@pytest.mark.parametrize("name", [  # PyG's first processing of Physics alone takes ~20 s
    pytest.param(name, marks=pytest.mark.slow) if name == "physics" else name
    for name in README_TABLE
])
def test_dataset_matches_readme_and_leaves_root_untouched(name: str) -> None:
    before = snapshot(DATA_ROOT)
    data = load_dataset(name)
    assert snapshot(DATA_ROOT) == before

    nodes, edges, features, classes, split_sizes = README_TABLE[name]
    assert (data.num_nodes, data.num_edges, data.num_features, data.num_classes) == (
        nodes, edges, features, classes)
    assert data.name == name
    assert data.x.dtype == torch.float32 and data.x.layout == torch.strided
    assert data.y.dtype == torch.long and data.y.shape == (nodes,)
    assert data.edge_index.dtype == torch.long
    assert not bool((data.edge_index[0] == data.edge_index[1]).any())
    assert torch.equal(coalesce(data.edge_index, num_nodes=nodes), data.edge_index)
    assert is_undirected(data.edge_index, num_nodes=nodes) == (name not in DIRECTED)
    for mask in (data.train_mask, data.val_mask, data.test_mask):
        assert mask.dtype == torch.bool and mask.shape == (nodes,)
    assert_disjoint(data)

    sizes = tuple(int(m.sum()) for m in (data.train_mask, data.val_mask, data.test_mask))
    if split_sizes is not None:
        assert sizes == split_sizes
    else:
        assert sum(sizes) == nodes
        for size, ratio in zip(sizes, (0.6, 0.2, 0.2)):
            assert abs(size - ratio * nodes) <= classes


@needs_data
def test_check_dataset_and_status() -> None:
    assert check_dataset("Cora") == {"name": "cora", "nodes": 2708, "edges": 10556,
                                     "features": 1433, "classes": 7, "train": 140,
                                     "val": 500, "test": 1000}
    status = dataset_status("PubMed")
    assert (status.source, status.present) == ("local files", True)
    assert status.path == str(Path(DATA_ROOT, "planetoid_pubmed_approx", "PubMed"))
    assert "planetoid_pubmed_approx" in status.detail and "reconstructed" in status.detail
    assert dataset_status("coauthor-CS").path == str(Path(DATA_ROOT, "coauthor", "CS"))
    assert dataset_status("synthetic").source == "generated"
    missing = dataset_status("wikics")
    assert not missing.present and "wikics/raw/data.json" in missing.detail
    offline = {"wikics", "reddit", "flickr", "yelp", "ogbn-arxiv", "ogbn-products", "suzhou", "venice", "amsterdam"}
    assert set(README_TABLE) | {"synthetic"} | offline == set(dataset_names())


@needs_data
def test_pubmed_prefers_exact_planetoid_folder(tmp_path: Path) -> None:
    raw = tmp_path / "planetoid" / "PubMed" / "raw"
    raw.mkdir(parents=True)
    for file in Path(DATA_ROOT, "planetoid_pubmed_approx", "PubMed", "raw").iterdir():
        (raw / file.name).symlink_to(file)
    status = dataset_status("pubmed", root=str(tmp_path))
    assert status.path == str(tmp_path / "planetoid" / "PubMed") and status.detail == ""


@needs_data
def test_read_only_root_is_mirrored_into_cache(tmp_path: Path) -> None:
    root, cache = tmp_path / "root", tmp_path / "cache"
    copy_dataset("planetoid/Cora", root)
    paths = [root, *root.rglob("*")]
    for path in paths:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        before = snapshot(root)
        data = load_dataset("cora", root=str(root), cache_dir=str(cache))
        assert snapshot(root) == before
    finally:
        for path in paths:
            path.chmod(0o755)
    assert list(cache.glob("mirrors/*/planetoid/Cora/processed/data.pt"))
    shared = load_dataset("cora")
    assert torch.equal(data.x, shared.x) and torch.equal(data.edge_index, shared.edge_index)


@needs_data
def test_results_are_copies() -> None:
    first = load_dataset("cora")
    first.x.zero_()
    first.train_mask[:] = True
    second = load_dataset("cora")
    assert float(second.x.sum()) > 0 and int(second.train_mask.sum()) == 140


def test_missing_files_fail_fast_with_one_line(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(DataError) as error:
        load_dataset("cora", root=str(tmp_path))
    message = str(error.value)
    assert time.monotonic() - start < 2
    assert "\n" not in message and "'cora'" in message and str(tmp_path) in message
    assert "planetoid/Cora/raw/ind.cora.x" in message


@needs_data
def test_missing_single_file_is_named(tmp_path: Path) -> None:
    dataset_dir = copy_dataset("planetoid/Cora", tmp_path)
    (dataset_dir / "raw" / "ind.cora.graph").unlink()
    with pytest.raises(DataError, match=r"expected planetoid/Cora/raw/ind\.cora\.graph \("):
        load_dataset("cora", root=str(tmp_path))


@needs_data
def test_corrupt_raw_file_is_named_without_traceback(tmp_path: Path) -> None:
    dataset_dir = copy_dataset("planetoid/Cora", tmp_path / "root")
    (dataset_dir / "raw" / "ind.cora.graph").write_bytes(b"not a pickle")
    with pytest.raises(DataError) as error:
        load_dataset("cora", root=str(tmp_path / "root"), cache_dir=str(tmp_path / "cache"))
    message = str(error.value)
    assert f"the file {dataset_dir / 'raw' / 'ind.cora.graph'} is damaged" in message, message
    assert "delete it and download it again" in message and "processed" not in message and "\n" not in message


@needs_data
def test_corrupt_processed_file_is_rebuilt_once_deleted(tmp_path: Path) -> None:
    from fedgl.data import _graphs

    copy_dataset("planetoid/Cora", tmp_path / "root")
    options = {"root": str(tmp_path / "root"), "cache_dir": str(tmp_path / "cache")}
    expected = load_dataset("cora", **options)
    [processed] = (tmp_path / "cache").glob("mirrors/*/planetoid/Cora/processed/data.pt")
    processed.write_bytes(processed.read_bytes()[:100])
    _graphs.clear()  # read from disk again, not from this process's memory
    with pytest.raises(DataError) as error:
        load_dataset("cora", **options)
    message = str(error.value)
    assert f"processed file {processed} is damaged" in message and f"delete {processed.parent} to rebuild" in message
    shutil.rmtree(processed.parent)
    assert torch.equal(load_dataset("cora", **options).x, expected.x)


def test_env_root_is_used_and_not_downloaded_into(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDGL_DATA_ROOT", str(tmp_path))
    assert resolve_data_root() == str(tmp_path)
    assert resolve_data_root(str(tmp_path / "x")) == str(tmp_path / "x")
    with pytest.raises(DataError, match=str(tmp_path)):
        load_dataset("photo")
    assert list(tmp_path.iterdir()) == []
    status = dataset_status("photo")
    assert (status.source, status.present) == ("local files", False)


def test_default_root_download_failure_is_reported(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.delenv("FEDGL_DATA_ROOT", raising=False)
    monkeypatch.setenv("FEDGL_CACHE", str(tmp_path))
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    assert resolve_data_root() == str(tmp_path / "datasets")
    assert dataset_status("photo").source == "download"
    start = time.monotonic()
    with pytest.raises(DataError) as error:
        load_dataset("photo")
    assert time.monotonic() - start < 5
    message = str(error.value)
    assert "download failed" in message and str(tmp_path / "datasets") in message
    assert "amazon/Photo/raw/amazon_electronics_photo.npz" in message and "\n" not in message


def test_unknown_dataset_lists_known_names() -> None:
    with pytest.raises(DataError, match="known datasets: cora, citeseer.*synthetic"):
        load_dataset("imagenet")


def test_ogb_needs_no_package(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="expected ogb/ogbn_arxiv/raw/edge.csv.gz"):
        load_dataset("OGBN_arxiv", root=str(tmp_path))
    assert "pip install" not in dataset_status("arxiv", root=str(tmp_path)).detail


# --- splits --------------------------------------------------------------------------------

def masks_of(data) -> tuple[torch.Tensor, ...]:
    return data.train_mask, data.val_mask, data.test_mask


@needs_data
@pytest.mark.parametrize("split", ["random", "ratio:0.5,0.25,0.25"])
def test_splits_are_seeded(split: str) -> None:
    rng_state = torch.get_rng_state()
    a, b = (load_dataset("cora", split=split, seed=3) for _ in range(2))
    c = load_dataset("cora", split=split, seed=4)
    assert torch.equal(torch.get_rng_state(), rng_state)
    assert all(torch.equal(x, y) for x, y in zip(masks_of(a), masks_of(b)))
    assert not torch.equal(a.train_mask, c.train_mask)
    assert_disjoint(a)


@needs_data
def test_random_split_follows_pyg_sizes() -> None:
    data = load_dataset("cora", split="random", train_per_class=10, num_val=300, num_test=700)
    assert torch.bincount(data.y[data.train_mask], minlength=7).tolist() == [10] * 7
    assert (int(data.val_mask.sum()), int(data.test_mask.sum())) == (300, 700)
    with pytest.raises(DataError, match="only 2568 remain"):
        load_dataset("cora", split="random", num_val=2000, num_test=1000)


@needs_data
def test_full_split_trains_on_everything_else() -> None:
    public, full = load_dataset("cora"), load_dataset("cora", split="FULL")
    assert torch.equal(full.val_mask, public.val_mask)
    assert torch.equal(full.test_mask, public.test_mask)
    assert torch.equal(full.train_mask, ~(public.val_mask | public.test_mask))
    assert int(full.train_mask.sum()) == 2708 - 1500


@needs_data
def test_ratio_split_is_stratified() -> None:
    data = load_dataset("photo", split="ratio:0.1,0.3,0.5", seed=1)
    counts = torch.bincount(data.y).double()
    for mask, ratio in zip(masks_of(data), (0.1, 0.3, 0.5)):
        per_class = torch.bincount(data.y[mask], minlength=counts.numel()).double()
        assert torch.all((per_class - ratio * counts).abs() <= 1)
    assert abs(int(sum(m.sum() for m in masks_of(data))) - 0.9 * data.num_nodes) <= counts.numel()
    assert_disjoint(data)


@pytest.mark.parametrize(("split", "cut"), [("ratio:0.8,0.1,0.1", round), ("ratio-floor:0.8,0.1,0.1", math.floor)])
def test_ratio_splits_cut_each_class_rounded_or_truncated(split: str, cut) -> None:
    """Per class, the training set holds cut(0.8 n_c) nodes and validation cut(0.9 n_c) - cut(0.8 n_c)."""
    y = torch.tensor([0] * 7 + [1] * 13 + [2] * 19)  # 0.8 n_c = 5.6, 10.4, 15.2: round and floor differ
    train, val, test = split_masks(y, parse_split(split), seed=3, dataset="toy")
    for c, n in enumerate((7, 13, 19)):
        assert int(train[y == c].sum()) == cut(0.8 * n)
        assert int(val[y == c].sum()) == cut(0.9 * n) - cut(0.8 * n)
        assert int(test[y == c].sum()) == n - cut(0.9 * n)


@needs_data
@pytest.mark.parametrize("index", [0, 3])
def test_geom_gcn_split_index(index: int) -> None:
    data = load_dataset("chameleon", split=f"geom-gcn:{index}")
    raw = np.load(Path(DATA_ROOT, "wikipedia_network/chameleon/geom_gcn/raw",
                       f"chameleon_split_0.6_0.2_{index}.npz"))
    for mask, key in zip(masks_of(data), ("train_mask", "val_mask", "test_mask")):
        assert torch.equal(mask, torch.from_numpy(raw[key]).bool())


@needs_data
@pytest.mark.parametrize("name, split, match", [
    ("cora", "bogus", "allowed: 'default'"),
    ("cora", "ratio:0.5,0.6,0.1", "sum <= 1"),
    ("cora", "ratio:a,b,c", "three fractions"),
    ("cora", "geom-gcn:x", "non-negative integer"),
    ("cora", "public:1", "1 fixed split"),
    ("cora", "geom-gcn", "no 'geom-gcn' split"),
    ("chameleon", "geom-gcn:10", "out of range 0..9"),
    ("photo", "public", "ships no fixed split"),
])
def test_bad_splits_are_rejected(name: str, split: str, match: str) -> None:
    with pytest.raises(DataError, match=match):
        load_dataset(name, split=split)


# --- synthetic -----------------------------------------------------------------------------

@pytest.mark.parametrize("homophily", [0.0, 0.3, 0.8, 1.0])
def test_csbm_homophily_and_structure(homophily: float) -> None:
    data = make_csbm(num_nodes=3000, num_classes=5, homophily=homophily, seed=2)
    src, dst = data.edge_index
    assert abs(float((data.y[src] == data.y[dst]).float().mean()) - homophily) <= 0.05
    assert is_undirected(data.edge_index, num_nodes=3000)
    assert not bool((src == dst).any())
    assert torch.equal(coalesce(data.edge_index, num_nodes=3000), data.edge_index)
    assert abs(data.num_edges / 3000 - 10) < 0.5
    assert torch.bincount(data.y).tolist() == [600] * 5
    assert data.x.shape == (3000, 64) and data.x.dtype == torch.float32


def test_csbm_is_seeded_and_signal_separates_classes() -> None:
    a, b, c = make_csbm(seed=5), make_csbm(seed=5), make_csbm(seed=6)
    assert torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index)
    assert not torch.equal(a.y, c.y)
    strong = make_csbm(feature_signal=6.0, seed=5)
    means = torch.stack([strong.x[strong.y == k].mean(0) for k in range(4)])
    nearest = torch.cdist(strong.x, means).argmin(1)
    assert float((nearest == strong.y).float().mean()) > 0.95


def test_csbm_scales() -> None:
    start = time.monotonic()
    data = make_csbm(num_nodes=200_000, num_features=16)
    assert time.monotonic() - start < 5
    assert data.num_nodes == 200_000 and data.num_edges > 1_900_000


def test_synthetic_through_load_dataset() -> None:
    data = load_dataset("Synthetic", num_nodes=1000, homophily=0.2, seed=1)
    assert data.name == "synthetic" and data.num_classes == 4
    assert tuple(int(m.sum()) for m in masks_of(data)) == (600, 200, 200)
    assert torch.equal(data.x, make_csbm(num_nodes=1000, homophily=0.2, seed=1).x)
    assert not torch.equal(data.x, load_dataset("synthetic", num_nodes=1000, homophily=0.2).x)


@pytest.mark.parametrize("options, match", [
    ({"homophily": 1.5}, "homophily must be in"),
    ({"num_nodes": 3}, "num_nodes must be an integer >= num_classes"),
    ({"num_classes": 1}, "num_classes must be an integer >= 2"),
    ({"avg_degree": 0}, "avg_degree"),
    ({"num_features": 2.5}, "num_features"),
    ({"homophilly": 0.5}, "unknown synthetic option.*allowed: num_nodes"),
])
def test_bad_synthetic_options(options: dict, match: str) -> None:
    with pytest.raises(DataError, match=match):
        load_dataset("synthetic", **options)


def test_options_rejected_for_real_datasets(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="only apply to 'synthetic'"):
        load_dataset("cora", root=str(tmp_path), homophily=0.5)
