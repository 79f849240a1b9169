"""Tiny run settings for every protocol with parties: a 150-node synthetic graph, three clients and a
deterministic clock, so one run takes about a second and two runs of one config are comparable bit
for bit."""

from __future__ import annotations

TINY = {"dataset": {"options": {"num_nodes": 150}}, "partition": {"num_clients": 3}, "train": {"rounds": 3},
        "network": {"compute": "ignore"}}

# Every protocol with parties, with options that exercise its exchanges in three rounds (dropout is on
# by default, so every party's random draws count).
PROTOCOLS = {
    "fedavg": {"protocol": {"name": "fedavg", "group_size": 1, "client_fraction": 0.7}},
    "glasu": {"protocol": {"name": "glasu", "batches": 4, "K": 1, "Q": 2, "S": 8}, "partition": {"label_holder": 0}},
    "swift": {"protocol": {"name": "swift", "K": 2, "I": 2}, "model": {"name": "sage"}},
    "fedgnn-g": {"protocol": {"name": "fedgnn-g"}, "model": {"name": "sage"}},
    "fedgnn-pns": {"protocol": {"name": "fedgnn-pns"}},
    "llcg": {"protocol": {"name": "llcg", "local_steps": 1}, "model": {"name": "sage"}},
    "fedaas": {"protocol": {"name": "fedaas", "interval_loss": "train", "batches": 4, "interval": 2}},
    "nfedgnn": {"protocol": {"name": "nfedgnn", "lam": 1.0}},
    "cnfgnn": {"protocol": {"name": "cnfgnn"}},
}
# Variants whose parties keep other state or exchange other messages.
VARIANTS = {
    "fedavg-group": {"protocol": {"name": "fedavg", "client_fraction": 0.7}},  # clients batched in one party
    "glasu-exact": {"protocol": {"name": "glasu", "batches": 2, "K": 2, "Q": 1, "backward": "exact"}},
    "swift-backprop": {"protocol": {"name": "swift", "K": 2, "I": 1, "remote_backprop": True},
                       "model": {"name": "sage"}},
    # keys are agreed once every party holds its shard (Protocol.start)
    "fedavg-secure": {"protocol": {"name": "fedavg", "group_size": 1}, "privacy": {"secure_aggregation": True}},
    # lam: auto, a search over whole runs (fedgl.search): every way of running it gives the same search
    "nfedgnn-auto": {"protocol": {"name": "nfedgnn", "lam_grid": [0.0, 3.0]}},
}


def merge(base: dict, extra: dict) -> dict:
    """``base`` with ``extra`` laid over it, section by section."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


SERVER_ONLY = {"centralized": {"protocol": {"name": "centralized"}}}  # the reference: no party, no message


def tiny(name: str, **sections) -> dict:
    """The tiny settings of protocol (or variant) ``name``, with ``sections`` laid over them."""
    return merge(merge(TINY, {**PROTOCOLS, **VARIANTS, **SERVER_ONLY}[name]), sections)


def fedaas(protocol: dict, rounds: int = 2, clients: int = 3, nodes: int = 150) -> dict:
    """FedAAS on a small synthetic graph, its presets and options given by ``protocol``."""
    return {
        "dataset": {"name": "synthetic", "options": {"num_nodes": nodes, "num_features": 16, "avg_degree": 6}},
        "partition": {"num_clients": clients, "method": "random"},
        "protocol": {"name": "fedaas", "widths": [16, 8], "fanouts": [4, 4], "interval_loss": "train", "batches": 4,
                     **protocol},
        "train": {"rounds": rounds, "lr": 0.01, "weight_decay": 0.0},
        "network": {"compute": "ignore"},
        "threads": 1,
    }
