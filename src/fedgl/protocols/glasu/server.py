"""GLASU's server: the mini-batch and the unions of the clients' index sets, the aggregations at the
aggregation levels (secure sums with secure aggregation) and, with ``backward: exact``, split learning's
gradients back through them. It holds no parameters."""

from __future__ import annotations

from typing import Any, Callable, Collection

import torch
from torch import Tensor
from torch_geometric.data import Data

from ...errors import ConfigError, RunFailed
from ...evaluation import Evaluator
from ...models.split_vertical import aggregate, backbone_options, check_width
from ...partition import partition_vertical
from ...privacy.dp import SUBSTITUTION, VERTICAL_ROWS, DPAccountant
from ...privacy.secure_aggregation import MIN_PARTICIPANTS
from ..aggregation import check_secure_round, secure_sum, trust_identities
from ..base import Protocol
from .client import GlasuClient, draw
from .options import GlasuOptions, aggregation_levels, layer_fanouts, vertical_blocks


def union(top: Tensor, parts: list[Tensor]) -> Tensor:
    """The server's union of the clients' index sets, keeping the common level above first."""
    rest = torch.cat(parts)
    rest = torch.unique(rest[~torch.isin(rest, top)])
    return torch.cat([top, rest])


class Glasu(Protocol):
    name = "glasu"
    scenario = "vertical"
    Options = GlasuOptions

    @classmethod
    def paper_sections(cls, options: GlasuOptions) -> dict[str, dict[str, Any]]:
        # feature blocks, not the horizontal default (METIS), so the config a run saves names what it ran
        return {"partition": {"method": "contiguous"}}

    sums = 0  # mean aggregations so far (training and inference): each secure sum's label, never used twice
    # the parties that do not answer a step of aggregation number k (``absent(k, step)``; "input": the
    # upload of H_m^+); the server's timeouts (a run in one process never times out, so None)
    absent: Callable[[int, str], Collection[str]] | None = None
    lost: tuple[str, ...] = ()  # parties lost in an aggregation: left out of every call and mean from then on

    def setup(self, data: Data) -> None:
        cfg, opts = self.cfg, self.opts
        model, p = cfg.model, cfg.partition
        self.levels = aggregation_levels(opts, model.layers) if opts.K != 0 else []
        fanouts = layer_fanouts(opts, model.layers)
        options = backbone_options(model.name, model.options)
        check_width(model.name, model.hidden, options)
        M = p.num_clients
        self.holder = p.label_holder
        self._refuse_unfit(M)
        part = partition_vertical(data, M, blocks=vertical_blocks(p), edge_keep=p.edge_keep, seed=cfg.seed,
                                  label_holder=self.holder)
        self.partition_stats = part.stats
        settings = {"S": opts.S, "Q": opts.Q, "batches": opts.batches, "sampling": opts.sampling,
                    "adjacency": opts.adjacency, "aggregation": opts.aggregation, "graph": opts.graph,
                    "backward": opts.backward, "inference": opts.inference, "lr_decay_every": opts.lr_decay_every,
                    "lr_decay": opts.lr_decay}
        self.num_nodes = data.num_nodes
        # every node has a block at every client: one accounting owner for all of them
        self.accountant = (DPAccountant(cfg.privacy.dp, torch.zeros(data.num_nodes), VERTICAL_ROWS)
                           if cfg.privacy.dp is not None else None)
        # One client (centralized) holds everything: every aggregation is the identity, nothing is sent.
        self.alone = not self.levels or M == 1
        self.clients = self.transport.spawn(GlasuClient, [
            dict(name=f"client{m}", seed=cfg.seed * 100_003 + m + 1, index=m, num_clients=M, x=shard.x,
                 edge_index=shard.edge_index, y=shard.y, train_mask=shard.train_mask, model=model, train=cfg.train,
                 num_classes=part.num_classes, levels=[] if self.alone else self.levels, fanouts=fanouts,
                 opts=settings, privacy=cfg.privacy)
            for m, shard in enumerate(part.shards)
        ])
        # Algorithm 2: with labels everywhere the server draws the mini-batches, so it knows the training ids.
        self.train_nodes = data.train_mask.nonzero().flatten() if self.holder is None else None
        if opts.eval_client is not None:
            self.heads = [self.clients[opts.eval_client]]
        elif self.holder is not None:
            self.heads = [self.clients[self.holder]]
        else:
            self.heads = self.clients[:1] if self.alone else self.clients

    def _refuse_unfit(self, M: int) -> None:
        """One line for a setting this run cannot honour, before anything is partitioned or spawned."""
        cfg, opts, model = self.cfg, self.opts, self.cfg.model
        if opts.aggregation == "concat" and model.name in ("gcnii", "gcnres"):
            raise ConfigError(f"protocol.aggregation concat changes layer widths, which {model.name}'s residuals "
                              f"cannot follow; use mean, or model.name gcn or gat")
        if self.holder is not None and not self.levels:
            raise ConfigError("standalone training (protocol.K=0) needs labels at every client; "
                              "unset partition.label_holder")
        if opts.eval_client is not None:
            if opts.eval_client >= M:
                raise ConfigError(f"protocol.eval_client={opts.eval_client} is not a client; allowed: 0..{M - 1}")
            if self.holder is not None and opts.eval_client != self.holder:
                raise ConfigError(f"protocol.eval_client={opts.eval_client} holds no labels; only client "
                                  f"{self.holder} (partition.label_holder) has a classifier")
        for key, value in (("inference", "sampled"), ("train_clients", "scoring")):
            if getattr(opts, key) == value and self.levels and M > 1:
                raise ConfigError(f"protocol.{key} {value} is for clients that never aggregate; it needs "
                                  "protocol.K=0 (standalone) or partition.num_clients=1 (centralized)")
        if cfg.privacy.secure_aggregation and (opts.aggregation != "mean" or opts.backward != "local"):
            raise ConfigError("glasu: privacy.secure_aggregation sums the clients' representations, so it needs "
                              f"protocol.aggregation mean and backward local (got {opts.aggregation}, {opts.backward})")
        if cfg.privacy.secure_aggregation and self.levels and M > 1:
            check_secure_round(cfg.privacy, M, "glasu")
        if cfg.privacy.dp is not None and (opts.backward != "local" or self.holder is not None):
            raise ConfigError("glasu: privacy.dp noises the representations clients send, not the gradients that "
                              "backward exact or a label holder (partition.label_holder) sends; use backward local "
                              "and labels at every client")

    def start(self) -> None:
        if self.cfg.privacy.secure_aggregation and not self.alone:
            trust_identities(self.transport, self.clients, self.cfg.privacy)

    @property
    def active(self) -> list[int]:
        """The ids of the clients not lost: every call and every mean is over them."""
        return [m for m, name in enumerate(self.clients) if name not in self.lost]

    @property
    def members(self) -> list[str]:
        """The parties of those clients."""
        return [name for name in self.clients if name not in self.lost]

    @property
    def scorers(self) -> list[str]:
        """The parties not lost whose classifiers score the nodes."""
        return [name for name in self.heads if name not in self.lost]

    def _aggregate(self, outs: list[Tensor | None]) -> Tensor:
        """Agg of the active clients' H_m^+ (``outs``, one each, None under secure aggregation): the
        mean over the clients that deliver, from the decoded ``secure_sum`` with secure aggregation.
        Clients that do not deliver are lost for the rest of the run (``_lose``)."""
        self.sums += 1
        label, ids = self.sums, self.active
        absent = None if self.absent is None else (lambda step: self.absent(label, step))
        if self.cfg.privacy.secure_aggregation:
            threshold = self.cfg.privacy.secure_threshold(len(self.clients))
            total, kept = secure_sum(self.transport, self.members, ids, label, threshold, absent)
            h = (total / len(kept)).to(torch.get_default_dtype())
        else:
            gone = set(absent("input")) if absent is not None else set()
            kept = [m for m in ids if self.clients[m] not in gone]
            h = aggregate([out for m, out in zip(ids, outs) if m in kept], self.opts.aggregation)
        self._lose([m for m in ids if m not in kept])
        return h

    def _lose(self, lost: list[int]) -> None:
        """Go on without the clients ``lost`` in an aggregation: the others are told how many clients
        every mean is over from now on (their extract and local stand-in divide by it)."""
        if not lost:
            return
        self.lost = (*self.lost, *(self.clients[m] for m in lost))
        names = ", ".join(self.clients[m] for m in lost)
        if self.opts.aggregation != "mean":
            raise RunFailed(f"glasu lost {names}: aggregation concat cannot go on without their feature blocks")
        if not self.scorers:
            raise RunFailed(f"glasu lost {names}: no client left to score the nodes (label holder or eval_client)")
        if self.cfg.privacy.secure_aggregation and len(self.active) < MIN_PARTICIPANTS:
            raise RunFailed(f"glasu lost {names}: {len(self.active)} clients remain, a secure sum needs "
                            f"{MIN_PARTICIPANTS}")
        self.transport.call_many(self.members, "regroup", count=len(self.active))

    # ---- training ---------------------------------------------------------------------------------
    def train_round(self, round_index: int) -> dict[str, float]:
        if self.alone:
            trained = self.heads if self.opts.train_clients == "scoring" else self.clients
            self.transport.call_many(trained, "train_alone")
            with self.transport.evaluation():
                losses = self.transport.call_many(trained, "training_loss")
            return {"train_loss": sum(losses) / len(losses), **self.spent()}
        losses, rows = [], 0
        for _ in range(self.opts.batches):
            loss, n = self._glasu_round()
            losses.append(loss)
            rows += n
        return {"train_loss": sum(losses) / len(losses), "embedding_rows": float(rows), **self.spent()}

    def spent(self) -> dict[str, float]:
        """DP: epsilon so far, for any one node (every release costs every node the same)."""
        return {} if self.accountant is None else self.accountant.epsilons()

    def charge(self, sizes: list[int], senders: int | None = None) -> None:
        """DP: each of ``senders`` clients (None: every active one) releases a set of n rows per entry of
        ``sizes``, each set at most 2 sqrt(n) max_norm from its neighbour in L2, for any node."""
        count = len(self.active) if senders is None else senders
        rows = torch.tensor(sizes, dtype=torch.float64).repeat(count)
        self.accountant.charge(clients=torch.zeros(rows.numel()), multiple=SUBSTITUTION * rows.sqrt())

    def _glasu_round(self) -> tuple[float, int]:
        """One mini-batch: sampling with unions, joint inference, Q local updates. Returns the loss and
        the number of node rows aggregated (summed over aggregation levels)."""
        t, clients, how = self.transport, self.members, self.opts.aggregation
        if self.holder is None:
            top = draw(self.train_nodes, self.opts.S, self.generator)
            args = [{"targets": top} for _ in clients]
        else:
            top = t.call(self.clients[self.holder], "draw_batch")
            args = [{} if m == self.holder else {"targets": top} for m in self.active]
        sets = [top]  # the common node set of every aggregation level, L first
        for _ in self.levels[:-1]:
            top = union(top, t.call_many(clients, "sample", per_target=args))
            args = [{"targets": top} for _ in clients]
            sets.append(top)
        if self.accountant is not None:  # every client sends one row per node of every level's set
            self.charge([s.numel() for s in sets])
        outs = t.call_many(clients, "forward", per_target=args)
        rows, stack = 0, []
        exact = self.opts.backward == "exact"
        for level in self.levels:
            if exact:  # keep the clients' parts and Agg's graph, to back-propagate through it
                outs = [o.requires_grad_() for o in outs]
                stack.append((outs, aggregate(outs, how)))
                h = stack[-1][1].detach()
            else:
                h = self._aggregate(outs)
            rows += h.size(0)
            if level == self.levels[-1]:
                break
            outs = t.call_many(self.members, "forward", h=h)
        if exact:
            return self._exact_backward(h, stack), rows
        if self.holder is None:
            replies = t.call_many(self.members, "local_update", h=h)
            return sum(r["loss"] for r in replies) / len(replies), rows
        head = t.call(self.clients[self.holder], "head_gradient", h=h)
        per = [{} if m == self.holder else {"h": h, "grad": head["grad"]} for m in self.active]
        t.call_many(self.members, "local_update", per_target=per)
        return head["loss"], rows

    def _exact_backward(self, h: Tensor, stack: list[tuple[list[Tensor], Tensor]]) -> float:
        """Split learning: the sum of the label holders' losses (as in the authors' code), back-propagated
        through every aggregation; returns their mean loss.

        The gradient for H[L] is the sum of the holders' gradients; at each aggregation level the
        server differentiates Agg for each client's share, and the gradients the clients return for
        the aggregate below (which fed every client's sub-layers) add up."""
        t, clients = self.transport, self.members
        heads = clients if self.holder is None else [self.clients[self.holder]]
        replies = t.call_many(heads, "head_gradient", h=h)
        grad = sum(r["grad"] for r in replies)
        for parts, aggregated in reversed(stack):
            shares = torch.autograd.grad(aggregated, parts, grad)
            below = t.call_many(clients, "backward", per_target=[{"grad": share} for share in shares])
            if below[0] is not None:
                grad = sum(below)
        return sum(r["loss"] for r in replies) / len(replies)

    # ---- evaluation -------------------------------------------------------------------------------
    def predict(self, evaluator: Evaluator) -> torch.Tensor:
        """Joint inference over all nodes; the scoring clients' logits are averaged. Under DP each
        scorer's logits of every node are one more release of n rows (the server knows the H[L] they
        score, so they would show the scorer's head), charged before they are asked for."""
        t = self.transport
        h = None if self.alone else self._joint_inference()
        if self.accountant is not None:
            self.charge([self.num_nodes], senders=len(self.scorers))
        replies = t.call_many(self.scorers, "infer") if h is None else t.call_many(self.scorers, "infer", h=h)
        return torch.stack([r["logits"] for r in replies]).mean(0)

    def _joint_inference(self) -> Tensor:
        """H[L] of every node: the members' rows aggregated level by level (every row charged under DP)."""
        t = self.transport
        if self.accountant is not None:  # joint inference sends every node's row at every level
            self.charge([self.num_nodes] * len(self.levels))
        outs = t.call_many(self.members, "infer")
        for level in self.levels:
            h = self._aggregate([o["h"] for o in outs])
            if level != self.levels[-1]:
                outs = t.call_many(self.members, "infer", h=h)
        return h

    # ---- results and checkpoints -------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {} if self.accountant is None else self.accountant.summary()

    def state_dict(self) -> dict[str, Any]:
        dp = {"dp": self.accountant.state()} if self.accountant is not None else {}
        return super().state_dict() | {"sums": self.sums, "lost": list(self.lost)} | dp

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # a retry reloads the checkpoint into this live server, whose clients keep the labels they used
        # since (secrets are not rolled back): go on after both, never back
        self.sums = max(self.sums, state.get("sums", 0))  # (no "sums": a checkpoint from before labels)
        self.lost = tuple(state.get("lost", ()))
        if self.accountant is not None:
            self.accountant.load_state(state["dp"])
