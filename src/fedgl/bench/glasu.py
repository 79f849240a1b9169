"""GLASU's tables: Table 2 (accuracy against its baselines), Table 3 (lazy aggregation K), Table 4
(stale updates Q, time to an accuracy threshold), Table 5 (number of clients M) and Figure 3
(backbones), over the Planetoid graphs, plus Coauthor CS and Amazon Computers (not in the paper).

Every baseline is a configuration of the ``glasu`` protocol: centralized is one client holding every
feature and edge (a single party: nothing is sent); standalone is K = 0 (clients never communicate);
simulated centralized is exact split learning ([9]): every client keeps every edge, the server
aggregates at every layer (K = L) and back-propagates through the aggregations.
Every accuracy is reported twice: ``test_accuracy`` at the round of best validation accuracy and
``final_test_accuracy`` after the last round.
Runtimes are on the simulated clock (1 Gbps links, 1 ms latency, measured compute); the paper's are
seconds on its GPU cluster, so only their ratios compare. docs/glasu.md explains the settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..report import comparison_plot, load_runs
from .core import BenchTask, Variant

PAPER = "Zhang, Hong & Chen, GLASU (arXiv:2303.09531): Tables 2-5 and Figure 3"
LAYERS = 4

_COMMON: dict[str, Any] = {
    "partition": {"num_clients": 3, "method": "random", "edge_keep": 0.8},
    "model": {"name": "gcnii", "layers": LAYERS, "hidden": 128, "dropout": 0.5},
    "protocol": {"name": "glasu", "K": 2, "Q": 4, "S": 16, "batches": 32, "fanout": 3, "sampling": "layerwise",
                 "lr_decay_every": 4, "lr_decay": 0.5},
    "train": {"rounds": 16, "optimizer": "adam", "lr": 0.01, "weight_decay": 5e-5 / 3},
    "network": {"bandwidth_mbps": 1000.0, "latency_ms": 1.0, "compute": "measured"},
}

# Per-dataset settings on top of the common ones.
_DATASETS: dict[str, dict[str, Any]] = {  # the authors' random splits: 60 / 84 / 320 training nodes per class
    "cora": {"dataset.name": "cora", "dataset.split": "random", "dataset.options": {"train_per_class": 60}},
    "citeseer": {"dataset.name": "citeseer", "dataset.split": "random", "dataset.options": {"train_per_class": 84}},
    "pubmed": {"dataset.name": "pubmed", "dataset.split": "random", "dataset.options": {"train_per_class": 320},
               "protocol.batches": 64},  # the authors train PubMed twice as long
    "cs": {"dataset.name": "cs", "dataset.split": "random", "dataset.options": {"train_per_class": 20}},
    "computers": {"dataset.name": "computers", "dataset.split": "random", "dataset.options": {"train_per_class": 20}},
}

def clients(M: int) -> dict[str, Any]:
    """M clients with the authors' weight decay of 5e-5 / M (a larger one stalls the split model: each
    client's sub-layers see only a 1/M share of the gradient)."""
    return {"partition.num_clients": M, "train.weight_decay": 5e-5 / M}


EXACT = {"protocol.backward": "exact"}  # the authors' "v1", which implementation-facts.md takes for GLASU-1
PUBLIC_SPLIT = {"dataset.split": "public", "dataset.options": {}}
CENTRALIZED = {**clients(1), "partition.edge_keep": 1.0, "protocol.K": LAYERS, "protocol.Q": 1}
STANDALONE = {"protocol.K": 0, "protocol.Q": 1}
SIMULATED = {"partition.edge_keep": 1.0, "protocol.K": LAYERS, "protocol.Q": 1, **EXACT}
GLASU_1 = {"protocol.Q": 1}
GLASU_4 = {"protocol.Q": 4}

_TABLE2 = {  # test accuracy (%) from Table 2: Cent., StAl., Sim., GLASU-1, GLASU-4
    "cora": (80.9, 74.6, 80.1, 81.0, 80.3),
    "pubmed": (84.9, 77.2, 82.7, 82.3, 83.8),
    "citeseer": (70.2, 64.4, 70.0, 70.0, 68.8),
}
_METHODS = (("Cent.", CENTRALIZED), ("StAl.", STANDALONE), ("Sim.", SIMULATED), ("GLASU-1", GLASU_1),
            ("GLASU-4", GLASU_4))


