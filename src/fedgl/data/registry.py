"""Where each benchmark dataset lives on disk and how PyTorch Geometric reads it.

One table (``DATASETS``) maps a canonical name to the PyG loader, the folder layout under the
data root and the raw files that must be there. A user-supplied data root is treated as
read-only: PyG always writes ``processed/`` next to ``raw/``, so the raw files are symlinked
into a writable mirror under the cache folder and PyG is pointed at the mirror. Only the
default cache root may be downloaded into.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib
import importlib.util
import io
import os
import socket
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, redirect_stderr
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch_geometric.data import Data
from torch_geometric.utils import coalesce, remove_self_loops, to_undirected

from fedgl.data.herigraph import CITIES as HERIGRAPH_CITIES
from fedgl.data.herigraph import herigraph_file
from fedgl.data.ogb_raw import ogb_files
from fedgl.errors import DataError

DOWNLOAD_TIMEOUT = 10.0
"""Seconds a download socket may stay silent before the attempt is abandoned."""

SYNTHETIC = "synthetic"


@dataclass(frozen=True)
class DatasetSpec:
    """How to find and read one real dataset.

    ``folder`` is the PyG ``root`` relative to the data root, ``subdir`` the dataset folder
    under it (the one holding ``raw/``), and ``files`` the files expected in ``subdir``.
    """

    loader: str
    folder: str
    subdir: str
    files: tuple[str, ...]
    kwargs: Mapping[str, object] = field(default_factory=dict)
    undirected: bool = True
    fixed_split: str | None = None
    aliases: tuple[str, ...] = ()
    detail: str = ""
    fallback_folder: str | None = None
    fallback_detail: str = ""

    def relative_dir(self, folder: str | None = None) -> str:
        return f"{folder or self.folder}/{self.subdir}".rstrip("/")

    @property
    def package(self) -> str:
        return self.loader.split(".")[0]


def _planetoid(name: str, folder: str = "planetoid", **extra: object) -> DatasetSpec:
    parts = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    files = tuple(f"raw/ind.{name.lower()}.{part}" for part in parts)
    return DatasetSpec("torch_geometric.datasets.planetoid:Planetoid", folder, name, files,
                       kwargs={"name": name}, fixed_split="public", **extra)


def _wikipedia(name: str) -> DatasetSpec:
    files = ("raw/out1_node_feature_label.txt", "raw/out1_graph_edges.txt",
             *(f"raw/{name}_split_0.6_0.2_{i}.npz" for i in range(10)))
    return DatasetSpec("torch_geometric.datasets.wikipedia_network:WikipediaNetwork", "wikipedia_network",
                       f"{name}/geom_gcn", files,
                       kwargs={"name": name, "geom_gcn_preprocess": True},
                       undirected=False, fixed_split="geom-gcn",
                       detail="geom-gcn preprocessed, directed, 10 fixed splits, "
                              "self loops removed")


def _npz(loader: str, folder: str, name: str, file: str, alias: str) -> DatasetSpec:
    return DatasetSpec(f"torch_geometric.datasets.{loader.lower()}:{loader}", folder, name, (f"raw/{file}",),
                       kwargs={"name": name}, aliases=(alias,))


def _saint(name: str, detail: str = "") -> DatasetSpec:
    """A GraphSAINT-format graph (Flickr, Yelp): one folder of four raw files, a shipped split."""
    return DatasetSpec(f"torch_geometric.datasets.{name.lower()}:{name}", name.lower(), "",
                       ("raw/adj_full.npz", "raw/feats.npy", "raw/class_map.json", "raw/role.json"),
                       fixed_split="public", detail=detail)


def _ogb(name: str, undirected: bool = True, detail: str = "") -> DatasetSpec:
    """An OGB node-property graph, read from OGB's folder layout without the ``ogb`` package."""
    return DatasetSpec("fedgl.data.ogb_raw:OgbNodeDataset", "ogb", name.replace("-", "_"), ogb_files(name),
                       kwargs={"name": name}, undirected=undirected, fixed_split="public",
                       aliases=(name.removeprefix("ogbn-"),), detail=detail)


def _herigraph(city: str) -> DatasetSpec:
    return DatasetSpec("fedgl.data.herigraph:HeriGraph", "herigraph", city, (herigraph_file(city),),
                       kwargs={"name": city}, fixed_split="public", aliases=(f"herigraph-{city.lower()}",),
                       detail="fedgl's one-file format: union of the temporal, social and spatial subgraphs")


