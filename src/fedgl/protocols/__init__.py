"""Protocol registry: names to classes, imported on first use so a run loads only what it needs."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from pydantic import BaseModel, ValidationError

from ..config import describe, register_protocol_options
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
    key = str(name).lower()
    if key not in REGISTRY:
        raise ConfigError(f"unknown protocol {name!r}; allowed: {', '.join(sorted(REGISTRY))}")
    module, _, attr = REGISTRY[key].partition(":")
    return getattr(import_module(module), attr)


def protocol_options(section: dict[str, Any]) -> BaseModel:
    if "name" not in section:
        raise ConfigError(f"invalid config: protocol.name is required; allowed: {', '.join(sorted(REGISTRY))}")
    cls = protocol_class(section["name"])
    try:
        return cls.Options.model_validate({**section, "name": str(section["name"]).lower()})
    except ValidationError as err:
        raise ConfigError(describe(err, prefix="protocol.")) from None


def training_defaults(protocol: str, model: str, optimizer: str) -> dict[str, Any]:
    return protocol_class(protocol).paper_training(model, optimizer)


register_protocol_options(protocol_options, training_defaults)