def _acc(percent: float | None) -> dict[str, float]:
    """The paper's accuracy beside both of ours: at the best validation round and after the last round
    (the authors' code never looks at the validation set)."""
    return {} if percent is None else {"test_accuracy": percent / 100, "final_test_accuracy": percent / 100}


def _table2(dataset: str, split: dict[str, Any] | None = None) -> list[Variant]:
    """Table 2's five columns on one dataset (one task per dataset, so each can have its own seeds)."""
    return [Variant(f"{dataset} {label}", {**_DATASETS[dataset], **(split or {}), **overrides},
                    _acc(_TABLE2[dataset][i]))
            for i, (label, overrides) in enumerate(_METHODS)]


class RuntimeSaving:
    """Derived column for Table 3: the simulated-time saving of each run against the first variant
    (K = L) run with the same seed, in percent.

    ``run_task`` runs every seed of a variant, from seed 0, before the next variant, so a run with
    seed 0 opens a new variant; the first variant's times are the references.
    """

    def __init__(self, num_variants: int):
        self.num_variants = num_variants
        self.variant = -1
        self.reference: dict[int, float] = {}

    def __call__(self, summary: dict[str, Any]) -> dict[str, Any]:
        if summary["seed"] == 0:
            self.variant = (self.variant + 1) % self.num_variants
        if self.variant == 0:
            self.reference[summary["seed"]] = summary["sim_time_s"]
        base = self.reference.get(summary["seed"])
        return {"runtime_saving_pct": 100 * (1 - summary["sim_time_s"] / base) if base else None}


_K_VALUES = ((LAYERS, 82.5, 130.0, None), (2, 83.8, 96.6, 25.7), (1, 82.2, 81.3, 37.5))
_Q_VALUES = ((2, 82.5, 66.1), (4, 82.0, 43.8), (8, 82.1, 88.9), (16, None, None))
_TABLE5 = {  # Table 5: (Cent., StAl. M=3/5/7, GLASU M=3/5/7)
    "citeseer": (70.2, (64.4, 44.6, 36.6), (68.8, 69.5, 69.4)),
    "pubmed": (84.9, (77.2, 73.8, 67.0), (83.8, 84.6, 84.4)),
}


def _table5() -> list[Variant]:
    variants = []
    for dataset, (cent, stal, glasu) in _TABLE5.items():
        variants.append(Variant(f"{dataset} Cent.", {**_DATASETS[dataset], **CENTRALIZED}, _acc(cent)))
        for M, standalone, ours in zip((3, 5, 7), stal, glasu):
            variants.append(Variant(f"{dataset} StAl. M={M}", {**_DATASETS[dataset], **STANDALONE, **clients(M)},
                                    _acc(standalone)))
            variants.append(Variant(f"{dataset} GLASU M={M}", {**_DATASETS[dataset], **GLASU_4, **clients(M)},
                                    _acc(ours)))
    return variants


# The authors' scripts (implementation-facts.md, GLASU): the residual GCN with BatchNorm, SGD with the
# learning rate divided by 4 every 12 rounds, node-wise sampling of 2 neighbours, the induced adjacency,
# feature dropout 0.4 and 32 rounds of 32 (PubMed 64) mini-batches.
_CODE: dict[str, Any] = {
    "model.name": "gcnres", "model.dropout": 0.4, "train.optimizer": "sgd", "train.rounds": 32,
    "protocol.sampling": "nodewise", "protocol.fanout": 2, "protocol.adjacency": "induced",
    "protocol.lr_decay_every": 12, "protocol.lr_decay": 0.25,
}
_CODE_DATASETS = {"cora": {"model.hidden": 192, "train.lr": 0.02}, "citeseer": {"model.hidden": 256, "train.lr": 0.02},
                  "pubmed": {"model.hidden": 256, "train.lr": 0.01}}


def _table2_code() -> list[Variant]:
    return [Variant(f"{dataset} {label}", {**_DATASETS[dataset], **overrides, **_CODE, **_CODE_DATASETS[dataset]},
                    _acc(_TABLE2[dataset][i]))
            for dataset in _CODE_DATASETS for i, (label, overrides) in enumerate(_METHODS) if label.startswith("GLASU")]


