"""The server's routing table for horizontal cross-client protocols.

The server knows which client owns each node and the node's local index there, nothing else. It
turns a training client's remote picks (target position, global id) into requests to the picks'
owners, grouped into (target, owner) pairs, and adds the owners' partial sums of each target back
together (``Assembly``, batch by batch of owners) before they return to the target's owner.

Requests travel under opaque names (``Handles``): a message to a client calls the client's own
request ``OWN`` and every other one by a handle drawn at random for the round, so an owner serving
picks never learns which client trains.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class LayerRoute:
    """How one training client's picks of one layer map to pairs and targets."""

    pair_counts: Tensor  # pairs served by each owner (owner order = pair order)
    target_of_pair: Tensor  # target row of every pair
    target_counts: Tensor  # target rows held by each owner
    pick_ids: Tensor  # global id of every pick
    pick_pair: Tensor  # pair of every pick

    def sendable(self, fewest: int) -> Tensor:
        """Which pairs can carry a vector: those with at least ``fewest`` picks (an owner withholds a
        pair that sums fewer rows than its threshold), known before any owner replies."""
        return torch.bincount(self.pick_pair, minlength=self.target_of_pair.numel()) >= fewest


OWN = "own"  # the name a client's own request carries in the messages to that client


class Handles:
    """One round's opaque names of the training clients' requests (random, from the operating system)."""

    def __init__(self, trainers: list[str]):
        self.handle = {t: secrets.token_hex(8) for t in trainers}
        self.trainer = {h: t for t, h in self.handle.items()}

    def to(self, party: str, by_trainer: dict[str, Any]) -> dict[str, Any]:
        """``{trainer: x}`` as sent to ``party``: its own request as ``OWN``, the others by handle."""
        return {OWN if t == party else self.handle[t]: x for t, x in by_trainer.items()}

    def back(self, party: str, by_name: dict[str, Any]) -> dict[str, Any]:
        """``{name: x}`` as received from ``party`` back to ``{trainer: x}``."""
        return {party if h == OWN else self.trainer[h]: x for h, x in by_name.items()}


