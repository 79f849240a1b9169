"""The privacy tasks: accuracy against epsilon under secure aggregation and DP, and ``fedgl audit`` on
every protocol, all on Cora.

``privacy-fedavg-cora`` and ``privacy-swift-cora`` sweep the noise multiplier of FedAvg and
Swift-FedGNN (updates, and Swift's exchanged rows, clipped to L2 norm ``MAX_NORM``);
``privacy-dp-glasu-cora`` and ``privacy-dp-fedaas-cora`` start from another task's setting (GLASU's
Table 2 Cora run, FedAAS's Table 2 iid run moved to Cora) and add DP. ``privacy-audit`` records
short runs of every protocol and reports what the audit recovers from their messages: its
``compute`` trains the run in a temporary folder (the recorded messages reach half a gigabyte per
round for CNFGNN), audits it and keeps the report as the run's summary.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ..config import RunConfig
from .core import BenchTask, Variant, variant_config

MAX_NORM = 1.0
DELTA = 1e-5
EPSILON = "epsilon (delta=1e-5)"
ACCURACY_NOTE = "Test accuracy (%) at the best validation round and at the last round."


def dp_variants(sigmas: tuple[float, ...], secure: bool = True) -> list[Variant]:
    """Plain, optionally secure aggregation, and DP at every noise multiplier in ``sigmas``."""
    dp = [Variant(f"dp sigma={s:g}", {"privacy.dp": {"noise_multiplier": s, "max_norm": MAX_NORM, "delta": DELTA}})
          for s in sigmas]
    secured = [Variant("secure aggregation", {"privacy.secure_aggregation": True})] if secure else []
    return [Variant("plain"), *secured, *dp]


def dp_columns(summary: dict[str, Any]) -> dict[str, Any]:
    """Epsilon (and its parts where the run reports them) and traffic in MB, as the tables show them."""
    out = {EPSILON: summary.get("epsilon"), "epsilon gradient uploads": summary.get("epsilon_model"),
           "epsilon model uploads": summary.get("epsilon_model"), "epsilon exchange": summary.get("epsilon_embedding"),
           "MB_total": summary["bytes_total"] / 1e6}
    if summary.get("bytes_cross_client") is not None:
        out["MB_cross_client"] = summary["bytes_cross_client"] / 1e6
    return out


EPSILON_FORMATS = {EPSILON: ".4g", "epsilon gradient uploads": ".4g", "epsilon model uploads": ".4g",
                   "epsilon exchange": ".4g", "MB_total": ".2f", "MB_cross_client": ".2f"}


def from_task(task: BenchTask, label: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The config of ``task``'s variant ``label`` with ``overrides``, as a base for another task."""
    variant = next(v for v in task.variants if v.label == label)
    return variant_config(task, variant, 0, overrides).model_dump(mode="json")


def _dp_tasks() -> list[BenchTask]:
    from .fedaas import TASKS as FEDAAS_TASKS
    from .glasu import TASKS as GLASU_TASKS

    glasu = from_task(GLASU_TASKS["glasu-table2-cora"], "cora GLASU-4", {"train.rounds": 5, "threads": 1})
    fedaas = from_task(FEDAAS_TASKS["fedaas-table2-pubmed"], "FedAAS iid", {
        "dataset.name": "cora", "dataset.split": "full", "partition.num_clients": 10, "train.lr": 0.01,
        "network.compute": "ignore", "protocol.sync_counter": "round", "train.rounds": 10, "threads": 1})
    common = {"seeds": 1, "derive": dp_columns, "formats": EPSILON_FORMATS, "quick": {"train.rounds": 1}}
    return [
        BenchTask(
            name="privacy-dp-glasu-cora", base=glasu, variants=dp_variants((0.01, 0.1, 1.0, 4.0), secure=False),
            columns=[EPSILON, "test_accuracy", "final_test_accuracy", "MB_total"], **common,
            description="GLASU with DP on Cora: the setting of glasu-table2-cora's GLASU-4 (3 clients with 80% of "
                        "the edges each, 4-layer GCNII of 128 hidden, K = 2, Q = 4, S = 16, 32 mini-batches per round, "
                        "60 training nodes per class) for 5 rounds instead of 16. DP clips each node's row of every "
                        "representation a client sends (training and every evaluation's joint inference) and of every "
                        "scoring client's logits to L2 norm "
                        f"{MAX_NORM:g} and adds Gaussian noise; epsilon at delta = {DELTA:g} from the run's "
                        f"accountant. {ACCURACY_NOTE}"),
        BenchTask(
            name="privacy-dp-fedaas-cora", base=fedaas, variants=dp_variants((0.01, 0.1, 0.3, 1.0, 4.0), secure=False),
            columns=[EPSILON, "epsilon model uploads", "epsilon exchange", "final_test_accuracy",
                     "final_test_macro_f1", "MB_total"], **common,
            description="FedAAS with DP on Cora: fedaas-table2-pubmed's FedAAS iid (stratified clients holding "
                        "training nodes only, 99% of in-client edges dropped, attention layers 256/128, attention "
                        "sampling, adaptive interval, 10 batches) on Cora's full split with 10 clients instead of "
                        "50, Adam 0.01 instead of 0.001 and 10 rounds, compute not measured. DP clips and noises "
                        "each client's model update and every row, key and query it sends at a sync; epsilon at "
                        f"delta = {DELTA:g} from the run's accountant, and its two parts. Test accuracy and "
                        "macro-F1 (%) at the last round."),
    ]


