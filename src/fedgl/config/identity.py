"""A run's identity: its config as flat keys and the hash of what it computes.

The hash marks a finished run (bench reuses only runs with the same one), a checkpoint (a resume
needs the same one) and a shard folder (a deployed run needs the config it was written with). Keys
that change how long a run goes, where it runs and what it records are left out of it.
"""

from __future__ import annotations

import hashlib
import json
from itertools import combinations
from typing import Any

from . import RunConfig

# Keys a resumed run may change: how long it runs, where, and what it records, not what it computes.
# ``device`` is left out of a run's identity too (a shard folder runs on any device), but a checkpoint
# resumes only on the device it was made on (``Run.resume``).
RESUMABLE_CHANGES = ("train.rounds", "checkpoint_every", "threads", "device", "backend.name", "backend.address",
                     "backend.actors", "backend.shards", "backend.parties", "backend.ray_auth", "logging",
                     "privacy.record_messages", "protocol.memory_budget_mb")

# Keys added after hashes were first written, each with the value runs made before it behaved as: a
# config holding that value hashes as it did before the key existed, so older checkpoints and shard
# folders still load, and only where they computed the same thing. (DP noise was drawn from the seed;
# nFedGNN's penalty was Eq. 6 as written and its users stepped at train.lr; a target was on validation
# accuracy; edge drops decided node pairs. Secure aggregation had no collusion setting, and how clients get
# their identity table changes the set-up messages only, never what a run computes. GLASU scored with full
# neighbourhoods and trained every client; nFedGNN's server stepped at a constant lr and its users kept rows.)
ADDED_KEYS = {"privacy.dp.replayable_noise": True, "protocol.regulariser": "raw", "protocol.user_lr": None,
              "eval.target_test_accuracy": None, "partition.drop_unit": "pair",
              "privacy.secure_aggregation.collusion": 0, "privacy.secure_aggregation.identities": "relayed",
              "privacy.secure_aggregation.roster": None, "protocol.inference": "full", "protocol.train_clients": "all",
              "protocol.lr_schedule": "constant", "protocol.user_state": "rows", "protocol.lam_grid": [0.3, 1.0, 3.0]}


# Values a resolved key used to carry for the same computation: GLASU's feature blocks were contiguous
# while its config still said the horizontal default, METIS, until the config named them (9951ae2).
FORMER_VALUES = {("glasu", "partition.method", "contiguous"): "metis"}


def flat_config(cfg: RunConfig) -> dict[str, Any]:
    """The resolved config as {dotted key: value}."""
    def walk(node: Any, prefix: str) -> dict[str, Any]:
        if isinstance(node, dict):
            return {k: v for key, child in node.items() for k, v in walk(child, f"{prefix}{key}.").items()}
        return {prefix[:-1]: node}
    return walk(cfg.model_dump(mode="json"), "")


def resumable_change(key: str) -> bool:
    return any(key == k or key.startswith(f"{k}.") for k in RESUMABLE_CHANGES)


def _hash(flat: dict[str, Any], hashed: frozenset[str] = frozenset()) -> str:
    """The hash of ``flat``, its ``ADDED_KEYS`` at their earlier value left out but those in ``hashed``."""
    kept = {k: v for k, v in flat.items()
            if not resumable_change(k) and (k in hashed or not (k in ADDED_KEYS and ADDED_KEYS[k] == v))}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def config_hash(cfg: RunConfig) -> str:
    """What the run computes, as a short hash (keys a resume may change are left out)."""
    return _hash(flat_config(cfg))


def hash_without(cfg: RunConfig, keys: set[str]) -> str:
    """The hash ``cfg`` had before its keys ``keys`` existed (a run made then holds it)."""
    return _hash({k: v for k, v in flat_config(cfg).items() if k not in keys})


def config_hashes(cfg: RunConfig) -> set[str]:
    """The hash of ``cfg`` and the ones the same computation had before ``FORMER_VALUES`` changed how its
    config reads, and while keys now in ``ADDED_KEYS`` (at their earlier value here) were still hashed, as
    they were between their arrival and their entry there: what a checkpoint, a shard folder or a bench
    result written then may hold."""
    flat = flat_config(cfg)
    former = {key: old for (protocol, key, value), old in FORMER_VALUES.items()
              if cfg.protocol_name == protocol and flat.get(key) == value}
    added = [k for k in ADDED_KEYS if k in flat and flat[k] == ADDED_KEYS[k]]
    kept = [frozenset(c) for n in range(len(added) + 1) for c in combinations(added, n)]
    return {_hash(f, keys) for f in (flat, flat | former) for keys in kept}