# The authors' centralized script (CiteSeer's Cent. line; Cora has none, so Cora keeps its GLASU script's
# rate and width): the same recipe on one client, with a fan-out of 5 instead of 2.
_CENT_CODE = {"citeseer": {"train.lr": 0.01}, "cora": {}}


def _centralized_gap() -> list[Variant]:
    """Cent. and GLASU-4, both with the authors' script settings, on Cora and CiteSeer; Cent. (one step
    per mini-batch, as the script's v1 line) also with GLASU-4's 4 steps per mini-batch."""
    return [Variant(f"{dataset} {label}", {**_DATASETS[dataset], **overrides, **_CODE, **_CODE_DATASETS[dataset],
                                           **extra}, _acc(_TABLE2[dataset][column]))
            for dataset, cent in _CENT_CODE.items()
            for label, overrides, extra, column in (
                ("Cent.", CENTRALIZED, {"protocol.fanout": 5, **cent}, 0),
                ("Cent. Q=4", CENTRALIZED, {"protocol.fanout": 5, **cent, "protocol.Q": 4}, 0),
                ("GLASU-4", GLASU_4, {}, 4))]


_QUICK = {"train.rounds": 2, "protocol.batches": 4}

# What the authors' standalone script (GFL_single.py, implementation-facts.md) does differently from
# fedgl's standalone, one factor at a time: the client scored (index 2, not 0), the feature blocks,
# node-wise sampling of 2 neighbours with the induced adjacency, scoring through that sampled pipeline,
# the edge share; then all of its settings together (residual GCN, SGD, lr / 4 every 8 rounds).
_NODEWISE = {"protocol.sampling": "nodewise", "protocol.fanout": 2, "protocol.adjacency": "induced"}
_SAMPLED = {**_NODEWISE, "protocol.inference": "sampled"}
_SCORED = {"protocol.train_clients": "scoring"}
_STAL_CAUSES = (("StAl.", {}), ("client 2", {"protocol.eval_client": 2}),
                ("contiguous blocks", {"partition.method": "contiguous"}), ("nodewise", _NODEWISE),
                ("nodewise, sampled inference", _SAMPLED), ("60% edges", {"partition.edge_keep": 0.6}))
_STAL_SCRIPT = {**_CODE, **_SAMPLED, "model.hidden": 256, "train.lr": 0.01, "protocol.lr_decay_every": 8,
                "protocol.eval_client": 2}
_PUBMED_RUNS = ("M=3 StAl.", "M=3 60% edges", "M=3 authors' script", "M=7 StAl.", "M=7 authors' script")
_STAL_EDGES = {"citeseer": 0.8, "pubmed": 0.6}  # the script's edge share: PubMed's standalone line drops 40%


def _standalone_causes(dataset: str, counts: tuple[int, ...], ends_only: tuple[int, ...] = ()) -> list[Variant]:
    """Standalone at each M: as in glasu-table5, then changed in one factor, then the authors' script
    (at the M of ``ends_only``: only the first and the last). Only the scored client trains (the same
    scores as glasu-table5's, where every client trains)."""
    stal = dict(zip((3, 5, 7), _TABLE5[dataset][1]))
    script = ("authors' script", {**_STAL_SCRIPT, "partition.edge_keep": _STAL_EDGES[dataset]})
    adam = ("authors' script, Adam", {**script[1], "train.optimizer": "adam"})  # is SGD's short schedule the cause?
    return [Variant(f"M={M} {label}", {**_DATASETS[dataset], **STANDALONE, **clients(M), **_SCORED, **overrides},
                    _acc(stal[M]))
            for M in sorted((*counts, *ends_only))
            for label, overrides in ((_STAL_CAUSES[0], script) if M in ends_only else (*_STAL_CAUSES, script, adam))
            if label != adam[0] or (dataset, M) == ("citeseer", 7)]


_TABLE2_COLUMNS = ["test_accuracy", "final_test_accuracy", "best_round", "best_val_accuracy", "bytes_total",
                   "sim_time_s"]
_ROUNDS = ("test_accuracy is at the round of best validation accuracy (best_round), final_test_accuracy after "
           "the last round.")