# ---- fedgl audit on every protocol ---------------------------------------------------------------------
ATTACKS = {"raw_row_match": "raw rows", "reconstruction": "reconstruction", "membership": "single-row sums",
           "labels": "labels"}


def audited(cfg: RunConfig) -> dict[str, Any]:
    """Train ``cfg`` in a temporary folder, audit its recorded messages and return the summary: the
    run's, each attack's recovered and attacked counts, and the whole report (``audit``)."""
    from ..audit import audit_run
    from ..search import run

    with tempfile.TemporaryDirectory() as tmp:
        summary = run(cfg, Path(tmp) / "run").summary
        report = audit_run(Path(tmp) / "run")
    counts = {}
    for attack in ATTACKS:
        counts[attack] = report["attacks"][attack]["recovered"]
        counts[f"{attack} attacked"] = report["attacks"][attack]["attacked"]
    return {key: summary.get(key) for key in ("rounds", "test_accuracy", "bytes_total")} | counts | {
        "flagged": len(report["flagged"]), "audit": report}


HORIZONTAL = {"partition": {"num_clients": 10, "method": "metis"}}
SWIFT_MODEL = {"name": "sage", "hidden": 64, "layers": 2, "dropout": 0.5}
SWIFT = {**HORIZONTAL, "model": SWIFT_MODEL, "train": {"rounds": 20, "lr": 0.01}}
NODE_LEVEL = {"model": {"name": "gcn", "hidden": 16, "layers": 2, "dropout": 0.5},
              "train": {"rounds": 2, "lr": 0.1, "weight_decay": 5e-4}}
FEDAAS = {**HORIZONTAL, "train": {"rounds": 2, "lr": 0.001, "weight_decay": 5e-4}}
NO_DROPOUT = {"model": {**SWIFT_MODEL, "dropout": 0.0}}
AUDITED: list[tuple[str, dict[str, Any]]] = [  # (label, config sections replacing the base's)
    ("FedAvg", {**HORIZONTAL, "model": {"name": "gcn", "hidden": 64, "layers": 2},
                "protocol": {"name": "fedavg", "local_epochs": 1}, "train": {"rounds": 5, "lr": 0.01}}),
    ("GLASU", {"dataset": {"name": "cora", "split": "random", "options": {"train_per_class": 60}},
               "partition": {"num_clients": 3, "method": "random", "edge_keep": 0.8},
               "model": {"name": "gcnii", "layers": 4, "hidden": 128, "dropout": 0.5},
               "protocol": {"name": "glasu", "K": 2, "Q": 4, "S": 16, "batches": 4, "sampling": "layerwise",
                            "fanout": 3, "aggregation": "mean"},
               "train": {"rounds": 2, "lr": 0.01}}),
    ("nFedGNN", {**NODE_LEVEL, "protocol": {"name": "nfedgnn", "lam": 300, "regulariser": "raw"}}),
    ("CNFGNN", {**NODE_LEVEL, "protocol": {"name": "cnfgnn", "lam": 0}}),
    ("Swift-FedGNN", {**SWIFT, "protocol": {"name": "swift", "I": 10, "K": 5, "batch_size": 256}}),
    ("Swift-FedGNN dropout 0", {**SWIFT, **NO_DROPOUT, "protocol": {"name": "swift", "I": 10, "K": 5,
                                                                    "batch_size": 256}}),
    ("Swift-FedGNN dropout 0, secure aggregation", {**SWIFT, **NO_DROPOUT,
                                                    "protocol": {"name": "swift", "I": 10, "K": 5, "batch_size": 256},
                                                    "privacy.secure_aggregation": True}),
    ("FedGNN-G", {**SWIFT, "protocol": {"name": "fedgnn-g", "batch_size": 256}}),
    ("FedGNN-G dropout 0", {**SWIFT, **NO_DROPOUT, "protocol": {"name": "fedgnn-g", "batch_size": 256}}),
    ("FedGNN-G dropout 0, secure aggregation", {**SWIFT, **NO_DROPOUT,
                                                "protocol": {"name": "fedgnn-g", "batch_size": 256},
                                                "privacy.secure_aggregation": True}),
    ("FedGNN-G min_aggregate 1", {**SWIFT, "protocol": {"name": "fedgnn-g", "batch_size": 256, "min_aggregate": 1}}),
    ("LLCG", {**SWIFT, "protocol": {"name": "llcg", "local_steps": 10, "batch_size": 256}}),
    ("FedAAS", {**FEDAAS, "protocol": {"name": "fedaas", "interval_loss": "train"}}),
    ("FedAAS interval 1", {**FEDAAS, "protocol": {"name": "fedaas", "interval_loss": "train", "interval": 1}}),
    ("FedAAS interval 1, min_pair_rows 2", {**FEDAAS, "protocol": {"name": "fedaas", "interval_loss": "train",
                                                                     "interval": 1, "min_pair_rows": 2}}),
]


