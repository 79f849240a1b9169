"""The fast paths of FedGNN-G, CNFGNN and FedAAS give the runs the code before them gave, to the bit.

Each case is a short run; its fingerprint is the SHA-256 of every metric row (wall time aside), every
ledger line and the summary (timings aside), so one flipped bit in a loss, an accuracy or a byte count
changes it. The expected fingerprints (and the last training loss, to read) were produced by the code
before the fast paths (main at ede103e; the two sparse FedGNN-G cases at 785c012, which has the same
code there; torch 2.13 CPU, one thread) with ``python tests/test_perf_equivalence.py``, which prints them,
and printed again when summaries gained keys (``final_train_loss``, ``label_reach``; every loss the same) and
when the split GCN's propagation became a CSR product (``cnfgnn-synthetic`` only, a later digit of a metric:
its sums run in another order; ``cnfgnn-cora`` kept its fingerprint);
they pin float results of this platform's kernels, so on another torch or another CPU kernel set the
pinned cases skip, saying so. The sparse FedGNN-G cases are also run against the dense route (the rows
made dense before they are summed) in the same process, which holds on any platform. Adding an owner's
sparse rows in another order fails the sparse GraphSAGE case.
"""

from __future__ import annotations

import hashlib
import json
import sys

import pytest
import torch

from fedgl.config import build_config
from fedgl.data import load_dataset
from fedgl.protocols.horizontal import client as horizontal_client, partial_sums, shared
from fedgl.search import run

SYNTHETIC = {"name": "synthetic", "options": {"num_nodes": 300, "num_features": 64, "avg_degree": 6}}
# Two clients and many neighbours: a pair sums several rows, so the order they are added in shows.
CROWDED = {"name": "synthetic", "options": {"num_nodes": 300, "num_features": 64, "avg_degree": 16}}


def settings(protocol: dict, model: dict | None = None, dataset: dict = SYNTHETIC, clients: int = 4,
             rounds: int = 3) -> dict:
    return {"seed": 3, "threads": 1, "dataset": dataset, "partition": {"num_clients": clients, "method": "random"},
            "model": model or {}, "protocol": protocol, "train": {"rounds": rounds, "lr": 0.01},
            "eval": {"every": 1}, "network": {"compute": "ignore"}}


CROSS = {"batch_size": 32, "fanouts": [12, 8]}
# name: (settings, forced feature density of horizontal clients (1.0: sparse rows of the thinned synthetic
# features, 0.0: dense), real data (slow))
CASES = {
    "fedgnn-g-sage-sparse": (settings({"name": "fedgnn-g", **CROSS}, {"name": "sage", "hidden": 8, "dropout": 0.5},
                                      CROWDED, clients=2), 1.0, False),
    "fedgnn-g-gcn-sparse-backprop": (settings({"name": "fedgnn-g", "remote_backprop": True, **CROSS},
                                              {"name": "gcn", "hidden": 8, "dropout": 0.3}, CROWDED, clients=2),
                                     1.0, False),
    "fedgnn-g-gin-dense": (settings({"name": "fedgnn-g", "min_aggregate": 1, **CROSS},
                                    {"name": "gin", "hidden": 8, "dropout": 0.2}), 0.0, False),
    "fedgnn-g-cora": (settings({"name": "fedgnn-g", "batch_size": 64, "fanouts": [15, 10]},
                               {"name": "sage", "hidden": 64}, {"name": "cora"}, clients=10, rounds=2), None, True),
    "cnfgnn-synthetic": (settings({"name": "cnfgnn", "message_mb": 0.02}, {"name": "gcn", "hidden": 8}), None, False),
    "cnfgnn-cora": (settings({"name": "cnfgnn"}, {"name": "gcn", "hidden": 16, "dropout": 0.5}, {"name": "cora"},
                             rounds=2), None, True),
    "fedaas-synthetic": (settings({"name": "fedaas", "widths": [16, 8], "fanouts": [4, 4], "interval_loss": "train",
                                   "batches": 4}), None, False),
    "fedaas-cora": (settings({"name": "fedaas", "widths": [32, 16], "fanouts": [10, 10], "interval_loss": "train",
                              "batches": 2},
                             dataset={"name": "cora"}, clients=5, rounds=2), None, True),
}

PINNED_ON = ("2.13.0+cpu", "AVX512", "Intel(R) Xeon(R) Processor")  # torch, its kernels and the CPU of EXPECTED


