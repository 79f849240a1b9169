"""Speed of the in-process backend: FedAvg on Cora with 10 METIS clients.

The setting peers use by default: 100 rounds, 3 local epochs, 2-layer GCN with 64 hidden units,
Adam 0.01, evaluation every round. Reports ms per round, the whole run's wall time and peak
memory (the process's maximum resident set, measured in a fresh interpreter), beside centralized
full-graph GCN epochs and the same FedAvg run with one party per client (``group_size: 1``) timed in
the same process, so the comparisons are ratios from one run.
Writes benchmarks/results/fedavg_speed.json and the table the README cites, fedavg_speed.md.

    FEDGL_DATA_ROOT=../shared/datasets python benchmarks/fedavg_speed.py
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "fedavg_speed.json"
TABLE = OUT.with_suffix(".md")
ROWS = [  # (key, what it measures, format, target)
    ("ms_per_round", "ms per round", "{:.1f}", "<= 30"),
    ("run_s", "whole run (setup + 100 rounds), s", "{:.2f}", "< 10"),
    ("peak_rss_mb", "peak memory (max RSS), MB", "{:.0f}", "< 600"),
    ("centralized_gcn_epoch_ms", "centralized GCN epoch, same process, ms", "{:.2f}", ""),
    ("round_over_centralized_epoch", "round / centralized epoch", "{:.1f}", ""),
    ("one_party_per_client_ms_per_round", "one party per client (`protocol.group_size: 1`), ms per round",
     "{:.1f}", ""),
    ("test_accuracy", "test accuracy at the best validation round", "{:.3f}", ""),
]


def markdown(result: dict) -> str:
    lines = [f"Measured {result['date']} on {result['machine']}, {result['threads']} torch thread.", "",
             "| measure | value | target |", "|---|---|---|"]
    lines += [f"| {label} | {fmt.format(result[key])} | {target} |" for key, label, fmt, target in ROWS]
    return "\n".join(lines) + "\n"


def measure() -> dict:
    import tempfile

    import torch

    torch.set_num_threads(1)  # a client subgraph is a few hundred nodes: one thread beats two
    from fedgl.config import build_config
    from fedgl.runner import Run

    base = {"dataset": {"name": "cora"}, "model": {"name": "gcn", "hidden": 64, "layers": 2},
            "train": {"rounds": 100, "lr": 0.01}, "network": {"compute": "ignore"}}
    cfg = build_config({**base, "protocol": {"name": "fedavg", "local_epochs": 3},
                        "partition": {"num_clients": 10, "method": "metis"}})
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        job = Run(cfg, tmp)
        setup_s = time.perf_counter() - start
        t0 = time.perf_counter()
        result = job.execute(progress=False)
        rounds_s = time.perf_counter() - t0
    total_s = time.perf_counter() - start
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    per_client = build_config({**base, "protocol": {"name": "fedavg", "local_epochs": 3, "group_size": 1},
                               "partition": {"num_clients": 10, "method": "metis"}})
    with tempfile.TemporaryDirectory() as tmp:
        job = Run(per_client, tmp)
        t0 = time.perf_counter()
        job.execute(progress=False)
        per_client_ms = 1e3 * (time.perf_counter() - t0) / 100

    central = build_config({**base, "protocol": {"name": "centralized"}, "train": {"rounds": 200, "lr": 0.01}})
    with tempfile.TemporaryDirectory() as tmp:
        job = Run(central, tmp)
        trainer = job.protocol.trainer
        for _ in range(20):
            trainer.train_epochs(1)
        t0 = time.perf_counter()
        for _ in range(200):
            trainer.train_epochs(1)
        epoch_ms = (time.perf_counter() - t0) / 200 * 1e3
        job.transport.close()
    return {
        "setting": "fedavg, cora, 10 metis clients, 100 rounds x 3 local epochs, gcn 64 hidden, adam 0.01, eval every round",
        "threads": torch.get_num_threads(),
        "ms_per_round": 1e3 * rounds_s / 100,
        "run_s": total_s,
        "setup_s": setup_s,
        "peak_rss_mb": peak_rss_mb,
        "test_accuracy": result.summary["test_accuracy"],
        "centralized_gcn_epoch_ms": epoch_ms,
        "round_over_centralized_epoch": 1e3 * rounds_s / 100 / epoch_ms,
        "one_party_per_client_ms_per_round": per_client_ms,
        "speedup_over_one_party_per_client": per_client_ms / (1e3 * rounds_s / 100),
    }


def main() -> None:
    if "--child" in sys.argv:
        print(json.dumps(measure()))
        return
    # A fresh interpreter, so peak memory is this run's alone.
    proc = subprocess.run([sys.executable, __file__, "--child"], capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    OUT.parent.mkdir(exist_ok=True)
    result |= {"date": time.strftime("%Y-%m-%d"),
               "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, Python "
                          f"{platform.python_version()}"}
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    TABLE.write_text(markdown(result))
    for key, value in result.items():
        print(f"{key:>30}: {value:.3f}" if isinstance(value, float) else f"{key:>30}: {value}")
    print(f"written to {OUT}")


if __name__ == "__main__":
    main()
