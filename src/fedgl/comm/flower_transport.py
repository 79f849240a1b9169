"""The Flower backend: the fedgl server runs in a Flower ServerApp and reaches each party as Flower
messages to the SuperNode of the party's organisation.

Every ``@rpc`` call is one message ``query.<method>`` to the party's node, its payload encoded without
pickle (``flower_codec``); the node's ClientApp (``fedgl.flower_relay``) hands it to the party host the
party lives in (``flower_party``), which answers. Measuring happens before dispatch, in the shared
``Transport``, so the ledger is the one the in-process run writes. A node that stops answering (Flower
reports it unavailable, or no reply comes within the reply timeout), or that was started again and no
longer holds the party, is a lost party: the runner applies ``backend.on_client_failure``.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import ConfigError, PartyFailure
from ..flower_relay import REFUSED
from .flower_codec import decode, encode
from .flower_party import CONTROL
from .network import NetworkModel
from .party import Party
from .transport import Transport

_ACTIVE: dict[str, Any] = {}  # the grid (and reply timeout) of the ServerApp running in this process


def checkpoint_name(folder: Path) -> str:
    """What the nodes are told of a checkpoint: a key of its run folder and the round's folder name. A
    node keeps its checkpoints in its own state folder; no path of the server's machine reaches it."""
    run = hashlib.sha256(str(Path(folder).resolve().parent).encode()).hexdigest()[:16]
    return f"{run}/{Path(folder).name}"


@contextmanager
def serving(grid: Any, reply_timeout_s: float | None = None, connect_timeout_s: float = 60.0) -> Iterator[None]:
    """Within the block, a ``flower`` transport talks through ``grid`` (the ServerApp's), waits up to
    ``connect_timeout_s`` for a party's SuperNode and ``reply_timeout_s`` (None: until Flower reports
    the node unavailable) for a reply."""
    _ACTIVE.update(grid=grid, timeout=reply_timeout_s, connect=connect_timeout_s)
    try:
        yield
    finally:
        _ACTIVE.clear()


