"""The party host of a Flower SuperNode: the process a node's one party lives in for a whole run.

A SuperNode belongs to one organisation and hosts one party, made from its own shard file from
``fedgl partition``. Flower starts a ClientApp process per message, while a party may keep live
state from one call to the next (GLASU's and nFedGNN's forward passes wait for their gradients), so
the party lives here, in a process the organisation starts beside its SuperNode
(``flower_setup supernode``; in the Simulation Engine, ``flower_app.simulate`` starts one per
simulated node). Each ClientApp (``fedgl.flower_relay``) hands its message over an owner-only Unix
socket with a random key beside it. A message ``query.<method>`` calls the party's ``@rpc`` method;
the few ``query._fedgl_*`` actions are the node's own bookkeeping (make the party from its shard,
checkpoint, hold, roll back). Any other method is refused with one line.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .. import device as devices
from ..errors import ConfigError, FedglError
from ..files import write_atomically
from ..flower_relay import ABSENT, REFUSAL, RelayError, from_bytes, to_bytes
from .flower_codec import decode, encode
from .party import Party
from .rpc import spec_of
from .shard_file import load_party

CONTROL = "_fedgl_"  # prefix of the node's own actions; no @rpc method starts with an underscore


class NotMade(ConfigError):
    """A call to a party this host has not made for the run: its SuperNode was started again mid-run,
    so the server counts the party as lost (and may make it again) rather than stopping."""


# A checkpoint's name as the server sends it: its run folder's key and the round's folder, nothing a
# path could be made of, so the server never chooses where on this node a party's state is written.
CHECKPOINT = re.compile(r"[0-9a-f]{16}/parties-[0-9]+")
KEPT = 2  # checkpoints kept per run: the newest may not be committed by the server yet


class NodeParty:
    """The one party of a SuperNode for one run, made from its own shard file, live between messages.
    Its state and checkpoints stay in the node's own state folder, owner-only."""

    def __init__(self, name: str, shard: str, state_dir: str, run_id: int):
        self.name, self.shard, self.live = name, shard, None
        self.root = Path(state_dir)
        self.folder = self.root / f"run-{run_id}"
        self.state, self.held, self.spec = (self.folder / f"{name}{suffix}" for suffix in (".pt", ".held.pt", ".json"))

    def checkpoint(self, label: Any) -> Path:
        """Where this node keeps the checkpoint the server names ``label`` (refused unless it is a name)."""
        if not isinstance(label, str) or not CHECKPOINT.fullmatch(label):
            raise ConfigError(f"refused checkpoint name {str(label)[:80]!r}: the server names a checkpoint, "
                              "this node chooses where it is kept")
        return self.root / "checkpoints" / label / f"{self.name}.pt"

    def _made(self) -> tuple[type[Party], dict[str, Any], dict[str, str]]:
        try:
            spec = json.loads(self.spec.read_text())
        except FileNotFoundError:
            raise NotMade(f"party {self.name} was not made on this node for this run") from None
        cls, kwargs = load_party(self.shard, spec["class"], spec["sha256"])
        return cls, kwargs, spec

    def _party(self) -> Party:
        """The party as its last message left it."""
        if self.live is not None:
            return self.live
        cls, kwargs, spec = self._made()
        party = cls.create(devices.resolve(spec["device"]), **kwargs)
        party.load(self.state)
        self.live = party
        return party

    def spawn(self, cls_path: str, sha256: str, device: str) -> None:
        """Make the party from its own shard, which must hold ``cls_path`` and hash to ``sha256``."""
        cls, kwargs = load_party(self.shard, cls_path, sha256 or None)
        party = cls.create(devices.resolve(device), **kwargs)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        party.save(self.state)
        self.spec.write_text(json.dumps({"class": cls_path, "sha256": sha256 or None, "device": device}))

    def call(self, method: str, kwargs: Any) -> tuple[Any, tuple[float, float]]:
        """One ``@rpc`` call; anything else is refused before the party is made."""
        cls, _, _ = self._made()
        spec_of(cls, method)
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ConfigError(f"a call of {method} must carry its arguments by name")
        party = self._party()
        return party.dispatch(method, kwargs)

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
            path = self.checkpoint(meta.get("checkpoint"))
            party = self._party()
            party.load(path)  # checked as the party's own checkpoint
            party.save(self.state)
        elif action in COPIES:
            source, target = COPIES[action](self, meta)
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomically(target, lambda fh: fh.write(source.read_bytes()), private=True)
            if action == "save":
                _prune(target.parent)
        else:
            raise ConfigError(f"unknown node action {action!r}")
        return None


