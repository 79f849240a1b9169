"""The runs the ``cnfgnn-cs`` and ``fedaas-cs`` groups time, built from whichever fedgl is on the path:
``perf.py`` times them beside plain PyG, ``perf_before.py`` on this code and on the code before."""

from __future__ import annotations

from typing import Any, NamedTuple

from perf_harness import ROOT, Place, load


class Timed(NamedTuple):
    """A run's config, the data it reads and how many rounds are timed (after one warm-up)."""

    cfg: dict
    data: Any
    rounds: int


def cnfgnn_cs(place: Place, quick: bool) -> Timed:
    """CNFGNN with the nFedGNN bench's GCN 16 and Adam, every node of Coauthor CS a user."""
    cfg = place.config({"name": "cnfgnn", "lam": 0}, "cs", {"name": "gcn", "hidden": 16, "layers": 2, "dropout": 0.5},
                       lr=0.1, weight_decay=5e-4, optimizer="adam")
    return Timed(cfg, load("cs"), 1 if quick else 3)


def fedaas_cs(place: Place, quick: bool) -> Timed:
    """FedAAS as examples/fedaas-cs.yaml runs it, without evaluation or simulated compute time (the data
    with the example's split)."""
    import yaml

    from fedgl.config import build_config
    from fedgl.data import load_data

    cfg = yaml.safe_load((ROOT / "examples" / "fedaas-cs.yaml").read_text())
    cfg = cfg | {"network": {"compute": "ignore"}, "device": place.name, "eval": {"every": 10**6}}
    return Timed(cfg, load_data(build_config(cfg)), 1 if quick else 2)


SETTINGS = {"cnfgnn-cs": cnfgnn_cs, "fedaas-cs": fedaas_cs}
