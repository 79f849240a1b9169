"""Cross-client mini-batch training over horizontal subgraphs (Swift-FedGNN, Eq. 3-8).

Shared by Swift-FedGNN, FedGNN-G, FedGNN-PNS, FedSage and LLCG's local phase. Nodes are split
disjointly among clients; a client knows which of its nodes have remote in-neighbours (their
global ids) but not who holds them. The server holds only the routing table (owner and local
index of every node).

One training client's step with cross-client neighbours (Algorithm 2) runs as a short chain of
calls the server relays:

1. sampling, top-down: the owner of every frontier node samples its in-neighbours (local or
   remote) and reports the remote picks; the server routes each pick to the pick's owner, which
   adds it to its own frontier, and so on down to the input layer (messages of kind ``index``);
2. aggregation, bottom-up, one call per layer: each owner sums its layer-(l-1) embeddings of the
   picks it holds per (target node, owner) pair, Eq. (5), and sends one vector per pair
   (``embedding``) with the number of rows summed (``index``); the server adds the vectors of
   each target across owners, Eq. (6), and sends one vector per target to the target's owner,
   which combines it with its local neighbours, Eq. (7), and applies the layer, Eq. (8). The
   server asks the owners in batches that fit ``memory_budget_mb`` beside the sums it assembles,
   adding each batch in before asking the next (same messages, same sums);
3. the training client computes the loss on its batch and returns its gradient (``gradient``);
4. with ``remote_backprop`` (App. H.1), one ``backward`` call per hidden level: the gradient of
   every received sum goes back through the server to the owners of its pairs, which backpropagate
   it through the activations they kept; at the input level each owner returns its share of the
   parameters' gradient, which the server adds to the trainers' gradients.

Without ``remote_backprop`` remote contributions reach the training client as constants: its
gradient flows through its own nodes' computation only (ARCHITECTURE.md). GCN's normalisation
D^-1/2 (A + I) D^-1/2 is split between the two ends: each owner scales its rows by
(deg + 1)^-1/2 of their own node before summing, the target's owner scales the sum by its node's
(deg + 1)^-1/2 (and by deg / sampled count, which is 1 with all neighbours).
A remote client answers a first-layer pair only if it sums at least ``min_aggregate`` rows that are
non-zero as summed (after dropout), so no raw feature row ever leaves its owner; a withheld pair
sends its count (0) and no vector.

Requests travel under per-round random handles (``routing.Handles``): no owner learns which client
trains. Privacy options (docs/privacy.md, Swift-FedGNN): with ``secure_aggregation`` the parties of a
request agree on fresh keys after sampling and every partial sum travels in fixed point, masked so that
only its recipient (the target's owner) can remove the masks from the total the server forwards, and
the gradient uploads are averaged by ``protocols/aggregation.py``'s ``secure_sum``; with ``dp`` every
row an owner sums is clipped and every partial sum noised (``PrivateRelease``), and the server charges
each sum to the nodes it may carry (``DPAccountant``: a raw row to its node, a sum of n computed rows n
times over to every node of its owner).
"""

from __future__ import annotations

import math
import secrets
from typing import Any, Callable

import torch
from pydantic import Field, field_validator
from torch import Tensor
from torch_geometric.data import Data

from ...comm.payload import nbytes, outbox
from ...config import ModelConfig
from ...errors import ConfigError
from ...evaluation import Evaluator
from ...models import make_model
from ...models.graph import canonical_model_name
from ...models.split_horizontal import SPLITTABLE, first_linear
from ...optim import make_optimizer
from ...partition import horizontal_from_config
from ...privacy.dp import NODE_EXCHANGE, SUBSTITUTION, DPAccountant
from ..aggregation import check_secure_round, secure_sum, trust_identities
from ..base import Protocol, ProtocolOptions
from .client import CrossClient
from .routing import Assembly, Handles, LayerRoute, Router


