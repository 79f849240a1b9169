"""The protocols a run may name, and where each one's class lives (loaded on first use).

A config's ``protocol`` section is validated by the named protocol's own ``Options`` model, and its
unset ``train`` values come from the protocol's ``paper_training``. The classes sit in the layer above
the config, so this table names them by module path and imports one only when a config names it: a
run loads only its own protocol, importing ``fedgl.config`` needs nothing imported before it, and the
protocols import nothing but the config's section models from here. Adding a protocol adds its line.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ..errors import ConfigError

REGISTRY: dict[str, str] = {
    "centralized": "fedgl.protocols.centralized:Centralized",
    "fedavg": "fedgl.protocols.fedavg.server:FedAvg",
    "glasu": "fedgl.protocols.glasu.server:Glasu",
    "nfedgnn": "fedgl.protocols.node_level.nfedgnn:NFedGNN",
    "cnfgnn": "fedgl.protocols.node_level.cnfgnn:CNFGNN",
    "swift": "fedgl.protocols.horizontal.swift:SwiftFedGNN",
    "fedgnn-g": "fedgl.protocols.horizontal.swift:FedGNNG",
    "llcg": "fedgl.protocols.horizontal.llcg:LLCG",
    "fedgnn-pns": "fedgl.protocols.horizontal.fedgnn_pns:FedGNNPNS",
    "fedaas": "fedgl.protocols.fedaas.server:FedAAS",
    "fedcross": "fedgl.protocols.fedaas.presets:FedCross",
    "fedaas-pns": "fedgl.protocols.fedaas.presets:FedPNS",
    "fedlocal": "fedgl.protocols.fedaas.presets:FedLocal",
    "fedall": "fedgl.protocols.fedaas.presets:FedAll",
    "fedaas1": "fedgl.protocols.fedaas.presets:FedAAS1",
    "fedaas2": "fedgl.protocols.fedaas.presets:FedAAS2",
    "graphfed-recon": "fedgl.protocols.fedaas.presets:GraphFedRecon",
    "fedgraph-recon": "fedgl.protocols.fedaas.presets:FedGraphRecon",
}


def protocol_class(name: str) -> type:
    """The protocol class registered under ``name`` (case-insensitive); one line naming the known ones
    for any other name."""
    key = str(name).lower()
    if key not in REGISTRY:
        raise ConfigError(f"unknown protocol {name!r}; allowed: {', '.join(sorted(REGISTRY))}")
    module, _, attr = REGISTRY[key].partition(":")
    return getattr(import_module(module), attr)


def paper_training(protocol: str, model: str, optimizer: str) -> dict[str, Any]:
    """The ``train`` values ``protocol``'s paper uses with this model and optimiser, where they differ
    from the shared defaults."""
    return protocol_class(protocol).paper_training(model, optimizer)
