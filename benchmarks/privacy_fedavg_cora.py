"""Accuracy against epsilon: FedAvg on Cora with secure aggregation and with differentially private updates.

Ten METIS clients, 2-layer GCN (64 hidden), 3 local epochs, Adam 0.01, 50 rounds, every client in
every round (so each round is one plain Gaussian release per client). Variants: plain FedAvg, secure
aggregation (same accuracy, more bytes), and DP with updates clipped to L2 norm 1 and several noise
multipliers; epsilon at delta = 1e-5 is what the run's accountant reported after the last round.
Writes results.json (one summary per run), table.json and table.md into
benchmarks/results/privacy-fedavg-cora/; each run's folder goes to runs/ there (not committed).

    FEDGL_DATA_ROOT=/work/shared/datasets python benchmarks/privacy_fedavg_cora.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

from privacy_tables import markdown_rows, mean_std, write_results

OUT = Path(__file__).parent / "results" / "privacy-fedavg-cora"
SEEDS = (0, 1, 2)
ROUNDS = 50
MAX_NORM = 1.0
NOISE_MULTIPLIERS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
BASE = {"dataset": {"name": "cora"}, "model": {"name": "gcn", "hidden": 64, "layers": 2},
        "train": {"rounds": ROUNDS, "lr": 0.01}, "network": {"compute": "ignore"},
        "protocol": {"name": "fedavg", "local_epochs": 3}, "partition": {"num_clients": 10, "method": "metis"}}


def variants() -> list[tuple[str, dict]]:
    """(label, privacy section) of every variant."""
    dp = [(f"dp sigma={s:g}", {"dp": {"noise_multiplier": s, "max_norm": MAX_NORM, "delta": 1e-5}})
          for s in NOISE_MULTIPLIERS]
    return [("plain", {}), ("secure aggregation", {"secure_aggregation": True}), *dp]


def run_all() -> list[dict]:
    import torch

    torch.set_num_threads(1)
    from fedgl.config import build_config
    from fedgl.runner import Run

    rows = []
    for label, privacy in variants():
        for seed in SEEDS:
            cfg = build_config({**BASE, "seed": seed, "privacy": privacy})
            folder = OUT / "runs" / f"{label.replace(' ', '-').replace('=', '')}-seed{seed}"
            summary = Run(cfg, folder).execute(progress=False).summary
            rows.append({"variant": label, "seed": seed, "privacy": privacy,
                         **{k: summary.get(k) for k in ("test_accuracy", "final_test_accuracy", "epsilon", "delta",
                                                        "bytes_total")}})
            print(label, seed, rows[-1]["test_accuracy"], rows[-1]["epsilon"], flush=True)
    return rows


def table(rows: list[dict]) -> tuple[list[dict], str]:
    out = []
    for label, privacy in variants():
        runs = [r for r in rows if r["variant"] == label]
        dp = privacy.get("dp") or {}
        eps = {r["epsilon"] for r in runs}
        out.append({
            "variant": label,
            "noise_multiplier": dp.get("noise_multiplier", "-"),
            "max_norm": dp.get("max_norm", "-"),
            "epsilon (delta=1e-5)": f"{eps.pop():.4g}" if dp else "-",
            "test_accuracy": mean_std([r["test_accuracy"] for r in runs], 100),
            "final_test_accuracy": mean_std([r["final_test_accuracy"] for r in runs], 100),
            "MB_total": f"{statistics.mean(r['bytes_total'] for r in runs) / 1e6:.2f}",
        })
    lines = ["# privacy-fedavg-cora", "",
             f"FedAvg on Cora, 10 METIS clients, GCN 64 hidden, 3 local epochs, {ROUNDS} rounds, every client in "
             f"every round. DP: each client clips its update to L2 norm {MAX_NORM:g} and adds Gaussian noise of std "
             f"noise_multiplier x max_norm; epsilon from dp-accounting's RDP accountant after the last round. "
             f"Test accuracy (%) at the best validation round and at the last round.", "",
             f"Mean ± std over {len(SEEDS)} seeds.", "", *markdown_rows(out)]
    return out, "\n".join(lines) + "\n"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = run_all()
    write_results(OUT, rows, *table(rows))


if __name__ == "__main__":
    main()
