"""What one owner holds of one training client's sampled L-hop neighbourhood (``OwnerPlan``): the node
sets per level, the picks and received partial sums per layer, and the embeddings computed from them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ...models import Backbone, select_rows
from ...models.graph import feature_dropout
from ...models.split_horizontal import block_layer
from ...privacy.secure_aggregation import RequestMasking


@dataclass
class OwnerPlan:
    """What one owner holds of one training client's sampled L-hop neighbourhood.

    ``nodes[l]`` are the owner's local ids needed at level l (level L: the batch; level 0: inputs);
    ``nodes[l]`` is a prefix of ``nodes[l-1]``, so a node's own previous embedding is at the same
    position. Layer l maps level l-1 to level l through the owner's local picks (``src``/``dst``
    positions), partial sums received for ``remote_rows`` and the pairs it serves for others.
    """

    grad: bool
    degree: Tensor  # in-degree of every local node in the graph sampled from (GCN's normalisation)
    nodes: dict[int, Tensor] = field(default_factory=dict)
    picks: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)  # layer -> (dst pos, local nbr id)
    incoming: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)  # layer -> (local id, pair id)
    src: dict[int, Tensor] = field(default_factory=dict)
    dst: dict[int, Tensor] = field(default_factory=dict)
    serve_src: dict[int, Tensor] = field(default_factory=dict)
    serve_pair: dict[int, Tensor] = field(default_factory=dict)
    remote_rows: dict[int, Tensor] = field(default_factory=dict)
    remote_sum: dict[int, Tensor] = field(default_factory=dict)
    remote_count: dict[int, Tensor] = field(default_factory=dict)
    sent: dict[int, Tensor] = field(default_factory=dict)  # sums served for layer l, kept for remote backprop
    h: dict[int, Tensor] = field(default_factory=dict)
    h_in: dict[int, Tensor] = field(default_factory=dict)
    masking: RequestMasking | None = None  # this request's keys (secure aggregation)
    secret_state = frozenset({"masking"})  # the request's private key: never checkpointed (``comm.party_state``)

    def form(self, level: int, num_local: int) -> None:
        """Fix ``nodes[level]``: the level above, its local picks and the picks routed here."""
        if level in self.nodes:
            return
        above = self.nodes.get(level + 1, torch.zeros(0, dtype=torch.long))
        dst, nbr = self.picks.pop(level + 1, (torch.zeros(0, dtype=torch.long),) * 2)
        routed, pair = self.incoming.pop(level + 1, (torch.zeros(0, dtype=torch.long),) * 2)
        pos = torch.full((num_local,), -1, dtype=torch.long)
        pos[above] = torch.arange(above.numel())
        fresh = torch.cat([nbr, routed])
        fresh = torch.unique(fresh[pos[fresh] < 0])
        nodes = torch.cat([above, fresh])
        pos[fresh] = torch.arange(above.numel(), nodes.numel())
        self.nodes[level] = nodes
        self.src[level + 1], self.dst[level + 1] = pos[nbr], dst
        if routed.numel():
            self.serve_src[level + 1], self.serve_pair[level + 1] = pos[routed], pair

    def embeddings(self, level: int, model: Backbone, x: Tensor) -> Tensor:
        """This owner's layer-``level`` embeddings of ``nodes[level]``, computed once per step."""
        if level not in self.h:
            self.form(level, x.size(0))
            with torch.set_grad_enabled(self.grad):
                if level == 0:
                    self.h[0] = select_rows(x, self.nodes[0])
                else:
                    self.h[level] = block_layer(
                        model, level - 1, self.inputs(level - 1, model, x), self.nodes[level].numel(),
                        self.src[level], self.dst[level], self.remote_rows.get(level),
                        self.remote_sum.get(level), self.remote_count.get(level), self.degree[self.nodes[level - 1]])
            if not self.grad:  # nothing differentiates through them later: the received sums are spent
                for received in (self.remote_rows, self.remote_sum, self.remote_count):
                    received.pop(level, None)
        return self.h[level]

    def inputs(self, level: int, model: Backbone, x: Tensor) -> Tensor:
        """The input of layer ``level + 1``: the embeddings after dropout, one mask per node, used
        both for the owner's own targets and for the sums it sends."""
        if level not in self.h_in:
            h = self.embeddings(level, model, x)
            with torch.set_grad_enabled(self.grad):
                self.h_in[level] = feature_dropout(h, model.dropout, model.training)
        return self.h_in[level]

    def reusable(self) -> "OwnerPlan":
        """The same sampled neighbourhood with its received remote sums, for recomputation later."""
        return OwnerPlan(True, self.degree, nodes=dict(self.nodes), src=dict(self.src), dst=dict(self.dst),
                    remote_rows=dict(self.remote_rows), remote_sum=dict(self.remote_sum),
                    remote_count=dict(self.remote_count))
