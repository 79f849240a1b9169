"""What `fedgl audit` recovers from each protocol's messages: short recorded runs on Cora, then the audit.

One run per variant (seed 0, `privacy.record_messages: true`), then `fedgl.privacy.audit.audit_run`
on its folder. GLASU runs examples/glasu-cora.yaml's setting for 2 rounds of 4 batches; nFedGNN and
CNFGNN a split GCN (16 hidden) for 2 rounds; FedAvg a GCN (64 hidden) on 10 METIS clients for 5
rounds of one local epoch. The other horizontal protocols use 10 METIS clients. The Swift family
(Swift-FedGNN, FedGNN-G) runs with the bench's model (GraphSAGE, 64 hidden here, dropout 0.5,
fanouts [15, 10], batches of 256) for 20 iterations, and again with dropout 0 (the least-squares
attack's best case), with dropout 0 and `privacy.secure_aggregation` (recorded as refused if the
config refuses it) and with `min_aggregate: 1`; LLCG uses the same model with a correction every 10
iterations; FedAAS its default options (adaptive interval, on the clients' training loss) and a sync
at every step (`interval: 1`), 2 rounds. Writes
results.json (every audit report, or the refusal) and table.md into
benchmarks/results/privacy-audit/; each run's folder goes to runs/ there (not committed), and its
recorded messages are deleted after the audit (CNFGNN's alone are about 0.5 GB per round).

    FEDGL_DATA_ROOT=/work/shared/datasets python benchmarks/privacy_audit.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fedgl.tables import markdown_table

OUT = Path(__file__).parent / "results" / "privacy-audit"
HORIZONTAL = {"partition": {"num_clients": 10, "method": "metis"}}
SWIFT_MODEL = {"name": "sage", "hidden": 64, "layers": 2, "dropout": 0.5}
SWIFT = {**HORIZONTAL, "model": SWIFT_MODEL, "train": {"rounds": 20, "lr": 0.01}}
NODE_LEVEL = {"model": {"name": "gcn", "hidden": 16, "layers": 2, "dropout": 0.5},
              "train": {"rounds": 2, "lr": 0.1, "weight_decay": 5e-4}}

# (label, config without dataset/privacy/seed)
VARIANTS: list[tuple[str, dict]] = [
    ("FedAvg", {**HORIZONTAL, "model": {"name": "gcn", "hidden": 64, "layers": 2},
                "protocol": {"name": "fedavg", "local_epochs": 1}, "train": {"rounds": 5, "lr": 0.01}}),
    ("GLASU", {"dataset": {"split": "random", "options": {"train_per_class": 60}},
               "partition": {"num_clients": 3, "method": "random", "edge_keep": 0.8},
               "model": {"name": "gcnii", "layers": 4, "hidden": 128, "dropout": 0.5},
               "protocol": {"name": "glasu", "K": 2, "Q": 4, "S": 16, "batches": 4, "sampling": "layerwise",
                            "fanout": 3, "aggregation": "mean"},
               "train": {"rounds": 2, "lr": 0.01}}),
    ("nFedGNN", {**NODE_LEVEL, "protocol": {"name": "nfedgnn", "lam": 300}}),
    ("CNFGNN", {**NODE_LEVEL, "protocol": {"name": "cnfgnn", "lam": 0}}),
    ("Swift-FedGNN", {**SWIFT, "protocol": {"name": "swift", "I": 10, "K": 5, "batch_size": 256}}),
    ("Swift-FedGNN dropout 0", {**SWIFT, "model": {**SWIFT_MODEL, "dropout": 0.0},
                                "protocol": {"name": "swift", "I": 10, "K": 5, "batch_size": 256}}),
    ("Swift-FedGNN dropout 0, secure aggregation", {**SWIFT, "model": {**SWIFT_MODEL, "dropout": 0.0},
                                                    "protocol": {"name": "swift", "I": 10, "K": 5, "batch_size": 256},
                                                    "privacy": {"secure_aggregation": True}}),
    ("FedGNN-G", {**SWIFT, "protocol": {"name": "fedgnn-g", "batch_size": 256}}),
    ("FedGNN-G dropout 0", {**SWIFT, "model": {**SWIFT_MODEL, "dropout": 0.0},
                            "protocol": {"name": "fedgnn-g", "batch_size": 256}}),
    ("FedGNN-G dropout 0, secure aggregation", {**SWIFT, "model": {**SWIFT_MODEL, "dropout": 0.0},
                                                "protocol": {"name": "fedgnn-g", "batch_size": 256},
                                                "privacy": {"secure_aggregation": True}}),
    ("FedGNN-G min_aggregate 1", {**SWIFT, "protocol": {"name": "fedgnn-g", "batch_size": 256, "min_aggregate": 1}}),
    ("LLCG", {**SWIFT, "protocol": {"name": "llcg", "local_steps": 10, "batch_size": 256}}),
    ("FedAAS", {**HORIZONTAL, "protocol": {"name": "fedaas", "interval_loss": "train"},
                "train": {"rounds": 2, "lr": 0.001, "weight_decay": 5e-4}}),
    ("FedAAS interval 1", {**HORIZONTAL, "protocol": {"name": "fedaas", "interval_loss": "train", "interval": 1},
                           "train": {"rounds": 2, "lr": 0.001, "weight_decay": 5e-4}}),
    ("FedAAS interval 1, min_pair_rows 2", {**HORIZONTAL, "protocol": {"name": "fedaas", "interval_loss": "train",
                                                                         "interval": 1, "min_pair_rows": 2},
                                            "train": {"rounds": 2, "lr": 0.001, "weight_decay": 5e-4}}),
]


def config(spec: dict) -> dict:
    spec = dict(spec)
    dataset = {"name": "cora", **spec.pop("dataset", {})}
    privacy = {"record_messages": True, **spec.pop("privacy", {})}
    rounds = spec["train"]["rounds"]
    return {**spec, "seed": 0, "dataset": dataset, "privacy": privacy, "eval": {"every": rounds},
            "network": {"compute": "ignore"}, "threads": 1}


def audit_all() -> list[dict]:
    import torch

    torch.set_num_threads(1)
    from fedgl.config import build_config
    from fedgl.errors import ConfigError
    from fedgl.privacy.audit import audit_run
    from fedgl.runner import Run

    rows = []
    for label, spec in VARIANTS:
        try:
            cfg = build_config(config(spec))
        except ConfigError as err:
            rows.append({"variant": label, "refused": str(err)})
            print(label, "refused:", err, flush=True)
            continue
        folder = OUT / "runs" / label.replace(",", "").replace(" ", "-").lower()
        shutil.rmtree(folder, ignore_errors=True)
        summary = Run(cfg, folder).execute(progress=False).summary
        report = audit_run(folder)
        shutil.rmtree(folder / "messages")
        rows.append({"variant": label, "protocol": cfg.protocol_name, "rounds": summary["rounds"],
                     "test_accuracy": summary["test_accuracy"], "bytes_total": summary["bytes_total"],
                     "attacks": report["attacks"]})
        print(label, {k: (v["recovered"], v["attacked"]) for k, v in report["attacks"].items()}, flush=True)
    return rows


ATTACKS = ("raw_row_match", "reconstruction", "membership", "labels")  # the table's columns, in order


def cell(attack: dict) -> str:
    return "-" if not attack["attacked"] else f"{attack['recovered']} / {attack['attacked']} ({attack['fraction']:.1%})"


def table(rows: list[dict]) -> str:
    lines = ["# privacy-audit", "",
             "`fedgl audit` on short recorded runs on Cora (seed 0; settings in benchmarks/privacy_audit.py): "
             "recovered / attacked (fraction). raw rows: message rows equal to a non-zero raw feature row (of all "
             "2,708 rows, or of a GLASU client's feature block); reconstruction: rows inside the server's "
             "input-layer sums recovered by least squares; single-row sums: input-layer sums (and FedAAS "
             "partials) holding one row; labels: nodes whose label reached a party not owning it.", "",
             *markdown_table(["variant", "rounds", "raw rows", "reconstruction", "single-row sums", "labels"],
                             [[row["variant"], "-", f"refused: {row['refused']}", "", "", ""] if "refused" in row else
                              [row["variant"], row["rounds"], *(cell(row["attacks"][attack]) for attack in ATTACKS)]
                              for row in rows])]
    return "\n".join(lines) + "\n"


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rows = audit_all()
    (OUT / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (OUT / "table.md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
