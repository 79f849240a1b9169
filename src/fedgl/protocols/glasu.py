"""GLASU: vertical federated GNN training with lazy aggregation and stale updates.

Clients share the node set; client m holds only its feature block X_m, its own edges E_m and (by
default) the labels. Every GNN layer is a client sub-layer plus a parameter-free server aggregation
(mean or concatenation), performed only at K of the L layers (lazy aggregation). One GLASU round:
the server draws a mini-batch of S training nodes; clients sample their neighbourhoods level by level
while the server takes unions of the index sets at aggregation levels (Algorithm 2); one joint
inference sends H_m^+ up and the aggregate H down at each aggregation level (Algorithm 3); then every
client takes Q local steps that reuse the stored "all but m" representation H_{-m} in place of the
server (Algorithm 4). With one label holder, the holder's gradient with respect to H[L] is broadcast
through the server (Appendix B.2, Algorithms 5-7). The server holds no parameters.

``backward: exact`` replaces the local updates by split learning as in the paper's reference [9]: the
server back-propagates the loss through every aggregation it performed and sends each client the
gradient of its H_m^+, level by level down to the first aggregation, so every update is the exact
gradient of the joint model.

The paper's baselines are configurations of this class (see docs/glasu.md): centralized (one client,
all edges: a single party, so no message at all), standalone (K = 0: clients never communicate),
simulated centralized (every client keeps every edge, K = L, exact backward) and the special cases of
Section 3.5 (K = 1, K = L, ``graph: false``).

With ``privacy.secure_aggregation`` (mean aggregation, local backward) every H_m^+ a client sends is
fixed-point encoded and pairwise masked (``fedgl.privacy.secure_aggregation``), so the server learns
only the mean it forwards. Every client receives every aggregation call, so each client counts its
masked messages and the count, identical at all clients, freshens the masks. With ``privacy.dp`` each
node's row of every H_m^+ a client sends (training and joint inference) is clipped to ``max_norm`` and
noised before it leaves (before masking, ``PrivateRelease``), and the server charges every release of n
rows to every node (``DPAccountant``: the rows come from a locally trained model, docs/privacy.md).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor
from torch.nn import functional as F
from torch_geometric.data import Data

from ..comm import Party, rpc
from ..config import ModelConfig, PartitionConfig, TrainConfig
from ..errors import ConfigError
from ..evaluation import Evaluator
from ..models.split_vertical import (
    ClientNet,
    ForwardPass,
    Plan,
    Rows,
    aggregate,
    backbone_options,
    check_width,
    client_graph,
    combine,
    extract,
    features,
    forward_through,
    full_plan,
    make_plan,
    sample_below,
)
from ..partition import partition_vertical
from ..privacy.dp import SUBSTITUTION, VERTICAL_ROWS, DPAccountant, PrivateRelease
from ..privacy.secure_aggregation import MaskedParty, MaskingClient, decode, encode, exchange_keys, ring_sum
from ..optim import make_optimizer
from .base import Protocol, ProtocolOptions

VERTICAL_BLOCKS = ("contiguous", "random")


class GlasuOptions(ProtocolOptions):
    K: int | None = Field(None, ge=0, description="number of aggregation layers, uniformly spaced with the last "
                                                  "always included; 0 = standalone; default every other layer")
    agg_layers: list[int] | None = Field(None, description="explicit aggregation layers I (1-based, must hold the "
                                                           "last layer L); overrides the uniform spacing")
    Q: int = Field(4, ge=1, description="local updates per joint inference (stale updates; 1 = none)")
    backward: Literal["local", "exact"] = Field(
        "local", description="local: each client differentiates its own loss with the others' representations "
                             "held fixed (GLASU); exact: split learning ([9]), the server back-propagates "
                             "through every aggregation and returns each client its gradient (needs Q = 1)")
    S: int = Field(16, ge=1, description="mini-batch size: training nodes per GLASU round")
    batches: int = Field(16, ge=1, description="GLASU rounds (mini-batches) per training round (between evaluations)")
    fanout: int | list[int] = Field(3, description="sampled neighbours per node (layerwise: on average); one value or "
                                                   "one per layer, input layer first")
    sampling: Literal["layerwise", "nodewise", "full"] = Field(
        "layerwise", description="layerwise: uniform from the neighbours of the level above (paper); nodewise: up to "
                                 "fanout per node (authors' code); full: every neighbour")
    adjacency: Literal["scaled", "induced"] = Field(
        "scaled", description="scaled: rows of the client's normalised adjacency, rescaled to full-row sums (paper); "
                              "induced: normalised inside the sampled subgraph with self-loop weight 2 (authors' code)")
    aggregation: Literal["mean", "concat"] = "mean"
    graph: bool = Field(True, description="false: identity adjacency on every client (conventional vertical FL)")
    eval_client: int | None = Field(None, ge=0, description="client whose classifier scores the nodes; default the "
                                                            "mean of every label holder's logits (client 0 if K = 0)")
    lr_decay_every: int | None = Field(None, ge=1, description="multiply the learning rate by lr_decay every this many "
                                                               "training rounds (the authors' schedule)")
    lr_decay: float = Field(0.25, gt=0, le=1)

    @model_validator(mode="after")
    def _consistent(self) -> "GlasuOptions":
        fanouts = self.fanout if isinstance(self.fanout, list) else [self.fanout]
        if not fanouts or min(fanouts) < 1:
            raise ValueError("fanout must be a positive integer or a non-empty list of them")
        if self.agg_layers is not None:
            if self.K is not None and self.K != len(self.agg_layers):
                raise ValueError(f"K={self.K} disagrees with agg_layers {self.agg_layers}")
            if not self.agg_layers or min(self.agg_layers) < 1 or len(set(self.agg_layers)) != len(self.agg_layers):
                raise ValueError("agg_layers must be distinct layer numbers >= 1 (1-based)")
        if self.backward == "exact" and (self.Q != 1 or self.K == 0):
            raise ValueError(f"backward exact is split learning: it needs Q=1 and K>=1, got Q={self.Q}, K={self.K}")
        return self


def aggregation_levels(opts: GlasuOptions, num_layers: int) -> list[int]:
    """The aggregation levels I (1-based layer numbers, ascending), checked against L."""
    L = num_layers
    if opts.agg_layers is not None:
        levels = sorted(opts.agg_layers)
        if levels[-1] != L:
            raise ConfigError(f"protocol.agg_layers {opts.agg_layers} must include the last layer L={L} "
                              f"(and stay within 1..{L})")
        return levels
    K = max(1, L // 2) if opts.K is None else opts.K
    if K > L:
        raise ConfigError(f"protocol.K={K} exceeds the number of layers model.layers={L}; allowed: 0..{L}")
    return [k * L // K for k in range(1, K + 1)]


def layer_fanouts(opts: GlasuOptions, num_layers: int) -> list[int]:
    if isinstance(opts.fanout, int):
        return [opts.fanout] * num_layers
    if len(opts.fanout) != num_layers:
        raise ConfigError(f"protocol.fanout lists {len(opts.fanout)} values for model.layers={num_layers}; "
                          f"give one value or {num_layers}")
    return list(opts.fanout)


def vertical_blocks(partition: PartitionConfig) -> str:
    """The feature-block method; the horizontal default (never set) means contiguous blocks."""
    if "method" not in partition.model_fields_set and partition.method not in VERTICAL_BLOCKS:
        return "contiguous"
    if partition.method not in VERTICAL_BLOCKS:
        raise ConfigError(f"partition.method {partition.method!r} is not a vertical partition; "
                          f"allowed: {', '.join(VERTICAL_BLOCKS)}")
    return partition.method


def draw(train_nodes: Tensor, size: int, generator: torch.Generator | None) -> Tensor:
    """A mini-batch of ``size`` training nodes in random order; all of them, in their own order, when
    ``size`` covers them (a full batch has no order to draw, and repeats exactly from round to round)."""
    if size >= train_nodes.numel():
        return train_nodes
    return train_nodes[torch.randperm(train_nodes.numel(), generator=generator)[:size]]


def union(top: Tensor, parts: list[Tensor]) -> Tensor:
    """The server's union of the clients' index sets, keeping the common level above first."""
    rest = torch.cat(parts)
    rest = torch.unique(rest[~torch.isin(rest, top)])
    return torch.cat([top, rest])


class GlasuClient(MaskedParty, Party):
    """Client m: its feature block, its edges, its share of the split model and its optimiser.

    Between the calls of one GLASU round it keeps its sampled sets, its forward pass (with the autograd
    graph of the joint inference, reused for the first local step) and the stored H_{-m}.
    """

    def __init__(self, name: str, seed: int, index: int, num_clients: int, x: Tensor, edge_index: Tensor,
                 y: Tensor | None, train_mask: Tensor, model: ModelConfig, train: TrainConfig, num_classes: int,
                 levels: list[int], fanouts: list[int], opts: dict[str, Any]):
        super().__init__(name, seed)
        self.index, self.num_clients = index, num_clients
        self.features, self.y = features(x), y
        self.train_nodes = train_mask.nonzero().flatten() if y is not None else None
        self.levels, self.fanouts = levels, fanouts
        self.L = model.layers
        self.opts = opts
        self.graph = client_graph(edge_index, x.size(0), opts["graph"])
        wide = frozenset(levels) if opts["aggregation"] == "concat" else frozenset()
        options = backbone_options(model.name, model.options)
        self.net = ClientNet(model.name, x.size(1), model.hidden, num_classes if y is not None else None,
                             model.layers, model.dropout, options, wide, num_clients)
        self.optimizer = make_optimizer(self.net.parameters(), train)
        self.rounds_done = 0
        self.last_loss: float | None = None
        self._full = None
        self._eval: ForwardPass | None = None
        self._memo: dict[Any, tuple] = {}  # full sampling: the last sets below and plan (see _below, _prepare)
        self.masker = MaskingClient.create(index) if opts["secure_aggregation"] else None
        self.masked_sent = 0  # masked messages so far: the same count at every client
        self.dp = opts["dp"]
        self.private = PrivateRelease(self.dp, seed) if self.dp is not None else None
        self._reset()

    def _release(self, h: Tensor) -> Tensor:
        """H_m^+ as the others may see it: under DP every node's row clipped to ``max_norm`` and noised."""
        return h if self.dp is None else self.private(h)

    def _send(self, h: Tensor) -> Tensor:
        """H_m^+ as it leaves the client: plain, or encoded and masked for secure aggregation."""
        if self.masker is None:
            return h
        self.masked_sent += 1
        encoded = encode(h.reshape(1, -1), torch.ones(1), self.num_clients)[0]
        return self.masker.mask(encoded, None, self.masked_sent).view(h.shape)

    # ---- one GLASU round ------------------------------------------------------------------------
    def _reset(self) -> None:
        self.sets: dict[int, Tensor] = {}
        self.cursor: int | None = None
        self.run: ForwardPass | None = None
        self.own: Tensor | None = None  # H_m^+ at the current aggregation level, with its graph
        self.shown: Tensor | None = None  # H_m^+ as sent (noised under DP), what the aggregate holds
        self.rest: dict[int, Tensor] = {}  # H_{-m} per aggregation level
        self.pending: float | None = None  # the label holder's first-step loss, already backpropagated
        self.sent: dict[int, Tensor] = {}  # exact backward: H_m^+ per aggregation level, with its graph
        self.received: dict[int, Tensor] = {}  # exact backward: the aggregate H per level, a leaf

    def _draw(self) -> Tensor:
        return draw(self.train_nodes, self.opts["S"], None)

    def _take(self, targets: Tensor | None) -> None:
        """Adopt the common set at the current level (a new round starts at level L)."""
        if self.cursor is None:
            self._reset()
            self.cursor = self.L
        if targets is not None:
            self.sets[self.cursor] = targets

    def _start(self) -> None:
        """A new round whose mini-batch this client draws itself (sole label holder, or standalone)."""
        self.cursor = None
        self._take(self._draw())

    def _prepare(self) -> tuple[Plan, Rows]:
        """The plan of the current sets and the feature rows it reads. With full sampling both are
        functions of the sets, so they are kept and reused while the sets repeat (a full batch has the
        same sets every round), with the transposes built on their first backward pass."""
        sets = [self.sets[level] for level in range(self.L + 1)]
        last = self._memo.get("plan")
        if last is not None and all(torch.equal(a, b) for a, b in zip(last[0], sets)):
            return last[1], last[2]
        prepared = make_plan(self.graph, sets, self.opts["adjacency"]), self.features.select(sets[0])
        if self.opts["sampling"] == "full":
            self._memo["plan"] = (sets, *prepared)
        return prepared

    def _below(self, level: int, above: Tensor) -> Tensor:
        """The set one level below ``above``; full sampling reuses the last one while ``above`` repeats."""
        method = self.opts["sampling"]
        if method != "full":
            return sample_below(self.graph, above, self.fanouts[level], method)
        last = self._memo.get(level)
        if last is None or not torch.equal(last[0], above):
            last = self._memo[level] = (above, sample_below(self.graph, above, self.fanouts[level], method))
        return last[1]

    def _descend(self, bottom: int) -> None:
        for level in range(self.cursor - 1, bottom - 1, -1):
            self.sets[level] = self._below(level, self.sets[level + 1])
        self.cursor = bottom

    @rpc(returns="index")
    def draw_batch(self) -> Tensor:
        """Algorithm 5: the only label holder draws the mini-batch S[L]."""
        self._start()
        return self.sets[self.L]

    @rpc(targets="index", returns="index")
    def sample(self, targets: Tensor | None = None) -> Tensor:
        """Algorithm 2: from the common set at this aggregation level, sample down to the next one below."""
        self._take(targets)
        self._descend(max(level for level in self.levels if level < self.cursor))
        return self.sets[self.cursor]

    @rpc(targets="index", h="embedding", returns="embedding")
    def forward(self, targets: Tensor | None = None, h: Tensor | None = None) -> Tensor:
        """Algorithm 3: compute up to the next aggregation level and send H_m^+ there.

        The first call carries the common set of the lowest aggregation level; later calls carry the
        aggregate H at the previous level, from which the client keeps H_{-m}.
        """
        if self.run is None:
            self._take(targets)
            self._descend(0)
            self.net.train()
            self.optimizer.zero_grad()  # the exact backward accumulates over several calls
            self.run = ForwardPass(self.net, *self._prepare())
        else:
            self._settle(h)
        self.own = self.run.run_to(min(level for level in self.levels if level > self.run.level))
        if self.opts["backward"] == "exact":
            self.sent[self.run.level] = self.own
        self.shown = self._release(self.own.detach())
        return self._send(self.shown)

    def _settle(self, h: Tensor) -> Tensor:
        """Keep H_{-m} = Extract(H, H_m^+) and continue from Agg(H_{-m}, H_m^+) (equal to H, with
        gradients reaching this client's own sub-layers only). With the exact backward, continue from H
        itself, whose gradient goes back to the server."""
        level = self.run.level
        if self.opts["backward"] == "exact":
            h = h.detach().requires_grad_()  # a leaf of this client's own (a Ray host shares one h among its parties)
            self.received[level] = h
            self.run.resume(h)
            return h
        rest = extract(h, self.shown, self.index, self.num_clients, self.opts["aggregation"])
        self.rest[level] = rest
        mine = combine(rest, self.own, self.index, self.num_clients, self.opts["aggregation"])
        self.run.resume(mine)
        return mine

    def _objective(self, top: Tensor, grad: Tensor | None) -> Tensor:
        """Cross-entropy on the batch, or, without labels, the chain-rule surrogate <dL/dH[L], H_m[L]>."""
        if self.net.head is None:
            return (grad * top).sum()
        return F.cross_entropy(self.net.classify(top), self.y[self.sets[self.L]])

    @rpc(h="embedding", returns={"grad": "gradient", "loss": "control"})
    def head_gradient(self, h: Tensor) -> dict[str, Any]:
        """Algorithm 6 (label holder): the loss on H[L] and its gradient with respect to H[L]."""
        top = self._settle(h)
        top.retain_grad()
        loss = self._objective(top, None)
        self.optimizer.zero_grad()
        loss.backward()
        self.pending = loss.item()
        return {"grad": top.grad.detach(), "loss": self.pending}

    @rpc(grad="gradient", returns="gradient")
    def backward(self, grad: Tensor) -> Tensor | None:
        """Split learning ([9]): back-propagate the server's gradient for H_m^+ at the highest pending
        aggregation level through this client's sub-layers; return the gradient for the aggregate H this
        segment started from, or, at the bottom, take the optimiser step and return nothing."""
        level = max(self.sent)
        own = self.sent.pop(level)
        start = max((below for below in self.received if below < level), default=None)
        own.backward(grad, retain_graph=start is not None)  # lower segments share the level-0 graph (GCNII)
        if start is None:
            self.optimizer.step()
            self._finish_round()
            return None
        h = self.received.pop(start)
        return h.grad if h.grad is not None else torch.zeros_like(h)

    @rpc(h="embedding", grad="gradient", returns={"loss": "control"})
    def local_update(self, h: Tensor | None = None, grad: Tensor | None = None) -> dict[str, float]:
        """Algorithm 4 (7): Q local steps; the first reuses the joint inference, the rest recompute the
        client's own sub-layers and stand in for the server with the stored H_{-m}."""
        losses = []
        if self.pending is None:
            loss = self._objective(self._settle(h), grad)
            self.optimizer.zero_grad()
            loss.backward()
            losses.append(loss.item())
        else:
            losses.append(self.pending)
        self.optimizer.step()
        plan, inputs = self.run.plan, self.run.x
        how = self.opts["aggregation"]
        for _ in range(1, self.opts["Q"]):
            top = forward_through(self.net, plan, inputs, self.levels,
                                  lambda level, own: combine(self.rest[level], own, self.index, self.num_clients, how))
            loss = self._objective(top, grad)
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            losses.append(loss.item())
        self._finish_round()
        return {"loss": sum(losses) / len(losses)}

    @rpc()
    def train_alone(self) -> None:
        """Training on local data only (standalone, K = 0, or the single client of a centralized run):
        ``batches`` mini-batches of Q steps, no messages. With one client every aggregation is the
        identity, so this is exactly GLASU with M = 1."""
        losses = []
        self.net.train()
        for _ in range(self.opts["batches"]):
            self._start()
            self._descend(0)
            plan, inputs = self._prepare()
            for _ in range(self.opts["Q"]):
                loss = self._objective(forward_through(self.net, plan, inputs, [], None), None)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                losses.append(loss.item())
            self._finish_round()
        self.last_loss = sum(losses) / len(losses)

    @rpc(returns="control")
    def training_loss(self) -> float:
        """The mean loss of the last ``train_alone`` call, read by the harness as monitoring traffic."""
        return self.last_loss

    def _finish_round(self) -> None:
        self._reset()
        self.rounds_done += 1
        every = self.opts["lr_decay_every"]
        if every and self.rounds_done % (every * self.opts["batches"]) == 0:
            for group in self.optimizer.param_groups:
                group["lr"] *= self.opts["lr_decay"]

    # ---- joint inference on the whole graph ------------------------------------------------------
    @rpc(h="embedding", returns={"h": "embedding", "logits": "prediction"})
    @torch.no_grad()
    def infer(self, h: Tensor | None = None) -> dict[str, Tensor]:
        """Joint inference over every node with full neighbourhoods: H_m^+ at the next aggregation
        level, or this client's logits once H[L] (or its own top level, standalone) is reached."""
        self.net.eval()
        if h is not None and self._eval is None:  # H[L] has arrived: score it
            return {"logits": self.net.classify(h)}
        if h is None:
            if self._full is None:
                self._full = full_plan(self.graph, self.L, self.opts["adjacency"])
            self._eval = ForwardPass(self.net, self._full, self.features)
        else:
            self._eval.resume(h)
        above = [level for level in self.levels if level > self._eval.level]
        level = above[0] if above else self.L
        out = self._eval.run_to(level)
        if level == self.L:
            self._eval = None
        return {"h": self._send(self._release(out))} if above else {"logits": self.net.classify(out)}


