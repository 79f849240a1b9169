"""The Python API: what the ``fedgl`` command does, for scripts and notebooks.

    import fedgl
    result = fedgl.run("examples/fedavg-cora.yaml", train__rounds=50)
    result.summary["best_val_accuracy"], result.summary["bytes_by_kind"]
    again = fedgl.run(result.config_path, out_dir="results/again")

Overrides are config keys with ``__`` for the dots of ``--set`` (``partition__num_clients=20`` is
``--set partition.num_clients=20``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from .config import RunConfig, build_config, read_yaml


def load_config(config: RunConfig | str | Path | dict[str, Any] | None = None, **overrides: Any) -> RunConfig:
    """A validated config from a ``RunConfig``, a YAML path, a dict of sections or nothing (the
    defaults), with ``overrides`` applied."""
    if isinstance(config, RunConfig):
        data = config.model_dump(mode="json")
    elif isinstance(config, dict):
        data = copy.deepcopy(config)
    elif config is None:
        data = {}
    else:
        data = read_yaml(config)
    for key, value in overrides.items():
        node = data
        *sections, leaf = key.split("__")
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return build_config(data)


def run(config: RunConfig | str | Path | dict[str, Any] | None = None, *, out_dir: str | Path | None = None,
        resume: bool = False, progress: bool = False, **overrides: Any):
    """Train one federation and write its results folder; returns a ``RunResult`` (``summary``,
    ``metrics``, ``out_dir``, ``ledger()``, ``config_path``)."""
    from .runner import run as execute

    return execute(load_config(config, **overrides), out_dir, resume=resume, progress=progress)


__all__ = ["load_config", "run"]
