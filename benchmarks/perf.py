"""The performance suite: fedgl's overhead over plain PyG, its speed beside a peer's, its scale and
its start-up.

    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/perf.py           # everything
    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/perf.py --quick   # a short pass (a few minutes)

Writes ``benchmarks/results/perf.json`` (every measure with its value, unit, target, pass/fail, and
the date and machine: CPU model, cores, load average at start, torch version) and ``perf.md`` (the
table the README includes). Each group runs in a fresh interpreter, so its peak memory is its own;
ratios are timed in one process, one right after the other, so a busy machine slows both sides.

Groups:

* ``overhead``: per protocol, seconds per round of the federated run over the same gradient work
  done by a plain PyG loop written here (``torch_geometric.nn`` layers, Adam, the same model, the
  same number of forward/backward passes over the same nodes; mini-batch neighbourhoods drawn here
  with the same batch size and fan-outs);
* ``peers``: FedAvg on Cora with 10 METIS clients and 100 rounds (``examples/fedavg-cora.yaml``): the
  whole ``fedgl run`` process, ms per round in-process, the same run on Ray, peak memory. The peers'
  figures are the issue reporter's measurements, quoted in the table, never compared in code;
* ``scale``: all PubMed users in nFedGNN (GCN, GAT), 1,000 FedAvg clients on PubMed;
  ``synthetic``: a 1.5M-node graph over 195 clients (FedAvg, Swift; ``--quick`` shrinks it);
* ``glasu-cs``: a GLASU round on Coauthor CS with 3 clients over a centralized epoch of the same model
  (GLASU with one client: the split model's L layers and classifier head), timed alternately;
* ``fedgnn-g-physics``: FedGNN-G at batch 256 with 20 random clients on Coauthor Physics, peak memory
  (skipped by ``--quick``);
* ``startup``: ``python -X importtime`` of ``fedgl.cli`` and ``fedgl.runner``, ``fedgl --version``.

``--only GROUP`` (repeatable) runs some groups and keeps the others' last rows in perf.json.

``--device cuda`` (or ``cuda:N``) runs every fedgl run with ``device: cuda`` and the plain PyG references
on the same GPU (each timed step waits for the GPU to finish), and adds the scale, synthetic and
FedGNN-G groups' peak GPU memory; the peer targets and the Physics address-space cap are the CPU
machine's and are left out. It writes ``perf-cuda.json`` and ``perf-cuda.md`` beside the CPU pass,
which it leaves alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from fedgl import device as devices
from fedgl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PEERS = ("OpenFGL (FedAvg, Cora, 10 clients, 100 rounds): 16.5 s per run, 121 ms per round, 461 MiB; "
         "FedGraph on Ray: 62 s per run. Measured by the issue reporter, 2-core machine.")
DEVICE_NAME = "cpu"  # ``--device``: where runs and references compute
DEVICE = devices.CPU  # the torch device it names (``use_device``)


# ---- measures -------------------------------------------------------------------------------------
@dataclass
class Measure:
    group: str
    name: str
    value: float | None
    unit: str
    target: str | None = None  # "<= 1.3", "< 4"; None: reported only
    note: str = ""

    @property
    def passed(self) -> bool | None:
        if self.target is None:
            return None
        if self.value is None:
            return False
        op, bound = self.target.split()
        return {"<=": self.value <= float(bound), "<": self.value < float(bound)}[op]

    def row(self) -> dict[str, Any]:
        return asdict(self) | {"pass": self.passed}


def failed(group: str, name: str, unit: str, target: str | None, err: BaseException) -> Measure:
    """A measure that could not be taken: no value, the error as its note (a target fails)."""
    return Measure(group, name, None, unit, target, f"not measured: {type(err).__name__}: {err}"[:300])


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": cpu, "cores": os.cpu_count(),
            "kernels": torch.backends.cpu.get_cpu_capability(),  # the instruction set torch's CPU kernels use
            "load_average": [round(x, 2) for x in os.getloadavg()], "torch": torch.__version__,
            "python": platform.python_version(), "device": DEVICE_NAME,
            **({"gpu": torch.cuda.get_device_name(DEVICE)} if DEVICE.type == "cuda" else {})}


def use_device(name: str) -> None:
    """Compute on ``name`` (cpu, cuda, cuda:N), refused with one line where this machine cannot."""
    global DEVICE, DEVICE_NAME
    DEVICE, DEVICE_NAME = devices.resolve(name), name


def finished(step: Callable[[], Any]) -> Callable[[], Any]:
    """``step`` with the benchmark's device as torch's default, returning once the device has done
    its work (a GPU runs kernels asynchronously, so an unfinished step would be timed short)."""
    def run() -> Any:
        with devices.working_on(DEVICE):
            out = step()
        if DEVICE.type == "cuda":
            torch.cuda.synchronize(DEVICE)
        return out
    return run


def paired_seconds(first: Callable[[], Any], second: Callable[[], Any], calls: int) -> tuple[float, float]:
    """Median seconds per call of two steps timed alternately (after one warm-up call each), so that a
    shared machine's slow spells fall on both sides of their ratio."""
    first()
    second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(calls):
        for step, out in zip((first, second), times):
            start = time.perf_counter()
            step()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def seconds_per_call(step: Callable[[], Any], calls: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - start) / calls