DATASETS: dict[str, DatasetSpec] = {
    "cora": _planetoid("Cora"),
    "citeseer": _planetoid("CiteSeer"),
    "pubmed": _planetoid(
        "PubMed", fallback_folder="planetoid_pubmed_approx",
        fallback_detail="PubMed from planetoid_pubmed_approx (reconstructed allx)"),
    "cs": _npz("Coauthor", "coauthor", "CS", "ms_academic_cs.npz", "coauthor-cs"),
    "physics": _npz("Coauthor", "coauthor", "Physics", "ms_academic_phy.npz", "coauthor-physics"),
    "computers": _npz("Amazon", "amazon", "Computers", "amazon_electronics_computers.npz",
                      "amazon-computers"),
    "photo": _npz("Amazon", "amazon", "Photo", "amazon_electronics_photo.npz", "amazon-photo"),
    "chameleon": _wikipedia("chameleon"),
    "squirrel": _wikipedia("squirrel"),
    "wikics": DatasetSpec("torch_geometric.datasets.wikics:WikiCS", "wikics", "", ("raw/data.json",),
                          kwargs={"is_undirected": True}, fixed_split="public",
                          aliases=("wiki-cs",), detail="20 fixed splits"),
    "reddit": DatasetSpec("torch_geometric.datasets.reddit:Reddit", "reddit", "",
                          ("raw/reddit_data.npz", "raw/reddit_graph.npz"), fixed_split="public"),
    "flickr": _saint("Flickr"),
    "yelp": _saint("Yelp", detail="multi-label (100 labels per node): refused by fedgl's single-label "
                                  "protocols"),
    "ogbn-arxiv": _ogb("ogbn-arxiv", undirected=False, detail="directed, OGB time split"),
    "ogbn-products": _ogb("ogbn-products", detail="OGB sales-ranking split"),
    **{city.lower(): _herigraph(city) for city in HERIGRAPH_CITIES},
}


@dataclass(frozen=True)
class DatasetStatus:
    """What ``fedgl datasets list`` shows for one dataset."""

    name: str
    source: str
    present: bool
    path: str
    detail: str


def dataset_names() -> list[str]:
    return [*DATASETS, SYNTHETIC]


def canonical_name(name: str) -> str:
    """Map a user-given name (any case, aliases, ``_`` for ``-``) to its canonical form."""
    if not isinstance(name, str):
        raise DataError(f"dataset name must be a string, got {type(name).__name__}")
    key = name.strip().lower().replace("_", "-")
    if key in DATASETS or key == SYNTHETIC:
        return key
    for canonical, spec in DATASETS.items():
        if key in spec.aliases:
            return canonical
    raise DataError(f"unknown dataset {name!r}; known datasets: {', '.join(dataset_names())}")


def _env_path(variable: str) -> str | None:
    value = os.environ.get(variable, "").strip()
    return value or None


def cache_root(cache_dir: str | None = None) -> Path:
    """Writable cache folder: ``cache_dir`` > ``$FEDGL_CACHE`` > ``~/.cache/fedgl``."""
    chosen = cache_dir or _env_path("FEDGL_CACHE") or "~/.cache/fedgl"
    return Path(chosen).expanduser().absolute()


def default_data_root() -> Path:
    return cache_root() / "datasets"


def resolve_data_root(root: str | None = None) -> str:
    """Data root: explicit ``root`` > ``$FEDGL_DATA_ROOT`` > ``<cache>/datasets``."""
    chosen = root or _env_path("FEDGL_DATA_ROOT")
    return str(Path(chosen).expanduser().absolute()) if chosen else str(default_data_root())


def _downloads_allowed(data_root: str) -> bool:
    return os.path.realpath(data_root) == os.path.realpath(default_data_root())


def _locate(spec: DatasetSpec, data_root: str) -> tuple[str, str] | None:
    """The folder holding all of ``spec``'s files (and its status detail), or None."""
    candidates = [(spec.folder, spec.detail)]
    if spec.fallback_folder:
        candidates.append((spec.fallback_folder, spec.fallback_detail))
    for folder, detail in candidates:
        base = Path(data_root, spec.relative_dir(folder))
        if all((base / file).is_file() for file in spec.files):
            return folder, detail
    return None


def _expected_files(spec: DatasetSpec, data_root: str) -> str:
    """The missing files of ``spec``'s primary folder, as a short one-line list."""
    base = Path(data_root, spec.relative_dir())
    missing = [f"{spec.relative_dir()}/{f}" for f in spec.files if not (base / f).is_file()]
    shown = ", ".join(missing[:3]) + (f" (+{len(missing) - 3} more)" if len(missing) > 3 else "")
    alternative = f" (or the same under {spec.fallback_folder}/)" if spec.fallback_folder else ""
    return f"expected {shown}{alternative}"


def _missing_message(name: str, spec: DatasetSpec, data_root: str) -> str:
    return (f"dataset {name!r} not found under {data_root}: {_expected_files(spec, data_root)} "
            f"(point dataset.data_root, --data-root or FEDGL_DATA_ROOT at the datasets)")


