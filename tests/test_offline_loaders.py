"""The papers' datasets that are not on this machine (Reddit, Flickr, Yelp, WikiCS, ogbn-arxiv,
ogbn-products, the HeriGraph cities) load by name from tiny files written here in each one's on-disk
format, with their shipped splits and aliases; Yelp's multi-label target is refused in one line."""

from __future__ import annotations

import gzip
import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import fedgl.data.ogb_raw as ogb_raw
from fedgl.cli import main
from fedgl.data import dataset_status, load_dataset
from fedgl.errors import DataError

N, F, C = 12, 4, 3
# a ring, two chords, one duplicate (reversed) and one self loop, as raw files may hold
RAW_EDGES = np.array([[i for i in range(N)] + [0, 3, 5, 7], [(i + 1) % N for i in range(N)] + [6, 9, 4, 7]])
LABELS = np.arange(N) % C
TRAIN, VAL, TEST = [0, 1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 11]
OFFLINE = ("reddit", "flickr", "yelp", "wikics", "ogbn-arxiv", "ogbn-products", "suzhou", "venice", "amsterdam")


def features() -> np.ndarray:
    return np.arange(N * F, dtype=np.float32).reshape(N, F) / 10


def undirected_count(edges: np.ndarray) -> int:
    pairs = {(min(a, b), max(a, b)) for a, b in edges.T.tolist() if a != b}
    return 2 * len(pairs)


def directed_count(edges: np.ndarray) -> int:
    return len({(a, b) for a, b in edges.T.tolist() if a != b})


def write_reddit(root: Path) -> None:
    raw = root / "reddit" / "raw"
    raw.mkdir(parents=True)
    types = np.zeros(N, dtype=np.int64)
    types[TRAIN], types[VAL], types[TEST] = 1, 2, 3
    np.savez(raw / "reddit_data.npz", feature=features(), label=LABELS, node_types=types)
    adjacency = sp.coo_matrix((np.ones(RAW_EDGES.shape[1]), (RAW_EDGES[0], RAW_EDGES[1])), shape=(N, N))
    sp.save_npz(raw / "reddit_graph.npz", adjacency)


def write_saint(root: Path, name: str, class_map: dict[str, object]) -> None:
    raw = root / name / "raw"
    raw.mkdir(parents=True)
    adjacency = sp.csr_matrix((np.ones(RAW_EDGES.shape[1]), (RAW_EDGES[0], RAW_EDGES[1])), shape=(N, N))
    np.savez(raw / "adj_full.npz", data=adjacency.data, indices=adjacency.indices, indptr=adjacency.indptr,
             shape=np.array(adjacency.shape))
    np.save(raw / "feats.npy", features())
    (raw / "class_map.json").write_text(json.dumps(class_map))
    (raw / "role.json").write_text(json.dumps({"tr": TRAIN, "va": VAL, "te": TEST}))


def write_wikics(root: Path) -> list[list[int]]:
    raw = root / "wikics" / "raw"
    raw.mkdir(parents=True)
    links = [[int(b) for a, b in RAW_EDGES.T if a == i] for i in range(N)]
    train = [[(i + k) % 4 == 0 for i in range(N)] for k in range(20)]
    val = [[(i + k) % 4 == 1 for i in range(N)] for k in range(20)]
    data = {"features": features().tolist(), "labels": LABELS.tolist(), "links": links, "train_masks": train,
            "val_masks": val, "test_mask": [i % 4 == 3 for i in range(N)], "stopping_masks": val}
    (raw / "data.json").write_text(json.dumps(data))
    return train


def write_csv_gz(path: Path, rows: np.ndarray, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        np.savetxt(handle, rows, fmt=fmt, delimiter=",")


def write_ogb(root: Path, name: str, split: str) -> None:
    folder = root / "ogb" / name.replace("-", "_")
    write_csv_gz(folder / "raw" / "edge.csv.gz", RAW_EDGES.T, "%d")
    write_csv_gz(folder / "raw" / "node-feat.csv.gz", features(), "%.6f")
    write_csv_gz(folder / "raw" / "node-label.csv.gz", LABELS[:, None], "%d")
    write_csv_gz(folder / "raw" / "num-node-list.csv.gz", np.array([[N]]), "%d")
    write_csv_gz(folder / "raw" / "num-edge-list.csv.gz", np.array([[RAW_EDGES.shape[1]]]), "%d")
    for part, nodes in (("train", TRAIN), ("valid", VAL), ("test", TEST)):
        write_csv_gz(folder / "split" / split / f"{part}.csv.gz", np.array(nodes)[:, None], "%d")


HERI_LABELS = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, -1])
HERI_EDGES = {"temporal": RAW_EDGES[:, :6], "social": RAW_EDGES[:, 4:10], "spatial": RAW_EDGES[:, 10:]}