# ---- fedgl side -----------------------------------------------------------------------------------
def config(protocol: dict, dataset: str, model: dict, partition: dict | None = None,
           options: dict | None = None, **train: Any) -> dict:
    return {"dataset": {"name": dataset, **({"options": options} if options else {})},
            "partition": partition or {}, "model": model, "protocol": protocol,
            "train": {"rounds": 1000, "lr": 0.01, **train}, "network": {"compute": "ignore"}, "device": DEVICE_NAME}


class FedglRun:
    """A configured run whose rounds are timed one by one (no evaluation, no results folder)."""

    def __init__(self, cfg: dict, data=None):
        from fedgl.config import build_config
        from fedgl.runner import Run

        self.tmp = tempfile.mkdtemp(prefix="fedgl-perf-")
        self.job = Run(build_config(cfg), self.tmp, data=data)
        self.round = 0

    @property
    def protocol(self):
        return self.job.protocol

    def step(self) -> None:
        self.round += 1
        self.job.transport.set_round(self.round)
        self.job.protocol.train_round(self.round)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize(DEVICE)

    def close(self) -> None:
        self.job.transport.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def load(name: str, **options: Any):
    from fedgl.data import load_dataset

    split = "full" if name == "pubmed" else "default"
    return load_dataset(name, split=split, **options)


# ---- plain PyG references -------------------------------------------------------------------------
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
                    out = layer((x, x[: size[1]]), edge_index, size=size)
                    if self.roots is not None:
                        out = out + self.roots[i](x[: size[1]])
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
                 graphs: list | None = None, head: int | None = None):
        self.data, self.clients, self.batch, self.fanouts = data, clients, batch, fanouts
        self.graphs = graphs or [csr_of(data.edge_index, data.num_nodes)] * len(clients)
        self.model = pyg_stack(kind, dims, head=head)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)
        self.generator = devices.generator(DEVICE).manual_seed(0)

    def step(self, client: int) -> None:
        import torch.nn.functional as F

        train = self.clients[client]
        batch = train[torch.randperm(train.numel(), generator=self.generator)[: self.batch]]
        rowptr, col = self.graphs[client]
        nodes, blocks = sample_blocks(rowptr, col, batch, self.fanouts, self.generator)
        self.model.train()
        self.optimizer.zero_grad()
        out = self.model(self.data.x[nodes], blocks)
        F.cross_entropy(out, self.data.y[batch]).backward()
        self.optimizer.step()