class Router:
    """The server's routing table: which client owns a node and the node's local index there."""

    def __init__(self, owner: Tensor, local_index: Tensor, names: list[str]):
        self.owner = owner
        self.local_index = local_index
        self.names = names
        self.index = {name: i for i, name in enumerate(names)}

    def route(self, picks: dict[str, dict[str, dict[str, Tensor]]]) -> tuple[dict[str, dict], dict[str, LayerRoute]]:
        """Group remote picks {trainer: {target owner: {targets, ids}}} into (target, owner) pairs;
        return the requests {owner: {trainer: {u, pair}}} and each trainer's route for combining."""
        m = len(self.names)
        requests: dict[str, dict[str, dict[str, Tensor]]] = {}
        routes: dict[str, LayerRoute] = {}
        for trainer, by_owner in picks.items():
            parts = [(self.index[c], p["targets"], p["ids"]) for c, p in by_owner.items() if p["ids"].numel()]
            if not parts:
                continue
            tgt_owner = torch.cat([torch.full_like(t, c) for c, t, _ in parts])
            tpos = torch.cat([t for _, t, _ in parts])
            gid = torch.cat([g for _, _, g in parts])
            src_owner = self.owner[gid]
            span = int(tpos.max()) + 1
            keys, pair_of_pick = torch.unique((src_owner * m + tgt_owner) * span + tpos, return_inverse=True)
            pair_src = keys // (m * span)
            pair_counts = torch.bincount(pair_src, minlength=m)
            local_pair = pair_of_pick - (torch.cumsum(pair_counts, 0) - pair_counts)[src_owner]
            targets, target_of_pair = torch.unique(keys % (m * span), return_inverse=True)
            routes[trainer] = LayerRoute(pair_counts, target_of_pair, torch.bincount(targets // span, minlength=m),
                                         gid, pair_of_pick)
            u = self.local_index[gid]
            for c in pair_src.unique().tolist():
                mine = src_owner == c
                requests.setdefault(self.names[c], {})[trainer] = {"u": u[mine], "pair": local_pair[mine]}
        return requests, routes

    def channels(self, route: LayerRoute) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Per pair: its owner (sender), its target's owner (recipient), the target's row among the
        recipient's targets and the pair's rank among the sender's pairs to that recipient."""
        m = len(self.names)
        sender = torch.repeat_interleave(torch.arange(m), route.pair_counts)
        recipient = torch.repeat_interleave(torch.arange(m), route.target_counts)[route.target_of_pair]
        row = route.target_of_pair - (torch.cumsum(route.target_counts, 0) - route.target_counts)[recipient]
        _, channel, sizes = torch.unique_consecutive(sender * m + recipient, return_inverse=True, return_counts=True)
        rank = torch.arange(channel.numel()) - (torch.cumsum(sizes, 0) - sizes)[channel]
        return sender, recipient, row, rank

    def scatter(self, routes: dict[str, LayerRoute], grads: dict[str, dict[str, Tensor]],
                counts: dict[str, dict[str, Tensor]], sizes: dict[str, dict[str, Tensor]]) -> dict[str, dict]:
        """The transpose of ``Assembly`` (remote backprop): each target's gradient, from the target's
        owner, goes to every pair summed into it. ``counts``/``sizes`` are the row counts ``Assembly``
        sent per target and received per pair; rows exist only where they are not zero."""
        out: dict[str, dict[str, Tensor]] = {}
        for trainer, route in routes.items():
            held = [(c, counts[c][trainer]) for c in self.names if trainer in counts.get(c, {})]
            if not any(trainer in grads.get(c, {}) for c, _ in held):
                continue
            per_target = torch.cat([torch.zeros(cnt.numel(), grads[c][trainer].size(1)).index_copy_(
                0, (cnt > 0).nonzero().flatten(), grads[c][trainer]) for c, cnt in held])
            pair_grad = per_target[route.target_of_pair]
            owners = route.pair_counts.nonzero().flatten().tolist()
            for c, rows in zip(owners, pair_grad.split(route.pair_counts[owners].tolist())):
                name = self.names[c]
                out.setdefault(name, {})[trainer] = rows[sizes[name][trainer] > 0]
        return out


class Assembly:
    """Eq. (6) as the owners' replies arrive: each target's partial sums added over owners.

    The server folds in the replies of a batch of owners (``add``) and drops them, so it never
    holds every owner's reply at once, only one row per target that has received a vector so far
    (a withheld pair carries no vector, and a target none of whose pairs carried one gets no row).
    A target's row is made when its first vector arrives, in a block per ``add``; the vectors of a
    target are added in owner order however the owners were batched, so the sums are the same bit
    for bit as one sum over all replies. Batches must come in owner order (the order of
    ``names``). Counts cover every pair and target.
    """

    def __init__(self, routes: dict[str, LayerRoute], names: list[str]):
        self.routes = routes
        self.index = {name: i for i, name in enumerate(names)}
        self.names = names
        self.count = {t: torch.zeros(int(r.target_counts.sum()), dtype=torch.long) for t, r in routes.items()}
        self.slot = {t: torch.full_like(count, -1) for t, count in self.count.items()}  # row of each target
        self.blocks: dict[str, list[Tensor]] = {t: [] for t in routes}

    def add(self, replies: dict[str, dict[str, dict[str, Tensor]]]) -> None:
        """Fold in ``{owner: {"sums": {trainer: vectors}, "counts": {trainer: rows per pair}}}``."""
        owners = sorted(replies, key=self.index.__getitem__)
        for trainer, route in self.routes.items():
            first = torch.cumsum(route.pair_counts, 0) - route.pair_counts
            mine = [(self.index[c], replies[c]) for c in owners if route.pair_counts[self.index[c]] > 0]
            if not mine:
                continue
            targets = [route.target_of_pair[first[i]:first[i] + route.pair_counts[i]] for i, _ in mine]
            sizes = [r["counts"][trainer] for _, r in mine]
            self.count[trainer].index_add_(0, torch.cat(targets), torch.cat(sizes))
            self._sum(trainer, [t[n > 0] for t, n in zip(targets, sizes)], [r["sums"][trainer] for _, r in mine])

    def _sum(self, trainer: str, targets: list[Tensor], vectors: list[Tensor]) -> None:
        """Add each owner's ``vectors`` to the rows of its ``targets``, owner after owner (rows made for
        targets seen for the first time), straight from the replies: no copy of a vector is made."""
        slot, blocks = self.slot[trainer], self.blocks[trainer]
        every = torch.cat(targets)
        fresh = torch.unique(every[slot[every] < 0])
        if fresh.numel() or not blocks:
            made = sum(b.size(0) for b in blocks)
            slot[fresh] = torch.arange(made, made + fresh.numel())
            # int64 (masked) sums wrap in the ring
            blocks.append(vectors[0].new_zeros(fresh.numel(), vectors[0].size(1)))
        for owner_targets, owner_vectors in zip(targets, vectors):
            row, start = slot[owner_targets], 0
            for block in blocks:
                inside = (row >= start) & (row < start + block.size(0))
                if bool(inside.all()):
                    block.index_add_(0, row - start, owner_vectors)
                elif bool(inside.any()):
                    block.index_add_(0, row[inside] - start, owner_vectors[inside])
                start += block.size(0)

    def result(self) -> tuple[dict[str, dict[str, Tensor]], dict[str, dict[str, Tensor]]]:
        """``({target owner: {trainer: one row per target with a vector}}, {target owner: {trainer:
        count per target}})``, releasing the assembled rows trainer by trainer."""
        remote: dict[str, dict[str, Tensor]] = {}
        counts: dict[str, dict[str, Tensor]] = {}
        for trainer, route in self.routes.items():
            blocks = self.blocks.pop(trainer)
            rows = torch.cat(blocks) if len(blocks) > 1 else blocks[0]
            split = route.target_counts.tolist()
            for c, cnt, slot in zip(self.names, self.count[trainer].split(split), self.slot[trainer].split(split)):
                if cnt.numel():
                    remote.setdefault(c, {})[trainer] = rows[slot[cnt > 0]]
                    counts.setdefault(c, {})[trainer] = cnt
        return remote, counts

