"""``fedgl audit``: attack a run's recorded messages (``privacy.record_messages``) and fail on a leak.

The auditor re-reads the run's config and dataset (the ground truth no party holds), rebuilds the
partition and runs the attacks of ``privacy.attacks``, ``privacy.label_attack`` and
``privacy.noise_replay`` over every message, whatever kind it is declared as: raw rows, the
server's least-squares reconstruction of routed sums, single-row aggregates, missing
secure-aggregation masks, labels, and DP noise drawn again from the config seed (payloads whose
noise is replayed are attacked again without it). The report counts, per attack, what was attacked
and recovered; ``flagged`` names the findings that fail the audit (``FAILING``), leaving out what a
protocol sends by design (``BY_DESIGN``). ``fedgl audit`` exits with 1 when anything is flagged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from .config import RunConfig, load_config
from .errors import ConfigError
from .privacy.attacks import (AttackResult, FixedPointCheck, RawRowMatch, RoutedSums, calls, membership,
                              reconstruction, single_partials)
from .privacy.label_attack import LabelLeak
from .privacy.noise_replay import NoiseReplay, candidate_seeds
from .privacy.record import message_files, read_messages

REPORT = "audit.json"
# Protocols that send raw rows or labels by design, and why (named in the report when found).
BY_DESIGN = {"llcg": "by design: LLCG's server correction trains on the global graph (raw rows and the batch's "
                     "training labels go to the server)"}
# attack -> what fails the audit: its recovered count, or for membership the input-layer aggregates
# holding one raw row (FedAAS partials and hidden sums of one node are reported, not failed)
FAILING = {"raw_row_match": "recovered", "reconstruction": "recovered", "membership": "single_input",
           "masking": "recovered", "labels": "recovered", "noise_replay": "recovered"}


# ---- the ground truth and the whole audit ------------------------------------------------------------
@dataclass
class GroundTruth:
    """What the auditor knows and no party does: every raw row, label and split, and which global
    nodes each horizontal client holds (``nodes``: party name -> global ids, in local order)."""

    x: Tensor
    y: Tensor
    masks: dict[str, Tensor]
    private: list[Tensor]
    nodes: dict[str, Tensor]

    @property
    def num_classes(self) -> int:
        return int(self.y.max()) + 1


def ground_truth(cfg: RunConfig, data: Data) -> GroundTruth:
    """Re-build the run's partition from its config (partitions are deterministic in the seed)."""
    from .protocols import protocol_class

    x = data.x.to_dense().float() if data.x.layout != torch.strided else data.x.float()
    masks = {name: getattr(data, f"{name}_mask") for name in ("train", "val", "test")}
    scenario = protocol_class(cfg.protocol_name).scenario
    nodes: dict[str, Tensor] = {}
    private = [x]
    if scenario == "horizontal":
        from .partition import horizontal_from_config

        part = horizontal_from_config(data, cfg.partition, cfg.seed)
        nodes = {f"client{m}": shard.nodes for m, shard in enumerate(part.shards)}
    elif scenario == "vertical":
        from .partition import partition_vertical
        from .protocols.glasu.options import vertical_blocks

        p = cfg.partition
        part = partition_vertical(data, p.num_clients, blocks=vertical_blocks(p), edge_keep=p.edge_keep,
                                  seed=cfg.seed, label_holder=p.label_holder)
        private = [shard.x.to_dense().float() if shard.x.layout != torch.strided else shard.x.float()
                   for shard in part.shards]
    return GroundTruth(x, data.y, masks, private, nodes)


def audit_messages(folder: Path, truth: GroundTruth, replay: NoiseReplay | None = None) -> list[AttackResult]:
    """Run every attack over the messages recorded in ``folder`` (one pass, chunk by chunk); with
    ``replay``, payloads whose DP noise it replays are attacked again without it."""
    raw, routed, fixed = RawRowMatch(truth.private), RoutedSums(), FixedPointCheck()
    served: list[Tensor] = []
    labels = LabelLeak(truth.nodes, truth.y, truth.num_classes)
    for down, msg in calls(read_messages(folder)):
        raw.add(msg)
        fixed.add(msg)
        labels.add(down, msg)
        clean = replay.add(msg) if replay is not None else None
        if clean is not None:
            raw.add(clean)
            labels.add(down, clean)
        if down is None:
            routed.request(msg)
        elif msg.method == "propagate":
            routed.add(down, msg, truth.nodes)
        elif msg.method == "serve":
            served += single_partials(down, msg)
    noise = replay.result() if replay is not None else AttackResult("noise_replay", 0, 0, "the run adds no DP noise")
    return [raw.result(), reconstruction(routed, truth.x), membership(routed, served, truth.x), fixed.result(),
            labels.result(truth.masks), noise]