# ---- overhead ---------------------------------------------------------------------------------------
def overhead(quick: bool, dataset: str = "cora", large: str = "pubmed", protocols: tuple[str, ...] | None = None
             ) -> list[Measure]:
    """Seconds per federated round over the plain PyG loop doing the same gradient work. The runs read
    the datasets on the CPU (their parties move what they hold to ``DEVICE``); the references are built
    and stepped on ``DEVICE`` from copies there (``small_dev``, ``big_dev``), with partitions made on the
    CPU."""
    from fedgl.partition import partition_horizontal
    from torch_geometric.utils import subgraph

    rounds = 5 if quick else 30
    targets = {"centralized": "<= 1.3", "fedavg": "<= 1.3", "nfedgnn": "<= 1.3", "glasu": "<= 2", "swift": "<= 2"}
    gcn = {"name": "gcn", "hidden": 64, "layers": 2}
    sage = {"name": "sage", "hidden": 256, "layers": 2}
    out: list[Measure] = []

    def measure(name: str, cfg: dict, reference: Callable[[Any], Callable[[], None]], data, what: str,
                calls: int = rounds) -> None:
        target = targets.get(name)
        try:
            run = FedglRun(cfg, data)
            try:
                with devices.working_on(DEVICE):  # the reference's model and working tensors there
                    step = reference(run)
                fed, ref = paired_seconds(run.step, finished(step), calls)
            finally:
                run.close()
        except Exception as err:  # one failing protocol must not hide the others
            out.append(failed("overhead", name, "x", target, err))
            return
        out.append(Measure("overhead", name, fed / ref, "x", target,
                           f"{fed * 1e3:.1f} ms per round against {ref * 1e3:.1f} ms of plain PyG; {what}"))

    wanted = protocols or ("centralized", "fedavg", "glasu", "nfedgnn", "swift", "fedgnn-g", "fedaas")
    small = load(dataset)
    small_dev = devices.move(small, DEVICE)
    small_x = pyg_features(small_dev.x)
    classes = int(small.y.max()) + 1
    mask = small_dev.train_mask
    if "centralized" in wanted:
        def full(run):
            model = pyg_stack("gcn", [small.num_features, 64, classes])
            opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
            return lambda: pyg_full_graph_step(model, opt, small_x, small_dev.edge_index, small_dev.y, mask)
        measure("centralized", config({"name": "centralized"}, dataset, gcn), full, small,
                f"GCN 64, {dataset}, one full-graph epoch per round")
    if "fedavg" in wanted:
        owner = devices.move(partition_horizontal(small, 10, "metis", seed=0).owner, DEVICE)  # the run's own

        def per_client(run):
            steps = []
            for k in range(10):
                nodes = (owner == k).nonzero().flatten()
                edges, _ = subgraph(nodes, small_dev.edge_index, relabel_nodes=True, num_nodes=small.num_nodes)
                model = pyg_stack("gcn", [small.num_features, 64, classes])
                opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
                steps.append((model, opt, pyg_features(small_dev.x[nodes]), edges, small_dev.y[nodes], mask[nodes]))
            return lambda: [pyg_full_graph_step(*s) for s in steps for _ in range(3)]
        measure("fedavg", config({"name": "fedavg", "local_epochs": 3}, dataset, gcn,
                                 {"num_clients": 10, "method": "metis"}), per_client, small,
                f"GCN 64, {dataset}, 10 METIS clients x 3 local epochs per round")
    if "glasu" in wanted:
        def split(run):
            blocks = torch.arange(small.num_features).chunk(3)
            steps = []
            for cols in blocks:
                model = pyg_stack("gcn", [cols.numel(), 64, 64])
                head = torch.nn.Linear(64, classes)
                params = [*model.parameters(), *head.parameters()]
                opt = torch.optim.Adam(params, lr=0.01)
                steps.append((model, head, opt, pyg_features(small_dev.x[:, cols].contiguous())))

            def step():
                for model, head, opt, x in steps:
                    model.train()
                    opt.zero_grad()
                    h = fast_dropout(model(x, small_dev.edge_index).relu(), True)
                    torch.nn.functional.cross_entropy(head(h)[mask], small_dev.y[mask]).backward()
                    opt.step()
            return step
        measure("glasu", config({"name": "glasu", "K": 2, "Q": 1, "S": 10**9, "batches": 1, "sampling": "full"},
                                dataset, gcn, {"num_clients": 3, "method": "random", "edge_keep": 1.0}), split, small,
                f"GCN 64, {dataset}, 3 clients (feature blocks), all training nodes, full neighbourhoods, "
                "K = L = 2, Q = 1: each client a full-graph pass over its block")
    if "nfedgnn" in wanted:
        def full_gcn(run):
            return laplacian_gcn_step(small_x, small_dev.edge_index, small_dev.y, mask, 64, classes, run.protocol.lam)
        measure("nfedgnn", config({"name": "nfedgnn"}, dataset, gcn), full_gcn, small,
                f"GCN 64, {dataset}, every node a user, one full-graph step per round; the reference's loss adds "
                "the same Laplacian penalty on the first layer's projection (Eq. 6-7, lam of the run)")
    if any(p in wanted for p in ("swift", "fedgnn-g", "fedaas")):
        big = load(large)
        big_dev = devices.move(big, DEVICE)
        big_classes = int(big.y.max()) + 1
        owner = partition_horizontal(big, 10, "metis", seed=0).owner
        train = devices.move([((owner == k) & big.train_mask).nonzero().flatten() for k in range(10)], DEVICE)
        local = [devices.move(csr_of(big.edge_index[:, owner[big.edge_index[0]] == owner[big.edge_index[1]]],
                                     big.num_nodes), DEVICE)] * 10
        whole = devices.move(csr_of(big.edge_index, big.num_nodes), DEVICE)
        for name, cross in (("swift", 5), ("fedgnn-g", 10)):
            if name not in wanted:
                continue

            def reference(run, cross=cross):
                ref = MiniBatchReference(big_dev, "sage", [big.num_features, 256, big_classes], train, 256, [15, 10],
                                         [whole] * cross + local[cross:])
                return lambda: [ref.step(k) for k in range(10)]
            options = {"name": name, "batch_size": 256, "fanouts": [15, 10]} | (
                {"I": 1, "K": 5} if name == "swift" else {})
            measure(name, config(options, large, sage, {"num_clients": 10, "method": "metis"}), reference, big,
                    f"GraphSAGE 256, {large}, 10 METIS clients, batch 256, fan-outs 15/10; {cross} clients sample "
                    "across clients each iteration (the reference samples their neighbours in the whole graph)")
        if "fedaas" in wanted:
            def attention(run):
                ref = MiniBatchReference(big_dev, "attention", [big.num_features, 256, 128], train, 0, [10, 10],
                                         [whole] * 10, head=big_classes)
                sizes = [max(1, -(-t.numel() // 10)) for t in train]

                def step():
                    for k in range(10):
                        ref.batch = sizes[k]
                        for _ in range(10):
                            ref.step(k)
                return step
            measure("fedaas", config({"name": "fedaas", "widths": [256, 128], "fanouts": [10, 10], "batches": 10,
                                      "interval_loss": "train"},
                                     large, {},
                                     {"num_clients": 10, "method": "metis"}, weight_decay=0.0),
                    attention, big, f"attention 256/128 + root weight, {large}, 10 METIS clients x 10 batches, "
                    "fan-outs 10/10 (the reference: PyG GATConv, one head, plus a root Linear, two layers and a "
                    "linear head)", calls=max(2, rounds // 10))
    return out


# ---- peers ------------------------------------------------------------------------------------------
def timed_process(argv: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """Wall seconds and peak resident MiB of one child process (its own rusage, via wait4)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv[:4])} exited {proc.returncode}: {output.strip()[-300:]}")
    return wall, usage.ru_maxrss / 1024, output


def fedgl_command() -> list[str]:
    return [sys.executable, "-m", "fedgl.cli"]


def peers(quick: bool) -> list[Measure]:
    """The peer setting: examples/fedavg-cora.yaml (FedAvg, Cora, 10 METIS clients, 100 rounds,
    3 local epochs, GCN 64, Adam 0.01, evaluation every round). Each process is run three times (once
    with ``--quick``) and the median reported, as one run on a shared machine can be a slow spell. The
    targets are the 2-core CPU machine's; a GPU pass reports the same measures without them (its
    processes also start CUDA)."""
    example = str(ROOT / "examples" / "fedavg-cora.yaml")
    seconds, mib, ms, ray_seconds = ("<= 4", "<= 500", "<= 10", "<= 12") if DEVICE.type == "cpu" else (None,) * 4
    repeats = 1 if quick else 3
    out: list[Measure] = []
    with tempfile.TemporaryDirectory() as tmp:
        base = [*fedgl_command(), "run", example, "--quiet", "--overwrite", "--rounds", "100",
                "--set", f"device={DEVICE_NAME}"]
        note = f"median of {repeats} runs"
        try:
            runs, per_round = [], []
            for _ in range(repeats):
                runs.append(timed_process([*base, "--out", f"{tmp}/local"]))
                per_round.append(json.loads((Path(tmp) / "local" / "summary.json").read_text())["wall_ms_per_round"])
            out += [Measure("peers", "fedavg cora: whole `fedgl run` process", statistics.median(r[0] for r in runs),
                            "s", seconds, f"{note}. {PEERS}"),
                    Measure("peers", "fedavg cora: peak memory of that process", max(r[1] for r in runs), "MiB",
                            mib, f"largest of {repeats} runs"),
                    Measure("peers", "fedavg cora: ms per round in-process (train + evaluation)",
                            statistics.median(per_round), "ms", ms, f"{note}, read from their summaries")]
        except Exception as err:  # every row the local runs would have given says why it is missing
            out += [failed("peers", "fedavg cora: whole `fedgl run` process", "s", seconds, err),
                    failed("peers", "fedavg cora: peak memory of that process", "MiB", mib, err),
                    failed("peers", "fedavg cora: ms per round in-process (train + evaluation)", "ms", ms, err)]
        try:
            walls = [timed_process([*base, "--out", f"{tmp}/ray", "--backend", "ray"])[0] for _ in range(repeats)]
            out.append(Measure("peers", "fedavg cora: whole run on Ray (`--backend ray`)", statistics.median(walls),
                               "s", ray_seconds, note))
        except Exception as err:
            out.append(failed("peers", "fedavg cora: whole run on Ray (`--backend ray`)", "s", ray_seconds, err))
    return out


# ---- scale ------------------------------------------------------------------------------------------
def peak_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gpu_peak(group: str, name: str) -> list[Measure]:
    """The process's peak GPU memory so far, as a measure (none on the CPU)."""
    if DEVICE.type != "cuda":
        return []
    return [Measure(group, name, torch.cuda.max_memory_allocated(DEVICE) / 2**20, "MiB", None,
                    "torch.cuda.max_memory_allocated")]


def round_timer(group: str, out: list[Measure], rounds: int) -> Callable[..., None]:
    """``per_round(name, cfg, target, note, data=None)``: seconds per round of a run (after one warm-up
    round), appended to ``out``."""
    def per_round(name: str, cfg: dict, target: str | None, note: str, data=None) -> None:
        try:
            run = FedglRun(cfg, data)
            try:
                value = seconds_per_call(run.step, rounds)
            finally:
                run.close()
        except Exception as err:
            out.append(failed(group, name, "s", target, err))
            return
        out.append(Measure(group, name, value, "s", target, note))
    return per_round


def scale(quick: bool) -> list[Measure]:
    """Large populations: each setting's seconds per round (after one warm-up round)."""
    out: list[Measure] = []
    per_round = round_timer("scale", out, 1 if quick else 3)

    gat = {"name": "gat", "hidden": 64, "layers": 2, "options": {"heads": 8}}
    gcn = {"name": "gcn", "hidden": 64, "layers": 2}
    per_round("nfedgnn GCN: one round of all 19,717 PubMed users",
              config({"name": "nfedgnn"}, "pubmed", {**gcn, "hidden": 16}), None, "GCN 16 (examples/nfedgnn-cora.yaml)")
    per_round("nfedgnn GAT: one round of all 19,717 PubMed users", config({"name": "nfedgnn"}, "pubmed", gat),
              "<= 0.5", "GAT 8 heads x 8")
    clients = 100 if quick else 1000
    per_round(f"fedavg: one round of {clients:,} horizontal clients on PubMed",
              config({"name": "fedavg", "local_epochs": 1}, "pubmed", gcn, {"num_clients": clients,
                                                                             "method": "random"}),
              None, "GCN 64, random partition, 1 local epoch")
    return out + gpu_peak("scale", "after the scale settings: peak GPU memory of the process")


def synthetic(quick: bool) -> list[Measure]:
    """The 1.5M-node graph over 195 clients, in a process of its own (its peak memory is the setting's)."""
    out: list[Measure] = []
    per_round = round_timer("synthetic", out, 1 if quick else 3)

    gcn = {"name": "gcn", "hidden": 64, "layers": 2}
    nodes, parts = (150_000, 20) if quick else (1_500_000, 195)
    options = {"num_nodes": nodes, "num_features": 128, "num_classes": 10, "avg_degree": 10}
    try:
        start = time.perf_counter()
        graph = load("synthetic", **options)
        built = time.perf_counter() - start
    except Exception as err:
        out.append(failed("synthetic", "synthetic graph", "s", None, err))
        return out
    note = f"{nodes:,} nodes, 128 features, {parts} random clients, GCN 64, 1 local epoch; graph built in {built:.0f} s"
    target = "<= 10" if not quick else None
    per_round(f"fedavg: one round, {nodes:,}-node synthetic graph, {parts} clients",
              config({"name": "fedavg", "local_epochs": 1}, "synthetic", gcn,
                     {"num_clients": parts, "method": "random"}, options), target, note, data=graph)
    out.append(Measure("synthetic", "fedavg on the synthetic graph: peak memory of the process", peak_mib(), "MiB",
                       None if quick else "<= 16384"))
    out += gpu_peak("synthetic", "fedavg on the synthetic graph: peak GPU memory of the process")
    if not quick:
        per_round(f"swift: one iteration, {nodes:,}-node synthetic graph, {parts} clients",
                  config({"name": "swift", "batch_size": 256, "fanouts": [15, 10], "I": 10, "K": 5}, "synthetic",
                         {"name": "sage", "hidden": 256, "layers": 2}, {"num_clients": parts, "method": "random"},
                         options), None, "GraphSAGE 256, batch 256, fan-outs 15/10, I = 10, K = 5", data=graph)
        out.append(Measure("synthetic", "after swift: peak memory of the process", peak_mib(), "MiB"))
        out += gpu_peak("synthetic", "after swift: peak GPU memory of the process")
    return out


def glasu_cs(quick: bool) -> list[Measure]:
    """GLASU on Coauthor CS with 3 clients (all training nodes, full neighbourhoods, K = L = 2, Q = 1)
    per round over one epoch of the same model trained centrally: GLASU with one client holding every
    feature and edge (the paper's Cent., exactly centralized training of the split model: L GCN layers
    and a classifier head), in one process."""
    gcn = {"name": "gcn", "hidden": 64, "layers": 2}
    options = {"name": "glasu", "K": 2, "Q": 1, "S": 10**9, "batches": 1, "sampling": "full"}
    rounds = 3 if quick else 10
    name = "glasu round / centralized epoch of the same model, Coauthor CS, 3 clients"
    try:
        glasu = FedglRun(config(options, "cs", gcn, {"num_clients": 3, "method": "random", "edge_keep": 1.0}))
        central = FedglRun(config(options, "cs", gcn, {"num_clients": 1, "method": "random", "edge_keep": 1.0}))
        try:
            federated, epoch = paired_seconds(glasu.step, central.step, rounds)
        finally:
            glasu.close()
            central.close()
    except Exception as err:
        return [failed("glasu-cs", name, "x", "<= 3", err)]
    return [Measure("glasu-cs", name, federated / epoch, "x", "<= 3",
                    f"{federated * 1e3:.0f} ms per GLASU round against {epoch * 1e3:.0f} ms per epoch of GLASU with "
                    "one client (2 GCN layers of 64 and a classifier head); every client a full-graph pass over "
                    "its feature block")]


def fedgnn_g_physics(quick: bool) -> list[Measure]:
    """FedGNN-G at batch 256 with 20 random clients on Coauthor Physics: seconds per iteration and the
    process's peak memory. On the CPU the child's address space is capped (``MEMORY_CAP_GIB``) so a run
    that would exhaust the machine fails with MemoryError instead; CUDA reserves far more address space
    than it uses, so a GPU pass runs uncapped."""
    import resource

    if quick:
        return []
    capped = DEVICE.type == "cpu"
    if capped:
        cap = MEMORY_CAP_GIB * 1024**3
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    out: list[Measure] = []
    round_timer("fedgnn-g-physics", out, 3)(
        "fedgnn-g: one iteration, Coauthor Physics, 20 random clients, batch 256",
        config({"name": "fedgnn-g", "batch_size": 256, "fanouts": [15, 10]}, "physics",
               {"name": "sage", "hidden": 256, "layers": 2}, {"num_clients": 20, "method": "random"}), None,
        "GraphSAGE 256, fan-outs 15/10, every client crosses every iteration")
    out.append(Measure("fedgnn-g-physics", "fedgnn-g on Coauthor Physics: peak memory of the process", peak_mib(),
                       "MiB", "<= 8192", f"address space capped at {MEMORY_CAP_GIB} GiB" if capped else ""))
    return out + gpu_peak("fedgnn-g-physics", "fedgnn-g on Coauthor Physics: peak GPU memory of the process")


MEMORY_CAP_GIB = 12


# ---- start-up ---------------------------------------------------------------------------------------
def import_seconds(module: str) -> tuple[float, set[str]]:
    """``python -X importtime -c "import MODULE"``: the module's cumulative import time and every
    module the import loaded."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True,
                          text=True, check=True)
    loaded, total = set(), 0.0
    for line in proc.stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if match:
            loaded.add(match.group(3))
            if match.group(3) == module and not match.group(2):
                total = int(match.group(1)) / 1e6
    return total, loaded


HEAVY = {"matplotlib", "ray", "sklearn", "rich", "torch", "torch_geometric", "pandas", "networkx", "scipy"}


def startup(quick: bool) -> list[Measure]:
    rows = []
    for module in ("fedgl.cli", "fedgl.runner"):
        seconds, loaded = import_seconds(module)
        heavy = sorted({m.split(".")[0] for m in loaded} & HEAVY)
        dynamo = "loads torch._dynamo" if "torch._dynamo" in loaded else "without torch._dynamo"
        rows.append(Measure("startup", f"`import {module}` (-X importtime, cumulative)", seconds, "s", None,
                            "heavy packages loaded: " + (", ".join(heavy) or "none") + f"; {dynamo}"))
    wall, _, _ = timed_process([*fedgl_command(), "--version"])
    pyg_seconds, pyg_loaded = import_seconds("torch_geometric")
    return [
        *rows,
        Measure("startup", "`fedgl --version`, whole process", wall, "s"),
        Measure("startup", "`import torch_geometric` without fedgl (-X importtime, cumulative)", pyg_seconds, "s",
                None, "loads torch._dynamo" if "torch._dynamo" in pyg_loaded else "without torch._dynamo"),
    ]


GROUPS: dict[str, Callable[[bool], list[Measure]]] = {"startup": startup, "overhead": overhead, "peers": peers,
                                                      "scale": scale, "synthetic": synthetic, "glasu-cs": glasu_cs,
                                                      "fedgnn-g-physics": fedgnn_g_physics}


# ---- output -----------------------------------------------------------------------------------------
def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def markdown(result: dict) -> str:
    m = result["machine"]
    ran = f"groups {', '.join(result['groups_run'])}" if result.get("groups_run") else "every group"
    kernels = f", {m['kernels']} kernels" if m.get("kernels") else ""
    gpu = f" and {m['device']} ({m['gpu']})" if m.get("gpu") else ""
    lines = [f"Last run {m['date']} ({ran}) on {m['cpu']} ({m['cores']} cores{kernels}, load average "
             f"{m['load_average'][0]} at start){gpu}, torch {m['torch']}, "
             f"{'quick' if result['quick'] else 'full'} pass. "
             "The measured column is when the row's group ran, the load column the 1-minute load average then (the "
             "machine is shared).", "",
             "| group | measure | value | unit | target | pass | measured | load | notes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in result["measures"]:
        verdict = {True: "pass", False: "FAIL", None: ""}[row["pass"]]
        note = row["note"].replace("|", "/")
        lines.append(f"| {row['group']} | {row['name']} | {fmt(row['value'])} | {row['unit']} | "
                     f"{row['target'] or ''} | {verdict} | {row.get('measured', '')} | {row.get('load_average', '')} | "
                     f"{note} |")
    return "\n".join(lines) + "\n"


def stem(device: str) -> str:
    """The results' file name: ``perf`` for the CPU pass the README includes, ``perf-cuda`` for a GPU's."""
    return "perf" if device == "cpu" else "perf-cuda"


def write(result: dict, out_dir: Path = RESULTS) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = stem(result["machine"].get("device", "cpu"))
    json_path, md_path = out_dir / f"{name}.json", out_dir / f"{name}.md"
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    md_path.write_text(markdown(result))
    return json_path, md_path


def run_group(name: str, quick: bool) -> list[dict]:
    """One group in a fresh interpreter; its measures as rows."""
    argv = [sys.executable, __file__, "--child", name, "--device", DEVICE_NAME] + (["--quick"] if quick else [])
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        err = RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
        return [failed(name, f"the {name} group", "", None, err).row()]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short pass: fewer rounds, the big settings shrunk")
    parser.add_argument("--only", action="append", choices=sorted(GROUPS), help="run only this group (repeatable)")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="folder for perf.json and perf.md (a GPU pass: perf-cuda.json and perf-cuda.md)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default), cuda or cuda:N: where runs and references compute; a GPU pass writes "
                             "perf-cuda.json and perf-cuda.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", args.device):
        parser.error(f"--device {args.device}: expected cpu, cuda or cuda:N")
    try:
        use_device(args.device)
    except ConfigError as err:
        parser.error(str(err))
    if args.child:
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        torch.set_num_threads(1)  # as fedgl runs by default (threads: 1)
        load, date = round(os.getloadavg()[0], 2), time.strftime("%Y-%m-%d %H:%M")
        print(json.dumps([m.row() | {"load_average": load, "measured": date}
                          for m in GROUPS[args.child](args.quick)]))
        return
    result = {"machine": machine(), "quick": args.quick, "peers_cited": PEERS, "measures": []}
    previous = args.out / f"{stem(DEVICE_NAME)}.json"
    if args.only:
        result["groups_run"] = args.only
    earlier = json.loads(previous.read_text()) if args.only and previous.exists() else None
    if earlier is not None and earlier["machine"].get("gpu") != result["machine"].get("gpu"):
        print(f"{previous} was measured on another GPU ({earlier['machine'].get('gpu')}); its rows are dropped")
        earlier = None
    if earlier is not None:  # keep the other groups' last measures, with their dates
        result["measures"] = [{"measured": earlier["machine"]["date"], **row} for row in earlier["measures"]
                              if row["group"] not in args.only]
    for name in args.only or GROUPS:
        started = time.perf_counter()
        rows = run_group(name, args.quick)
        result["measures"] += rows
        print(f"{name}: {len(rows)} measures in {time.perf_counter() - started:.0f} s", flush=True)
        for row in rows:
            verdict = {True: "pass", False: "FAIL", None: ""}[row["pass"]]
            print(f"  {row['name']}: {fmt(row['value'])} {row['unit']} {row['target'] or ''} {verdict}", flush=True)
    order = list(GROUPS)
    result["measures"].sort(key=lambda row: order.index(row["group"]) if row["group"] in order else len(order))
    json_path, md_path = write(result, args.out)
    print(f"written to {json_path} and {md_path}")


if __name__ == "__main__":
    main()
