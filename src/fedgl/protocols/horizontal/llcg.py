"""LLCG (Ramezani et al., 2022) over horizontal subgraphs, the baseline of swift-fedgnn.txt.

Clients train locally, each with its own Adam state that persists across rounds (implementation
facts, LLCG section). Every ``local_steps`` iterations the server averages the client models
weighted by training-node counts and corrects the average with ``server_steps`` optimiser steps
on mini-batches of the *global* graph: nodes drawn uniformly from all nodes, their L-hop
neighbourhood with ``server_fanouts`` (all neighbours by default, the paper's "full-neighbour
training"), the loss on the training nodes among them.

LLCG was designed for a data centre whose server holds the graph. Here the server holds only the
routing table, so for each correction it asks the owners for the neighbour lists (``index``), the
raw feature rows of the sampled nodes (``embedding``) and the labels of the batch's training
nodes (``label``; validation and test labels stay with their owners):
this is what makes LLCG's correction costly, and unlike the Swift-FedGNN family it reveals raw
features to the (trusted) server.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch import Tensor
from torch.nn import functional as F

from ...comm import rpc
from ...config import TrainConfig
from ...errors import ConfigError
from ...optim import make_optimizer
from ...models import as_model_input
from ...models.graph import feature_dropout
from ...models.split_horizontal import block_layer
from ..fedavg.server import weighted_average
from .client import CrossClient
from .server import CrossClientProtocol, MiniBatchOptions
from .shared import FEATURE_DENSITY, sample_hop


class LLCGOptions(MiniBatchOptions):
    local_steps: int = Field(10, ge=1, description="local iterations between server corrections")
    server_steps: int = Field(1, ge=0, description="server correction steps after each averaging")
    server_batch_size: int = Field(256, ge=1, description="nodes drawn from the whole graph per correction step")
    server_fanouts: list[int] | None = Field(None, description="neighbours per layer for the correction, input "
                                                                "layer first; null or -1 = all neighbours")
    server_lr: float | None = Field(None, gt=0, description="correction learning rate; default train.lr")

    def unread(self) -> dict[str, str]:
        """Options this configuration never reads, each with why (``fedgl.session.unread_settings``)."""
        if self.server_steps:
            return {}
        return dict.fromkeys(("server_lr", "server_fanouts", "server_batch_size"),
                             "server_steps is 0, so the server never corrects")


class LLCGClient(CrossClient):
    """A cross-client party that also trains on its own with a persistent optimiser and answers the
    server's requests for neighbour lists and rows."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # made with the party, not at its first step, so a checkpoint's Adam moments have a place to load into
        self.optimizer = make_optimizer(self.model.parameters(), self.train_cfg)

    @rpc(state="model", returns={"state": "model", "num_train": "control", "loss": "control"})
    def local(self, state: dict[str, Tensor] | None = None, upload: bool = False) -> dict[str, Any]:
        """One local iteration (Algorithm 3 with a local optimiser step); optionally upload the model."""
        if state is not None:
            self.model.load_state_dict(state)
        out: dict[str, Any] = {"num_train": int(self.train_idx.numel())}
        if self.train_idx.numel():
            self.optimizer.zero_grad()
            loss = self._loss(self._local_plan())
            loss.backward()
            self.optimizer.step()
            out["loss"] = float(loss.detach())
        if upload:
            out["state"] = self.model.state_dict()
        return out

    @rpc(nodes="index", returns="index")
    def neighbours(self, nodes: Tensor, fanout: int) -> dict[str, Tensor]:
        """Sampled in-neighbours (global ids) of the given local nodes, with their count per node."""
        pos, col = sample_hop(self.full_csr, nodes, fanout, self.generator)
        n = self.x.size(0)
        local = col < n
        ids = torch.empty_like(col)
        ids[local] = self.global_ids[col[local]]
        ids[~local] = self.remote_ids[col[~local] - n]
        return {"count": torch.bincount(pos, minlength=nodes.numel()), "ids": ids}

    @rpc(features="index", labels="index", returns={"x": "embedding", "y": "label", "train": "index"})
    def rows(self, features: Tensor, labels: Tensor) -> dict[str, Tensor]:
        """Feature rows of the sampled nodes ``features``; labels only of the training nodes among
        ``labels`` (their positions in ``train``): validation and test labels never leave the client."""
        train = self.train_mask[labels].nonzero().flatten()
        return {"x": self.x[features], "train": train, "y": self.y[labels[train]]}