def write_herigraph(root: Path, city: str) -> None:
    raw = root / "herigraph" / city / "raw"
    raw.mkdir(parents=True)
    np.savez(raw / f"{city.lower()}.npz", x=features(), y=HERI_LABELS, **HERI_EDGES)


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data_root = tmp_path / "root"
    data_root.mkdir()
    monkeypatch.setenv("FEDGL_DATA_ROOT", str(data_root))
    monkeypatch.setenv("FEDGL_CACHE", str(tmp_path / "cache"))
    return data_root


def check_graph(data, name: str, edges: int, split: tuple[list[int], ...] = (TRAIN, VAL, TEST)) -> None:
    assert data.name == name
    assert data.x.shape == (N, F) and data.x.dtype == torch.float32
    assert torch.allclose(data.x, torch.from_numpy(features()), atol=1e-6)
    assert data.y.shape == (N,) and data.y.dtype == torch.long
    assert data.edge_index.shape == (2, edges)
    assert not bool((data.edge_index[0] == data.edge_index[1]).any())
    for mask, nodes in zip((data.train_mask, data.val_mask, data.test_mask), split):
        assert mask.shape == (N,) and mask.nonzero().flatten().tolist() == nodes


@pytest.mark.parametrize("name, alias", [("reddit", "Reddit"), ("flickr", "FLICKR")])
def test_reddit_and_flickr(root: Path, name: str, alias: str) -> None:
    write_reddit(root) if name == "reddit" else write_saint(root, "flickr", {str(i): int(LABELS[i]) for i in range(N)})
    data = load_dataset(alias)
    check_graph(data, name, undirected_count(RAW_EDGES))
    assert data.y.tolist() == LABELS.tolist() and data.num_classes == C
    assert dataset_status(name).present


def test_wikics_has_twenty_fixed_splits(root: Path) -> None:
    train = write_wikics(root)
    first = load_dataset("wiki-cs")
    assert first.name == "wikics" and first.edge_index.size(1) == undirected_count(RAW_EDGES)
    for index in (0, 3, 19):
        data = load_dataset("wikics", split=f"public:{index}")
        assert data.train_mask.tolist() == train[index]
        assert data.test_mask.nonzero().flatten().tolist() == [3, 7, 11]
    with pytest.raises(DataError, match="has 20 fixed split"):
        load_dataset("wikics", split="public:20")


@pytest.mark.parametrize("name, alias, split, directed", [("ogbn-arxiv", "arxiv", "time", True),
                                                         ("ogbn-products", "OGBN_products", "sales_ranking", False)])
def test_ogb_layout_reads_without_the_ogb_package(root: Path, name: str, alias: str, split: str,
                                                  directed: bool) -> None:
    write_ogb(root, name, split)
    data = load_dataset(alias)
    check_graph(data, name, directed_count(RAW_EDGES) if directed else undirected_count(RAW_EDGES))
    assert data.y.tolist() == LABELS.tolist()
    assert load_dataset(name.removeprefix("ogbn-"), split="ratio:0.5,0.25,0.25").train_mask.sum() == 6


def test_ogb_counts_that_disagree_are_named(root: Path) -> None:
    write_ogb(root, "ogbn-products", "sales_ranking")
    write_csv_gz(root / "ogb" / "ogbn_products" / "raw" / "num-node-list.csv.gz", np.array([[N + 1]]), "%d")
    with pytest.raises(DataError) as error:
        load_dataset("ogbn-products")
    message = str(error.value)
    assert "node-feat.csv.gz has 12 rows where the count files say 13" in message and "\n" not in message


