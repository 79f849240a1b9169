"""A party on a Flower SuperNode: the ClientApp side of the ``flower`` backend.

A SuperNode belongs to one organisation and hosts one party. Its node config names the party and its
shard file from ``fedgl partition`` (``fedgl-party``, ``fedgl-shard``; ``fedgl-state``: where the party
keeps its state, default the system's temporary folder). Flower starts a ClientApp process per
message, while a party may keep live state from one call to the next (GLASU's and nFedGNN's forward
passes wait for their gradients). So the party lives in a party host, a process the organisation
starts beside its SuperNode (``fedgl-host``: its Unix socket, readable by the owner only, with a
random key beside it); each ClientApp hands its message to the host and returns the answer. Without a
host (Flower's Simulation Engine), the party is made again from its shard for every message and its
state loaded from and written to its state file, which holds between calls but not across a live
forward pass. A message ``query.<method>`` calls the party's ``@rpc`` method; the few
``query._fedgl_*`` actions are the node's own bookkeeping (make the party from its shard, checkpoint,
hold, roll back). Any other method is refused.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from .. import device as devices
from ..errors import ConfigError, FedglError
from .flower_codec import decode, encode, pack, unpack
from .party import Party
from .rpc import spec_of
from .shard_file import load_party

CONTROL = "_fedgl_"  # prefix of the node's own actions; no @rpc method starts with an underscore
REFUSED = 600  # the Flower error code of a call the party refused (a one-line reason)
PARTY, SHARD, STATE, HOST = "fedgl-party", "fedgl-shard", "fedgl-state", "fedgl-host"


class Refused(FedglError):
    """A party host's one-line refusal, passed on as it is."""


class NodeParty:
    """The one party of a SuperNode, made from its own shard file for every message."""

    def __init__(self, name: str, shard: str, state_dir: str, run_id: int, hosted: bool = False):
        self.name, self.shard = name, shard
        self.hosted, self.live = hosted, None  # a host keeps the party itself between calls
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
        if self.live is not None:
            return self.live
        cls, kwargs, spec = self._made()
        party = cls.create(devices.resolve(spec["device"]), **kwargs)
        party.load(self.state)
        if self.hosted:
            self.live = party
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
        if not self.hosted:
            party.save(self.state)
        return result, seconds

    def control(self, action: str, meta: dict[str, Any]) -> Any:
        """The node's own bookkeeping; its checkpoints are written and read on this node."""
        if action == "hello":
            return self.name
        if self.live is not None and action in ("save", "hold"):
            self.live.save(self.state)
        if action in ("spawn", "load", "roll_back"):  # made again from the state file on the next call
            self.live = None
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


def answer(node: NodeParty, action: str, payload: Any, meta: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The result of one message to ``node``'s party, and the meta entries of the reply."""
    if action.startswith(CONTROL):
        return node.control(action.removeprefix(CONTROL), meta), {}
    result, (elapsed, cpu) = node.call(action, payload)
    return result, {"elapsed": elapsed, "cpu": cpu}


def _reason(err: BaseException) -> str:
    line = str(err).splitlines()[0] if str(err) else ""
    return line if isinstance(err, Refused) else f"{type(err).__name__}: {line}"


def ask_host(socket: str, run_id: int, action: str, payload: Any, meta: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """One message to the node's party host."""
    from multiprocessing.connection import Client

    with Client(socket, family="AF_UNIX", authkey=Path(f"{socket}.key").read_bytes()) as conn:
        conn.send_bytes(pack(payload, **meta, **{"fedgl-action": action, "fedgl-run": run_id}))
        result, out = unpack(conn.recv_bytes())
    if "fedgl-refused" in out:
        raise Refused(out["fedgl-refused"])
    return result, out


def handle(message: Any, context: Any, shards: str | None = None) -> Any:
    """Answer one message of the fedgl server: a reply with the result, or a one-line refusal."""
    from flwr.app import Error, Message

    action = message.metadata.message_type.partition(".")[2]
    try:
        payload, meta = decode(message.content)
        host = context.node_config.get(HOST)
        if host:
            result, out = ask_host(str(host), int(context.run_id), action, payload, meta)
        else:
            result, out = answer(NodeParty.from_context(context, shards), action, payload, meta)
        return Message(encode(result, **out), reply_to=message)
    except (FedglError, AttributeError, OSError, EOFError) as err:
        return Message(Error(code=REFUSED, reason=_reason(err)), reply_to=message)


def serve(socket: str, name: str, shard: str, state_dir: str) -> None:
    """The party host: answer the ClientApps of this node, one message at a time, keeping the party
    of the current run alive between them."""
    from multiprocessing.connection import AuthenticationError, Listener

    Path(socket).parent.mkdir(parents=True, exist_ok=True)
    Path(socket).unlink(missing_ok=True)
    key = Path(f"{socket}.key")
    key.unlink(missing_ok=True)
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    secret = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as fh:
        fh.write(secret)
    nodes: dict[int, NodeParty] = {}
    with Listener(socket, family="AF_UNIX", authkey=secret) as listener:
        os.chmod(socket, 0o600)
        while True:
            try:
                conn = listener.accept()
            except (AuthenticationError, OSError, EOFError):
                continue
            with conn:
                try:
                    payload, meta = unpack(conn.recv_bytes())
                    action, run = str(meta.pop("fedgl-action")), int(meta.pop("fedgl-run"))
                    if run not in nodes:  # a new run: the previous one's party is let go
                        nodes = {run: NodeParty(name, shard, state_dir, run, hosted=True)}
                    result, out = answer(nodes[run], action, payload, meta)
                    reply = pack(result, **out)
                except (FedglError, AttributeError, OSError, KeyError) as err:
                    reply = pack(None, **{"fedgl-refused": _reason(err)})
                conn.send_bytes(reply)


def client_app(shards: str | None = None) -> Any:
    """The ClientApp of every fedgl party (``shards``: the simulation engine's shard folder)."""
    from flwr.clientapp import ClientApp

    class PartyApp(ClientApp):
        def __call__(self, message: Any, context: Any) -> Any:
            return handle(message, context, shards)

    return PartyApp()


def main(argv: list[str] | None = None) -> None:
    """``python -m fedgl.comm.flower_party --party P --shard FILE --state DIR --socket PATH``: the host."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fedgl.comm.flower_party")
    for flag in ("--party", "--shard", "--state", "--socket"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args(argv)
    serve(args.socket, args.party, str(Path(args.shard).resolve()), args.state)


if __name__ == "__main__":
    main(sys.argv[1:])
