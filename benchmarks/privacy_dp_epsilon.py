"""Epsilon of every committed DP benchmark, recomputed for the server as the adversary.

The committed tables (privacy-fedavg-cora, privacy-swift-cora, privacy-dp-fedaas-cora,
privacy-dp-glasu-cora, nfedgnn-dp-cora) report epsilon as the accountant stated it before: Poisson
amplification where the server samples, sensitivity max_norm per release (add/remove), and a node's
row counted alone. This script states it as ``fedgl.privacy.dp`` now does: no amplification, twice
max_norm per release (substitution: counts travel in the clear), and every hidden row or row of a
locally trained model charged to every node its owner holds, n rows of a sum at once (docs/privacy.md).

What a run releases does not depend on the noise for FedAvg, nFedGNN and CNFGNN (every party every
round, so no training is needed), nor for the Swift family and GLASU (the sums and node sets come from
the parties' own sampling draws): one run per seed gives every noise multiplier's epsilon. FedAAS's
syncs and attention draws follow its training, so it runs once per noise multiplier. Runs are the
committed tasks' own variants (``fedgl.bench.privacy``), seed for seed.

    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/privacy_dp_epsilon.py fedavg nfedgnn
    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/privacy_dp_epsilon.py swift
    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/privacy_dp_epsilon.py glasu
    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/privacy_dp_epsilon.py fedaas

Each call updates its protocols' rows of results.json and rewrites table.json and table.md in
benchmarks/results/privacy-dp-epsilon/.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fedgl.tables import markdown_table

RESULTS = Path(__file__).parent / "results"
OUT = RESULTS / "privacy-dp-epsilon"
DELTA = 1e-5
ORDER = ("fedavg", "swift", "fedaas", "glasu", "nfedgnn")
TABLES = {"fedavg": "privacy-fedavg-cora", "swift": "privacy-swift-cora", "fedaas": "privacy-dp-fedaas-cora",
          "glasu": "privacy-dp-glasu-cora", "nfedgnn": "nfedgnn-dp-cora"}


def committed(protocol: str) -> list[dict]:
    """The DP runs of a committed table: variant, seed, noise multiplier and the epsilon reported then."""
    rows = json.loads((RESULTS / TABLES[protocol] / "results.json").read_text())
    out = []
    for row in rows:
        if row.get("epsilon") is None:
            continue
        dp = row["privacy"]["dp"] if "privacy" in row else None
        sigma = dp["noise_multiplier"] if dp else float(row["variant"].rsplit("sigma=", 1)[1])
        out.append({"variant": row["variant"], "seed": row["seed"], "noise_multiplier": sigma,
                    "before": row["epsilon"]})
    return out


def without_training(protocol: str) -> list[dict]:
    """FedAvg: 50 rounds, every client in every round. nFedGNN: 200 rounds plus 10 scorings, every user
    each time; CNFGNN adds a weight upload per round. One release of sensitivity 2 max_norm each."""
    from fedgl.privacy.dp import SUBSTITUTION, gaussian_epsilon

    out = []
    for row in committed(protocol):
        releases = 50 if protocol == "fedavg" else (2 * 200 if "cnfgnn" in row["variant"] else 200) + 10
        then = gaussian_epsilon(row["noise_multiplier"], releases, DELTA)  # the old accounting, as a check
        if abs(then / row["before"] - 1) > 1e-3:
            raise SystemExit(f"{protocol} {row['variant']}: {releases} releases give {then:.4g}, "
                             f"the table {row['before']:.4g}")
        now = gaussian_epsilon(row["noise_multiplier"], releases * SUBSTITUTION**2, DELTA)
        out.append(row | {"protocol": protocol, "now": now, "adjacency": "client-level" if protocol == "fedavg"
                          else "node-level (one user's row)"})
    return out


def measured(protocol: str) -> list[dict]:
    """Run the bench setting and read the accountant's loads (once per seed, or per noise multiplier
    when the releases follow training)."""
    import torch

    torch.set_num_threads(1)
    from fedgl.privacy.dp import gaussian_epsilon
    from fedgl.runner import Run

    loads: dict[tuple, dict[str, float]] = {}
    out = []
    for row in committed(protocol):
        key = (row["seed"], row["noise_multiplier"] if protocol == "fedaas" else None)
        if key not in loads:
            job = Run(config(protocol, row["seed"], row["noise_multiplier"]), OUT / "runs" / f"{protocol}-{len(loads)}")
            job.execute(progress=False)
            accountant = job.protocol.accountant
            loads[key] = {p: float(accountant.load((p,)).max()) for p in accountant.nodes} | \
                {"all": float(accountant.load().max())}
            adjacency = accountant.guarantee.adjacency.split(":")[0]
        eps = {p: gaussian_epsilon(row["noise_multiplier"], v, DELTA) for p, v in loads[key].items()}
        out.append(row | {"protocol": protocol, "now": eps.pop("all"), "adjacency": adjacency,
                          **{f"now_{p}": v for p, v in eps.items()}})
    return out


def config(protocol: str, seed: int, sigma: float):
    """The committed task's own variant at noise multiplier ``sigma``, for ``seed``."""
    from fedgl.bench import get_task
    from fedgl.bench.core import variant_config

    task = get_task(TABLES[protocol])
    variant = next(v for v in task.variants if v.label == f"dp sigma={sigma:g}")
    return variant_config(task, variant, seed, {})


def cell(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4g}" + (f" ± {std:.2g}" if len(values) > 1 else "")


def table(rows: list[dict]) -> tuple[list[dict], str]:
    out = []
    for protocol in ORDER:
        mine = [r for r in rows if r["protocol"] == protocol]
        for variant in dict.fromkeys(r["variant"] for r in mine):
            runs = [r for r in mine if r["variant"] == variant]
            exchange = [r["now_embedding"] for r in runs if "now_embedding" in r]
            out.append({"variant": variant.removeprefix("cora ") if protocol == "nfedgnn" else f"{protocol} {variant}",
                        "noise_multiplier": runs[0]["noise_multiplier"], "adjacency": runs[0]["adjacency"],
                        "epsilon before": cell([r["before"] for r in runs]),
                        "epsilon now": cell([r["now"] for r in runs]),
                        "epsilon now, exchange alone": cell(exchange) if exchange else "-",
                        "committed run": TABLES[protocol]})
    lines = ["# privacy-dp-epsilon", "",
             "Epsilon at delta 1e-5 of each committed DP run: as reported then (Poisson amplification where the "
             "server samples, sensitivity max_norm per release, a node's row counted alone) and now, against the "
             "server (no amplification, substitution sensitivity 2 max_norm, hidden and model-dependent rows "
             "charged to every node of their owner). Mean ± std over seeds where the table has several.", "",
             *markdown_table(list(out[0]), [list(row.values()) for row in out])]
    return out, "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("protocols", nargs="*",
                        help=f"of {', '.join(ORDER)}; none: rewrite the table from results.json")
    chosen = parser.parse_args().protocols
    if set(chosen) - set(ORDER):
        parser.error(f"unknown protocol {sorted(set(chosen) - set(ORDER))[0]}; choose from {', '.join(ORDER)}")
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "results.json"
    rows = [r for r in (json.loads(path.read_text()) if path.exists() else []) if r["protocol"] not in chosen]
    for protocol in chosen:
        rows += without_training(protocol) if protocol in ("fedavg", "nfedgnn") else measured(protocol)
    rows.sort(key=lambda r: ORDER.index(r["protocol"]))
    summary, markdown = table(rows)
    (OUT / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (OUT / "table.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    (OUT / "table.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