def check_model(model: ModelConfig, allowed: tuple[str, ...] = SPLITTABLE) -> None:
    name = canonical_model_name(model.name)
    if name not in allowed:
        raise ConfigError(f"model.name {model.name!r} cannot be split across clients here (cross-client "
                          f"aggregation needs an element-wise aggregator); allowed: {', '.join(allowed)}")


def mib(size: int) -> str:
    """``size`` bytes in MiB, rounded up to two decimals (what a budget must at least be)."""
    return f"{math.ceil(size / 2**20 * 100) / 100:.2f}"


# ---- the protocol base ------------------------------------------------------------------------------
class MiniBatchOptions(ProtocolOptions):
    batch_size: int | None = Field(256, ge=1, description="training nodes per client per iteration; null = all")
    fanouts: list[int] = Field(default_factory=lambda: [15, 10],
                               description="neighbours sampled per layer, input layer first; -1 = all")

    @field_validator("fanouts")
    @classmethod
    def _fanouts(cls, value: list[int]) -> list[int]:
        if not value or any(f == 0 or f < -1 for f in value):
            raise ValueError("fanouts must be a non-empty list of positive integers or -1 (all neighbours)")
        return value


class CrossClientOptions(MiniBatchOptions):
    min_aggregate: int = Field(2, ge=1, description="fewest rows, non-zero after dropout, a remote client sums "
                                                     "into one first-layer vector; fewer: no vector, count 0 "
                                                     "(1 allows single rows)")
    remote_backprop: bool = Field(False, description="send the gradients of the remote partial sums back to "
                                                     "their owners (App. H.1) instead of holding them constant")
    memory_budget_mb: float = Field(2048, gt=0, description="MiB the server may hold at once for one aggregation "
                                  "phase of a cross-client step: the per-target sums it assembles and forwards plus "
                                  "the owners' replies not yet added in; it asks the owners in batches that fit "
                                  "(same messages, same results) and stops with an error when one owner's reply "
                                  "beside the sums does not; the sums' storage is kept between steps")


