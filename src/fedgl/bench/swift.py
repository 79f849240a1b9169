"""Swift-FedGNN benchmark tasks (swift-fedgnn.txt, Section 6 and Appendix G).

``swift-compare-<dataset>`` runs Swift-FedGNN, FedGNN-G, LLCG, FedGNN-PNS and FedSage on one
dataset; its columns are the paper's Table 1 (GB to the target validation accuracy), Figure 5
(MB per step), the cross-client MB per step and per iteration in which cross-client data moved
(Table 7's "overhead per iteration when communication occurs"), Table 8 (validation accuracy) and
Figure 4's time to target (simulated seconds). When a task finishes, ``finish`` draws Figures 4 and 5
into its folder and writes ``ratios.md``: every variant's bytes per step against FedGNN-G's, in total
and cross-client bytes. ``swift-sensitivity-*`` is Tables 2-3 (I and K), ``swift-gin-*`` Tables 10-11,
``swift-scale-*`` Tables 4 and 9 (M = 80, 100), ``swift-random-*`` Tables 12-13 (random partition);
``swift-min-aggregate-*`` is the privacy rule's ablation (``min_aggregate`` 1 against 2),
``swift-backprop-*`` stopped against backpropagated remote gradients (App. H.1), and
``swift-llcg-drift-*`` the measurement behind LLCG's accuracy on label-skewed clients.
Reference numbers are attached where the dataset is one of the paper's. One round is one iteration
(step) of every protocol.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..results import read_jsonl
from ..tables import markdown_table
from .core import BenchTask, Variant

SOURCE = "swift-fedgnn.txt (Swift-FedGNN), Tables 1-4 and 7-13"
PROTOCOLS = ("Swift-FedGNN", "FedGNN-G", "LLCG", "FedGNN-PNS", "FedSage")

# Per-dataset settings: the paper's (Appendix G.2) for its datasets, the same recipe for the others.
SETTINGS: dict[str, dict[str, Any]] = {
    "citeseer": {"split": "default", "lr": 0.01, "I": 5, "K": 5, "clients": 10, "rounds": 200, "target": 0.64},
    "pubmed": {"split": "full", "lr": 0.01, "I": 10, "K": 5, "clients": 10, "rounds": 200, "target": 0.90},
    "computers": {"split": "default", "lr": 0.01, "I": 10, "K": 5, "clients": 10, "rounds": 200, "target": 0.85},
    "cora": {"split": "default", "lr": 0.01, "I": 10, "K": 5, "clients": 10, "rounds": 200, "target": 0.75},
    "reddit": {"split": "default", "lr": 0.001, "I": 10, "K": 5, "clients": 10, "rounds": 1000, "target": 0.945},
    "ogbn-arxiv": {"split": "default", "lr": 0.001, "I": 10, "K": 5, "clients": 10, "rounds": 1000, "target": 0.55},
    "flickr": {"split": "default", "lr": 0.0001, "I": 10, "K": 5, "clients": 10, "rounds": 1000, "target": 0.49},
}

# Paper numbers per dataset and protocol: Table 1 (GB), Table 8 (%), Table 7 (MB), Tables 10-11 (GIN).
# ogbn-products loads by name but has no task yet, so its numbers are left out.
TABLE1 = {"reddit": (5.89, 70.72, 23.89, 8.96), "ogbn-arxiv": (0.95, 7.91, 1.46, 1.41),
          "flickr": (1.07, 17.22, 1.30, 1.27), "citeseer": (35.32, 43.43, 25.80, 36.11)}
TABLE8 = {"reddit": (95.47, 95.96, 95.27, 95.46, 95.30), "ogbn-arxiv": (57.17, 56.78, 56.78, 55.86, 56.55),
          "flickr": (50.19, 51.57, 50.12, 51.47, 49.75), "citeseer": (66.00, 66.08, 68.40, 66.27, 64.39)}
TABLE7 = {"reddit": (90.4, 180.7, 619.6, 180.7)}
TABLE10 = {"ogbn-arxiv": (56.69, 57.01, 57.32, 56.54), "citeseer": (47.34, 50.76, 46.60, 47.99)}
TABLE11 = {"ogbn-arxiv": ((2.29, 75.80), (19.36, 575.26), (3.81, 103.98), (3.62, 131.92))}
GIN_TARGET = {"ogbn-arxiv": 0.56}

COLUMNS = ["best_val_accuracy", "gb_at_target", "mb_per_step", "mb_cross_per_step", "mb_cross_per_comm_iteration",
           "sim_time_at_target_s", "round_at_target", "test_accuracy"]


def _base(dataset: str, model: str = "sage") -> dict[str, Any]:
    s = SETTINGS[dataset]
    return {
        "dataset": {"name": dataset, "split": s["split"]},
        "model": {"name": model, "hidden": 256, "layers": 2, "dropout": 0.5},
        "partition": {"num_clients": s["clients"], "method": "metis"},
        "train": {"rounds": s["rounds"], "optimizer": "adam", "lr": s["lr"], "weight_decay": 5e-4},
        "eval": {"every": 10, "target_val_accuracy": s["target"]},
        "network": {"bandwidth_mbps": 1000.0, "latency_ms": 1.0, "compute": "measured"},
        "protocol": {"name": "swift", "batch_size": 256, "fanouts": s.get("fanouts", [15, 10])},
    }


def _protocols(dataset: str) -> dict[str, dict[str, Any]]:
    """Overrides of each compared protocol (LLCG corrects as often as Swift crosses clients)."""
    s = SETTINGS[dataset]
    return {
        "Swift-FedGNN": {"protocol.name": "swift", "protocol.I": s["I"], "protocol.K": s["K"]},
        "FedGNN-G": {"protocol.name": "fedgnn-g"},
        "LLCG": {"protocol.name": "llcg", "protocol.local_steps": s["I"]},
        "FedGNN-PNS": {"protocol.name": "fedgnn-pns"},
        "FedSage": {"protocol.name": "swift", "protocol.K": 0},
    }


def derive(summary: dict[str, Any]) -> dict[str, Any]:
    """Per-run columns in the paper's units, from the measured totals of the summary."""
    rounds = summary["rounds"] or 1
    at_target = summary.get("bytes_at_target")
    cross, comm = summary.get("bytes_cross_client"), summary.get("cross_client_iterations")
    return {
        "mb_per_step": summary["bytes_total"] / rounds / 1e6,
        "mb_cross_per_step": cross / rounds / 1e6 if cross is not None else None,
        "mb_cross_per_comm_iteration": cross / comm / 1e6 if comm else None,
        "gb_at_target": at_target / 1e9 if at_target is not None else None,
        "mb_at_target": at_target / 1e6 if at_target is not None else None,
        "label_entropy": (summary.get("partition") or {}).get("mean_label_entropy"),  # clients' label skew
    }


