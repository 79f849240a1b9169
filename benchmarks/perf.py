"""The performance suite: fedgl's overhead over plain PyG, its speed beside a peer's, its scale and
its start-up.

    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/perf.py           # everything
    FEDGL_DATA_ROOT=/path/to/datasets python benchmarks/perf.py --quick   # a short pass (a few minutes)

Writes ``benchmarks/results/perf.json`` (every measure with its value, unit, target, pass/fail, and
the date and machine: CPU model, cores, load average at start, torch version) and ``perf.md`` (the
table the README includes). Each group runs in a fresh interpreter, so its peak memory is its own;
ratios are timed in one process, one right after the other, so a busy machine slows both sides.

Groups:

* ``overhead``: per protocol, seconds per round of the federated run over the same gradient work
  done by a plain PyG loop written here (``torch_geometric.nn`` layers, Adam, the same model, the
  same number of forward/backward passes over the same nodes; mini-batch neighbourhoods drawn here
  with the same batch size and fan-outs);
* ``peers``: FedAvg on Cora with 10 METIS clients and 100 rounds (``examples/fedavg-cora.yaml``): the
  whole ``fedgl run`` process, ms per round in-process, peak memory, the same run on Ray over the
  in-process one, and the in-process one over OpenFGL's FedAvg in the same setting, run here from its
  source (``peers_openfgl.py``; left out with one line when it is not there);
* ``scale``: all PubMed users in nFedGNN (GCN, GAT), 1,000 FedAvg clients on PubMed;
  ``synthetic``: a 1.5M-node graph over 195 clients (FedAvg, Swift; ``--quick`` shrinks it);
* ``glasu-cs``: a GLASU round on Coauthor CS with 3 clients over a centralized epoch of the same model
  (GLASU with one client: the split model's L layers and classifier head), timed alternately;
* ``fedgnn-g-physics``: FedGNN-G at batch 256 with 20 random clients on Coauthor Physics, peak memory,
  and the same iteration's dense feature sums written, added and multiplied alone (skipped by ``--quick``);
* ``cnfgnn-cs``, ``fedaas-cs``: one CNFGNN round (every node of Coauthor CS a user) and one FedAAS round
  (examples/fedaas-cs.yaml), in seconds and over the plain PyG steps of the same model timed alternately,
  with the bytes of a round each way, and over the same round on the code before the speed work
  (``perf_before.BEFORE``, its ``git archive``: the median of three paired CPU-time ratios, each code in a child);
* ``startup``: ``python -X importtime`` of ``fedgl.cli`` and ``fedgl.runner``, ``fedgl --version``;
* ``bench-jobs``: a 2-variant × 3-seed bench task on a synthetic graph, one run after another and then
  with ``--jobs 2``: the ratio of their wall times and whether their tables are the same (CPU pass only).

``--only GROUP`` (repeatable) runs some groups and keeps the others' last rows in perf.json.

``--device cuda`` (or ``cuda:N``) runs every fedgl run with ``device: cuda`` and the plain PyG references
on the same GPU (each timed step waits for the GPU to finish), and adds the scale, synthetic and
FedGNN-G groups' peak GPU memory; the peer targets and the Physics address-space cap are the CPU
machine's and are left out. It writes ``perf-cuda.json`` and ``perf-cuda.md`` beside the CPU pass,
which it leaves alone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch

import perf_references as references
import perf_settings as settings
from perf_before import over_before, paired_rounds
from fedgl import device as devices
from fedgl.errors import ConfigError
from perf_harness import (CPU, RESULTS, FedglRun, Measure, Place, failed, fedgl_command, fmt, gpu_peak,
                          import_seconds, load, machine, paired_seconds, peak_mib, round_timer, seconds_per_call, stem,
                          timed_process, verdict, write)

PEERS = ("FedGraph on Ray: 62 s per run, measured by the issue reporter on a 2-core machine (OpenFGL is measured "
         "here, in the rows below).")


# ---- overhead -------------------------------------------------------------------------------------------
OVERHEAD_PROTOCOLS = ("centralized", "fedavg", "glasu", "nfedgnn", "swift", "fedgnn-g", "fedaas")
OVERHEAD_TARGETS = {"centralized": "<= 1.3", "fedavg": "<= 1.3", "nfedgnn": "<= 1.3", "glasu": "<= 2", "swift": "<= 2"}
GCN = {"name": "gcn", "hidden": 64, "layers": 2}
SAGE = {"name": "sage", "hidden": 256, "layers": 2}


class Setting(NamedTuple):
    """One overhead measure: the run, its reference (built from the run, e.g. its ``lam``), the data the
    run reads and what the reference does."""

    name: str
    cfg: dict
    reference: Callable[[FedglRun], Callable[[], None]]
    data: Any
    what: str
    calls: int | None = None  # rounds timed; None: the group's


def small_settings(place: Place, dataset: str, wanted: tuple[str, ...]):
    """The full-graph protocols on ``dataset``, each beside its reference."""
    if not set(wanted) & {"centralized", "fedavg", "glasu", "nfedgnn"}:
        return
    small = references.Graph.on(load(dataset), place.device)
    if "centralized" in wanted:
        yield Setting("centralized", place.config({"name": "centralized"}, dataset, GCN),
                      lambda run: references.full_graph(small), small.data,
                      f"GCN 64, {dataset}, one full-graph epoch per round")
    if "fedavg" in wanted:
        from fedgl.partition import partition_horizontal

        owner = devices.move(partition_horizontal(small.data, 10, "metis", seed=0).owner, place.device)  # the run's
        yield Setting("fedavg", place.config({"name": "fedavg", "local_epochs": 3}, dataset, GCN,
                                             {"num_clients": 10, "method": "metis"}),
                      lambda run: references.per_client(small, owner), small.data,
                      f"GCN 64, {dataset}, 10 METIS clients x 3 local epochs per round")
    if "glasu" in wanted:
        yield Setting("glasu", place.config({"name": "glasu", "K": 2, "Q": 1, "S": 10**9, "batches": 1,
                                             "sampling": "full"}, dataset, GCN,
                                            {"num_clients": 3, "method": "random", "edge_keep": 1.0}),
                      lambda run: references.feature_blocks(small, 3), small.data,
                      f"GCN 64, {dataset}, 3 clients (feature blocks), all training nodes, full neighbourhoods, "
                      "K = L = 2, Q = 1: each client a full-graph pass over its block")
    if "nfedgnn" in wanted:
        yield Setting("nfedgnn", place.config({"name": "nfedgnn", "lam": 1.0}, dataset, GCN),
                      lambda run: references.laplacian(small, run.protocol.lam), small.data,
                      f"GCN 64, {dataset}, every node a user, one full-graph step per round; the reference's loss "
                      "adds the same Laplacian penalty on the first layer's projection (Eq. 6-7, lam of the run)")


def large_settings(place: Place, large: str, wanted: tuple[str, ...], rounds: int):
    """The mini-batch protocols on ``large`` over 10 METIS clients, each beside its reference."""
    if not set(wanted) & {"swift", "fedgnn-g", "fedaas"}:
        return
    big = references.Graph.on(load(large), place.device)
    split = references.HorizontalSplit.of(big)
    clients = {"num_clients": 10, "method": "metis"}
    for name, cross in (("swift", 5), ("fedgnn-g", 10)):
        if name in wanted:
            options = {"name": name, "batch_size": 256, "fanouts": [15, 10]} | (
                {"I": 1, "K": 5} if name == "swift" else {})
            yield Setting(name, place.config(options, large, SAGE, clients),
                          lambda run, cross=cross: references.sampled(big, split, cross), big.data,
                          f"GraphSAGE 256, {large}, 10 METIS clients, batch 256, fan-outs 15/10; {cross} clients "
                          "sample across clients each iteration (the reference samples their neighbours in the whole "
                          "graph)")
    if "fedaas" in wanted:
        yield Setting("fedaas", place.config({"name": "fedaas", "widths": [256, 128], "fanouts": [10, 10],
                                              "batches": 10, "interval_loss": "train"}, large, {}, clients,
                                             weight_decay=0.0),
                      lambda run: references.attention(big, split), big.data,
                      f"attention 256/128 + root weight, {large}, 10 METIS clients x 10 batches, fan-outs 10/10 (the "
                      "reference: PyG GATConv, one head, plus a root Linear, two layers and a linear head)",
                      calls=max(2, rounds // 10))


def time_overhead(place: Place, setting: Setting, calls: int) -> Measure:
    """The run's seconds per round over its reference's, timed alternately; a failing protocol is a row
    saying why, and does not hide the others."""
    target = OVERHEAD_TARGETS.get(setting.name)
    try:
        run = FedglRun(setting.cfg, setting.data)
        try:
            with devices.working_on(place.device):  # the reference's model and working tensors there
                step = setting.reference(run)
            fed, ref = paired_seconds(run.step, place.finished(step), setting.calls or calls)
        finally:
            run.close()
    except Exception as err:
        return failed("overhead", setting.name, "x", target, err)
    return Measure("overhead", setting.name, fed / ref, "x", target,
                   f"{fed * 1e3:.1f} ms per round against {ref * 1e3:.1f} ms of plain PyG; {setting.what}")


def overhead(quick: bool, place: Place = CPU, dataset: str = "cora", large: str = "pubmed",
             protocols: tuple[str, ...] | None = None) -> list[Measure]:
    """Seconds per federated round over the plain PyG loop doing the same gradient work. The runs read
    the datasets on the CPU (their parties move what they hold to the pass's device); the references are
    built and stepped on that device from copies there, with partitions made on the CPU."""
    wanted, rounds = protocols or OVERHEAD_PROTOCOLS, 5 if quick else 30
    settings = [*small_settings(place, dataset, wanted), *large_settings(place, large, wanted, rounds)]
    return [time_overhead(place, setting, rounds) for setting in settings]


# ---- peers ----------------------------------------------------------------------------------------------
def peers(quick: bool, place: Place = CPU) -> list[Measure]:
    """The peer setting: examples/fedavg-cora.yaml (FedAvg, Cora, 10 METIS clients, 100 rounds,
    3 local epochs, GCN 64, Adam 0.01, evaluation every round): the whole ``fedgl run`` process in-process
    and on Ray, and OpenFGL's FedAvg in the same setting (benchmarks/peers_openfgl.py) when its source is
    found; 1-round runs on both backends split Ray's gap into what it costs once and what it costs a round.
    Each repeat runs the processes one after another (three repeats, one with ``--quick``), after
    one untimed OpenFGL run that writes its client files; medians are reported, and each ratio is of
    medians over the same repeats. The targets are the 2-core CPU machine's; a GPU pass reports the same
    measures without them (its processes also start CUDA) and leaves OpenFGL out."""
    import peers_openfgl as openfgl

    seconds, mib, ms, ray_ratio, peer_ratio = (None,) * 5 if place.gpu else ("<= 4", "<= 500", "<= 10", "<= 1.6",
                                                                             "<= 0.25")
    names = {"local": "fedavg cora: whole `fedgl run` process", "ray": "fedavg cora: whole run on Ray / in-process",
             "openfgl": "fedavg cora: whole `fedgl run` process / OpenFGL's"}
    source = None if place.gpu else openfgl.openfgl_path()
    repeats = 1 if quick else 3
    note = f"median of {repeats} runs"
    with tempfile.TemporaryDirectory() as tmp:
        argv = {f"{side}{tag}": openfgl.fedgl_command(Path(tmp) / f"{side}{tag}", rounds, "--set",
                                                      f"device={place.name}", "--backend", side)
                for side in ("local", "ray") for tag, rounds in (("", 100), ("-1", 1))}
        runs: dict[str, list] = {side: [] for side in argv} | ({"openfgl": []} if source else {})
        per_round = []
        try:
            if source:
                argv["openfgl"] = openfgl.openfgl_command(source, openfgl.openfgl_root(Path(tmp) / "openfgl"))
                timed_process(argv["openfgl"])  # writes its client files, which later runs read
            for _ in range(repeats):
                for side, times in runs.items():
                    times.append(timed_process(argv[side]))
                per_round.append(json.loads((Path(tmp) / "local" / "summary.json").read_text())["wall_ms_per_round"])
        except Exception as err:  # every row says why it is missing
            return [failed("peers", names[side], unit, target, err) for side, unit, target in
                    (("local", "s", seconds), ("ray", "x", ray_ratio), ("openfgl", "x", peer_ratio)) if side in runs]
    wall = {side: statistics.median(run[0] for run in times) for side, times in runs.items()}
    out = [Measure("peers", names["local"], wall["local"], "s", seconds, f"{note}. {PEERS}"),
           Measure("peers", "fedavg cora: peak memory of that process", max(run[1] for run in runs["local"]), "MiB",
                   mib, f"largest of {repeats} runs"),
           Measure("peers", "fedavg cora: ms per round in-process (train + evaluation)", statistics.median(per_round),
                   "ms", ms, f"{note}, read from their summaries"),
           Measure("peers", "fedavg cora: whole run on Ray (`--backend ray`)", wall["ray"], "s", None, note),
           Measure("peers", names["ray"], wall["ray"] / wall["local"], "x", ray_ratio,
                   f"{wall['ray']:.1f} s against {wall['local']:.1f} s, {note} each, one after the other"),
           Measure("peers", "fedavg cora: Ray's fixed cost over in-process (whole 1-round runs)",
                   wall["ray-1"] - wall["local-1"], "s", None,
                   f"{wall['ray-1']:.1f} s against {wall['local-1']:.1f} s, {note} each: starting Ray, its hosts "
                   f"(Python processes importing torch) and stopping it, which no number of rounds pays back"),
           Measure("peers", "fedavg cora: one round on Ray over one in-process",
                   1000 * ((wall["ray"] - wall["ray-1"]) - (wall["local"] - wall["local-1"])) / 99, "ms", None,
                   f"the 100-round runs less the 1-round runs, over 99 rounds: {1000 * (wall['ray'] - wall['ray-1']) / 99:.1f} "
                   f"ms against {1000 * (wall['local'] - wall['local-1']) / 99:.1f} ms a round")]
    if source:
        out += [Measure("peers", "fedavg cora: OpenFGL's FedAvg, whole process", wall["openfgl"], "s", None,
                        f"{note}; {OPENFGL_NOTE}"),
                Measure("peers", names["openfgl"], wall["local"] / wall["openfgl"], "x", peer_ratio,
                        f"{wall['local']:.1f} s against {wall['openfgl']:.1f} s, {note} each, one after the other")]
    elif not place.gpu:
        out.append(Measure("peers", names["openfgl"], None, "x", None, openfgl.skip_line()))
    return out


OPENFGL_NOTE = ("OpenFGL from its source (benchmarks/peers_openfgl.py): 10 METIS clients, 100 rounds x 3 local "
                "epochs, GCN 64, Adam 0.01, weight decay 5e-4, every client evaluated every round, one torch thread; "
                "the modules it imports for Louvain and clustering accuracy (sknetwork, munkres; not installed here) "
                "get placeholders")


# ---- scale --------------------------------------------------------------------------------------------
def scale(quick: bool, place: Place = CPU) -> list[Measure]:
    """Large populations: each setting's seconds per round (after one warm-up round)."""
    out: list[Measure] = []
    per_round = round_timer("scale", out, 1 if quick else 3)

    gat = {"name": "gat", "hidden": 64, "layers": 2, "options": {"heads": 8}}
    gcn = {"name": "gcn", "hidden": 64, "layers": 2}
    per_round("nfedgnn GCN: one round of all 19,717 PubMed users",
              place.config({"name": "nfedgnn", "lam": 1.0}, "pubmed", {**gcn, "hidden": 16}), None,
              "GCN 16 (examples/nfedgnn-cora.yaml)")
    per_round("nfedgnn GAT: one round of all 19,717 PubMed users", place.config({"name": "nfedgnn", "lam": 1.0}, "pubmed", gat),
              "<= 0.5", "GAT 8 heads x 8")
    clients = 100 if quick else 1000
    per_round(f"fedavg: one round of {clients:,} horizontal clients on PubMed",
              place.config({"name": "fedavg", "local_epochs": 1}, "pubmed", gcn, {"num_clients": clients,
                                                                             "method": "random"}),
              None, "GCN 64, random partition, 1 local epoch")
    return out + gpu_peak(place, "scale", "after the scale settings: peak GPU memory of the process")


def synthetic(quick: bool, place: Place = CPU) -> list[Measure]:
    """The 1.5M-node graph over 195 clients, in a process of its own (its peak memory is the setting's)."""
    out: list[Measure] = []
    per_round = round_timer("synthetic", out, 1 if quick else 3)

    gcn = {"name": "gcn", "hidden": 64, "layers": 2}
    nodes, parts = (150_000, 20) if quick else (1_500_000, 195)
    options = {"num_nodes": nodes, "num_features": 128, "num_classes": 10, "avg_degree": 10}
    try:
        start = time.perf_counter()
        graph = load("synthetic", **options)
        built = time.perf_counter() - start
    except Exception as err:
        out.append(failed("synthetic", "synthetic graph", "s", None, err))
        return out
    note = f"{nodes:,} nodes, 128 features, {parts} random clients, GCN 64, 1 local epoch; graph built in {built:.0f} s"
    target = "<= 10" if not quick else None
    per_round(f"fedavg: one round, {nodes:,}-node synthetic graph, {parts} clients",
              place.config({"name": "fedavg", "local_epochs": 1}, "synthetic", gcn,
                     {"num_clients": parts, "method": "random"}, options), target, note, data=graph)
    out.append(Measure("synthetic", "fedavg on the synthetic graph: peak memory of the process", peak_mib(), "MiB",
                       None if quick else "<= 16384"))
    out += gpu_peak(place, "synthetic", "fedavg on the synthetic graph: peak GPU memory of the process")
    if not quick:
        per_round(f"swift: one iteration, {nodes:,}-node synthetic graph, {parts} clients",
                  place.config({"name": "swift", "batch_size": 256, "fanouts": [15, 10], "I": 10, "K": 5}, "synthetic",
                         {"name": "sage", "hidden": 256, "layers": 2}, {"num_clients": parts, "method": "random"},
                         options), None, "GraphSAGE 256, batch 256, fan-outs 15/10, I = 10, K = 5", data=graph)
        out.append(Measure("synthetic", "after swift: peak memory of the process", peak_mib(), "MiB"))
        out += gpu_peak(place, "synthetic", "after swift: peak GPU memory of the process")
    return out


def glasu_cs(quick: bool, place: Place = CPU) -> list[Measure]:
    """GLASU on Coauthor CS with 3 clients (all training nodes, full neighbourhoods, K = L = 2, Q = 1)
    per round over one epoch of the same model trained centrally: GLASU with one client holding every
    feature and edge (the paper's Cent., exactly centralized training of the split model: L GCN layers
    and a classifier head), in one process."""
    gcn = {"name": "gcn", "hidden": 64, "layers": 2}
    options = {"name": "glasu", "K": 2, "Q": 1, "S": 10**9, "batches": 1, "sampling": "full"}
    rounds = 3 if quick else 10
    name = "glasu round / centralized epoch of the same model, Coauthor CS, 3 clients"
    try:
        glasu = FedglRun(place.config(options, "cs", gcn, {"num_clients": 3, "method": "random", "edge_keep": 1.0}))
        central = FedglRun(place.config(options, "cs", gcn, {"num_clients": 1, "method": "random", "edge_keep": 1.0}))
        try:
            federated, epoch = paired_seconds(glasu.step, central.step, rounds)
        finally:
            glasu.close()
            central.close()
    except Exception as err:
        return [failed("glasu-cs", name, "x", "<= 3", err)]
    return [Measure("glasu-cs", name, federated / epoch, "x", "<= 3",
                    f"{federated * 1e3:.0f} ms per GLASU round against {epoch * 1e3:.0f} ms per epoch of GLASU with "
                    "one client (2 GCN layers of 64 and a classifier head); every client a full-graph pass over "
                    "its feature block")]


def fedgnn_g_physics(quick: bool, place: Place = CPU) -> list[Measure]:
    """FedGNN-G at batch 256 with 20 random clients on Coauthor Physics: seconds per iteration, the
    process's peak memory and (on the CPU) what the paper's dense feature sums alone cost. On the CPU the
    child's address space is capped (``MEMORY_CAP_GIB``) so a run that would exhaust the machine fails
    with MemoryError instead; CUDA reserves far more address space than it uses, so a GPU pass runs
    uncapped."""
    import resource

    if quick:
        return []
    capped = not place.gpu
    if capped:
        cap = MEMORY_CAP_GIB * 1024**3
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    name = "fedgnn-g: one iteration, Coauthor Physics, 20 random clients, batch 256"
    try:
        data = load("physics")
        run = FedglRun(place.config({"name": "fedgnn-g", "batch_size": 256, "fanouts": [15, 10]}, "physics",
                                    {"name": "sage", "hidden": 256, "layers": 2},
                                    {"num_clients": 20, "method": "random"}), data)
        try:
            out = [Measure("fedgnn-g-physics", name, seconds_per_call(run.step, 3), "s", "<= 5" if capped else None,
                           "GraphSAGE 256, fan-outs 15/10, every client crosses every iteration")]
            sums = round_bytes(run, "embedding")
        finally:
            run.close()
    except Exception as err:
        return [failed("fedgnn-g-physics", name, "s", None, err)]
    out.append(Measure("fedgnn-g-physics", "fedgnn-g on Coauthor Physics: peak memory of the process", peak_mib(),
                       "MiB", "<= 8192", f"address space capped at {MEMORY_CAP_GIB} GiB" if capped else ""))
    del run  # before the floor, whose storage the peak above leaves out
    if capped:
        out.append(Measure("fedgnn-g-physics", "fedgnn-g: writing one iteration's dense feature sums, adding them "
                           "per target and multiplying them by the first layer", statistics.median(
                               references.dense_sums_floor(*sums, data.num_features, 256) for _ in range(3)), "s", None,
                           f"what an iteration cannot go below while owners send sums of {data.num_features:,}-value "
                           f"feature rows: the last iteration's {sums[0] / 2**30:.2f} GiB of sums up and "
                           f"{sums[1] / 2**30:.2f} GiB down (ledger, kind embedding, both layers), as "
                           f"{data.num_features:,}-value rows, written once, added per target once and multiplied by "
                           "a 256-wide first layer forward and for its weight's gradient, in plain torch; timed after "
                           "the iterations, the median of 3"))
    return out + gpu_peak(place, "fedgnn-g-physics", "fedgnn-g on Coauthor Physics: peak GPU memory of the process")


MEMORY_CAP_GIB = 12


# ---- CNFGNN and FedAAS on Coauthor CS ------------------------------------------------------------------
def round_bytes(run: FedglRun, kind: str | None = None) -> tuple[int, int]:
    """Bytes of the run's last round up to the server and down from it (of one ``kind``; None: all but eval)."""
    rows = [r for r in run.job.transport.ledger.rows() if r["round"] == run.round
            and (r["kind"] == kind if kind else r["kind"] != "eval")]
    return tuple(sum(r["bytes"] for r in rows if r["direction"] == way) for way in ("up", "down"))


def beside_reference(group: str, place: Place, cfg: dict, data, reference: Callable[[], Callable[[], None]],
                     calls: int, what: str, target: str | None = None) -> list[Measure]:
    """A run's seconds per round, and over the plain PyG step doing its gradient work (timed alternately),
    with the bytes of its last round each way."""
    name = f"{cfg['protocol']['name']}: one round, Coauthor CS"
    try:
        run = FedglRun(cfg, data)
        try:
            with devices.working_on(place.device):
                step = reference()
            fed, ref = paired_seconds(run.step, place.finished(step), calls)
            up, down = round_bytes(run)
        finally:
            run.close()
    except Exception as err:
        return [failed(group, name, "s", None, err)]
    note = (f"{fed:.2f} s per round against {ref * 1e3:.0f} ms of plain PyG; {up / 2**30:.2f} GiB up and "
            f"{down / 2**30:.2f} GiB down per round (ledger); {what}")
    return [Measure(group, name, fed, "s", None, note),
            Measure(group, f"{name}, over plain PyG", fed / ref, "x", target, note)]


def cnfgnn_cs(quick: bool, place: Place = CPU) -> list[Measure]:
    """CNFGNN (the nFedGNN bench's GCN 16, Adam) on Coauthor CS, every node a user: every round each user
    uploads its whole first-layer weight and adopts the broadcast average, beside one full-graph step of
    the same GCN in plain PyG; and over the same round on the code before (``perf_before``)."""
    cfg, data, rounds = settings.cnfgnn_cs(place, quick)
    g = references.Graph.on(data, place.device)
    out = over_before("cnfgnn-cs", paired_rounds("cnfgnn-cs", quick, place), beside_reference(
        "cnfgnn-cs", place, cfg, data,
        lambda: references.laplacian_gcn_step(g.x, g.dev.edge_index, g.dev.y, g.dev.train_mask, 16, g.classes, 0.0),
        rounds, "GCN 16, every node a user; the reference: the same GCN, one full-graph step"), "<= 0.4")
    floor = references.upload_floor(data.num_nodes, data.num_features, 16)
    return out + [Measure(
        "cnfgnn-cs", "cnfgnn: writing one round's uploads once and summing them once", floor, "s", None,
        "what a round cannot go below while every user sends its whole weight: each 1 GiB message written from one "
        "shared matrix and summed over its users by torch, in storage made once; timed after the rounds")]


def fedaas_cs(quick: bool, place: Place = CPU) -> list[Measure]:
    """FedAAS as examples/fedaas-cs.yaml runs it (50 stratified clients holding training nodes, 99% of
    in-client edges dropped, attention 256/128 with root weights, 10 batches, fan-outs 10/10), beside
    the same model's mini-batch steps in plain PyG over the same clients' training nodes (neighbours
    sampled in the whole graph, features as sparse rows: dense, the reference's step takes three times as
    long); and over the same round on the code before (``perf_before``)."""
    from fedgl.config import build_config
    from fedgl.partition import horizontal_from_config

    cfg, data, rounds = settings.fedaas_cs(place, quick)
    built = build_config(cfg)
    g = references.Graph.on(data, place.device)

    def reference() -> Callable[[], None]:
        owner = horizontal_from_config(data, built.partition, built.seed).owner  # the run's own clients
        return references.attention(g, references.HorizontalSplit.of_owner(g, owner), cfg["protocol"]["batches"],
                                    sparse=True)
    out = over_before("fedaas-cs", paired_rounds("fedaas-cs", quick, place), beside_reference(
        "fedaas-cs", place, cfg, data, reference, rounds,
        "attention 256/128 + root weight, 50 clients x 10 batches, fan-outs 10/10", "<= 1"), "<= 0.6")
    steps = built.partition.num_clients * cfg["protocol"]["batches"]
    return out + [Measure("fedaas-cs", "fedaas: the Adam steps of one round alone", adam_steps(
        data.num_features, cfg["protocol"]["widths"], int(data.y.max()) + 1, steps), "s", None,
        f"{steps} steps of torch's fused Adam over the model's parameters (98% of them the first layer's two "
        "weights, every entry updated each step), the kernel each client's step runs (from its second step on "
        "called directly, optim.optimizer_step); timed through Adam.step after the rounds")]


def adam_steps(features: int, widths: list[int], classes: int, steps: int) -> float:
    """Seconds of ``steps`` fused Adam steps over FedAAS's model (attention, root weights)."""
    from fedgl.models.split_attention import SplitAttentionNet

    params = list(SplitAttentionNet(features, widths, classes, "attention", True).parameters())
    for p in params:
        p.grad = torch.rand_like(p)
    optimizer = torch.optim.Adam(params, lr=1e-3, fused=True)
    optimizer.step()  # its moments made
    return seconds_per_call(optimizer.step, steps, warmup=0) * steps


# ---- start-up -----------------------------------------------------------------------------------------
HEAVY = {"matplotlib", "ray", "sklearn", "rich", "torch", "torch_geometric", "pandas", "networkx", "scipy"}


def startup(quick: bool, place: Place = CPU) -> list[Measure]:
    rows = []
    for module in ("fedgl.cli", "fedgl.runner"):
        seconds, loaded = import_seconds(module)
        heavy = sorted({m.split(".")[0] for m in loaded} & HEAVY)
        dynamo = "loads torch._dynamo" if "torch._dynamo" in loaded else "without torch._dynamo"
        rows.append(Measure("startup", f"`import {module}` (-X importtime, cumulative)", seconds, "s", None,
                            "heavy packages loaded: " + (", ".join(heavy) or "none") + f"; {dynamo}"))
    wall, _, _ = timed_process([*fedgl_command(), "--version"])
    pyg_seconds, pyg_loaded = import_seconds("torch_geometric")
    return [
        *rows,
        Measure("startup", "`fedgl --version`, whole process", wall, "s"),
        Measure("startup", "`import torch_geometric` without fedgl (-X importtime, cumulative)", pyg_seconds, "s",
                None, "loads torch._dynamo" if "torch._dynamo" in pyg_loaded else "without torch._dynamo"),
    ]


def bench_jobs(quick: bool, place: Place = CPU) -> list[Measure]:
    """``fedgl bench --jobs 2`` against one run after another, both from the task's ``cost.json``."""
    if place.name != "cpu":
        return []
    from rich.console import Console

    from fedgl.bench.core import COST, BenchTask, Variant, run_task

    nodes, rounds = (2000, 10) if quick else (5000, 300)  # long beside a worker's start, as a table's runs are
    task = BenchTask("perf-jobs", "two backbones on a synthetic graph", seeds=3, columns=["test_accuracy"],
                     base={"dataset": {"name": "synthetic", "options": {"num_nodes": nodes}},
                           "train": {"rounds": rounds}},
                     variants=[Variant("gcn"), Variant("sage", {"model.name": "sage"})])
    walls, tables = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for jobs in (1, 2):
            out = Path(tmp) / f"jobs{jobs}"
            run_task(task, out, jobs=jobs, console=Console(quiet=True))
            walls[jobs] = json.loads((out / COST).read_text())["wall_s"]
            tables[jobs] = (out / "table.json").read_text()
    same = "the same tables" if tables[1] == tables[2] else "tables that differ"
    return [Measure("bench-jobs", "bench task of 2 variants x 3 seeds: wall with --jobs 2 / one after another",
                    walls[2] / walls[1], "x", None if quick or (os.cpu_count() or 1) < 2 else "<= 0.6",
                    f"{walls[1]:.1f} s against {walls[2]:.1f} s, {same}; FedAvg, {rounds} rounds on a {nodes:,}-node "
                    f"synthetic graph")]


GROUPS: dict[str, Callable[[bool, Place], list[Measure]]] = {"startup": startup, "overhead": overhead, "peers": peers,
                                                      "scale": scale, "synthetic": synthetic, "glasu-cs": glasu_cs,
                                                      "fedgnn-g-physics": fedgnn_g_physics, "cnfgnn-cs": cnfgnn_cs,
                                                      "fedaas-cs": fedaas_cs, "bench-jobs": bench_jobs}


# ---- the suite ----------------------------------------------------------------------------------------
def run_group(name: str, quick: bool, place: Place) -> list[dict]:
    """One group in a fresh interpreter; its measures as rows."""
    argv = [sys.executable, __file__, "--child", name, "--device", place.name] + (["--quick"] if quick else [])
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        err = RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
        return [failed(name, f"the {name} group", "", None, err).row()]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, Place]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short pass: fewer rounds, the big settings shrunk")
    parser.add_argument("--only", action="append", choices=sorted(GROUPS), help="run only this group (repeatable)")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="folder for perf.json and perf.md (a GPU pass: perf-cuda.json and perf-cuda.md)")
    parser.add_argument("--device", default="cpu",
                        help="cpu (default), cuda or cuda:N: where runs and references compute; a GPU pass writes "
                             "perf-cuda.json and perf-cuda.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", args.device):
        parser.error(f"--device {args.device}: expected cpu, cuda or cuda:N")
    try:
        return args, Place.of(args.device)
    except ConfigError as err:
        parser.error(str(err))