class Glasu(Protocol):
    name = "glasu"
    scenario = "vertical"
    Options = GlasuOptions

    def setup(self, data: Data) -> None:
        cfg, opts = self.cfg, self.opts
        model, p = cfg.model, cfg.partition
        self.levels = aggregation_levels(opts, model.layers) if opts.K != 0 else []
        fanouts = layer_fanouts(opts, model.layers)
        options = backbone_options(model.name, model.options)
        check_width(model.name, model.hidden, options)
        if opts.aggregation == "concat" and model.name in ("gcnii", "gcnres"):
            raise ConfigError(f"protocol.aggregation concat changes layer widths, which {model.name}'s residuals "
                              f"cannot follow; use mean, or model.name gcn or gat")
        M = p.num_clients
        self.holder = p.label_holder
        if self.holder is not None and not self.levels:
            raise ConfigError("standalone training (protocol.K=0) needs labels at every client; "
                              "unset partition.label_holder")
        if opts.eval_client is not None:
            if opts.eval_client >= M:
                raise ConfigError(f"protocol.eval_client={opts.eval_client} is not a client; allowed: 0..{M - 1}")
            if self.holder is not None and opts.eval_client != self.holder:
                raise ConfigError(f"protocol.eval_client={opts.eval_client} holds no labels; only client "
                                  f"{self.holder} (partition.label_holder) has a classifier")
        part = partition_vertical(data, M, blocks=vertical_blocks(p), edge_keep=p.edge_keep, seed=cfg.seed,
                                  label_holder=self.holder)
        self.partition_stats = part.stats
        settings = {"S": opts.S, "Q": opts.Q, "batches": opts.batches, "sampling": opts.sampling,
                    "adjacency": opts.adjacency, "aggregation": opts.aggregation, "graph": opts.graph,
                    "backward": opts.backward, "lr_decay_every": opts.lr_decay_every, "lr_decay": opts.lr_decay,
                    "secure_aggregation": cfg.privacy.secure_aggregation, "dp": cfg.privacy.dp}
        if cfg.privacy.secure_aggregation and (opts.aggregation != "mean" or opts.backward != "local"):
            raise ConfigError("glasu: privacy.secure_aggregation sums the clients' representations, so it needs "
                              f"protocol.aggregation mean and backward local (got {opts.aggregation}, {opts.backward})")
        if cfg.privacy.dp is not None and (opts.backward != "local" or self.holder is not None):
            raise ConfigError("glasu: privacy.dp noises the representations clients send, not the gradients that "
                              "backward exact or a label holder (partition.label_holder) sends; use backward local "
                              "and labels at every client")
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
                 opts=settings)
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

    def start(self) -> None:
        if self.cfg.privacy.secure_aggregation and not self.alone:
            exchange_keys(self.transport, self.clients)

    def _aggregate(self, outs: list[Tensor]) -> Tensor:
        """Agg of the clients' H_m^+; with secure aggregation the mean decoded from the masked sum."""
        if not self.cfg.privacy.secure_aggregation:
            return aggregate(outs, self.opts.aggregation)
        return (decode(ring_sum(torch.stack(outs))) / len(outs)).to(torch.get_default_dtype())

    # ---- training ---------------------------------------------------------------------------------
    def train_round(self, round_index: int) -> dict[str, float]:
        if self.alone:
            self.transport.call_many(self.clients, "train_alone")
            with self.transport.evaluation():
                losses = self.transport.call_many(self.clients, "training_loss")
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

    def charge(self, sizes: list[int]) -> None:
        """DP: every client releases a set of n rows per entry of ``sizes``, each set at most 2 sqrt(n)
        max_norm from its neighbour in L2, for any node."""
        rows = torch.tensor(sizes, dtype=torch.float64).repeat(len(self.clients))
        self.accountant.charge(clients=torch.zeros(rows.numel()), multiple=SUBSTITUTION * rows.sqrt())

    def _glasu_round(self) -> tuple[float, int]:
        """One mini-batch: sampling with unions, joint inference, Q local updates. Returns the loss and
        the number of node rows aggregated (summed over aggregation levels)."""
        t, clients, how = self.transport, self.clients, self.opts.aggregation
        if self.holder is None:
            top = draw(self.train_nodes, self.opts.S, self.generator)
            args = [{"targets": top} for _ in clients]
        else:
            top = t.call(clients[self.holder], "draw_batch")
            args = [{} if m == self.holder else {"targets": top} for m in range(len(clients))]
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
            outs = t.call_many(clients, "forward", h=h)
        if exact:
            return self._exact_backward(h, stack), rows
        if self.holder is None:
            replies = t.call_many(clients, "local_update", h=h)
            return sum(r["loss"] for r in replies) / len(replies), rows
        head = t.call(clients[self.holder], "head_gradient", h=h)
        per = [{} if m == self.holder else {"h": h, "grad": head["grad"]} for m in range(len(clients))]
        t.call_many(clients, "local_update", per_target=per)
        return head["loss"], rows

    def _exact_backward(self, h: Tensor, stack: list[tuple[list[Tensor], Tensor]]) -> float:
        """Split learning: the sum of the label holders' losses (as in the authors' code), back-propagated
        through every aggregation; returns their mean loss.

        The gradient for H[L] is the sum of the holders' gradients; at each aggregation level the
        server differentiates Agg for each client's share, and the gradients the clients return for
        the aggregate below (which fed every client's sub-layers) add up."""
        t, clients = self.transport, self.clients
        heads = clients if self.holder is None else [clients[self.holder]]
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
        """Joint inference over all nodes; the scoring clients' logits are averaged."""
        t = self.transport
        if self.alone:
            return torch.stack([r["logits"] for r in t.call_many(self.heads, "infer")]).mean(0)
        if self.accountant is not None:  # joint inference sends every node's row at every level
            self.charge([self.num_nodes] * len(self.levels))
        outs = t.call_many(self.clients, "infer")
        for level in self.levels:
            h = self._aggregate([o["h"] for o in outs])
            if level != self.levels[-1]:
                outs = t.call_many(self.clients, "infer", h=h)
        return torch.stack([r["logits"] for r in t.call_many(self.heads, "infer", h=h)]).mean(0)

    # ---- results and checkpoints -------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        return {} if self.accountant is None else self.accountant.summary()

    def state_dict(self) -> dict[str, Any]:
        dp = {"dp": self.accountant.state()} if self.accountant is not None else {}
        return super().state_dict() | dp

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.accountant is not None:
            self.accountant.load_state(state["dp"])
