"""Reading a file of a shard folder (``fedgl partition``) where it is used: a party's file on the
party's node, the evaluator's where scoring runs, the server's state in the driver.

Kept in ``comm`` because a party host reads its own file itself: the driver never holds it. A file is
read once into memory, its SHA-256 checked against the manifest's, and loaded from those same bytes
(tensors and plain data only), so the bytes checked are the bytes loaded.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from torch_geometric.data import Data

from ..errors import ConfigError
from ..evaluation import Evaluator
from ..files import load_tensors
from .party import Party
from .party_state import StateMismatch, first_line, own_class, restore

EVALUATOR_PARTY = "evaluator"  # the placement key (backend.parties) of the scoring harness


def read_shard_file(path: str | Path, what: str, sha256: str) -> Any:
    """A shard folder file as tensors and plain data, if its SHA-256 is ``sha256`` (the manifest's);
    anything else is refused with one line."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except OSError as err:
        raise ConfigError(f"{what} {path} cannot be read ({err.strerror or err})") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ConfigError(f"{what} {path} is not the file the manifest lists (its SHA-256 differs)")
    return load_tensors(path, what, data)


def load_party(path: str | Path, expected: str, sha256: str) -> tuple[type[Party], dict[str, Any]]:
    """The class (which must be ``expected``, a ``module:qualname``) and constructor arguments of a
    party, from its own shard file, whose SHA-256 must be ``sha256`` (the manifest's)."""
    saved = read_shard_file(path, "party shard", sha256)
    try:
        if saved["class"] != expected:
            raise StateMismatch(f"it holds a {saved['class']}, the manifest says {expected}")
        cls = own_class(saved["class"])
        if not issubclass(cls, Party):
            raise StateMismatch(f"{saved['class']} is not a party")
        return cls, own_files(path, restore(None, saved["kwargs"]))
    except (KeyError, TypeError, StateMismatch) as err:
        raise ConfigError(f"party shard {path} does not fit ({first_line(err)})") from None


def own_files(path: str | Path, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The constructor arguments with a file the shard names (``identity``: the party's private key,
    never in the shard itself) resolved in the party's own folder, beside its file: ``<name>/``."""
    if isinstance(kwargs, dict) and isinstance(kwargs.get("identity"), str):
        kwargs["identity"] = str(Path(path).with_suffix("") / Path(kwargs["identity"]).name)
    return kwargs


def load_evaluator(path: str | Path, sha256: str) -> Evaluator:
    """The scoring harness from ``evaluator.pt`` (read where the ground truth is)."""
    truth = read_shard_file(path, "evaluator file", sha256)
    try:
        data = Data(x=truth["x"], y=truth["y"], edge_index=truth["edge_index"],
                    **{f"{s}_mask": truth[f"{s}_mask"] for s in ("train", "val", "test")})
        data.num_classes = truth["num_classes"]
    except (KeyError, TypeError) as err:
        raise ConfigError(f"evaluator file {path} does not fit ({first_line(err)})") from None
    return Evaluator(data)