def _loader_class(name: str, spec: DatasetSpec) -> type:
    module, attribute = spec.loader.split(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except ImportError as exc:
        raise DataError(f"dataset {name!r} needs the {spec.package!r} package: "
                        f"pip install {spec.package}") from exc


def dataset_status(name: str, root: str | None = None) -> DatasetStatus:
    """Whether a dataset can be loaded from ``root`` and from where, without loading it."""
    name = canonical_name(name)
    if name == SYNTHETIC:
        return DatasetStatus(name, "generated", True, "", "contextual stochastic block model")
    spec = DATASETS[name]
    data_root = resolve_data_root(root)
    found = _locate(spec, data_root)
    if found is not None:
        folder, detail = found
        status = DatasetStatus(name, "local files", True,
                               str(Path(data_root, spec.relative_dir(folder))), detail)
    elif _downloads_allowed(data_root):
        status = DatasetStatus(name, "download", False, str(Path(data_root, spec.relative_dir())),
                               "downloaded on first load")
    else:
        status = DatasetStatus(name, "local files", False,
                               str(Path(data_root, spec.relative_dir())),
                               _expected_files(spec, data_root))
    if importlib.util.find_spec(spec.package) is None:
        note = f"needs the {spec.package!r} package: pip install {spec.package}"
        status = replace(status, detail="; ".join(filter(None, (note, status.detail))))
    return status


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Serialise PyG processing across processes so nobody reads a half-written file."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def _mirror(name: str, source: Path, relative_dir: str, cache: Path) -> Path:
    """Symlink every non-processed file of ``source`` into a writable mirror; return its base.

    The mirror is keyed by the source path and the files' sizes and mtimes, so replacing a
    raw file (e.g. the reconstructed PubMed ``allx``) leads to fresh processing.
    """
    files = sorted(
        Path(folder, file).relative_to(source)
        for folder, dirs, names in os.walk(source, followlinks=True)
        if "processed" not in Path(folder).relative_to(source).parts
        for file in names
    )
    digest = hashlib.sha256(os.path.realpath(source).encode())
    for file in files:
        stat = (source / file).stat()
        digest.update(f"\0{file}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    base = cache / "mirrors" / f"{name}-{digest.hexdigest()[:12]}"
    for file in files:
        link = base / relative_dir / file
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to((source / file).resolve())
    return base


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


_reads: ContextVar[list[str] | None] = ContextVar("fedgl_reads", default=None)
_audit_installed = False


def _record_read(event: str, args: tuple) -> None:
    """Audit hook: note files opened for reading (``open``'s arguments are path, mode, flags)."""
    if event != "open" or (reads := _reads.get()) is None or len(args) != 3:
        return
    path, mode, flags = args
    writing = any(c in mode for c in "wax+") if isinstance(mode, str) else int(flags) & (os.O_WRONLY | os.O_RDWR)
    if isinstance(path, (str, bytes, os.PathLike)) and not writing:
        reads.append(os.path.abspath(os.fsdecode(path)))


@contextmanager
def _files_read() -> Iterator[list[str]]:
    """The files this context opens for reading inside the block, in order (seen through Python's
    audit hook, installed once), so a reader that fails can be told which file it failed on."""
    global _audit_installed
    if not _audit_installed:
        sys.addaudithook(_record_read)
        _audit_installed = True
    reads: list[str] = []
    token = _reads.set(reads)
    try:
        yield reads
    finally:
        _reads.reset(token)


def _inside(path: object, folder: Path) -> bool:
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False
    return Path(os.path.abspath(os.fsdecode(path))).is_relative_to(folder)


def _cache_failure(exc: OSError, cache: Path) -> DataError:
    return DataError(f"cannot write the cache folder {cache} ({exc.strerror or _one_line(exc)}); "
                     f"set FEDGL_CACHE to a writable folder")


def _read_failure(name: str, spec: DatasetSpec, exc: Exception, reads: list[str], dataset_dir: Path,
                  cache: Path) -> DataError | None:
    """What went wrong, from the last dataset file read before ``exc``: a damaged raw file (named,
    to be fetched again), a damaged processed file (rebuilt once deleted), or a cache folder that
    cannot be written. None when the failure is none of these."""
    if isinstance(exc, OSError) and (exc.errno in (errno.ENOSPC, errno.EDQUOT) or _inside(exc.filename, cache)):
        return _cache_failure(exc, cache)  # processing writes only there
    for path in reversed(reads):
        relative = Path(path).relative_to(dataset_dir).as_posix() if _inside(path, dataset_dir) else ""
        if relative in spec.files:
            return DataError(f"dataset {name!r}: the file {os.path.realpath(path)} is damaged or truncated "
                             f"({_one_line(exc)}); delete it and download it again")
        if relative.startswith("processed/"):
            return DataError(f"dataset {name!r}: the processed file {path} is damaged ({_one_line(exc)}); "
                             f"delete {dataset_dir / 'processed'} to rebuild it")
    return None


def read_graph(name: str, root: str | None = None, cache_dir: str | None = None) -> Data:
    """Read a real dataset through PyG and normalise it.

    Returns ``Data`` with float32 ``x``, 1-D long ``y``, a coalesced ``edge_index`` without
    self loops (symmetrised for undirected datasets) and, for datasets that ship splits,
    ``train_mask``/``val_mask``/``test_mask`` of shape ``[N, num_splits]``.
    """
    spec = DATASETS[name]
    loader = _loader_class(name, spec)
    data_root = resolve_data_root(root)
    cache = cache_root(cache_dir)
    found = _locate(spec, data_root)
    if found is None and not _downloads_allowed(data_root):
        raise DataError(_missing_message(name, spec, data_root))
    try:
        with _exclusive(cache / "locks" / f"{name}.lock"):
            if found is None:
                dataset_dir = Path(data_root, spec.relative_dir())
                with _files_read() as reads:
                    try:
                        with _socket_timeout(DOWNLOAD_TIMEOUT):
                            dataset = loader(root=str(Path(data_root, spec.folder)), **spec.kwargs)
                    except Exception as exc:
                        failure = _read_failure(name, spec, exc, reads, dataset_dir, cache)
                        if failure is None and _locate(spec, data_root) is not None:
                            failure = DataError(f"could not process dataset {name!r} under {data_root}: "
                                                f"{_one_line(exc)}")
                        raise failure or DataError(f"{_missing_message(name, spec, data_root)}; download failed "
                                                   f"({_one_line(exc)})") from exc
            else:
                folder, _ = found
                relative_dir = spec.relative_dir(folder)
                base = (Path(data_root) if _downloads_allowed(data_root)
                        else _mirror(name, Path(data_root, relative_dir), relative_dir, cache))
                dataset_dir = base / relative_dir
                # PyG's own console lines ("Processing...") are dropped: success is silent, a failure is one line
                with _files_read() as reads, redirect_stderr(io.StringIO()):
                    try:
                        dataset = loader(root=str(base / folder), **spec.kwargs)
                    except Exception as exc:
                        raise _read_failure(name, spec, exc, reads, dataset_dir, cache) or DataError(
                            f"could not read dataset {name!r} from {Path(data_root, relative_dir)}: "
                            f"{_one_line(exc)} (delete {dataset_dir / 'processed'} to rebuild it)") from exc
    except OSError as exc:  # taking the lock or building the mirror
        if _inside(exc.filename, cache):
            raise _cache_failure(exc, cache) from exc
        raise DataError(f"could not read dataset {name!r}: {_one_line(exc)}") from exc
    return _normalise(name, spec, dataset)


def _fixed_masks(dataset: object, data: Data) -> tuple[torch.Tensor, ...]:
    """The shipped split(s) as three ``[N, K]`` bool masks."""
    num_nodes = data.num_nodes
    if hasattr(dataset, "get_idx_split"):
        index = dataset.get_idx_split()
        masks = []
        for key in ("train", "valid", "test"):
            mask = torch.zeros(num_nodes, 1, dtype=torch.bool)
            mask[index[key].view(-1), 0] = True
            masks.append(mask)
        return tuple(masks)
    masks = [data[key].bool() for key in ("train_mask", "val_mask", "test_mask")]
    width = max(mask.size(1) if mask.dim() == 2 else 1 for mask in masks)
    return tuple(
        (mask if mask.dim() == 2 else mask.view(-1, 1)).expand(num_nodes, width).contiguous()
        for mask in masks
    )


def _single_label(name: str, y: torch.Tensor) -> torch.Tensor:
    """``y`` as one class per node; a multi-label target (``[N, C]`` 0/1) is refused in one line."""
    if y.dim() == 2 and y.size(1) > 1:
        per_node = float(y.float().sum(1).mean())
        raise DataError(f"dataset {name!r} is multi-label ({y.size(1)} labels, {per_node:.2f} per node on "
                        f"average); fedgl's protocols train single-label classifiers and cannot use it")
    return y.view(-1).long()


def _normalise(name: str, spec: DatasetSpec, dataset: object) -> Data:
    data = dataset[0]
    y = _single_label(name, data.y)
    num_nodes = data.num_nodes
    x = data.x.to_dense() if data.x.is_sparse else data.x
    edge_index, _ = remove_self_loops(data.edge_index.long())
    if spec.undirected:
        edge_index = to_undirected(edge_index, num_nodes=num_nodes)
    else:
        edge_index = coalesce(edge_index, num_nodes=num_nodes)
    graph = Data(x=x.to(torch.float32), y=y, edge_index=edge_index)
    if spec.fixed_split:
        graph.train_mask, graph.val_mask, graph.test_mask = _fixed_masks(dataset, data)
    return graph