def audit_variant(label: str, sections: dict[str, Any]) -> Variant:
    """A variant evaluated once, after its last round (``eval.every`` = its rounds)."""
    return Variant(label, {**sections, "eval.every": sections["train"]["rounds"]})


AUDIT = BenchTask(
    name="privacy-audit",
    description="`fedgl audit` on short recorded runs on Cora (settings in fedgl.bench.privacy): recovered and "
                "attacked counts per attack. raw rows: message rows equal to a non-zero raw feature row (of all "
                "2,708 rows, or of a GLASU client's feature block); reconstruction: rows inside the server's "
                "input-layer sums recovered by least squares; single-row sums: input-layer sums (and FedAAS "
                "partials) holding one row; labels: nodes whose label reached a party not owning it.",
    base={"dataset": {"name": "cora"}, "network": {"compute": "ignore"}, "threads": 1,
          "privacy": {"record_messages": True}},
    variants=[audit_variant(label, sections) for label, sections in AUDITED],
    columns=["rounds", *(c for attack in ATTACKS for c in (attack, f"{attack} attacked"))],
    seeds=1,
    compute=audited,
    formats={"rounds": ".0f", **{c: ".0f" for attack in ATTACKS for c in (attack, f"{attack} attacked")}},
    labels={**ATTACKS, **{f"{attack} attacked": f"{name} attacked" for attack, name in ATTACKS.items()}},
)


# ---- accuracy against epsilon: FedAvg and Swift-FedGNN ------------------------------------------------
def _sweeps() -> list[BenchTask]:
    fedavg = {"dataset": {"name": "cora"}, "model": {"name": "gcn", "hidden": 64, "layers": 2},
              "train": {"rounds": 50, "lr": 0.01}, "network": {"compute": "ignore"},
              "protocol": {"name": "fedavg", "local_epochs": 3}, "partition": {"num_clients": 10, "method": "metis"}}
    swift = {"dataset": {"name": "cora"}, "model": {"name": "sage", "hidden": 64, "layers": 2, "dropout": 0.5},
             "train": {"rounds": 100, "lr": 0.01}, "eval": {"every": 10}, "network": {"compute": "ignore"},
             "protocol": {"name": "swift", "I": 2, "K": 5, "batch_size": 64, "fanouts": [10, 5]},
             "partition": {"num_clients": 10, "method": "metis"}}
    return [
        BenchTask(
            name="privacy-fedavg-cora", base=fedavg, variants=dp_variants((0.01, 0.03, 0.1, 0.3, 1.0, 3.0)), seeds=3,
            columns=[EPSILON, "test_accuracy", "final_test_accuracy", "MB_total"], derive=dp_columns,
            formats=EPSILON_FORMATS, quick={"train.rounds": 2},
            description="FedAvg on Cora, 10 METIS clients, GCN 64 hidden, 3 local epochs, 50 rounds, every client "
                        "in every round. DP: each client clips its update to L2 norm 1 and adds Gaussian noise of std "
                        "noise_multiplier x max_norm; epsilon from dp-accounting's RDP accountant after the last "
                        f"round. {ACCURACY_NOTE}"),
        BenchTask(
            name="privacy-swift-cora", base=swift, variants=dp_variants((0.01, 0.03, 0.1, 0.5, 2.0, 8.0)), seeds=2,
            columns=[EPSILON, "epsilon gradient uploads", "epsilon exchange", "test_accuracy", "final_test_accuracy",
                     "MB_total", "MB_cross_client"], derive=dp_columns, formats=EPSILON_FORMATS,
            quick={"train.rounds": 4, "eval.every": 2},
            description="Swift-FedGNN on Cora, 10 METIS clients, GraphSAGE 64 hidden, batch 64, fanouts 10/5, I=2, "
                        "K=5, 100 iterations. DP: every row an owner sums for another client and every client's "
                        "gradient upload is clipped to L2 norm 1, and each partial sum and each upload gets Gaussian "
                        "noise of std noise_multiplier x max_norm; epsilon from dp-accounting's RDP accountant for "
                        "the node whose row went into the most noised sums, composed with one upload of its client "
                        f"per iteration (each part beside it). {ACCURACY_NOTE}"),
    ]


TASKS: dict[str, BenchTask] = {task.name: task for task in [*_sweeps(), *_dp_tasks(), AUDIT]}
