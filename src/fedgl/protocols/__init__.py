"""The protocols, one module each. Their names, and the module holding each class, are listed in
``fedgl.config.registry``, below the config that validates a run's ``protocol`` section with them;
a protocol's module loads on first use, so a run loads only what it needs."""

from __future__ import annotations

from ..config.registry import REGISTRY, protocol_class

__all__ = ["REGISTRY", "protocol_class"]
