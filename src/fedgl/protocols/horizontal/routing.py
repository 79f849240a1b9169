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
from typing import Any, Callable

import torch
from torch import Tensor

from ...errors import RunFailed


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
    holds every owner's reply at once, only one row per target that can receive a vector (one of
    its pairs has at least ``fewest`` picks: a pair with fewer is withheld), made when the first
    vector arrives in one block for every request (from ``storage``, kept from round to round) and
    laid out by target owner, so each recipient's sums leave as one slice of it (copied only where a
    target received nothing). The vectors of a target are added in owner order however the owners
    were batched, onto a zero row, so the sums are the same bit for bit as one sum over all replies.
    Batches must come in owner order (the order of ``names``). Counts cover every pair and target.
    """

    def __init__(self, routes: dict[str, LayerRoute], names: list[str], fewest: int = 1,
                 storage: Callable[[int, torch.dtype], Tensor] | None = None):
        self.routes = routes
        self.index = {name: i for i, name in enumerate(names)}
        self.names = names
        self.storage = storage or (lambda numel, dtype: torch.empty(numel, dtype=dtype))
        self.count = {t: torch.zeros(int(r.target_counts.sum()), dtype=torch.long) for t, r in routes.items()}
        # targets that can receive a vector: those of a pair with at least ``fewest`` picks
        self.bound = {t: torch.zeros_like(self.count[t], dtype=torch.bool).index_fill_(
            0, r.target_of_pair[r.sendable(fewest)], True) for t, r in routes.items()}
        self.slot = {t: torch.cumsum(bound, 0) - 1 for t, bound in self.bound.items()}  # row of a bound target
        self.rows: dict[str, Tensor] = {}

    def add(self, replies: dict[str, dict[str, dict[str, Tensor]]]) -> None:
        """Fold in ``{owner: {"sums": {trainer: vectors}, "counts": {trainer: rows per pair}}}``."""
        owners = sorted(replies, key=self.index.__getitem__)
        for trainer, route in self.routes.items():
            first = (torch.cumsum(route.pair_counts, 0) - route.pair_counts).tolist()
            served = route.pair_counts.tolist()
            for c in owners:
                i = self.index[c]
                if not served[i]:
                    continue
                targets, size = route.target_of_pair[first[i]:first[i] + served[i]], replies[c]["counts"][trainer]
                vectors = replies[c]["sums"][trainer]
                self.count[trainer].index_add_(0, targets, size)
                self._rows(vectors)[trainer].index_add_(0, self._slots(trainer, targets[size > 0]), vectors)

    def _rows(self, vectors: Tensor) -> dict[str, Tensor]:
        """Every request's zeroed rows, made on the first reply (its width and dtype: int64 when masked,
        which wraps in the ring)."""
        if not self.rows:
            sizes = [int(bound.sum()) for bound in self.bound.values()]
            width = vectors.size(1)
            block = self.storage(sum(sizes) * width, vectors.dtype).view(sum(sizes), width).zero_()
            self.rows = dict(zip(self.routes, block.split(sizes)))
        return self.rows

    def _slots(self, trainer: str, targets: Tensor) -> Tensor:
        """The rows of ``targets``, which were sent a vector; a vector for a pair of too few picks
        (one its owner had to withhold) is refused."""
        slot = self.slot[trainer][targets]
        if not bool(self.bound[trainer][targets].all()):
            raise RunFailed("an owner sent a partial sum for a pair with too few picks to be sent (min_aggregate)")
        return slot

    def result(self) -> tuple[dict[str, dict[str, Tensor]], dict[str, dict[str, Tensor]]]:
        """``({target owner: {trainer: one row per target with a vector}}, {target owner: {trainer:
        count per target}})``: slices of the assembled rows where every target that could receive a
        vector did, their received rows otherwise."""
        remote: dict[str, dict[str, Tensor]] = {}
        counts: dict[str, dict[str, Tensor]] = {}
        for trainer, route in self.routes.items():
            split = route.target_counts.tolist()
            bound = self.bound[trainer].split(split)
            rows = self.rows[trainer].split([int(b.sum()) for b in bound])
            for c, cnt, held, row in zip(self.names, self.count[trainer].split(split), bound, rows):
                if cnt.numel():
                    got = (cnt > 0)[held]
                    remote.setdefault(c, {})[trainer] = row if bool(got.all()) else row[got]
                    counts.setdefault(c, {})[trainer] = cnt
        self.rows = {}
        return remote, counts