def flagged(results: list[AttackResult], protocol: str) -> list[dict[str, Any]]:
    """The findings that fail the audit (``FAILING``), apart from what ``protocol`` sends by design."""
    out = []
    for r in results:
        if r.attack in ("raw_row_match", "labels") and protocol in BY_DESIGN:
            continue
        count = (r.details.get("input_count_one", 0) + r.details.get("input_effective_single", 0)
                 if FAILING.get(r.attack) == "single_input" else r.recovered)
        if r.attack == "labels" and r.details.get("flows"):
            count = max(count, 1)  # labels reached a party even where no node is resolved
        if count and r.attack in FAILING:
            out.append({"attack": r.attack, "count": count, "notes": r.notes})
    return out


def audit_run(run_dir: Path, data_root: str | None = None) -> dict[str, Any]:
    """Audit the run in ``run_dir``; returns the report written to ``audit.json``."""
    from .data import load_data

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir} is not a run folder")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"{run_dir} holds no config.yaml; not a fedgl run folder")
    folder = run_dir / "messages"
    if not message_files(folder) and (run_dir / "search").is_dir():  # fedgl.search: each candidate recorded its own
        raise ConfigError(f"{run_dir} is a search over whole runs; audit each of them: "
                          f"{', '.join(str(p) for p in sorted((run_dir / 'search').iterdir()))}")
    if not message_files(folder):
        raise ConfigError(f"{run_dir} holds no recorded messages; run it with privacy.record_messages: true")
    cfg = load_config(run_dir / "config.yaml")
    if data_root is not None:
        cfg.dataset = cfg.dataset.model_copy(update={"data_root": data_root})
    truth = ground_truth(cfg, load_data(cfg))
    replay = (NoiseReplay(candidate_seeds(cfg.seed, cfg.partition.num_clients + 1))
              if cfg.privacy.dp is not None else None)
    results = audit_messages(folder, truth, replay)
    for r in results:
        if r.attack in ("raw_row_match", "labels") and r.recovered and cfg.protocol_name in BY_DESIGN:
            r.notes += f"; {BY_DESIGN[cfg.protocol_name]}"
    report = {"run": str(run_dir), "protocol": cfg.protocol_name, "dataset": cfg.dataset.name,
              "privacy": cfg.privacy.model_dump(mode="json"),
              "attacks": {r.attack: r.as_dict() for r in results},
              "flagged": flagged(results, cfg.protocol_name)}
    (run_dir / REPORT).write_text(json.dumps(report, indent=1) + "\n")
    return report


def audit_command(run_dir: Path, console, *, as_json: bool, data_root: str | None) -> int:
    """``fedgl audit RUN_DIR``: the report as a table (or one JSON line); exit code 1 when a finding
    fails the audit, else 0."""
    report = audit_run(run_dir, data_root)
    failed = 1 if report["flagged"] else 0
    if as_json:
        console.print_json(json.dumps(report), indent=None)
        return failed
    from rich.table import Table

    table = Table(title=f"audit of {report['protocol']} on {report['dataset']} ({run_dir})")
    for column in ("attack", "attacked", "recovered", "fraction", "notes"):
        table.add_column(column, justify="right" if column in ("attacked", "recovered", "fraction") else "left")
    for name, r in report["attacks"].items():
        fraction = "-" if r["fraction"] is None else f"{r['fraction']:.4f}"
        table.add_row(name, str(r["attacked"]), str(r["recovered"]), fraction, r["notes"])
    console.print(table)
    console.print(f"written {Path(run_dir) / REPORT}")
    if failed:
        console.print("audit failed: " + "; ".join(f"{f['attack']} ({f['count']})" for f in report["flagged"]))
    return failed