class FlowerTransport(Transport):
    backend = "flower"

    def __init__(self, network: NetworkModel | None = None, device: str = "cpu", *, grid: Any = None,
                 reply_timeout_s: float | None = None, connect_timeout_s: float | None = None):
        super().__init__(network, device)
        self._grid = grid if grid is not None else _ACTIVE.get("grid")
        if self._grid is None:
            raise ConfigError("backend 'flower' runs inside a Flower ServerApp: submit the run to the SuperLink "
                              "with `python -m fedgl.comm.flower_setup submit` (docs/deployment.md)")
        self._device = device
        self._timeout = reply_timeout_s if reply_timeout_s is not None else _ACTIVE.get("timeout")
        self._connect_timeout = connect_timeout_s or _ACTIVE.get("connect", 60.0)
        self._nodes: dict[str, int] = {}  # party name -> the node id of its SuperNode
        self._specs: dict[str, tuple[str, str]] = {}  # how each party was made, to make it again
        self._lost: set[str] = set()  # parties whose node stopped answering (until revived)
        # Called with every Message sent and every reply received: what a test watches to see payload types.
        self.outbound: list[Any] = []

    # ---- messages ---------------------------------------------------------------------------------
    def _push(self, sends: list[tuple[str, int, str, Any, dict[str, Any]]]) -> dict[str, str]:
        """Send ``(key, node, action, payload, meta)`` messages at once; the message id of each key."""
        from flwr.app import Message

        messages = [Message(encode(payload, **meta), dst_node_id=node, message_type=f"query.{action}")
                    for _, node, action, payload, meta in sends]
        for message in messages:
            self._watch(message)
        ids = list(self._grid.push_messages(messages)) if messages else []
        return {message_id: key for message_id, (key, *_) in zip(ids, sends)}

    def _pull(self, pending: dict[str, str], replies: dict[str, Any], timeout: float | None) -> None:
        """Collect replies to the ``pending`` message ids (removed as they come) into ``replies`` by key,
        until none is pending or ``timeout`` seconds pass; polls often at first, then every half second."""
        deadline, pause = None if timeout is None else time.monotonic() + timeout, 0.01
        while pending:
            for reply in self._grid.pull_messages(list(pending)):
                self._watch(reply)
                replies[pending.pop(reply.metadata.reply_to_message_id)] = reply
            if not pending or (deadline is not None and time.monotonic() > deadline):
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def _exchange(self, sends: list[tuple[str, int, str, Any, dict[str, Any]]], timeout: float | None
                  ) -> dict[str, Any]:
        """Each key's reply to its message (keys without one are missing)."""
        replies: dict[str, Any] = {}
        self._pull(self._push(sends), replies, timeout)
        return replies

    def _watch(self, message: Any) -> None:
        for observer in self.outbound:
            observer(message)

    def _calls(self, sends: list[tuple[str, str, Any, dict[str, Any]]]) -> list[tuple[Any, dict[str, Any]]]:
        """``(party, action, payload, meta)`` to the parties' nodes; each reply decoded, in order. Parties
        whose node is unavailable or silent are lost; a refusal is raised as its one line."""
        replies = self._exchange([(name, self._nodes[name], action, payload, meta)
                                  for name, action, payload, meta in sends], self._timeout)
        lost = [name for name, *_ in sends if name not in replies
                or (replies[name].has_error() and replies[name].error.code != REFUSED)]
        if lost:
            self._lost.update(lost)
            raise PartyFailure(lost)
        for name, *_ in sends:
            if replies[name].has_error():
                raise ConfigError(f"party {name} refused: {replies[name].error.reason}")
        return [decode(replies[name].content) for name, *_ in sends]

    def _control(self, names: Sequence[str], action: str, **meta: Any) -> list[tuple[Any, dict[str, Any]]]:
        return self._calls([(name, CONTROL + action, None, meta) for name in names])

    def _execute(self, calls: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[Any, tuple[float, float]]]:
        replies = self._calls([(name, method, kwargs, {}) for name, method, kwargs in calls])
        return [(result, (float(meta["elapsed"]), float(meta["cpu"]))) for result, meta in replies]

    # ---- parties ----------------------------------------------------------------------------------
    def _discover(self, name: str) -> int:
        """The node hosting party ``name``: every connected node is asked which party it hosts, until
        one says ``name`` or ``connect_timeout_s`` passes."""
        deadline = time.monotonic() + self._connect_timeout
        asked: set[int] = set(self._nodes.values())
        pending: dict[str, str] = {}
        while name not in self._nodes:
            new = [n for n in self._grid.get_node_ids() if n not in asked]
            asked.update(new)
            pending |= self._push([(str(n), n, CONTROL + "hello", None, {}) for n in new])
            replies: dict[str, Any] = {}
            self._pull(pending, replies, 1.0)
            for key, reply in replies.items():
                if reply.has_error():  # e.g. a node that was down when asked: ask it again
                    asked.discard(int(key))
                else:
                    self._nodes.setdefault(str(decode(reply.content)[0]), int(key))
            if name not in self._nodes and time.monotonic() > deadline:
                raise ConfigError(f"no SuperNode of this federation hosts party {name} "
                                  f"(waited {self._connect_timeout:g} s; is its SuperNode started?)")
        return self._nodes[name]

    def _create(self, name: str, cls: type[Party], kwargs: dict[str, Any]) -> None:
        raise ConfigError("backend 'flower' makes every party from its own shard on its own node: "
                          "write the shards with `fedgl partition` and set backend.shards")

    def _create_from_file(self, name: str, cls_path: str, path: str, sha256: str | None) -> None:
        # ``path`` is where the server would look; the party's node reads the file its node config names
        self._specs[name] = (cls_path, sha256 or "")
        self._discover(name)
        self._control([name], "spawn", **{"class": cls_path, "sha256": sha256 or "", "device": self._device})

    def revive(self, parties: Sequence[str]) -> None:
        """A lost party's SuperNode, started again, joins again: find it by the party it names and make
        the party from its shard there (its state is then loaded from a checkpoint)."""
        for name in parties:
            self._nodes.pop(name, None)
            self._lost.discard(name)
            cls_path, sha256 = self._specs[name]
            self._discover(name)
            self._control([name], "spawn", **{"class": cls_path, "sha256": sha256, "device": self._device})

    def _live(self) -> list[str]:
        return [name for name in self.parties if name not in self._lost]

    def hold(self) -> None:
        self._control(self._live(), "hold")

    def roll_back(self) -> None:
        self._control(self._live(), "roll_back")

    def save_parties(self, folder: Path) -> None:
        self._control(self._live(), "save", checkpoint=checkpoint_name(folder))

    def load_parties(self, folder: Path) -> None:
        self._control(self._live(), "load", checkpoint=checkpoint_name(folder))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        raise ConfigError("backend 'flower': a party's state stays on its node")

    def restore(self, states: dict[str, dict[str, Any]]) -> None:
        raise ConfigError("backend 'flower': a party's state stays on its node")
