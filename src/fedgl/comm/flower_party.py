"""A party on a Flower SuperNode: the ClientApp side of the ``flower`` backend.

A SuperNode belongs to one organisation and hosts one party. Its node config names the party and its
shard file from ``fedgl partition`` (``fedgl-party``, ``fedgl-shard``; ``fedgl-state``: where the party
keeps its state between messages, default the system's temporary folder). Flower starts a ClientApp
process per message, so the party is made again from its own shard for every message and its state
(parameters, optimiser, RNG state) is loaded from and written back to its state file, as a checkpoint
would be. A message ``query.<method>`` calls the party's ``@rpc`` method; the few ``query._fedgl_*``
actions are the node's own bookkeeping (make the party from its shard, checkpoint, hold, roll back).
Any other method is refused.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .. import device as devices
from ..errors import ConfigError, FedglError
from .flower_codec import decode, encode
from .party import Party
from .rpc import spec_of
from .shard_file import load_party

CONTROL = "_fedgl_"  # prefix of the node's own actions; no @rpc method starts with an underscore
REFUSED = 600  # the Flower error code of a call the party refused (a one-line reason)
PARTY, SHARD, STATE = "fedgl-party", "fedgl-shard", "fedgl-state"


class NodeParty:
    """The one party of a SuperNode, made from its own shard file for every message."""

    def __init__(self, name: str, shard: str, state_dir: str, run_id: int):
        self.name, self.shard = name, shard
        self.folder = Path(state_dir) / f"run-{run_id}"
        self.state, self.held, self.spec = (self.folder / f"{name}{suffix}" for suffix in (".pt", ".held.pt", ".json"))

    @classmethod
    def from_context(cls, context: Any, shards: str | None = None) -> "NodeParty":
        """The node's party from its node config; in the simulation engine (nodes numbered by
        ``partition-id``) from the ``shards`` folder's manifest, party ``partition-id``."""
        config, run_id = context.node_config, context.run_id
        state = str(config.get(STATE, Path(tempfile.gettempdir()) / "fedgl-flower"))
        if PARTY in config and SHARD in config:
            return cls(str(config[PARTY]), str(config[SHARD]), state, run_id)
        if shards is not None and "partition-id" in config:
            party = json.loads((Path(shards) / "manifest.json").read_text())["parties"][int(config["partition-id"])]
            return cls(party["name"], str(Path(shards) / party["file"]), state, run_id)
        raise ConfigError(f"this SuperNode's node config names no party: start it with "
                          f"--node-config '{PARTY}=\"<name>\" {SHARD}=\"<file>\"'")

    def _made(self) -> tuple[type[Party], dict[str, Any], dict[str, str]]:
        try:
            spec = json.loads(self.spec.read_text())
        except FileNotFoundError:
            raise ConfigError(f"party {self.name} was not made on this node for this run") from None
        cls, kwargs = load_party(self.shard, spec["class"], spec["sha256"])
        return cls, kwargs, spec

    def _party(self) -> Party:
        """The party as its last message left it."""
        cls, kwargs, spec = self._made()
        party = cls.create(devices.resolve(spec["device"]), **kwargs)
        party.load(self.state)
        return party

    def spawn(self, cls_path: str, sha256: str, device: str) -> None:
        """Make the party from its own shard, which must hold ``cls_path`` and hash to ``sha256``."""
        cls, kwargs = load_party(self.shard, cls_path, sha256 or None)
        party = cls.create(devices.resolve(device), **kwargs)
        self.folder.mkdir(parents=True, exist_ok=True)
        party.save(self.state)
        self.spec.write_text(json.dumps({"class": cls_path, "sha256": sha256 or None, "device": device}))

    def call(self, method: str, kwargs: Any) -> tuple[Any, tuple[float, float]]:
        """One ``@rpc`` call; anything else is refused before the party is made."""
        cls, _, _ = self._made()
        spec_of(cls, method)
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ConfigError(f"a call of {method} must carry its arguments by name")
        party = self._party()
        result, seconds = party.dispatch(method, kwargs)
        party.save(self.state)
        return result, seconds

    def control(self, action: str, meta: dict[str, Any]) -> Any:
        """The node's own bookkeeping; its checkpoints are written and read on this node."""
        if action == "hello":
            return self.name
        if action == "spawn":
            self.spawn(str(meta["class"]), str(meta["sha256"]), str(meta["device"]))
        elif action == "load":
            party = self._party()
            party.load(Path(str(meta["folder"])) / f"{self.name}.pt")  # checked as the party's own checkpoint
            party.save(self.state)
        elif action in COPIES:
            source, target = COPIES[action](self, meta)
            shutil.copyfile(source, target)
        else:
            raise ConfigError(f"unknown node action {action!r}")
        return None


# The actions that copy the party's state file: (source, target) of each
COPIES = {
    "save": lambda node, meta: (node.state, Path(str(meta["folder"])) / f"{node.name}.pt"),
    "hold": lambda node, meta: (node.state, node.held),
    "roll_back": lambda node, meta: (node.held, node.state),
}


def handle(message: Any, context: Any, shards: str | None = None) -> Any:
    """Answer one message of the fedgl server: a reply with the result, or a one-line refusal."""
    from flwr.app import Error, Message

    action = message.metadata.message_type.partition(".")[2]
    try:
        node = NodeParty.from_context(context, shards)
        payload, meta = decode(message.content)
        if action.startswith(CONTROL):
            return Message(encode(node.control(action.removeprefix(CONTROL), meta)), reply_to=message)
        result, (elapsed, cpu) = node.call(action, payload)
        return Message(encode(result, elapsed=elapsed, cpu=cpu), reply_to=message)
    except (FedglError, AttributeError, OSError) as err:
        line = str(err).splitlines()[0] if str(err) else type(err).__name__
        return Message(Error(code=REFUSED, reason=f"{type(err).__name__}: {line}"), reply_to=message)


def client_app(shards: str | None = None) -> Any:
    """The ClientApp of every fedgl party (``shards``: the simulation engine's shard folder)."""
    from flwr.clientapp import ClientApp

    class PartyApp(ClientApp):
        def __call__(self, message: Any, context: Any) -> Any:
            return handle(message, context, shards)

    return PartyApp()