def _refs(dataset: str, i: int) -> dict[str, float]:
    ref: dict[str, float] = {}
    if dataset in TABLE1 and i < 4:
        ref["gb_at_target"] = TABLE1[dataset][i]
    if dataset in TABLE8:
        ref["best_val_accuracy"] = TABLE8[dataset][i]
    if dataset in TABLE7 and i < 4:
        ref["mb_cross_per_comm_iteration"] = TABLE7[dataset][i]
    return ref


def compare_task(dataset: str) -> BenchTask:
    variants = [Variant(label, overrides, _refs(dataset, i))
                for i, (label, overrides) in enumerate(_protocols(dataset).items())]
    return BenchTask(
        name=f"swift-compare-{dataset}",
        description=f"{dataset}: Swift-FedGNN against FedGNN-G, LLCG, FedGNN-PNS and FedSage (2-layer GraphSAGE, "
                    f"METIS clients): Tables 1, 7, 8 and Figures 4-5 of the paper.",
        base=_base(dataset), variants=variants, columns=COLUMNS, seeds=3,
        quick={"train.rounds": 20, "eval.every": 10}, derive=derive, source=SOURCE,
        finish=finish)


def sensitivity_task(dataset: str, clients: int = 20) -> BenchTask:
    """Tables 2-3: I in {5, 10, 20, 40} at K = 10, and K in {1, 5, 10, 15} at I = 10, with M = 20
    (the paper's numbers are on ogbn-products, which is not available here)."""
    grid = [(10, i) for i in (5, 10, 20, 40)] + [(k, 10) for k in (1, 5, 15)]
    variants = [Variant(f"K={k} I={i}", {"protocol.K": k, "protocol.I": i}) for k, i in grid]
    base = _base(dataset)
    base["partition"]["num_clients"] = clients
    return BenchTask(
        name=f"swift-sensitivity-{dataset}",
        description=f"{dataset}, {clients} METIS clients: Swift-FedGNN's correction frequency I and sampled "
                    f"clients K (Tables 2-3: validation accuracy and MB to the target).",
        base=base, variants=variants,
        columns=["best_val_accuracy", "mb_at_target", "mb_per_step", "mb_cross_per_step", "test_accuracy"],
        seeds=3, quick={"train.rounds": 20}, derive=derive, source=SOURCE, finish=finish)