def child(group: str, quick: bool, place: Place) -> None:
    """Run one group here and print its rows as one JSON line (for ``run_group``)."""
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
    torch.set_num_threads(1)  # as fedgl runs by default (threads: 1)
    load_average, date = round(os.getloadavg()[0], 2), time.strftime("%Y-%m-%d %H:%M")
    print(json.dumps([m.row() | {"load_average": load_average, "measured": date} for m in GROUPS[group](quick, place)]))


def earlier_rows(previous: Path, result: dict, only: list[str]) -> list[dict]:
    """With ``--only``, the other groups' last measures, with their dates (none from another GPU)."""
    earlier = json.loads(previous.read_text()) if only and previous.exists() else None
    if earlier is not None and earlier["machine"].get("gpu") != result["machine"].get("gpu"):
        print(f"{previous} was measured on another GPU ({earlier['machine'].get('gpu')}); its rows are dropped")
        earlier = None
    if earlier is None:
        return []
    return [{"measured": earlier["machine"]["date"], **row} for row in earlier["measures"] if row["group"] not in only]


def main(argv: list[str] | None = None) -> None:
    args, place = parse(argv)
    if args.child:
        return child(args.child, args.quick, place)
    result = {"machine": machine(place), "quick": args.quick, "peers_cited": PEERS, "measures": []}
    if args.only:
        result["groups_run"] = args.only
    result["measures"] = earlier_rows(args.out / f"{stem(place.name)}.json", result, args.only)
    for name in args.only or GROUPS:
        started = time.perf_counter()
        rows = run_group(name, args.quick, place)
        result["measures"] += rows
        print(f"{name}: {len(rows)} measures in {time.perf_counter() - started:.0f} s", flush=True)
        for row in rows:
            print(f"  {row['name']}: {fmt(row['value'])} {row['unit']} {row['target'] or ''} {verdict(row)}",
                  flush=True)
    order = list(GROUPS)
    result["measures"].sort(key=lambda row: order.index(row["group"]) if row["group"] in order else len(order))
    json_path, md_path = write(result, args.out)
    print(f"written to {json_path} and {md_path}")


if __name__ == "__main__":
    main()
