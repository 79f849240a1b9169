"""The audit's label attack: which nodes' labels reached a party not holding them.

Labels are found by what a message holds, not by the kind it is declared as: a label vector (1-D,
integral values in [0, C), any dtype) or one-hot rows (``[k, C]``, one 1 per row) whose values equal
the labels of the nodes they line up with. A candidate lines up with the sender's own nodes in its
local order, with every node (a party holding all labels), or with the node ids of the same call:
an index vector of the same length (global ids or either end's local ids), or one indexed by a
vector of positions (LLCG's ``rows``: training positions into the requested local ids). Messages of
kind ``label`` (from the ``@rpc`` declarations) are reported by flow even where no node is resolved.
An undeclared candidate counts only with at least ``MIN_LABELS`` entries of two or more classes, so
a short vector of counts cannot match by chance.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from .attacks import AttackResult, Flow, describe, flow_list
from .record import Message

MIN_LABELS = 16


def label_fields() -> dict[str, tuple[set[str], set[str] | None]]:
    """method -> (arguments, result keys) declared of kind ``label`` by any party class (None: the
    whole result is a label)."""
    from ..comm.party import Party
    from ..comm.rpc import Rows

    def kind(k: Any) -> str:
        return k.kind if isinstance(k, Rows) else k

    out: dict[str, tuple[set[str], set[str] | None]] = {}
    classes, stack = set(), [Party]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in classes:
                classes.add(sub)
                stack.append(sub)
    for cls in classes:
        for name in dir(cls):
            spec = getattr(getattr(cls, name, None), "rpc_spec", None)
            if spec is None:
                continue
            args = {a for a, k in spec.args.items() if kind(k) == "label"}
            ret = ({r for r, k in spec.returns.items() if kind(k) == "label"} if isinstance(spec.returns, dict)
                   else (None if kind(spec.returns) == "label" else set()))
            if args or ret is None or ret:
                old_args, old_ret = out.get(name, (set(), set()))
                out[name] = (old_args | args, None if ret is None or old_ret is None else old_ret | ret)
    return out


def as_labels(t: Tensor, num_classes: int) -> Tensor | None:
    """The labels ``t`` holds if it is a label vector or one-hot rows, else None."""
    if t.is_complex() or not t.numel() or not (t.dim() == 1 or t.dim() == 2 and t.size(1) == num_classes):
        return None  # shapes first: a large payload of another shape is never converted
    v = (t.to_dense() if t.layout != torch.strided else t).double()
    if v.dim() == 2:
        one_hot = bool(((v == 0) | (v == 1)).all()) and bool((v.sum(1) == 1).all())
        return v.argmax(1) if one_hot else None
    if not bool((v == v.round()).all()) or v.min() < 0 or v.max() >= num_classes:
        return None
    return v.long()


def id_vectors(*messages: Message) -> list[Tensor]:
    """The non-negative integer vectors of a call: the node ids (or positions) it may name."""
    out = []
    for msg in messages:
        for t in msg.tensors.values():
            if t.dim() == 1 and t.numel() and t.layout == torch.strided and not t.is_floating_point() \
                    and t.dtype != torch.bool and not t.is_complex() and int(t.min()) >= 0:
                out.append(t.long())
    return out


class LabelLeak:
    """Label values in messages, by flow, and the nodes they name (module docstring)."""

    def __init__(self, nodes: dict[str, Tensor], y: Tensor, num_classes: int):
        self.fields = label_fields()
        self.nodes = nodes
        self.y = y
        self.num_classes = num_classes
        self.flows: Counter[Flow] = Counter()
        self.exposed = torch.zeros(y.numel(), dtype=torch.bool)

    def _resolve(self, ids: Tensor, parties: tuple[str, ...]) -> Iterator[Tensor]:
        """``ids`` as global ids, and as each party's local ids where they fit."""
        top = int(ids.max())
        if top < self.y.numel():
            yield ids
        for party in parties:
            own = self.nodes.get(party)
            if own is not None and top < own.numel():
                yield own[ids]

    def _alignments(self, k: int, msg: Message, ids: list[Tensor], exclude: Tensor) -> Iterator[Tensor]:
        own = self.nodes.get(msg.sender)
        if own is not None and own.numel() == k:
            yield own
        if self.y.numel() == k:
            yield torch.arange(k)
        parties = (msg.sender, msg.receiver)
        for vec in ids:
            if vec is exclude:
                continue
            if vec.numel() == k:
                yield from self._resolve(vec, parties)
            for pos in ids:
                if pos.numel() == k and pos is not vec and pos is not exclude and int(pos.max()) < vec.numel():
                    yield from self._resolve(vec[pos], parties)

    def add(self, down: Message | None, up: Message) -> None:
        """One call: the request (None when the message is a request) and the message itself."""
        call = (up,) if down is None else (down, up)
        ids = id_vectors(*call)
        for msg, side in ((up, 1),) if down is None else ((down, 0), (up, 1)):
            declared = self.fields.get(msg.method)
            keys = declared[side] if declared is not None else set()
            for path, t in msg.tensors.items():
                named = keys is None or bool(path and path[0] in keys)
                if named:
                    self.flows[(msg.sender, msg.receiver, msg.method)] += int(t.numel())
                labels = as_labels(t, self.num_classes)
                if labels is None or not named and (labels.numel() < MIN_LABELS or labels.unique().numel() < 2):
                    continue
                exclude = next((v for v in ids if v.data_ptr() == t.data_ptr()), None)
                for nodes in self._alignments(labels.numel(), msg, ids, exclude):
                    if torch.equal(self.y[nodes], labels):
                        self.exposed[nodes] = True
                        if not named:
                            self.flows[(msg.sender, msg.receiver, msg.method)] += labels.numel()
                        break

    def result(self, masks: dict[str, Tensor]) -> AttackResult:
        flows = flow_list(self.flows, "labels")
        splits = {name: int((self.exposed & mask).sum()) for name, mask in masks.items()}
        if not flows:
            return AttackResult("labels", int(self.y.numel()), 0, "no labels in any message")
        resolved = int(self.exposed.sum())
        named = ", ".join(f"{k} {v}" for k, v in splits.items()) if resolved else "not resolved"
        notes = describe(flows, "labels", " values") + "; nodes named: " + named
        return AttackResult("labels", int(self.y.numel()), resolved, notes, {"flows": flows, "splits": splits})