def gin_task(dataset: str) -> BenchTask:
    """Tables 10-11: the comparison with a two-layer GIN."""
    variants = []
    for i, (label, overrides) in enumerate(list(_protocols(dataset).items())[:4]):
        ref = {}
        if dataset in TABLE10:
            ref["best_val_accuracy"] = TABLE10[dataset][i]
        if dataset in TABLE11:
            ref["gb_at_target"], ref["sim_time_at_target_s"] = TABLE11[dataset][i]
        variants.append(Variant(label, overrides, ref))
    base = _base(dataset, model="gin")
    if dataset in GIN_TARGET:
        base["eval"]["target_val_accuracy"] = GIN_TARGET[dataset]
    return BenchTask(
        name=f"swift-gin-{dataset}",
        description=f"{dataset}: the comparison with a 2-layer GIN (Tables 10-11).",
        base=base, variants=variants, columns=COLUMNS, seeds=3, quick={"train.rounds": 20},
        derive=derive, source=SOURCE, finish=finish)


def scale_task(dataset: str) -> BenchTask:
    """Tables 4 and 9: 80 and 100 clients; Swift with K = 10 and with K = M/2."""
    variants = []
    for m in (80, 100):
        protocols = _protocols(dataset)
        runs = {"Swift-FedGNN K=10": protocols["Swift-FedGNN"] | {"protocol.K": 10},
                "Swift-FedGNN K=M/2": protocols["Swift-FedGNN"] | {"protocol.K": m // 2},
                "FedGNN-G": protocols["FedGNN-G"], "LLCG": protocols["LLCG"],
                "FedGNN-PNS": protocols["FedGNN-PNS"], "FedSage": protocols["FedSage"]}
        variants += [Variant(f"M={m} {label}", overrides | {"partition.num_clients": m})
                     for label, overrides in runs.items()]
    return BenchTask(
        name=f"swift-scale-{dataset}",
        description=f"{dataset} with 80 and 100 METIS clients (Tables 4 and 9).",
        base=_base(dataset), variants=variants, columns=COLUMNS, seeds=3, quick={"train.rounds": 10},
        derive=derive, source=SOURCE, finish=finish)


def random_task(dataset: str) -> BenchTask:
    """Tables 12-13: random instead of METIS partitioning (plus FedSage, which the paper leaves out:
    with most edges crossing clients, local-only training is where cross-client neighbours pay off)."""
    base = _base(dataset)
    base["partition"]["method"] = "random"
    return BenchTask(
        name=f"swift-random-{dataset}",
        description=f"{dataset} with randomly partitioned clients (Appendix G.1.5, Tables 12-13).",
        base=base, variants=[Variant(label, overrides) for label, overrides in _protocols(dataset).items()],
        columns=COLUMNS, seeds=3, quick={"train.rounds": 20}, derive=derive, source=SOURCE, finish=finish)


def min_aggregate_task(dataset: str, method: str) -> BenchTask:
    """The privacy rule's price: ``min_aggregate`` 2 (no single raw row leaves its owner) against 1
    (Eq. 5 as written), for Swift-FedGNN and FedGNN-G: accuracy, cross-client bytes, withheld picks."""
    protocols = _protocols(dataset)
    variants = [Variant(f"{label} min_aggregate={k}", protocols[label] | {"protocol.min_aggregate": k})
                for label in ("Swift-FedGNN", "FedGNN-G") for k in (1, 2)]
    base = _base(dataset)
    base["partition"]["method"] = method
    base["train"]["rounds"] = 50  # FedGNN-G crosses every client at every iteration: keep the task affordable
    return BenchTask(
        name=f"swift-min-aggregate-{dataset}-{method}",
        description=f"{dataset}, 10 {method} clients, 50 iterations: first-layer sums of at least 1 or 2 "
                    f"non-zero rows (withheld pairs send nothing).",
        base=base, variants=variants,
        columns=["best_val_accuracy", "test_accuracy", "mb_cross_per_step", "withheld_pick_fraction",
                 "withheld_pair_fraction", "mb_per_step"],
        seeds=2, quick={"train.rounds": 20}, derive=derive, source="", finish=figures)


def backprop_task(dataset: str) -> BenchTask:
    """Swift-FedGNN with the remote gradients held constant (Algorithm 2's messages) or sent back to
    their owners (App. H.1): accuracy and what the extra ``backward`` messages cost."""
    swift = _protocols(dataset)["Swift-FedGNN"]
    variants = [Variant(f"Swift-FedGNN {label}", swift | {"protocol.remote_backprop": on})
                for label, on in (("stopped", False), ("remote_backprop", True))]
    return BenchTask(
        name=f"swift-backprop-{dataset}",
        description=f"{dataset}, 10 METIS clients: Swift-FedGNN with stopped or backpropagated remote gradients.",
        base=_base(dataset), variants=variants,
        columns=["best_val_accuracy", "test_accuracy", "mb_per_step", "mb_cross_per_step",
                 "mb_cross_per_comm_iteration"],
        seeds=1, quick={"train.rounds": 20}, derive=derive, source="", finish=figures)


def llcg_drift_task(dataset: str) -> BenchTask:
    """Why LLCG falls behind on METIS clients: the same LLCG on METIS (label-skewed) clients averaging
    the models every 10 iterations or every iteration, without the server correction, and on random
    (label-balanced) clients."""
    variants = [Variant(f"LLCG {method} local_steps={k}", {"protocol.name": "llcg", "protocol.local_steps": k,
                                                           "partition.method": method})
                for method, k in (("metis", 10), ("metis", 1), ("random", 10))]
    variants.append(Variant("LLCG metis local_steps=10 server_steps=0", {
        "protocol.name": "llcg", "protocol.local_steps": 10, "protocol.server_steps": 0}))
    return BenchTask(
        name=f"swift-llcg-drift-{dataset}",
        description=f"{dataset}, 10 clients: LLCG's accuracy against client label skew (METIS or random "
                    f"partition) and the number of local steps between model averages.",
        base=_base(dataset), variants=variants,
        columns=["best_val_accuracy", "test_accuracy", "label_entropy", "mb_per_step", "mb_cross_per_step"],
        seeds=1, quick={"train.rounds": 20}, derive=derive, source="", finish=figures)


def bytes_task(dataset: str) -> BenchTask:
    """Why Swift's saving in total bytes per step is far below the paper's 7-21x: the model exchange,
    which both protocols send every step, against the cross-client data, which Swift saves. The same
    pair with the paper's GraphSAGE 256, with 16 hidden units (a sixteenth of the model bytes), and
    on random clients (most neighbours across clients), 50 iterations (bytes per step settle early)."""
    protocols = _protocols(dataset)
    settings = {"metis hidden 256": {}, "metis hidden 16": {"model.hidden": 16},
                "random hidden 256": {"partition.method": "random"}}
    variants = [Variant(f"{label} {setting}", protocols[label] | overrides | {"train.rounds": 50})
                for setting, overrides in settings.items() for label in ("Swift-FedGNN", "FedGNN-G")]
    return BenchTask(
        name=f"swift-bytes-{dataset}",
        description=f"{dataset}, 10 clients, 50 iterations: Swift-FedGNN's saving over FedGNN-G in total and in "
                    f"cross-client bytes per step, as the model shrinks (hidden 256 or 16) and as more neighbours "
                    f"cross clients (METIS or random partition); see ratios.md.",
        base=_base(dataset), variants=variants,
        columns=["mb_per_step", "mb_cross_per_step", "mb_cross_per_comm_iteration", "best_val_accuracy"],
        seeds=1, quick={"train.rounds": 10}, derive=derive, source="", finish=ratios)


def _reference(label: str, labels: list[str]) -> str | None:
    """The FedGNN-G variant run in the same setting as ``label``: the one whose other words all appear in
    ``label``, the most specific if several do (``M=80 FedGNN-G`` for ``M=80 Swift-FedGNN K=10``)."""
    words = set(label.split())
    fits = [other for other in labels if "FedGNN-G" in other.split() and set(other.split()) - {"FedGNN-G"} <= words]
    return max(fits, key=lambda other: len(other.split()), default=None)


def ratios(task_dir: str | Path) -> Path:
    """``ratios.md``: every variant's bytes per step (mean over seeds) and those of FedGNN-G in the same
    setting divided by them: in total bytes per step (the paper's Figure 5 unit), in cross-client bytes
    per step, and in cross-client bytes per iteration in which they moved (Table 7's quantity without
    the models)."""
    task_dir = Path(task_dir)
    runs = json.loads((task_dir / "results.json").read_text())
    columns = ("mb_per_step", "mb_cross_per_step", "mb_cross_per_comm_iteration")
    means: dict[str, list[float | None]] = {}
    for label in dict.fromkeys(r["variant"] for r in runs):
        values = [[r[c] for r in runs if r["variant"] == label and r[c] is not None] for c in columns]
        means[label] = [sum(v) / len(v) if v else None for v in values]
    header = ["variant", "MB per step", "cross-client MB per step", "cross-client MB per communicating iteration",
              "FedGNN-G ÷ variant: total per step", "cross-client per step",
              "cross-client per communicating iteration"]
    rows = []
    for label, values in means.items():
        full = means.get(_reference(label, list(means)))
        rows.append([label, *(f"{v:.3f}" if v is not None else "—" for v in values),
                     *(f"{f / v:.2f}" if full and f and v else "—" for f, v in zip(full or values, values))])
    lines = markdown_table(header, rows)
    path = task_dir / "ratios.md"
    path.write_text(f"# {task_dir.name}: bytes against FedGNN-G\n\n" + "\n".join(lines) + "\n")
    return path


def finish(task_dir: str | Path) -> None:
    """Figures 4-5 and ``ratios.md`` of a finished task folder."""
    figures(task_dir)
    ratios(task_dir)


def figures(task_dir: str | Path) -> Path:
    """Figure 4 (validation accuracy against simulated time) and Figure 5 (MB per step) of a
    finished ``swift-*`` task folder; returns the image path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    task_dir = Path(task_dir)
    runs = json.loads((task_dir / "results.json").read_text())
    fig, (curve, bars) = plt.subplots(1, 2, figsize=(12, 4))
    per_step: dict[str, list[float]] = {}
    for run in runs:
        rows = read_jsonl(Path(run["folder"]) / "metrics.jsonl")
        label = run["variant"] if run["seed"] == 0 else None
        curve.plot([r["sim_time_s"] for r in rows], [r["val_accuracy"] for r in rows],
                   color=f"C{list(dict.fromkeys(r['variant'] for r in runs)).index(run['variant'])}",
                   alpha=0.8, label=label)
        per_step.setdefault(run["variant"], []).append(run["bytes_total"] / max(run["rounds"], 1) / 1e6)
    curve.set(xlabel="simulated time (s)", ylabel="validation accuracy", title="Figure 4")
    curve.legend(fontsize="small")
    curve.grid(alpha=0.3)
    names = list(per_step)
    means = [sum(v) / len(v) for v in per_step.values()]
    bars.bar(range(len(names)), means, color=[f"C{i}" for i in range(len(names))])
    bars.set_xticks(range(len(names)), names, rotation=20, fontsize="small")
    bars.set(ylabel="MB per step", title="Figure 5")
    fig.tight_layout()
    path = task_dir / "figures.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


PAPER_DATASETS = ("reddit", "ogbn-arxiv", "flickr")  # run when present under the data root
LOCAL_DATASETS = ("citeseer", "pubmed")  # the paper's one offline dataset, and PubMed for its byte ratio
DRIFT_DATASET = "computers"  # the densest offline graph, and label-skewed under METIS: where LLCG drifts

TASKS: dict[str, BenchTask] = {
    task.name: task
    for task in [
        *(compare_task(d) for d in (*LOCAL_DATASETS, *PAPER_DATASETS)),
        sensitivity_task("citeseer"), gin_task("citeseer"), gin_task("ogbn-arxiv"),
        scale_task("citeseer"), random_task("citeseer"),
        min_aggregate_task("cora", "random"), llcg_drift_task(DRIFT_DATASET), backprop_task("pubmed"),
        bytes_task("pubmed"),
    ]
}
