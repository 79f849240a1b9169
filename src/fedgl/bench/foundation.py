"""The foundation's reference task: centralized GCN against FedAvg with METIS clients on Cora."""

from __future__ import annotations

from .core import BenchTask, Variant

_BASE = {
    "dataset": {"name": "cora"},
    "model": {"name": "gcn", "hidden": 64, "layers": 2, "dropout": 0.5},
    "train": {"rounds": 100, "lr": 0.01, "weight_decay": 5e-4},
    "partition": {"num_clients": 10, "method": "metis"},
    "network": {"compute": "ignore"},
}

TASKS = {
    "foundation-cora": BenchTask(
        name="foundation-cora",
        description="Cora public split, 2-layer GCN (64 hidden): centralized training against FedAvg over "
                    "10 METIS clients that ignore cross-client edges (3 local epochs per round).",
        base=_BASE,
        variants=[
            Variant("centralized", {"protocol.name": "centralized", "train.rounds": 200}),
            Variant("fedavg-metis10", {"protocol.name": "fedavg", "protocol.local_epochs": 3}),
            Variant("fedavg-random10", {"protocol.name": "fedavg", "protocol.local_epochs": 3,
                                        "partition.method": "random"}),
        ],
        columns=["test_accuracy", "best_val_accuracy", "bytes_total", "wall_time_s"],
        seeds=5,
        quick={"train.rounds": 20},
    ),
}
