"""GLASU's client party: its feature block, its edges, its share of the split model and its optimiser."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from ...comm import Party, rpc
from ...config import ModelConfig, TrainConfig
from ...errors import ConfigError
from ...models.split_vertical import (
    BatchPlan,
    ClientNet,
    FeatureRows,
    ForwardPass,
    backbone_options,
    client_graph,
    combine,
    extract,
    features,
    forward_through,
    full_plan,
    make_plan,
    sample_below,
)
from ...optim import make_optimizer
from ...privacy import PrivacyConfig
from ...privacy.bonawitz import SecAggClient
from ...privacy.dp import PrivateRelease
from ...privacy.secure_aggregation import encode
from ..aggregation import SecureSumParty


def draw(train_nodes: Tensor, size: int, generator: torch.Generator | None) -> Tensor:
    """A mini-batch of ``size`` training nodes in random order; all of them, in their own order, when
    ``size`` covers them (a full batch has no order to draw, and repeats exactly from round to round)."""
    if size >= train_nodes.numel():
        return train_nodes
    return train_nodes[torch.randperm(train_nodes.numel(), generator=generator)[:size]]


class GlasuClient(SecureSumParty, Party):
    """Client m: its feature block, its edges, its share of the split model and its optimiser.

    Between the calls of one GLASU round it keeps its sampled sets, its forward pass (with the autograd
    graph of the joint inference, reused for the first local step) and the stored H_{-m}.
    """

    def __init__(self, name: str, seed: int, index: int, num_clients: int, x: Tensor, edge_index: Tensor,
                 y: Tensor | None, train_mask: Tensor, model: ModelConfig, train: TrainConfig, num_classes: int,
                 levels: list[int], fanouts: list[int], opts: dict[str, Any], privacy: PrivacyConfig | None = None):
        super().__init__(name, seed)
        self.index = index
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
        self.members = num_clients  # the clients the mean is over: fewer once the server has lost some
        if privacy is None and (opts.get("dp") is not None or opts.get("secure_aggregation")):
            raise ConfigError(f"{name}: its shard holds privacy settings where GLASU's clients no longer read them "
                              f"(written by an older fedgl); partition again")
        privacy = privacy or PrivacyConfig()
        self.secagg = SecAggClient.create(index) if privacy.secure_aggregation and levels else None
        self.dp = privacy.dp
        self.private = PrivateRelease(self.dp, seed) if self.dp is not None else None
        self._reset()

    def _release(self, h: Tensor) -> Tensor:
        """H_m^+ or logits as the others may see them: under DP every node's row clipped to ``max_norm``
        and noised (the server accounts for every release, ``Glasu.charge``)."""
        return h if self.dp is None else self.private(h)

    def _scores(self, logits: Tensor) -> dict[str, Tensor]:
        """This client's logits as they leave it: a release like H_m^+, since the server knows the H[L]
        they score and would otherwise solve them for the head trained on this client's labels."""
        return {"logits": self._release(logits)}

    def _send(self, h: Tensor) -> Tensor | None:
        """H_m^+ as it leaves the client: plain, or, for secure aggregation, nothing yet: it is kept in
        fixed point for the secure sum that follows (``secagg_input`` sends it masked)."""
        if self.secagg is None:
            return h
        self.secure_value = encode(h.reshape(1, -1), torch.ones(1), self.members)[0].view(h.shape)
        return None

    @rpc(label="control", senders="control", sealed="control", returns="embedding")
    def secagg_input(self, label: int, senders: Tensor, sealed: Tensor) -> Tensor:
        """The masked H_m^+ (``SecureSumParty``'s step), sent as the representation it carries."""
        return super().secagg_input(label, senders, sealed)

    @rpc(count="control")
    def regroup(self, count: int) -> None:
        """The server lost clients: from now on every mean is over ``count`` clients."""
        self.members = count

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

    def _prepare(self) -> tuple[BatchPlan, FeatureRows]:
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
        rest = extract(h, self.shown, self.index, self.members, self.opts["aggregation"])
        self.rest[level] = rest
        mine = combine(rest, self.own, self.index, self.members, self.opts["aggregation"])
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
                                  lambda level, own: combine(self.rest[level], own, self.index, self.members, how))
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
        level, or this client's logits once H[L] (or its own top level, standalone) is reached; both
        released as in training (noised under DP)."""
        self.net.eval()
        if not self.levels and self.opts.get("inference") == "sampled":
            return self._scores(self._sampled_logits())
        if h is not None and self._eval is None:  # H[L] has arrived: score it
            return self._scores(self.net.classify(h))
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
        return {"h": self._send(self._release(out))} if above else self._scores(self.net.classify(out))

    def _sampled_logits(self) -> Tensor:
        """Every node's logits as the authors' code scores them: batches of S nodes in order, each through
        the sampled training pipeline (fan-out, adjacency) instead of its full neighbourhood."""
        logits = []
        for batch in torch.arange(self.graph.num_nodes).split(self.opts["S"]):
            self.cursor = None
            self._take(batch)
            self._descend(0)
            plan, inputs = self._prepare()
            logits.append(self.net.classify(forward_through(self.net, plan, inputs, [], None)))
        self._reset()
        return torch.cat(logits)