# The actions that copy the party's state file: (source, target) of each
COPIES = {
    "save": lambda node, meta: (node.state, node.checkpoint(meta.get("checkpoint"))),
    "hold": lambda node, meta: (node.state, node.held),
    "roll_back": lambda node, meta: (node.held, node.state),
}


def _prune(saved: Path) -> None:
    """After the checkpoint ``saved`` (``parties-<round>``), keep it and the newest ``KEPT`` - 1 of its run's
    earlier ones (the server may not have committed ``saved`` yet). Later rounds are left alone: they are
    a resumed run's, or an earlier run's in the same folder, and the server may still need one."""
    def number(folder: Path) -> int:
        return int(folder.name.removeprefix("parties-"))

    earlier = sorted((f for f in saved.parent.glob("parties-*") if number(f) < number(saved)), key=number)
    for folder in earlier[:len(earlier) - (KEPT - 1)]:
        shutil.rmtree(folder, ignore_errors=True)


def private_folder(folder: Path) -> Path:
    """``folder`` made owner-only (0700), refused if another user owns it: a party's state lives there."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_uid != os.getuid():
        raise ConfigError(f"the state folder {folder} belongs to another user: choose one of your own (--state)")
    folder.chmod(0o700)
    return folder


def answer(node: NodeParty, action: str, payload: Any, meta: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The result of one message to ``node``'s party, and the meta entries of the reply."""
    if action.startswith(CONTROL):
        return node.control(action.removeprefix(CONTROL), meta), {}
    result, (elapsed, cpu) = node.call(action, payload)
    return result, {"elapsed": elapsed, "cpu": cpu}


def _reason(err: BaseException) -> str:
    line = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {line}"


def _reply(blob: bytes, nodes: dict[int, NodeParty], name: str, shard: str, state_dir: str) -> bytes:
    """The host's answer to one ClientApp's bytes; ``nodes`` holds the party of the current run."""
    try:
        content, extra = from_bytes(blob)
        action, run = str(extra["action"]), int(extra["run"])
        payload, meta = decode(content)
        if run not in nodes:  # a new run: the previous one's party is let go
            nodes.clear()
            nodes[run] = NodeParty(name, shard, state_dir, run)
        result, out = answer(nodes[run], action, payload, meta)
        return to_bytes(encode(result, **out))
    except NotMade as err:
        return to_bytes({}, **{ABSENT: _reason(err)})
    except (FedglError, RelayError, AttributeError, OSError, KeyError) as err:
        return to_bytes({}, **{REFUSAL: _reason(err)})


def serve(socket: str, name: str, shard: str, state_dir: str) -> None:
    """The party host: answer the ClientApps of this node, one message at a time, keeping the party
    of the current run alive between them."""
    from multiprocessing.connection import AuthenticationError, Listener

    private_folder(Path(state_dir))
    Path(socket).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
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
                    conn.send_bytes(_reply(conn.recv_bytes(), nodes, name, shard, state_dir))
                except (OSError, EOFError):  # the ClientApp went away before its answer
                    continue


def _follow(parent: int) -> None:
    """End the host when the process that started it ends, however it was stopped."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    """``python -m fedgl.comm.flower_party --party P --shard FILE --state DIR --socket PATH``: the host."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fedgl.comm.flower_party")
    for flag in ("--party", "--shard", "--state", "--socket"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args(argv)
    threading.Thread(target=_follow, args=(os.getppid(),), daemon=True).start()
    serve(args.socket, args.party, str(Path(args.shard).resolve()), args.state)


if __name__ == "__main__":
    main(sys.argv[1:])