def cpu_model() -> str:
    """The CPU's model name (float results of one kernel set can still differ between CPU makers)."""
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")
EXPECTED: dict[str, tuple[str, float]] = {
    'cnfgnn-cora': ('a399923765a44f4bff3f0053dacad40c6cbb6167248800f6c3a741e7eef226af', 1.9442354440689087),
    'cnfgnn-synthetic': ('ec5fcfa04da99cc0e5352c19bd9ee3a42ef8cac0126fe3bc091bc45443b549ff', 1.5128514766693115),
    'fedaas-cora': ('a9ba329da12e916e8ca8b41071a2bdf2de98ad66fe697d8a8628c89e1e603980', 1.8671653908682737),
    'fedaas-synthetic': ('7a0dcd17cb0980c14d72ba435f98bce9880a71652ebfda540275c8ba07759e45', 1.268420756727009),
    'fedgnn-g-cora': ('00ee3c2709dc1f819ec1d4480dd14e7ef9942384a12098bf9f771e94418566a7', 1.8329514741897583),
    'fedgnn-g-gcn-sparse-backprop': ('3158ef831872033181b277f5e3f7a626d4c323ae74145885c92fbc45a5199837',
                                     1.3955830335617065),
    'fedgnn-g-gin-dense': ('756a939c359ad7261962b2d8466c276a7c447f2b1bd1f11a3f96d9074928e99f', 1.3095051646232605),
    'fedgnn-g-sage-sparse': ('564e94d699f35ea9f376b379cdbeb6685c082787776a7df2b664d446daacd6da', 1.4022790789604187),
}


def fingerprint(folder) -> tuple[str, float]:
    """(SHA-256 of the run's metrics, ledger and summary without timings, last training loss)."""
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if k != "wall_time_s"} for r in rows]
    summary = json.loads((folder / "summary.json").read_text())
    summary = {k: v for k, v in summary.items() if k not in ("wall_time_s", "wall_ms_per_round", "compute_s_by_party")}
    text = json.dumps([rows, (folder / "ledger.jsonl").read_text(), summary], sort_keys=True)
    losses = [r["train_loss"] for r in rows if "train_loss" in r]
    return hashlib.sha256(text.encode()).hexdigest(), losses[-1]


def thinned(cfg: dict):
    """The synthetic graph of ``cfg`` with half its feature values zeroed (fixed draw): sparse rows of
    unequal values, whose sums depend on the order they are added in."""
    data = load_dataset("synthetic", **cfg["dataset"]["options"])
    keep = torch.rand(data.x.shape, generator=torch.Generator().manual_seed(5)) < 0.5
    data.x = data.x * keep
    return data


def run_case(name: str, folder, monkeypatch=None) -> tuple[str, float]:
    cfg, density, _ = CASES[name]
    data = thinned(cfg) if density == 1.0 else None
    if density is not None:
        if monkeypatch is None:
            shared.FEATURE_DENSITY = density
        else:
            monkeypatch.setattr(shared, "FEATURE_DENSITY", density)
    return fingerprint(run(build_config(cfg), folder, data=data).out_dir)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if CASES[n][2] else n for n in sorted(CASES)])
def test_run_is_the_run_before_the_fast_paths(name, tmp_path, monkeypatch, request):
    here = (torch.__version__, torch.backends.cpu.get_cpu_capability(), cpu_model())
    if here != PINNED_ON:
        pytest.skip(f"fingerprints pinned on torch {PINNED_ON[0]} with {PINNED_ON[1]} kernels on {PINNED_ON[2]}; "
                    f"here {here}")
    if CASES[name][2]:
        request.getfixturevalue("data_root")
    digest, loss = run_case(name, tmp_path, monkeypatch)
    assert (digest, loss) == EXPECTED[name]


@pytest.mark.parametrize("name", ["fedgnn-g-sage-sparse", "fedgnn-g-gcn-sparse-backprop"])
def test_sparse_partial_sums_equal_the_dense_route_to_the_bit(name, tmp_path, monkeypatch):
    """Owners summing sparse rows entry by entry give the run whose owners make the rows dense first."""
    fast = run_case(name, tmp_path / "sparse", monkeypatch)
    monkeypatch.setattr(horizontal_client, "pick_sums", lambda h, *args: partial_sums.pick_sums(
        h.to_dense() if h.layout != torch.strided else h, *args))
    assert run_case(name, tmp_path / "dense", monkeypatch) == fast


if __name__ == "__main__":  # prints the expected fingerprints of this code
    import tempfile
    from pathlib import Path

    for case in sys.argv[1:] or sorted(CASES):
        default = shared.FEATURE_DENSITY
        with tempfile.TemporaryDirectory() as tmp:
            print(f"    {case!r}: {run_case(case, Path(tmp))!r},", flush=True)
        shared.FEATURE_DENSITY = default
