"""FedAAS's baselines (spec §5): presets that change only option defaults of the same code."""

from __future__ import annotations

from typing import Literal

from .options import FedAASOptions
from .server import FedAAS


class FedCrossOptions(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "uniform"
    interval: int | Literal["adaptive", "never"] = 1
    local_fanouts: list[int] | None = [5, 5]
    cross_fanouts: list[int] | None = [5, 5]


class FedPNSOptions(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "uniform"
    interval: int | Literal["adaptive", "never"] = 2
    between_sync: Literal["history", "drop"] = "drop"


class FedLocalOptions(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "uniform"
    interval: int | Literal["adaptive", "never"] = "never"


class FedAllOptions(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "all"
    interval: int | Literal["adaptive", "never"] = 1


class FedAAS1Options(FedAASOptions):
    interval: int | Literal["adaptive", "never"] = 1


class FedAAS2Options(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "all"


class GraphFedReconOptions(FedCrossOptions):
    personalize: Literal["none", "similarity"] = "similarity"


class FedGraphReconOptions(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "uniform"
    interval: int | Literal["adaptive", "never"] = 1
    fanout_policy: Literal["fixed", "learned"] = "learned"


class FedCross(FedAAS):
    """Uniform 5 local + 5 cross-client picks per layer, synchronised at every step."""
    name, Options = "fedcross", FedCrossOptions


class FedPNS(FedAAS):
    """The FedAAS paper's FedPNS: uniform picks, cross-client every 2 steps, local-only in between
    (not fedgl's ``fedgnn-pns``, the Swift paper's version)."""
    name, Options = "fedaas-pns", FedPNSOptions


class FedLocal(FedAAS):
    """Federated GraphSAGE-style sampling inside each client only; cross-client neighbours ignored."""
    name, Options = "fedlocal", FedLocalOptions


class FedAll(FedAAS):
    """Every neighbour, synchronised at every step."""
    name, Options = "fedall", FedAllOptions


class FedAAS1(FedAAS):
    """Attention sampling without adaptive synchronisation (τ = 1)."""
    name, Options = "fedaas1", FedAAS1Options


class FedAAS2(FedAAS):
    """Adaptive synchronisation with every neighbour (no sampling)."""
    name, Options = "fedaas2", FedAAS2Options


class GraphFedRecon(FedAAS):
    """GraphFed, reconstructed (fedaas.txt gives no formula): FedCross's exchange with models
    personalised by similarity on a probe graph (``similarity.py``)."""
    name, Options = "graphfed-recon", GraphFedReconOptions


class FedGraphRecon(FedAAS):
    """FedGraph, reconstructed (fedaas.txt names a DRL sampling policy, nothing more): uniform picks
    synchronised at every step, each step's fan-out chosen by the client's actor-critic
    (``fanout_policy.py``)."""
    name, Options = "fedgraph-recon", FedGraphReconOptions