class CrossClientProtocol(Protocol):
    """Server of the cross-client family: gradient averaging every iteration (one round = one
    iteration), each client training locally, across clients, or on a reused neighbourhood."""

    scenario = "horizontal"
    Options = CrossClientOptions
    client_class: type[CrossClient] = CrossClient
    models: tuple[str, ...] = SPLITTABLE
    sums = 0  # secure sums of the gradient uploads run so far (also when set up from a shard folder)
    # The calls (and their kinds; None = all) whose traffic exists only because of cross-client
    # neighbours: sampled ids, partial sums, counts and remote gradients, never the model exchange.
    cross_traffic: dict[str, tuple[str, ...] | None] = {
        "begin": ("index",), "route": None, "propagate": None, "finish": ("embedding", "index"), "backward": None,
        "request_keys": None, "request_peers": None}

    def setup(self, data: Data) -> None:
        cfg = self.cfg
        check_model(cfg.model, self.models)
        if len(self.opts.fanouts) != cfg.model.layers:
            raise ConfigError(f"protocol.fanouts has {len(self.opts.fanouts)} entries but model.layers is "
                              f"{cfg.model.layers}; give one fanout per layer")
        self.build(data.num_features, int(data.num_classes))
        part = horizontal_from_config(data, cfg.partition, cfg.seed)
        self.partition_stats = part.stats
        self.clients = self.transport.spawn(self.client_class, [
            dict(name=f"client{m}", seed=cfg.seed * 100_003 + m + 1, shard=shard, index=m,
                 **self.client_options(data))
            for m, shard in enumerate(part.shards)
        ])
        self.router = Router(part.owner, part.local_index, self.clients)
        self.levels = cfg.model.layers
        self.first_layer = dict.fromkeys(("pairs", "withheld_pairs", "picks", "withheld_picks"), 0)
        privacy = cfg.privacy
        if privacy.requested() and getattr(self.opts, "remote_backprop", False):
            raise ConfigError(f"privacy.{privacy.requested()[0]} covers the partial sums sent forward; the gradients "
                              f"remote_backprop sends back are neither masked nor noised: set "
                              f"protocol.remote_backprop: false")
        if privacy.secure_aggregation:  # the gradient averages' secure sums run over every client
            check_secure_round(privacy, len(self.clients), self.name)
        dp = privacy.dp
        # Gradient uploads (every client, every iteration) and the exchanged sums, composed per node.
        self.accountant = DPAccountant(dp, part.owner, NODE_EXCHANGE, ("model", "embedding")) if dp else None

    def start(self) -> None:
        if self.cfg.privacy.secure_aggregation:  # the identities the gradient sums' keys are signed with
            trust_identities(self.transport, self.clients, self.cfg.privacy)

    def build(self, num_features: int, num_classes: int) -> None:
        with torch.random.fork_rng():
            torch.manual_seed(self.cfg.seed)
            self.model = make_model(self.cfg.model, num_features, num_classes)
        self.optimizer = self.server_optimizer()
        # Per layer, the storage the per-target sums are assembled in, kept from round to round (faulting
        # in a gigabyte afresh every round costs more than adding into it).
        self.assembled: dict[int, Callable[[int, torch.dtype], Tensor]] = {}

    def server_optimizer(self) -> torch.optim.Optimizer:
        return make_optimizer(self.model.parameters(), self.cfg.train)

    def client_options(self, data: Data) -> dict[str, Any]:
        options = dict(model=self.cfg.model, train=self.cfg.train, num_features=data.num_features,
                       num_classes=int(data.num_classes), batch_size=self.opts.batch_size, fanouts=self.opts.fanouts)
        if isinstance(self.opts, CrossClientOptions):
            options |= {"min_aggregate": self.opts.min_aggregate, "remote_backprop": self.opts.remote_backprop,
                        "privacy": self.cfg.privacy}
        return options

    # ---- one iteration ---------------------------------------------------------------------------
    def iterate(self, modes: list[str], keep: bool = False) -> dict[str, float]:
        """Every client starts from the global parameters in its mode; cross-client trainers then
        run Algorithm 2 together; the server averages all gradients (under secure aggregation from
        their secure sum) and takes one optimiser step."""
        state = self.model.state_dict()
        if self.accountant is not None:  # counted before any client releases its gradient
            self.accountant.charge("model", clients=torch.arange(len(self.clients)))
        replies = self.transport.call_many(self.clients, "begin", per_target=[{"mode": m} for m in modes],
                                           state=state)
        results = [r for r in replies if "gradient" in r]
        trainers = {name: r for name, r, m in zip(self.clients, replies, modes) if m == "cross" and "targets" in r}
        remote_share = None
        if trainers:
            crossed, remote_share = self.cross_chain(trainers, keep)
            results += crossed
        stats = self.apply_secure() if self.cfg.privacy.secure_aggregation else self.apply(results, remote_share)
        return stats | self.epsilons()

    def epsilons(self) -> dict[str, float]:
        """DP: epsilon so far for one node's data, over its client's gradient uploads and its own row's
        releases in the exchanged sums (and each part alone)."""
        return {} if self.accountant is None else self.accountant.epsilons()

    def cross_chain(self, trainers: dict[str, dict[str, Tensor]], keep: bool
                    ) -> tuple[list[dict[str, Any]], dict[str, Tensor] | None]:
        """Algorithm 2 for all ``trainers`` at once (their first-hop picks given): sampling down the
        levels, one aggregation phase per layer, then each trainer's loss and gradient; with
        ``remote_backprop``, also the remote owners' summed share of the gradients. Requests travel
        under this round's handles; with secure aggregation the parties of each request agree on keys
        after sampling and every partial sum travels masked for its recipient."""
        handles = Handles(list(trainers))
        picks = {name: {name: reply} for name, reply in trainers.items()}
        active = list(trainers)
        routes: dict[int, dict[str, LayerRoute]] = {}
        requests: dict[int, dict[str, dict]] = {}
        for level in range(self.levels - 1, -1, -1):
            requests[level + 1], routes[level + 1] = self.router.route(picks)
            active = [c for c in self.clients if c in set(active) | set(requests[level + 1])]
            if level == 0:
                break
            replies = self.transport.call_many(active, "route", per_target=[
                {"incoming": handles.to(c, requests[level + 1].get(c, {}))} for c in active], level=level)
            picks = {}
            for c, reply in zip(active, replies):
                for trainer, p in handles.back(c, reply).items():
                    picks.setdefault(trainer, {})[c] = p
        peer_of = self.agree_request_keys(active, handles, requests[1]) if self.cfg.privacy.secure_aggregation else None
        unmask: dict[str, dict] = {}
        remote: dict[str, dict] = {}
        counts: dict[str, dict] = {}
        sizes: dict[int, dict[str, dict]] = {}  # per layer: {owner: {trainer: row count per pair}}
        down: dict[int, dict[str, dict]] = {}  # per layer: {target owner: {trainer: row count per target}}
        for layer in range(1, self.levels + 1):
            remote, counts, sizes[layer], unmask = self.aggregate(layer, active, handles, requests, routes[layer],
                                                                  remote, counts, peer_of, unmask)
            down[layer] = counts
        names = list(trainers)
        finish = [{"remote": remote.get(c, {}), "counts": counts.get(c, {})}
                  | ({"unmask": unmask.get(c, {})} if peer_of is not None else {}) for c in names]
        results = [r for r in self.transport.call_many(names, "finish", per_target=[
            {key: handles.to(c, v) for key, v in call.items()} for c, call in zip(names, finish)], keep=keep)
            if "gradient" in r]
        if not (getattr(self.opts, "remote_backprop", False) and self.levels > 1):
            return results, None
        grads: dict[str, dict] = {}
        for level in range(self.levels, 0, -1):
            replies = self.transport.call_many(active, "backward", per_target=[
                {"grads": handles.to(c, grads[c]) if c in grads else None} for c in active], level=level)
            if level > 1:
                sums = {c: handles.back(c, r["sums"]) for c, r in zip(active, replies)}
                grads = self.router.scatter(routes[level], sums, down[level], sizes[level])
        shares = [r["gradient"] for r in replies if "gradient" in r]
        return results, {name: sum(s[name] for s in shares) for name in shares[0]} if shares else None

    def aggregate(self, layer: int, active: list[str], handles: Handles, requests: dict[int, dict[str, dict]],
                  routes: dict[str, LayerRoute], remote: dict[str, dict], counts: dict[str, dict],
                  peer_of: dict[str, Tensor] | None, unmask: dict[str, dict]) -> tuple[dict, dict, dict, dict]:
        """One aggregation phase (Eq. 5-6): the owners of layer ``layer``'s pairs, and those due the
        sums ``remote``/``counts`` of the layer below, get one ``propagate`` call each; the server adds
        the replies into per-target sums as they come, in batches of owners that fit the memory budget
        (``owner_batches``), and drops each forwarded sum once sent. Returns the per-target sums and
        counts for the next layer, the row count of every pair per owner, and (secure aggregation)
        what each recipient needs to unmask its sums."""
        targets = [c for c in active if c in requests[layer] or c in remote]
        first = layer == 1 and peer_of is None  # with keys, the first layer's picks came with ``request_keys``
        channels = {t: self.router.channels(route) for t, route in routes.items()} if peer_of is not None else {}

        def arguments(c: str) -> dict[str, Any]:
            call = {"incoming": requests[1].get(c) if first else None, "remote": remote.pop(c, None),
                    "counts": counts.get(c)}
            if peer_of is not None:
                call["unmask"] = unmask.get(c) if call["remote"] is not None else None
                call["mask_to"] = self.recipients(c, channels, peer_of) if c in requests[layer] else None
            return {key: None if v is None else handles.to(c, v) for key, v in call.items()}

        assembly = Assembly(routes, self.clients, self.fewest(layer), self.assembled.setdefault(layer, outbox()))
        sizes: dict[str, dict[str, Tensor]] = {}

        def fold(batch: list[tuple[str, dict]]) -> None:
            replies = {c: {key: handles.back(c, v) for key, v in r.items()} for c, r in batch}
            assembly.add(replies)
            sizes.update({c: r["counts"] for c, r in replies.items()})

        batches = self.owner_batches(layer, targets, routes, nbytes(remote) + nbytes(counts))
        self.transport.call_batches(batches, "propagate", arguments, fold, layer=layer)
        if layer == 1:
            self.count_withheld(requests[1], sizes)
        if self.accountant is not None:
            self.record_releases(layer, routes, sizes)
        if peer_of is not None:
            unmask = self.senders(routes, channels, peer_of, sizes)
        return *assembly.result(), sizes, unmask

    # ---- the memory budget of a cross-client step ---------------------------------------------------------
    def fewest(self, layer: int) -> int:
        """The fewest picks a pair of layer ``layer`` needs to carry a vector (first-layer pairs below
        ``min_aggregate`` are withheld)."""
        return self.opts.min_aggregate if layer == 1 else 1

    def reply_bytes(self, layer: int, routes: dict[str, LayerRoute]) -> tuple[Tensor, int]:
        """Upper bounds, before any owner replies, of each owner's ``propagate`` reply for layer
        ``layer`` (a vector per pair that can carry one, a count per pair) and of the per-target sums
        the server assembles from all of them (a row per target that can receive a vector, a count per
        target), in bytes. Vectors have the layer's input width, in int64 when masked."""
        dtype = torch.int64 if self.cfg.privacy.secure_aggregation else torch.float32
        width = first_linear(self.model, layer - 1).weight.size(1) * dtype.itemsize
        owners = torch.arange(len(self.clients))
        replies, assembled = torch.zeros(len(self.clients), dtype=torch.long), 0
        for route in routes.values():
            sendable = route.sendable(self.fewest(layer))
            owner = torch.repeat_interleave(owners, route.pair_counts)
            replies += torch.bincount(owner[sendable], minlength=owners.numel()) * width + \
                route.pair_counts * torch.int64.itemsize
            assembled += torch.unique(route.target_of_pair[sendable]).numel() * width + \
                int(route.target_counts.sum()) * torch.int64.itemsize
        return replies, assembled

    def owner_batches(self, layer: int, targets: list[str], routes: dict[str, LayerRoute], held: int
                      ) -> list[list[str]]:
        """``targets`` (owners, in order) cut into consecutive batches whose replies fit in what
        ``memory_budget_mb`` leaves beside the per-target sums being assembled and the ``held`` bytes
        of sums still to forward: one batch when everything fits. One owner's reply is one message and
        cannot be split: if it alone does not fit, the step cannot run within the budget."""
        replies, assembled = self.reply_bytes(layer, routes)
        budget = self.opts.memory_budget_mb * 2**20
        room = budget - held - assembled
        batches: list[list[str]] = [[]]
        filled = 0
        for c in targets:
            size = int(replies[self.router.index[c]])
            if size > room:
                raise ConfigError(f"protocol.memory_budget_mb={self.opts.memory_budget_mb:g} is too small for one "
                                  f"cross-client step: layer {layer} needs {mib(held + assembled)} MiB for the "
                                  f"per-target sums and {mib(size)} MiB for the reply of {c}, which cannot be split; "
                                  f"set it to at least {mib(held + assembled + size)} or lower protocol.batch_size "
                                  f"or protocol.fanouts")
            if filled + size > room:
                batches.append([])
                filled = 0
            batches[-1].append(c)
            filled += size
        return batches

    # ---- privacy: keys, masks and the release count of every request -----------------------------------
    def agree_request_keys(self, active: list[str], handles: Handles, first: dict[str, dict]) -> dict[str, Tensor]:
        """Every party, given its first-layer picks ``first``, makes a key pair per request it takes
        part in (``request_keys``); the server relays each request's public keys to its parties as a
        table in random order, without names (``request_peers``). Returns, per trainer, each client's
        row in its request's table (-1: none)."""
        published = {c: handles.back(c, keys) for c, keys in zip(active, self.transport.call_many(
            active, "request_keys", per_target=[{"incoming": handles.to(c, first.get(c, {}))} for c in active]))}
        tables, peer_of = {}, {}
        for trainer in handles.handle:
            members = [c for c in active if trainer in published[c]]
            secrets.SystemRandom().shuffle(members)
            tables[trainer] = torch.stack([published[c][trainer] for c in members])
            peer_of[trainer] = torch.full((len(self.clients),), -1, dtype=torch.long)
            peer_of[trainer][[self.router.index[c] for c in members]] = torch.arange(len(members))
        self.transport.call_many(active, "request_peers", per_target=[
            {"peers": handles.to(c, {t: tables[t] for t in published[c]})} for c in active])
        return peer_of

    def recipients(self, owner: str, channels: dict[str, tuple], peer_of: dict[str, Tensor]) -> dict[str, Tensor]:
        """For each request ``owner`` serves pairs of: the table row of every pair's recipient."""
        me = self.router.index[owner]
        return {t: peer_of[t][recipient[sender == me]] for t, (sender, recipient, _, _) in channels.items()
                if bool((sender == me).any())}

    def senders(self, routes: dict[str, LayerRoute], channels: dict[str, tuple], peer_of: dict[str, Tensor],
                sizes: dict[str, dict]) -> dict[str, dict[str, Tensor]]:
        """For each recipient and request: (target row, sender's table row, rank in the sender's stream)
        of every vector sent towards it (withheld pairs sent none)."""
        out: dict[str, dict[str, Tensor]] = {}
        for t, (sender, recipient, row, rank) in channels.items():
            sent = self.released(routes[t], t, sizes)
            for c in recipient[sent].unique().tolist():
                mine = sent & (recipient == c)
                out.setdefault(self.clients[c], {})[t] = torch.stack([row[mine], peer_of[t][sender[mine]], rank[mine]])
        return out

    def released(self, route: LayerRoute, trainer: str, sizes: dict[str, dict]) -> Tensor:
        """Which pairs of ``route`` (in pair order) were sent with a vector (count not zero), from the
        row counts per pair each owner replied (``sizes``)."""
        owners = [self.clients[c] for c in route.pair_counts.nonzero().flatten().tolist()]
        return torch.cat([sizes[c][trainer] for c in owners]) > 0

    def record_releases(self, layer: int, routes: dict[str, LayerRoute], sizes: dict[str, dict]) -> None:
        """DP: a first-layer sum that was sent is a release of each raw row in it (sensitivity 2 C); a
        hidden-layer sum of n rows may carry any node of its owner in every row (2 n C), so it is charged
        to all of them."""
        if layer == 1:
            for trainer, route in routes.items():
                sent = self.released(route, trainer, sizes)[route.pick_pair]
                self.accountant.charge("embedding", nodes=route.pick_ids[sent])
            return
        for owner, by_trainer in sizes.items():
            counts = torch.cat([torch.zeros(0, dtype=torch.long), *by_trainer.values()])
            counts = counts[counts > 0].double()
            self.accountant.charge("embedding", clients=torch.full(counts.shape, self.router.index[owner]),
                                   multiple=SUBSTITUTION * counts)

    def count_withheld(self, requests: dict[str, dict], sizes: dict[str, dict]) -> None:
        """First-layer pairs (and the picks in them) that their owner withheld (count 0)."""
        for owner, by_trainer in sizes.items():
            for trainer, size in by_trainer.items():
                picks = torch.bincount(requests[owner][trainer]["pair"], minlength=size.numel())
                self.first_layer["pairs"] += size.numel()
                self.first_layer["withheld_pairs"] += int((size == 0).sum())
                self.first_layer["picks"] += int(picks.sum())
                self.first_layer["withheld_picks"] += int(picks[size == 0].sum())

    def apply_secure(self) -> dict[str, float]:
        """``apply`` from the secure sum [Σ gradient, clients, Σ loss] of every client's kept row."""
        self.sums += 1  # each secure sum's label, never used twice
        n = len(self.clients)
        threshold = self.cfg.privacy.secure_threshold(n)
        total, _ = secure_sum(self.transport, self.clients, list(range(n)), self.sums, threshold)
        count = float(total[-2])
        if count <= 0:
            return {"train_loss": math.nan}
        self.optimizer.zero_grad()
        params = list(self.model.parameters())
        for p, g in zip(params, total[:-2].split([p.numel() for p in params])):
            p.grad = (g / count).to(p.dtype).view_as(p)
        self.optimizer.step()
        return {"train_loss": float(total[-1]) / count, "clients": count}

    def apply(self, results: list[dict[str, Any]], remote_share: dict[str, Tensor] | None = None) -> dict[str, float]:
        """θ ← θ − α · mean of the clients' gradients (through the configured optimiser); a trainer's
        gradient includes the remote owners' share when they backpropagate (summed over trainers)."""
        if not results:
            return {"train_loss": math.nan}
        self.optimizer.zero_grad()
        for name, p in self.model.named_parameters():
            total = torch.stack([r["gradient"][name] for r in results]).sum(0)
            p.grad = (total + remote_share[name] if remote_share else total) / len(results)
        self.optimizer.step()
        return {"train_loss": sum(r["loss"] for r in results) / len(results), "clients": float(len(results))}

    # ---- evaluation and checkpoints -------------------------------------------------------------------
    def predict(self, evaluator: Evaluator) -> Tensor:
        return evaluator.full_graph_logits(self.model, self.cfg.model.name)

    def summary(self) -> dict[str, Any]:
        """Cross-client bytes (``cross_traffic``), the iterations in which they moved, and the share
        of first-layer remote pairs and picks withheld by ``min_aggregate``."""
        per_round: dict[int, int] = {}
        for row in self.transport.ledger.rows():
            if row["kind"] == "eval" or row["method"] not in self.cross_traffic:
                continue
            kinds = self.cross_traffic[row["method"]]
            if kinds is None or row["kind"] in kinds:
                per_round[row["round"]] = per_round.get(row["round"], 0) + row["bytes"]
        first = self.first_layer
        dp = {} if self.accountant is None else self.accountant.summary()
        return {
            "bytes_cross_client": sum(per_round.values()),
            "cross_client_iterations": sum(1 for b in per_round.values() if b),
            "withheld_pair_fraction": first["withheld_pairs"] / first["pairs"] if first["pairs"] else None,
            "withheld_pick_fraction": first["withheld_picks"] / first["picks"] if first["picks"] else None,
        } | dp

    def state_dict(self) -> dict[str, Any]:
        dp = {"dp": self.accountant.state()} if self.accountant is not None else {}
        return super().state_dict() | {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                                       "first_layer": dict(self.first_layer), "sums": self.sums} | dp

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.first_layer = dict(state["first_layer"])
        self.sums = max(self.sums, state.get("sums", 0))  # a retry keeps labels used after the checkpoint
        if self.accountant is not None:
            self.accountant.load_state(state["dp"])
