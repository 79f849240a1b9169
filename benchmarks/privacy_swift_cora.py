"""Accuracy against epsilon: Swift-FedGNN on Cora with secure aggregation and with DP on what clients send.

Ten METIS clients, 2-layer GraphSAGE (64 hidden, dropout 0.5), batch 64, fanouts 10/5, Adam 0.01, 100
iterations, K = 5 clients crossing every I = 2 iterations, evaluation every 10 iterations. Variants:
plain Swift, secure aggregation (same accuracy, more bytes), and DP with every exchanged row and every
gradient upload clipped to L2 norm 1 and several noise multipliers; epsilon at delta = 1e-5 is what the
run's accountant reported after the last iteration (the node whose row went into the most noised sums,
composed with its client's gradient uploads; each part alone beside it). Writes results.json,
table.json and table.md into benchmarks/results/privacy-swift-cora/; each run's folder goes to runs/
there (not committed). Under ten minutes on two cores.

    FEDGL_DATA_ROOT=/work/shared/datasets python benchmarks/privacy_swift_cora.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

from privacy_tables import markdown_rows, mean_std, write_results

OUT = Path(__file__).parent / "results" / "privacy-swift-cora"
SEEDS = (0, 1)
ROUNDS = 100
MAX_NORM = 1.0
NOISE_MULTIPLIERS = (0.01, 0.03, 0.1, 0.5, 2.0, 8.0)
BASE = {"dataset": {"name": "cora"}, "model": {"name": "sage", "hidden": 64, "layers": 2, "dropout": 0.5},
        "train": {"rounds": ROUNDS, "lr": 0.01}, "eval": {"every": 10}, "network": {"compute": "ignore"},
        "protocol": {"name": "swift", "I": 2, "K": 5, "batch_size": 64, "fanouts": [10, 5]},
        "partition": {"num_clients": 10, "method": "metis"}}


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
                         **{k: summary.get(k) for k in ("test_accuracy", "final_test_accuracy", "epsilon", "epsilon_model",
                                                        "epsilon_embedding", "delta", "bytes_total",
                                                        "bytes_cross_client")}})
            print(label, seed, rows[-1]["test_accuracy"], rows[-1]["epsilon"], flush=True)
    return rows


def epsilon_cell(values: list[float]) -> str:
    """Mean ± std in 4 significant digits (epsilon spans 1 to 1e8 across the variants)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4g} ± {std:.2g}"


def table(rows: list[dict]) -> tuple[list[dict], str]:
    out = []
    for label, privacy in variants():
        runs = [r for r in rows if r["variant"] == label]
        dp = privacy.get("dp") or {}
        out.append({
            "variant": label,
            "noise_multiplier": dp.get("noise_multiplier", "-"),
            "max_norm": dp.get("max_norm", "-"),
            **{column: epsilon_cell([r[key] for r in runs]) if dp else "-" for column, key in (
                ("epsilon (delta=1e-5)", "epsilon"), ("epsilon gradient uploads", "epsilon_model"),
                ("epsilon exchange", "epsilon_embedding"))},
            "test_accuracy": mean_std([r["test_accuracy"] for r in runs], 100),
            "final_test_accuracy": mean_std([r["final_test_accuracy"] for r in runs], 100),
            "MB_total": f"{statistics.mean(r['bytes_total'] for r in runs) / 1e6:.2f}",
            "MB_cross_client": f"{statistics.mean(r['bytes_cross_client'] for r in runs) / 1e6:.2f}",
        })
    lines = ["# privacy-swift-cora", "",
             f"Swift-FedGNN on Cora, 10 METIS clients, GraphSAGE 64 hidden, batch 64, fanouts 10/5, I=2, K=5, "
             f"{ROUNDS} iterations. DP: every row an owner sums for another client and every client's gradient "
             f"upload is clipped to L2 norm {MAX_NORM:g}, and each partial sum and each upload gets Gaussian noise "
             f"of std noise_multiplier x max_norm; epsilon from dp-accounting's RDP accountant for the node whose "
             f"row went into the most noised sums, composed with one upload of its client per iteration. Test "
             f"accuracy (%) at the best validation round and at the last round.", "",
             f"Mean ± std over {len(SEEDS)} seeds.", "", *markdown_rows(out)]
    return out, "\n".join(lines) + "\n"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = run_all()
    write_results(OUT, rows, *table(rows))


if __name__ == "__main__":
    main()