def _figure3(folder: Path) -> None:
    """``curves.png``: Figure 3's test accuracy against rounds, one curve per backbone (first seed)."""
    runs = [Path(r["folder"]) for r in json.loads((folder / "results.json").read_text()) if r["seed"] == 0]
    (folder / "curves.png").write_bytes(comparison_plot(load_runs(runs)))


def _task(**fields: Any) -> BenchTask:
    """A GLASU task: the shared settings, 3 seeds (the paper repeats only Table 2, five times) and the short
    smoke version unless ``fields`` say otherwise."""
    return BenchTask(**{"base": _COMMON, "seeds": 3, "quick": _QUICK, **fields})


TASKS: dict[str, BenchTask] = {task.name: task for task in [
    *(_task(
        name=f"glasu-table2-{dataset}",
        description=f"GLASU Table 2 on {dataset}: test accuracy of centralized (M=1), standalone (K=0), simulated "
                    "centralized (exact split learning: all edges, K=L, gradients back through the server), GLASU-1 "
                    f"(Q=1) and GLASU-4 (Q=4); 3 clients, 4-layer GCNII, K=2, S=16. {_ROUNDS}",
        variants=_table2(dataset),
        columns=_TABLE2_COLUMNS,
        seeds=5,
        source=f"{PAPER}, Table 2",
    ) for dataset in _TABLE2),
    _task(
        name="glasu-cora-split",
        description="The Cora gap: Table 2's columns on Cora with the public Planetoid split (20 training nodes per "
                    "class) instead of the authors' random 60 per class; everything else as glasu-table2-cora. "
                    "'GLASU-1 exact' is GLASU-1 with the exact backward (split learning, the authors' v1). "
                    f"{_ROUNDS}",
        variants=[*_table2("cora", PUBLIC_SPLIT),
                  Variant("cora GLASU-1 exact", {**_DATASETS["cora"], **PUBLIC_SPLIT, **GLASU_1, **EXACT},
                          _acc(_TABLE2["cora"][3]))],
        columns=_TABLE2_COLUMNS,
        source=f"{PAPER}, Table 2 (split not stated)",
    ),
    _task(
        name="glasu-table2-code",
        description="GLASU Table 2's GLASU-1 and GLASU-4 columns with the authors' script settings instead of the "
                    f"paper's method: residual GCN, SGD, node-wise sampling, induced adjacency, 32 rounds. {_ROUNDS}",
        variants=_table2_code(),
        columns=_TABLE2_COLUMNS,
        source=f"{PAPER}, Table 2",
    ),
    _task(
        name="glasu-table3",
        description="GLASU Table 3 (PubMed): lazy aggregation with K = 4, 2, 1 aggregation layers (Q=4): accuracy, "
                    f"simulated runtime and its saving against K = 4. {_ROUNDS}",
        variants=[Variant(f"K={K}", {**_DATASETS["pubmed"], "protocol.K": K},
                          {**_acc(acc), "sim_time_s": time, **({"runtime_saving_pct": saving} if saving else {})})
                  for K, acc, time, saving in _K_VALUES],
        columns=["test_accuracy", "final_test_accuracy", "sim_time_s", "runtime_saving_pct", "bytes_total"],
        derive=RuntimeSaving(len(_K_VALUES)),
        source=f"{PAPER}, Table 3 (runtimes there are seconds on 3 V100 GPUs; ours are simulated)",
    ),
    _task(
        name="glasu-table4",
        description="GLASU Table 4 (PubMed): stale updates Q = 2, 4, 8, 16: simulated time until the test "
                    "accuracy first reaches 82%, the paper's target (the run stops there); test_accuracy is at the "
                    "round of best validation accuracy. Rounds of 8 mini-batches, so the time to the target is "
                    "resolved finely; the learning rate halves every 32 of them, Table 2's schedule per mini-batch "
                    "(64 mini-batches a round, halved every 4 rounds).",
        base={**_COMMON, "eval": {"target_test_accuracy": 0.82, "stop_at_target": True}},
        variants=[Variant(f"Q={Q}", {**_DATASETS["pubmed"], "protocol.Q": Q, "protocol.batches": 8,
                                     "train.rounds": 48, "protocol.lr_decay_every": 32},
                          {**_acc(acc), **({"sim_time_at_target_s": time} if time else {})})
                  for Q, acc, time in _Q_VALUES],
        columns=["sim_time_at_target_s", "round_at_target", "test_accuracy", "bytes_at_target"],
        source=f"{PAPER}, Table 4 (the paper's Q=16 never reaches the threshold within 128 s)",
    ),
    _task(
        name="glasu-table5",
        description="GLASU Table 5: centralized, standalone and GLASU-4 with M = 3, 5, 7 clients on CiteSeer "
                    f"and PubMed. {_ROUNDS}",
        variants=_table5(),
        columns=["test_accuracy", "final_test_accuracy", "best_round", "bytes_total"],
        source=f"{PAPER}, Table 5",
    ),
    _task(
        name="glasu-standalone-causes",
        description="Why GLASU Table 5's standalone collapses with more clients and fedgl's does not: CiteSeer "
                    "standalone at M = 5 and 7 as in glasu-table5 (client 0, random feature blocks, layer-wise "
                    "sampling, full-neighbourhood scoring, 80% of the edges), then one factor of the authors' "
                    "script at a time (client 2 scored, contiguous blocks, node-wise sampling of 2 with the induced "
                    "adjacency, scoring through that sampled pipeline, 60% of the edges), then the script's "
                    "settings together, and at M = 7 those with Adam instead of SGD; at M = 3 only standalone and the "
                    f"script, to see whether the script reproduces Table 2's standalone. {_ROUNDS}",
        variants=_standalone_causes("citeseer", (5, 7), ends_only=(3,)),
        columns=["test_accuracy", "final_test_accuracy", "best_round"],
        source=f"{PAPER}, Table 5 (standalone)",
    ),
    _task(
        name="glasu-standalone-pubmed",
        description="glasu-standalone-causes on PubMed at M = 3 (Table 2's standalone; the authors' PubMed "
                    "standalone script keeps 60% of the edges) and M = 7, with fewer factors: standalone as in "
                    "glasu-table5, 60% of the edges (M = 3), the authors' script. "
                    f"{_ROUNDS}",
        variants=[v for v in _standalone_causes("pubmed", (3, 7)) if v.label in _PUBMED_RUNS],  # what PubMed affords
        columns=["test_accuracy", "final_test_accuracy", "best_round"],
        seeds=1,
        source=f"{PAPER}, Tables 2 and 5 (standalone)",
    ),
    _task(
        name="glasu-centralized-gap",
        description="How far GLASU-4 trails centralized training when both use the authors' script settings "
                    "(residual GCN, SGD, node-wise sampling, induced adjacency, 32 rounds; centralized with a "
                    f"fan-out of 5 as in the authors' centralized script). {_ROUNDS}",
        variants=_centralized_gap(),
        columns=["test_accuracy", "final_test_accuracy", "best_round"],
        source=f"{PAPER}, Table 2",
    ),
    _task(
        name="glasu-figure3",
        description="GLASU Figure 3 (PubMed): GLASU-4 with GCN, GAT and GCNII backbones; every run's "
                    f"metrics.jsonl holds its accuracy curve, overlaid in curves.png. {_ROUNDS}",
        variants=[Variant(backbone, {**_DATASETS["pubmed"], "model.name": backbone})
                  for backbone in ("gcn", "gat", "gcnii")]
        # GCN and GAT do not train at GCNII's learning rate on PubMed with Q = 4 (docs/glasu.md).
        + [Variant(f"{backbone} lr 0.001", {**_DATASETS["pubmed"], "model.name": backbone, "train.lr": 0.001})
           for backbone in ("gcn", "gat")],
        columns=["test_accuracy", "final_test_accuracy", "best_round", "sim_time_s"],
        source=f"{PAPER}, Figure 3 (curves only; no numbers to compare)",
        finish=_figure3,
    ),
    _task(
        name="glasu-extra",
        description="Beyond the paper: centralized, standalone and GLASU-4 on Coauthor CS and Amazon Computers "
                    "(3 clients, random 20-per-class splits).",
        variants=[Variant(f"{dataset} {label}", {**_DATASETS[dataset], **overrides})
                  for dataset in ("cs", "computers")
                  for label, overrides in (("Cent.", CENTRALIZED), ("StAl.", STANDALONE), ("GLASU-4", GLASU_4))],
        columns=["test_accuracy", "best_val_accuracy", "bytes_total", "sim_time_s"],
        source="not in the paper",
    ),
]}