def test_yelp_multi_label_is_refused_in_one_line(root: Path) -> None:
    labels = np.zeros((N, 5), dtype=np.int64)
    labels[np.arange(N), np.arange(N) % 5] = 1
    labels[: N // 2, 4] = 1  # half the nodes carry a second label
    write_saint(root, "yelp", {str(i): labels[i].tolist() for i in range(N)})
    with pytest.raises(DataError) as error:
        load_dataset("yelp")
    message = str(error.value)
    assert message == ("dataset 'yelp' is multi-label (5 labels, 1.42 per node on average); fedgl's protocols "
                       "train single-label classifiers and cannot use it")
    assert "multi-label" in dataset_status("yelp").detail


@pytest.mark.parametrize("city", ["Suzhou", "Venice", "Amsterdam"])
def test_herigraph_union_graph_and_shipped_split(root: Path, city: str) -> None:
    write_herigraph(root, city)
    data = load_dataset(f"herigraph-{city.lower()}")
    union = np.concatenate(list(HERI_EDGES.values()), axis=1)
    assert data.name == city.lower() and data.edge_index.size(1) == undirected_count(union)
    assert data.y.tolist() == HERI_LABELS.tolist() and data.num_classes == 3
    masks = torch.stack([data.train_mask, data.val_mask, data.test_mask])
    assert int(masks.sum(0).max()) == 1 and not bool(masks[:, 11].any())  # unlabelled: in no split
    y = torch.from_numpy(HERI_LABELS)
    # per class (5, 4, 2 nodes) truncated at 20% / 50% / 100%: train 1, 0, 0; val 1, 2, 1; test 3, 2, 1
    assert [torch.bincount(y[m], minlength=3).tolist() for m in masks] == [[1, 0, 0], [1, 2, 1], [3, 2, 1]]
    assert torch.equal(load_dataset(city).train_mask, data.train_mask)  # the split is the same every time
    with pytest.raises(DataError, match=r"has 1 unlabelled nodes \(label -1\); only its shipped split"):
        load_dataset(city, split="ratio:0.5,0.25,0.25")


def test_missing_datasets_are_listed_with_their_files(root: Path, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    expected = {"reddit": "reddit/raw/reddit_data.npz", "flickr": "flickr/raw/adj_full.npz",
                "yelp": "yelp/raw/adj_full.npz", "wikics": "wikics/raw/data.json",
                "ogbn-arxiv": "ogb/ogbn_arxiv/raw/edge.csv.gz", "ogbn-products": "ogb/ogbn_products/raw/edge.csv.gz",
                "suzhou": "herigraph/Suzhou/raw/suzhou.npz", "venice": "herigraph/Venice/raw/venice.npz",
                "amsterdam": "herigraph/Amsterdam/raw/amsterdam.npz"}
    for name in OFFLINE:
        status = dataset_status(name)
        assert not status.present and status.source == "local files"
        assert f"expected {expected[name]}" in status.detail and "pip install" not in status.detail
        with pytest.raises(DataError, match=f"dataset '{name}' not found under {root}: expected {expected[name]}"):
            load_dataset(name)
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["datasets", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name in OFFLINE:
        [line] = [line for line in lines if line.startswith(f"│ {name} ")]
        assert "missing" in line and expected[name] in line


@pytest.mark.parametrize("name, file, why", [
    ("products", "ogb/ogbn_products/raw/edge.csv.gz", "network is unreachable"),
    ("herigraph-suzhou", "herigraph/Suzhou/raw/suzhou.npz", "HeriGraph has no download"),
])
def test_download_failure_at_the_default_root_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          name: str, file: str, why: str) -> None:
    def offline(*args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.delenv("FEDGL_DATA_ROOT", raising=False)
    monkeypatch.setenv("FEDGL_CACHE", str(tmp_path))
    monkeypatch.setattr(urllib.request, "urlopen", offline)
    assert dataset_status(name).source == "download"
    with pytest.raises(DataError) as error:
        load_dataset(name)
    message = str(error.value)
    assert "download failed" in message and file in message and why in message and "\n" not in message


def test_ogb_download_unpacks_into_ogbs_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the default root the zip OGB serves (``products/...``) ends up where OGB's loader keeps it."""
    write_ogb(tmp_path / "zip", "ogbn-products", "sales_ranking")
    (tmp_path / "zip" / "ogb" / "ogbn_products").rename(tmp_path / "zip" / "products")
    archive = shutil.make_archive(str(tmp_path / "products"), "zip", tmp_path / "zip", "products")
    urls = []

    def served(url: str, folder: str) -> str:
        urls.append(url)
        return shutil.copy(archive, folder)

    monkeypatch.delenv("FEDGL_DATA_ROOT", raising=False)
    monkeypatch.setenv("FEDGL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ogb_raw, "download_url", served)
    data = load_dataset("ogbn-products")
    check_graph(data, "ogbn-products", undirected_count(RAW_EDGES))
    assert urls == ["http://snap.stanford.edu/ogb/data/nodeproppred/products.zip"]
    folder = tmp_path / "cache" / "datasets" / "ogb"
    assert sorted(p.name for p in folder.iterdir()) == ["ogbn_products"] and dataset_status("products").present
