"""The ClientApp of the ``flower`` backend: it hands each message to its SuperNode's party host.

Flower starts a ClientApp process for every message. This module keeps that process small: it
imports Flower but neither torch nor the party's code, turns the message's records into bytes
(a JSON header, then every array's bytes: never a pickle), sends them to the party host over its
owner-only Unix socket (``fedgl-host`` in the node config, a random key beside it) and turns the
host's bytes back into the reply. The host (``comm.flower_party``) decodes, checks and answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

HOST = "fedgl-host"  # node config: the party host's socket
REFUSED = 600  # the Flower error code of a call the party refused (a one-line reason)
NOT_MADE = 601  # ... of a call to a party this node's host has not made for the run (its SuperNode restarted)
REFUSAL, ABSENT = "fedgl-refused", "fedgl-not-made"  # the entries of a host's reply that carry either


class RelayError(ValueError):
    """Bytes between a ClientApp and its party host that are not the relay's format."""


def to_bytes(content: Any, **extra: Any) -> bytes:
    """A ``RecordDict`` of array and config records (and ``extra`` plain values) as bytes."""
    from flwr.app import ArrayRecord, ConfigRecord

    records, blobs = [], []
    for name, record in content.items():
        if isinstance(record, ArrayRecord):
            items = [[key, a.dtype, list(a.shape), a.stype, len(a.data)] for key, a in record.items()]
            blobs += [a.data for a in record.values()]
            records.append([name, "arrays", items])
        elif isinstance(record, ConfigRecord):
            records.append([name, "config", dict(record)])
        else:
            raise RelayError(f"record {name!r} is neither an ArrayRecord nor a ConfigRecord")
    header = json.dumps({"records": records, "extra": extra}).encode()
    return b"".join([len(header).to_bytes(8, "little"), header, *blobs])


def from_bytes(blob: bytes) -> tuple[Any, dict[str, Any]]:
    """The ``RecordDict`` and ``extra`` values of ``to_bytes``'s bytes."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    try:
        size = int.from_bytes(blob[:8], "little")
        header, offset, content = json.loads(blob[8:8 + size]), 8 + size, RecordDict()
        for name, kind, items in header["records"]:
            if kind == "config":
                content[str(name)] = ConfigRecord(dict(items))
                continue
            arrays = {}
            for key, dtype, shape, stype, length in items:
                data, offset = blob[offset:offset + int(length)], offset + int(length)
                arrays[str(key)] = Array(dtype=str(dtype), shape=tuple(int(s) for s in shape), stype=str(stype),
                                         data=data)
            content[str(name)] = ArrayRecord(arrays)
        if offset != len(blob):
            raise RelayError("its length does not match its header")
        return content, dict(header["extra"])
    except (KeyError, TypeError, ValueError) as err:
        raise RelayError(f"not a party host message ({str(err).splitlines()[0]})") from None


def ask(socket: str, blob: bytes) -> bytes:
    """One exchange with the party host listening on ``socket`` (its key in ``<socket>.key``)."""
    from multiprocessing.connection import Client

    with Client(socket, family="AF_UNIX", authkey=Path(f"{socket}.key").read_bytes()) as conn:
        conn.send_bytes(blob)
        return conn.recv_bytes()


def relay(message: Any, context: Any, hosts: Sequence[str] = ()) -> Any:
    """The reply to one message: the party host's answer, or its (or this relay's) one-line refusal.
    ``hosts``: the sockets of simulated nodes, by ``partition-id``."""
    from flwr.app import Error, Message

    config = context.node_config
    try:
        host = config.get(HOST) or (hosts[int(config["partition-id"])] if hosts else None)
        if not host:
            raise RelayError(f"this SuperNode names no party host ({HOST}): start it with "
                             f"`python -m fedgl.comm.flower_setup supernode` (docs/deployment.md)")
        action = message.metadata.message_type.partition(".")[2]
        answer = ask(str(host), to_bytes(message.content, action=action, run=int(context.run_id)))
        content, extra = from_bytes(answer)
        if ABSENT in extra:
            return Message(Error(code=NOT_MADE, reason=str(extra[ABSENT])), reply_to=message)
        if REFUSAL in extra:
            raise RelayError(str(extra[REFUSAL]))
        return Message(content, reply_to=message)
    except (RelayError, OSError, EOFError, KeyError, TypeError, ValueError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        return Message(Error(code=REFUSED, reason=reason if isinstance(err, RelayError)
                             else f"{type(err).__name__}: {reason}"), reply_to=message)


def client_app(hosts: Sequence[str] = ()) -> Any:
    """The ClientApp of every fedgl party (``hosts``: the simulated nodes' party hosts)."""
    from flwr.clientapp import ClientApp

    class PartyApp(ClientApp):
        def __call__(self, message: Any, context: Any) -> Any:
            return relay(message, context, hosts)

    return PartyApp()
