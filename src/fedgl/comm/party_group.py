"""The parties living in one process: all of them in-process, or one Ray actor's share.

What a group does for its caller moves no party state across: ``run`` dispatches ``@rpc`` methods,
``hold``/``roll_back`` keep a copy of the parties' states inside the group, and ``save``/``load``
write and read each party's own checkpoint file where the group lives. ``snapshot`` hands the live
states to an in-process caller (tests of the local backend); a Ray host never offers it.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from .. import device as devices
from .party import Party
from .shard_file import load_party


class PartyGroup:
    """The parties of one process, each computing on the group's ``device``."""

    def __init__(self, device: str = "cpu") -> None:
        self.parties: dict[str, Party] = {}
        self.device = device  # resolved where each party is made: a machine without it refuses that party
        self._held: bytes | None = None

    def add(self, name: str, cls: type[Party], kwargs: dict[str, Any]) -> None:
        """Make party ``name`` from constructor arguments (a simulation placing its shards)."""
        self.parties[name] = cls.create(devices.resolve(self.device), **kwargs)

    def add_from_file(self, name: str, cls_path: str, path: str, sha256: str) -> None:
        """Make party ``name`` from its own shard file, read here (deployment: on the party's node)."""
        cls, kwargs = load_party(path, cls_path, sha256)
        self.parties[name] = cls.create(devices.resolve(self.device), **kwargs)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every party's live state: for an in-process caller only."""
        return {name: party.get_state() for name, party in self.parties.items()}

    def hold(self) -> None:
        """Keep a copy of every party's state here, in the parties' own process."""
        self._held = pickle.dumps(self.snapshot())

    def roll_back(self) -> None:
        """Return every party to the state ``hold`` kept."""
        for name, state in pickle.loads(self._held).items():
            self.parties[name].set_state(state)

    def save(self, folder: str | Path) -> None:
        """Each party's own checkpoint, written here: party states never leave the process."""
        for name, party in self.parties.items():
            party.save(Path(folder) / f"{name}.pt")

    def load(self, folder: str | Path) -> None:
        for name, party in self.parties.items():
            party.load(Path(folder) / f"{name}.pt")

    def run(self, calls: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[Any, tuple[float, float]]]:
        """Each ``(party, method, kwargs)`` call, to ``@rpc`` methods only (``Party.dispatch``)."""
        return [self.parties[name].dispatch(method, kwargs) for name, method, kwargs in calls]
