"""The runs a search tries: the settings a protocol leaves to ``auto`` (``Protocol.search_space``, e.g.
nFedGNN's ``lam``) and one config per combination of their candidates. ``fedgl.search`` trains them;
a shard folder written for a search serves each of them (``deployment``)."""

from __future__ import annotations

import itertools
from typing import Any

from . import RunConfig, build_config, set_key
from .registry import protocol_class


def search_space(cfg: RunConfig) -> dict[str, tuple[Any, ...]]:
    """The config keys this run chooses on validation, with their candidates (empty: one run)."""
    return protocol_class(cfg.protocol_name).search_space(cfg.options())


def label(choice: dict[str, Any]) -> str:
    """A candidate's name, and its folder's: ``lam=0.3``."""
    return ",".join(f"{key.rsplit('.', 1)[-1]}={value:g}" if isinstance(value, float) else
                    f"{key.rsplit('.', 1)[-1]}={value}" for key, value in choice.items())


def candidates(cfg: RunConfig) -> list[tuple[dict[str, Any], RunConfig]]:
    """Every combination of the search's candidates, in order, with the config that runs it."""
    space = search_space(cfg)
    out = []
    for values in itertools.product(*space.values()):
        choice, data = dict(zip(space, values)), cfg.model_dump(mode="json")
        for key, value in choice.items():
            set_key(data, key.split("."), value, key)
        out.append((choice, build_config(data)))
    return out
