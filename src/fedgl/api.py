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
import os
import warnings
from pathlib import Path
from typing import Any

from .config import RunConfig, build_config, read_yaml, set_key
from .errors import ConfigError


class UnreadSetting(UserWarning):
    """A setting given a value that the run never reads (e.g. ``partition.num_clients`` for the
    centralized reference); ``warnings.simplefilter("ignore", fedgl.UnreadSetting)`` silences it."""


def load_config(config: RunConfig | str | Path | dict[str, Any] | None = None, **overrides: Any) -> RunConfig:
    """A validated config from a ``RunConfig``, a YAML path, a dict of sections or nothing (the
    defaults), with ``overrides`` applied."""
    if isinstance(config, RunConfig):  # train values it left unset stay unset (its protocol's, or shared)
        data = config.model_dump(mode="json") | {"train": config.train.model_dump(mode="json", exclude_unset=True)}
    elif isinstance(config, dict):
        data = copy.deepcopy(config)
    elif config is None:
        data = {}
    elif isinstance(config, (str, os.PathLike)):
        data = read_yaml(config)
    else:
        raise ConfigError(f"config must be a RunConfig, a YAML path, a dict of sections or None "
                          f"(got {type(config).__name__})")
    for key, value in overrides.items():
        if "." in key:
            raise ConfigError(f"override {key!r}: keyword overrides use __ for the dots of --set "
                              f"({key.replace('.', '__')})")
        set_key(data, key.split("__"), value, key)
    return build_config(data)


def run(config: RunConfig | str | Path | dict[str, Any] | None = None, *, out_dir: str | Path | None = None,
        resume: bool = False, overwrite: bool = False, progress: bool = False, **overrides: Any):
    """Train one federation and write its results folder; returns a ``RunResult`` (``summary``,
    ``metrics``, ``out_dir``, ``ledger()``, ``config_path``). As with ``fedgl run``, a folder holding a
    finished run is replaced only with ``overwrite=True``, and ``resume=True`` needs ``out_dir`` with
    a checkpoint."""
    from .session import API_NAMES, prepare, unread_settings

    cfg = load_config(config, **overrides)
    for note in unread_settings(cfg):
        warnings.warn(note, UnreadSetting, stacklevel=2)
    job = prepare(cfg, out_dir, resume=resume, overwrite=overwrite, names=API_NAMES)
    return job.execute(progress=progress)


__all__ = ["UnreadSetting", "load_config", "run"]
