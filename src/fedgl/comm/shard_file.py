"""Reading a file of a shard folder (``fedgl partition``) on the node of the party it belongs to.

Kept in ``comm`` because a party host reads its own file itself: the driver never holds it.
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from .party import Party
from .party_state import StateMismatch, first_line, own_class, restore

EVALUATOR_PARTY = "evaluator"  # the placement key (backend.parties) of the scoring harness


def read_shard_file(path: Path, what: str) -> Any:
    """A shard folder file as tensors and plain data; anything else is refused with one line."""
    try:
        return torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except Exception as err:
        if isinstance(err, pickle.UnpicklingError) and "GLOBAL" in str(err):
            raise ConfigError(f"{what} {path} holds objects other than tensors and plain data; refusing to load it") \
                from None
        raise ConfigError(f"{what} {path} is not a readable fedgl shard file ({type(err).__name__})") from None


def load_party(path: str | Path, expected: str, sha256: str | None = None) -> tuple[type[Party], dict[str, Any]]:
    """The class (which must be ``expected``, a ``module:qualname``) and constructor arguments of a
    party, from its own shard file, whose SHA-256 must be ``sha256`` (the manifest's) when given."""
    if sha256 is not None:
        try:
            digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError as err:
            raise ConfigError(f"party shard {path} cannot be read ({err.strerror or err})") from None
        if digest != sha256:
            raise ConfigError(f"party shard {path} is not the file the manifest lists (its SHA-256 differs)")
    saved = read_shard_file(Path(path), "party shard")
    try:
        if saved["class"] != expected:
            raise StateMismatch(f"it holds a {saved['class']}, the manifest says {expected}")
        cls = own_class(saved["class"])
        if not issubclass(cls, Party):
            raise StateMismatch(f"{saved['class']} is not a party")
        return cls, restore(None, saved["kwargs"])
    except (KeyError, TypeError, StateMismatch) as err:
        raise ConfigError(f"party shard {path} does not fit ({first_line(err)})") from None
