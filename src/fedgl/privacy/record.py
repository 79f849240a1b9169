"""Recording what crossed the party boundary, so ``fedgl audit`` can attack it afterwards.

``MessageRecorder`` is a ``Transport`` observer (``privacy.record_messages: true``). It keeps every
training message (evaluation traffic is left out), down (the call's arguments) and up (the result),
as the tensors and plain scalars it holds, each under its path inside the payload.

Format: the folder holds files ``part-SSS-NNNNN.pt`` (S: the recording session, one per run or
resume of the run; N: the chunk within it), each written atomically by ``torch.save`` as::

    {"format": "fedgl-messages-1",
     "messages": [{"seq": int, "round": int, "sender": str, "receiver": str, "method": str,
                   "tensors": [[path, Tensor], ...], "values": [[path, int | float | bool | str], ...]}]}

``path`` is the list of dict keys (str) and list positions (int) leading to the value, e.g.
``["sums", "client1"]``; ``seq`` orders the messages of a session. Numpy arrays are stored as
tensors, ``bytes`` as uint8 tensors; ``None`` is left out. A chunk is written when the round changes
or when the buffered tensors reach ``CHUNK_BYTES``, so memory stays bounded by one chunk. Files hold
tensors and plain data only and are read with ``torch.load(weights_only=True)``: reading never runs
code. A resumed run starts a new session and appends; rounds run again after a resume are recorded
again, since their messages crossed again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..comm.payload import nbytes
from ..errors import ConfigError
from ..files import load_tensors, write_atomically

FORMAT = "fedgl-messages-1"
CHUNK_BYTES = 64 * 2**20
PART = re.compile(r"part-(\d{3,})-(\d{5,})\.pt")

Location = tuple[str | int, ...]


def flatten(payload: Any, path: Location = ()) -> Iterator[tuple[Location, Any]]:
    """(path, leaf) for every tensor and scalar inside nested dicts, lists and tuples."""
    if isinstance(payload, dict):
        for key, value in payload.items():
            yield from flatten(value, (*path, str(key)))
    elif isinstance(payload, (list, tuple)):
        for i, value in enumerate(payload):
            yield from flatten(value, (*path, i))
    elif payload is not None:
        yield path, payload


def _leaf(value: Any) -> Tensor | int | float | bool | str:
    """A copy the sender cannot change any more (parameters are updated in place later)."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, bytes):
        return torch.frombuffer(bytearray(value), dtype=torch.uint8)
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (int, float, bool, str)):
        return value
    raise TypeError(f"cannot record a {type(value).__name__} payload")


@dataclass
class Message:
    """One recorded message: who sent it to whom, in which round and call, and what it held."""

    session: int
    seq: int
    round: int
    sender: str
    receiver: str
    method: str
    tensors: dict[Location, Tensor] = field(default_factory=dict)
    values: dict[Location, Any] = field(default_factory=dict)

    def under(self, *prefix: str | int) -> dict[Location, Tensor]:
        """The tensors whose path starts with ``prefix``, keyed by the rest of their path."""
        n = len(prefix)
        return {path[n:]: t for path, t in self.tensors.items() if path[:n] == prefix}


class MessageRecorder:
    """A transport observer writing every training message to ``folder`` (format: module docstring)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        sessions = [int(m.group(1)) for p in self.folder.iterdir() if (m := PART.fullmatch(p.name))]
        self.session = max(sessions, default=-1) + 1
        self.chunk = 0
        self.seq = 0
        self.buffer: list[dict[str, Any]] = []
        self.buffered = 0
        self.round: int | None = None

    def __call__(self, round_index: int, sender: str, receiver: str, method: str, payload: Any,
                 evaluating: bool) -> None:
        if evaluating:
            return
        if self.round is not None and round_index != self.round:
            self.flush()
        self.round = round_index
        tensors, values = [], []
        for path, leaf in flatten(payload):
            value = _leaf(leaf)
            if isinstance(value, Tensor):
                tensors.append([list(path), value])
                self.buffered += nbytes(value)
            else:
                values.append([list(path), value])
        self.buffer.append({"seq": self.seq, "round": int(round_index), "sender": sender, "receiver": receiver,
                            "method": method, "tensors": tensors, "values": values})
        self.seq += 1
        if self.buffered >= CHUNK_BYTES:
            self.flush()

    def flush(self) -> None:
        """Write the buffered messages as the next chunk file."""
        if not self.buffer:
            return
        state = {"format": FORMAT, "messages": self.buffer}
        path = self.folder / f"part-{self.session:03d}-{self.chunk:05d}.pt"
        write_atomically(path, lambda fh: torch.save(state, fh))
        self.chunk += 1
        self.buffer, self.buffered = [], 0

    def close(self) -> None:
        self.flush()


def message_files(folder: Path) -> list[Path]:
    """The chunk files of ``folder`` in recording order (session, then chunk)."""
    if not Path(folder).is_dir():
        return []
    found = [(int(m.group(1)), int(m.group(2)), p) for p in Path(folder).iterdir() if (m := PART.fullmatch(p.name))]
    return [p for _, _, p in sorted(found)]


def read_messages(folder: Path) -> Iterator[Message]:
    """Every recorded message of ``folder``, in the order it crossed, one chunk in memory at a time."""
    for path in message_files(folder):
        session = int(PART.fullmatch(path.name).group(1))
        state = load_tensors(path, "message record")
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ConfigError(f"{path} is not a fedgl message record (format {FORMAT})")
        for m in state["messages"]:
            yield Message(session, m["seq"], m["round"], m["sender"], m["receiver"], m["method"],
                          {tuple(p): t for p, t in m["tensors"]}, {tuple(p): v for p, v in m["values"]})