class LLCG(CrossClientProtocol):
    name = "llcg"
    Options = LLCGOptions
    client_class = LLCGClient
    cross_traffic = {"neighbours": None, "rows": None}  # the correction's fetches from the owners
    models = ("sage", "gin")  # the correction has no node degrees for GCN's normalisation

    @classmethod
    def paper_sections(cls, options: LLCGOptions) -> dict[str, dict[str, Any]]:
        return {"model": {"name": "sage"}}  # the paper's GraphSAGE, as the shared GCN is refused

    def setup(self, data) -> None:
        fanouts = self.opts.server_fanouts
        if fanouts is not None and (len(fanouts) != self.cfg.model.layers or any(f == 0 or f < -1 for f in fanouts)):
            raise ConfigError(f"protocol.server_fanouts must hold {self.cfg.model.layers} entries, each a positive "
                              f"integer or -1, got {fanouts}")
        super().setup(data)
        self.num_nodes = int(self.router.owner.numel())

    def start(self) -> None:
        """Refuse a run too short to average (checked here, not in ``setup``: partitioning does not fix
        the round count, and a deployed run does not set up)."""
        if self.cfg.train.rounds < self.opts.local_steps:  # the scored model would stay the initial one
            raise ConfigError(f"train.rounds ({self.cfg.train.rounds}) is below protocol.local_steps "
                              f"({self.opts.local_steps}): the server would never average the clients' models")
        super().start()

    def server_optimizer(self) -> torch.optim.Optimizer:
        lr = self.opts.server_lr or self.cfg.train.lr
        return make_optimizer(self.model.parameters(), TrainConfig(**(self.cfg.train.model_dump() | {"lr": lr})))

    def train_round(self, round_index: int) -> dict[str, float]:
        t = round_index - 1
        sync = round_index % self.opts.local_steps == 0
        state = self.model.state_dict() if t % self.opts.local_steps == 0 else None
        replies = self.transport.call_many(self.clients, "local", state=state, upload=sync)
        trained = [r for r in replies if r["num_train"]]
        stats = {"train_loss": sum(r["loss"] for r in trained) / max(len(trained), 1)}
        if sync:
            weights = torch.tensor([float(r["num_train"]) for r in replies])
            self.model.load_state_dict(weighted_average([r["state"] for r in replies], weights))
            for _ in range(self.opts.server_steps):
                stats["server_loss"] = self.correct()
        return stats

    # ---- the server's correction on the global graph ------------------------------------------------
    def correct(self) -> float:
        """One optimiser step of the server model on a mini-batch of the whole graph."""
        local_index = self.router.local_index
        batch = torch.randperm(self.num_nodes, generator=self.generator)[: self.opts.server_batch_size]
        frontier, blocks = batch, []
        fanouts = self.opts.server_fanouts or [-1] * self.levels
        for layer in range(self.levels, 0, -1):
            names, requests = self._by_owner(frontier)
            replies = self.transport.call_many(names, "neighbours", per_target=[
                {"nodes": local_index[frontier[idx]]} for idx in requests], fanout=fanouts[layer - 1])
            dst = torch.cat([torch.repeat_interleave(idx, r["count"]) for idx, r in zip(requests, replies)])
            src_ids = torch.cat([r["ids"] for r in replies])
            pos = torch.full((self.num_nodes,), -1, dtype=torch.long)
            pos[frontier] = torch.arange(frontier.numel())
            fresh = torch.unique(src_ids[pos[src_ids] < 0])
            pos[fresh] = torch.arange(frontier.numel(), frontier.numel() + fresh.numel())
            blocks.append((frontier.numel(), pos[src_ids], dst))
            frontier = torch.cat([frontier, fresh])
        names, requests = self._by_owner(frontier)
        in_batch = [idx[idx < batch.numel()] for idx in requests]
        replies = self.transport.call_many(names, "rows", per_target=[
            {"features": local_index[frontier[idx]], "labels": local_index[frontier[b]]}
            for idx, b in zip(requests, in_batch)])
        x = torch.empty(frontier.numel(), replies[0]["x"].size(1))
        y = torch.full((batch.numel(),), -1, dtype=torch.long)
        for idx, b, r in zip(requests, in_batch, replies):
            x[idx] = r["x"]
            y[b[r["train"]]] = r["y"]
        train = y >= 0
        if not train.any():
            return float("nan")
        self.model.train()
        h = as_model_input(x, FEATURE_DENSITY)
        for layer, (n_dst, src, dst) in enumerate(reversed(blocks)):
            h_in = feature_dropout(h, self.model.dropout, self.model.training)
            h = block_layer(self.model, layer, h_in, n_dst, src, dst)
        loss = F.cross_entropy(h[train], y[train])
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def _by_owner(self, nodes: Tensor) -> tuple[list[str], list[Tensor]]:
        """Positions of ``nodes`` grouped by owning client (clients holding none left out)."""
        owners = self.router.owner[nodes]
        groups = [(owners == c).nonzero().flatten() for c in range(len(self.clients))]
        keep = [c for c, g in enumerate(groups) if g.numel()]
        return [self.clients[c] for c in keep], [groups[c] for c in keep]
