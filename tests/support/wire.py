"""What an outsider reading the wire between parties sees: every payload that crosses, both ways,
training and scoring, copied as it was sent and kept as the audit's ``Message`` records (tensors by
their path inside the payload), with its size as the ledger counts it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedgl.comm.payload import nbytes
from fedgl.privacy.record import Message, flatten
from fedgl.runner import Run


@dataclass
class Crossing:
    """One message on the wire: what it held, whether it was scoring traffic, and its bytes."""

    message: Message
    evaluating: bool
    bytes: int


def tap(job: Run) -> list[Crossing]:
    """Every message ``job``'s transport carries from now on, in the order it crossed."""
    seen: list[Crossing] = []

    def observe(round_index, src, dst, method, payload, evaluating):
        leaves = list(flatten(payload))
        tensors = {path: leaf.detach().clone() for path, leaf in leaves if isinstance(leaf, torch.Tensor)}
        values = {path: leaf for path, leaf in leaves if not isinstance(leaf, torch.Tensor)}
        message = Message(0, len(seen), round_index, src, dst, method, tensors, values)
        seen.append(Crossing(message, evaluating, nbytes(payload)))

    job.transport.observers.append(observe)
    return seen


def messages(wire: list[Crossing], sender: str | None = None, receiver: str | None = None,
             method: str | None = None, scoring: bool = False) -> list[Message]:
    """The messages matching every filter given (training only unless ``scoring``)."""
    return [c.message for c in wire if (scoring or not c.evaluating) and sender in (None, c.message.sender)
            and receiver in (None, c.message.receiver) and method in (None, c.message.method)]


def flat(message: Message, *prefix: str) -> torch.Tensor:
    """The tensors under ``prefix`` (all of them when none is given) as one float64 row."""
    return torch.cat([t.flatten().double() for t in message.under(*prefix).values()])
