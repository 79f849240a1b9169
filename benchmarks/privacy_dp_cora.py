"""Accuracy against epsilon on Cora: GLASU and FedAAS with differential privacy on what their clients send.

GLASU: the bench's Table 2 Cora setting for GLASU-4 (task glasu-table2-cora: 3 clients with 80% of the
edges each, 4-layer GCNII of 128 hidden, K = 2, Q = 4, S = 16, 32 mini-batches per round, the authors'
random split of 60 training nodes per class), ROUNDS["glasu"] rounds instead of 16. DP clips each
node's row of every representation a client sends (training and the joint inference of every
evaluation) to L2 norm MAX_NORM and adds Gaussian noise.

FedAAS: the bench's Table 2 setting (task fedaas-table2-pubmed, variant FedAAS iid: stratified clients
holding training nodes only, 99% of in-client edges dropped, attention layers 256/128 with attention
sampling and the adaptive interval, 10 batches) on Cora with the "full" split, with 10 clients instead
of 50, Adam 0.01 instead of 0.001 and ROUNDS["fedaas"] rounds instead of 50 (with the paper's 50 clients
and 0.001 a plain run still predicts one class after 8 rounds), compute not measured. DP clips and
noises each client's model update and every row, key and query it sends at a sync.

One seed (0), a plain run and one run per noise multiplier; epsilon at delta = 1e-5 is what the run's
accountant reported at the end (summary.json). Writes results.json (one row per run), table.json and
table.md into benchmarks/results/privacy-dp-<protocol>-cora/; run folders go to runs/ there (not
committed).

    FEDGL_DATA_ROOT=/work/shared/datasets python benchmarks/privacy_dp_cora.py glasu
    FEDGL_DATA_ROOT=/work/shared/datasets python benchmarks/privacy_dp_cora.py fedaas
"""

from __future__ import annotations

import argparse
from pathlib import Path

from privacy_tables import markdown_rows, write_results

RESULTS = Path(__file__).parent / "results"
SEED = 0
MAX_NORM = 1.0
DELTA = 1e-5
ROUNDS = {"glasu": 5, "fedaas": 10}
NOISE_MULTIPLIERS = {"glasu": (0.01, 0.1, 1.0, 4.0), "fedaas": (0.01, 0.1, 0.3, 1.0, 4.0)}
# (bench task, variant, overrides) the runs start from
SETTING = {
    "glasu": ("glasu-table2-cora", "cora GLASU-4", {}),
    "fedaas": ("fedaas-table2-pubmed", "FedAAS iid", {"dataset.name": "cora", "dataset.split": "full",
                                                       "partition.num_clients": 10, "train.lr": 0.01,
                                                       "network.compute": "ignore",
                                                       "protocol.sync_counter": "round"}),
}
COLUMNS = {"glasu": ("test_accuracy", "final_test_accuracy"), "fedaas": ("final_test_accuracy", "final_test_macro_f1")}


def variants(protocol: str) -> list[tuple[str, dict]]:
    """(label, privacy section) of every variant."""
    dp = [(f"dp sigma={s:g}", {"dp": {"noise_multiplier": s, "max_norm": MAX_NORM, "delta": DELTA}})
          for s in NOISE_MULTIPLIERS[protocol]]
    return [("plain", {}), *dp]


def run_all(protocol: str, out: Path) -> list[dict]:
    import torch

    torch.set_num_threads(1)
    from fedgl.bench import get_task
    from fedgl.bench.core import variant_config
    from fedgl.runner import Run

    name, label, overrides = SETTING[protocol]
    task = get_task(name)
    variant = next(v for v in task.variants if v.label == label)
    rows = []
    for tag, privacy in variants(protocol):
        extra = {**overrides, "train.rounds": ROUNDS[protocol], "threads": 1, "privacy": privacy}
        cfg = variant_config(task, variant, SEED, extra)
        folder = out / "runs" / tag.replace(" ", "-").replace("=", "")
        summary = Run(cfg, folder).execute(progress=False).summary
        rows.append({"variant": tag, "seed": SEED, "rounds": ROUNDS[protocol], "privacy": privacy,
                     **{k: summary.get(k) for k in (*COLUMNS[protocol], "epsilon", "epsilon_model",
                                                    "epsilon_embedding", "delta", "bytes_total", "wall_time_s")}})
        print(tag, {k: rows[-1][k] for k in (*COLUMNS[protocol], "epsilon")}, flush=True)
    return rows


def epsilon(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def table(protocol: str, rows: list[dict]) -> tuple[list[dict], str]:
    out = []
    for row in rows:
        dp = row["privacy"].get("dp") or {}
        entry = {"variant": row["variant"], "noise_multiplier": dp.get("noise_multiplier", "-"),
                 "max_norm": dp.get("max_norm", "-"), "epsilon (delta=1e-5)": epsilon(row["epsilon"])}
        if protocol == "fedaas":
            entry |= {"epsilon model uploads": epsilon(row["epsilon_model"]),
                      "epsilon exchange": epsilon(row["epsilon_embedding"])}
        entry |= {column: f"{100 * row[column]:.2f}" for column in COLUMNS[protocol]}
        entry["MB_total"] = f"{row['bytes_total'] / 1e6:.2f}"
        out.append(entry)
    return out, "\n".join(markdown_rows(out)) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("protocol", choices=sorted(SETTING))
    protocol = parser.parse_args().protocol
    out = RESULTS / f"privacy-dp-{protocol}-cora"
    out.mkdir(parents=True, exist_ok=True)
    rows = run_all(protocol, out)
    write_results(out, rows, *table(protocol, rows))


if __name__ == "__main__":
    main()
