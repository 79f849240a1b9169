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
only its recipient (the target's owner) can remove the masks from the total the server forwards; with
``dp`` every row an owner sums is clipped and every partial sum noised, and the server counts the
noised releases each node's row went into (``ReleaseAccountant``).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import Field, field_validator
from torch import Tensor, nn
from torch.nn import functional as F
from torch_geometric.data import Data

from ..comm import rpc
from ..comm.payload import nbytes
from ..config import ModelConfig, TrainConfig
from ..errors import ConfigError
from ..evaluation import Evaluator
from ..models import Backbone, make_model, select_rows
from ..models.graph import canonical_model_name, feature_dropout, feature_linear
from ..partition import horizontal_from_config
from ..privacy import PrivacyConfig
from ..privacy.dp import Accountant, ReleaseAccountant, clip, gaussian, noise_generator
from ..privacy.secure_aggregation import (MaskedParty, MaskingClient, RequestMasking, decode, encode,
                                          exchange_keys, ring_sum)
from ..sampling import CSR
from ..optim import make_optimizer
from .base import Protocol, ProtocolOptions
from .horizontal_client import HorizontalClient, sample_hop
from .routing import OWN, Assembly, Handles, LayerRoute, Router

# Element-wise aggregators: mean (GraphSAGE), sum (GIN), degree-normalised sum (GCN).
SPLITTABLE = ("sage", "gin", "gcn")


# ---- the backbone's layers applied to aggregates assembled elsewhere --------------------------------
def check_model(model: ModelConfig, allowed: tuple[str, ...] = SPLITTABLE) -> None:
    name = canonical_model_name(model.name)
    if name not in allowed:
        raise ConfigError(f"model.name {model.name!r} cannot be split across clients here (cross-client "
                          f"aggregation needs an element-wise aggregator); allowed: {', '.join(allowed)}")


def _first_linear(model: Backbone, layer: int) -> nn.Linear:
    conv = model.layers[layer]
    return {"sage": lambda: conv.lin_l, "gin": lambda: conv.nn[0], "gcn": lambda: conv.lin}[model.name]()


def source_scale(model: Backbone, degree: Tensor) -> Tensor | None:
    """GCN's source half of D^-1/2 (A + I) D^-1/2: a node's row is scaled by (deg + 1)^-1/2 by its
    owner (who knows the node's in-degree) before it is summed; None for the other backbones."""
    return (degree + 1).rsqrt().unsqueeze(1) if model.name == "gcn" else None


def neigh(model: Backbone, layer: int, h: Tensor) -> Tensor:
    """The bias-free linear map GraphSAGE, GIN and GCN apply to the neighbour aggregate of layer
    ``layer``. It is linear, so it is applied to each party's rows or partial sums before adding."""
    return feature_linear(h, _first_linear(model, layer).weight)


def update(model: Backbone, layer: int, h_self: Tensor, neigh_sum: Tensor, neigh_count: Tensor,
           degree: Tensor | None = None) -> Tensor:
    """Layer ``layer`` (as the backbone's own layer computes it) from the nodes' own (dropped-out)
    inputs and the sum, through ``neigh``, and count of their neighbours' inputs. GCN also needs the
    nodes' in-degrees: its target half scales the (source-scaled) sum by (deg + 1)^-1/2 and by
    deg / count, so a sampled sum estimates the full one and all neighbours give the exact layer."""
    conv = model.layers[layer]
    if model.name == "sage":
        out = neigh_sum / neigh_count.clamp(min=1).unsqueeze(1) + conv.lin_l.bias + \
            feature_linear(h_self, conv.lin_r.weight)
    elif model.name == "gcn":
        d = degree.unsqueeze(1)
        out = neigh_sum * (d / neigh_count.clamp(min=1).unsqueeze(1) / (d + 1).sqrt()) + \
            neigh(model, layer, h_self) / (d + 1) + conv.bias
    else:
        bias = conv.nn[0].bias
        out = conv.nn[2](F.relu(neigh_sum + (1 + conv.eps) * neigh(model, layer, h_self) + bias))
    return model.activation(out) if layer < model.num_layers - 1 else out


def block_layer(model: Backbone, layer: int, h_in: Tensor, n_dst: int, src: Tensor, dst: Tensor,
                extra_rows: Tensor | None = None, extra_sum: Tensor | None = None,
                extra_count: Tensor | None = None, degree: Tensor | None = None) -> Tensor:
    """Layer ``layer`` for the first ``n_dst`` rows of ``h_in`` (the layer's input, after dropout)
    from edges src -> dst (positions), plus partial sums of input rows (and their row counts)
    received from other parties for rows ``extra_rows``; ``degree``: in-degrees of ``h_in``'s rows
    (GCN only; received sums come source-scaled)."""
    projected = neigh(model, layer, h_in)
    if model.name == "gcn":
        projected = projected * source_scale(model, degree)
    total = torch.zeros(n_dst, projected.size(1)).index_add(0, dst, projected[src])
    count = torch.bincount(dst, minlength=n_dst).float()
    if extra_rows is not None and extra_rows.numel():
        total = total.index_add(0, extra_rows, neigh(model, layer, extra_sum))
        count = count.index_add(0, extra_rows, extra_count.float())
    own = h_in[:n_dst] if h_in.layout == torch.strided else select_rows(h_in, torch.arange(n_dst))
    return update(model, layer, own, total, count, None if degree is None else degree[:n_dst])


def _grad(t: Tensor) -> Tensor:
    """The gradient accumulated in ``t`` (zeros where nothing reached it)."""
    return t.grad.detach().clone() if t.grad is not None else torch.zeros_like(t.detach())


def mib(size: int) -> str:
    """``size`` bytes in MiB, rounded up to two decimals (what a budget must at least be)."""
    return f"{math.ceil(size / 2**20 * 100) / 100:.2f}"


def dense_rows(h: Tensor, index: Tensor) -> Tensor:
    rows = select_rows(h, index)
    return rows if rows.layout == torch.strided else rows.to_dense()


# ---- one party's share of one training client's sampled computation graph --------------------------
@dataclass
class Plan:
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

    def reusable(self) -> "Plan":
        """The same sampled neighbourhood with its received remote sums, for recomputation later."""
        return Plan(True, self.degree, nodes=dict(self.nodes), src=dict(self.src), dst=dict(self.dst),
                    remote_rows=dict(self.remote_rows), remote_sum=dict(self.remote_sum),
                    remote_count=dict(self.remote_count))


# ---- the client ----------------------------------------------------------------------------------
class CrossClient(MaskedParty, HorizontalClient):
    """A client holding one horizontal shard: trains on it and serves partial sums to others."""

    def __init__(self, name: str, seed: int, shard: Any, model: ModelConfig, train: TrainConfig,
                 num_features: int, num_classes: int, batch_size: int | None, fanouts: list[int],
                 min_aggregate: int = 2, remote_backprop: bool = False, privacy: PrivacyConfig | None = None,
                 index: int = 0):
        super().__init__(name, seed, shard, model, num_features, num_classes)
        self.privacy = privacy or PrivacyConfig()
        self.masker = MaskingClient.create(index) if self.privacy.secure_aggregation else None
        self.noise = noise_generator(seed) if self.privacy.dp is not None else None
        self.train_cfg = train
        self.batch_size = batch_size
        self.fanouts = list(fanouts)
        self.min_aggregate = min_aggregate
        self.remote_backprop = remote_backprop
        n = self.x.size(0)
        self.degree = {"local": self.local_csr.rowptr.diff().float(), "full": self.full_csr.rowptr.diff()[:n].float()}
        self.plans: dict[str, Plan] = {}
        self.reuse: Plan | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    @property
    def levels(self) -> int:
        return self.model.num_layers

    # ---- building plans ------------------------------------------------------------------------
    def _batch(self) -> Tensor:
        idx = self.train_idx
        if self.batch_size is None or self.batch_size >= idx.numel():
            return idx
        return idx[torch.randperm(idx.numel(), generator=self.generator)[: self.batch_size]]

    def _sample(self, plan: Plan, level: int, csr: CSR) -> dict[str, Tensor]:
        """Sample layer ``level``'s in-neighbours of ``nodes[level]``; keep the local picks, return
        the remote ones (position of the target, global id of the neighbour) for the server."""
        n = self.x.size(0)
        plan.form(level, n)
        dst, col = sample_hop(csr, plan.nodes[level], self.fanouts[level - 1], self.generator)
        local = col < n
        plan.picks[level] = (dst[local], col[local])
        targets = dst[~local]
        plan.remote_rows[level] = torch.unique(targets)
        return {"targets": targets, "ids": self.remote_ids[col[~local] - n]}

    def _own_plan(self, csr: CSR) -> tuple[Plan, dict[str, Tensor]]:
        plan = Plan(True, self.degree["full" if csr is self.full_csr else "local"])
        plan.nodes[self.levels] = self._batch()
        return plan, self._sample(plan, self.levels, csr)

    def _local_plan(self) -> Plan:
        """Algorithm 3: a batch and its L-hop neighbourhood in the local subgraph only."""
        plan, _ = self._own_plan(self.local_csr)
        for level in range(self.levels - 1, 0, -1):
            self._sample(plan, level, self.local_csr)
        return plan

    def _loss(self, plan: Plan) -> Tensor:
        self.model.train()
        out = plan.embeddings(self.levels, self.model, self.features)
        return F.cross_entropy(out, self.y[plan.nodes[self.levels]])

    def _gradient(self, plan: Plan, retain: bool = False) -> dict[str, Any]:
        """Loss and parameter gradient on ``plan``'s batch (``retain``: keep the graph for remote backprop)."""
        self.model.zero_grad(set_to_none=False)
        loss = self._loss(plan)
        loss.backward(retain_graph=retain)
        grads = {name: p.grad.detach().clone() for name, p in self.model.named_parameters()}
        return {"gradient": grads, "loss": float(loss.detach())}

    def _upload(self, out: dict[str, Any], round_index: int | None) -> dict[str, Any]:
        """The gradient as it leaves the client: with DP clipped to ``max_norm`` and noised; with secure
        aggregation the fixed-point row ``[w * gradient, w, w * loss]`` (w = 1, or 0 for a client
        without training nodes), masked with every other client's pairwise masks for this iteration."""
        if not self.privacy.requested():
            return out
        flat = torch.cat([g.flatten() for g in out["gradient"].values()]) if out else \
            torch.cat([p.detach().flatten() for p in self.model.parameters()]).zero_()
        if self.privacy.dp is not None and out:
            flat = gaussian(clip(flat.unsqueeze(0), self.privacy.dp.max_norm)[0], self.privacy.dp, self.noise)
        if self.masker is None:
            sizes = [g.numel() for g in out["gradient"].values()]
            return out | {"gradient": {name: part.view_as(g) for (name, g), part in
                                       zip(out["gradient"].items(), flat.split(sizes))}}
        values = torch.cat([flat.double(), torch.tensor([1.0, out.get("loss", 0.0)], dtype=torch.float64)])
        encoded = encode(values.unsqueeze(0), torch.tensor([1 if out else 0]), self.masker.num_clients)
        return {"masked": self.masker.mask(encoded[0], None, round_index)}

    # ---- remote calls --------------------------------------------------------------------------
    @rpc(state="model", returns={"gradient": "gradient", "loss": "control", "targets": "index", "ids": "index",
                                 "masked": "gradient"})
    def begin(self, state: dict[str, Tensor], mode: str, round_index: int | None = None) -> dict[str, Any]:
        """Start an iteration with the global parameters: 'local' (Algorithm 3) returns a gradient;
        'cross' (Algorithm 2) returns the batch's remote picks; 'reuse' recomputes the last
        cross-client neighbourhood with the remote sums received then (FedGNN-PNS). ``round_index``
        (secure aggregation) seeds this iteration's masks."""
        self.model.load_state_dict(state)
        self.plans = {}
        if self.train_idx.numel() == 0:  # masked, an empty client still sends its (zero) share
            return self._upload({}, round_index) if self.masker is not None else {}
        if mode == "reuse":  # never a silent fallback to local training
            if self.reuse is None:
                raise RuntimeError(f"{self.name} has no cross-client neighbourhood to reuse; sample one first")
            return self._upload(self._gradient(self.reuse.reusable()), round_index)
        if mode != "cross":
            return self._upload(self._gradient(self._local_plan()), round_index)
        plan, picks = self._own_plan(self.full_csr)
        self.plans[OWN] = plan
        return picks

    @rpc(incoming="index", returns="index")
    def route(self, level: int, incoming: dict[str, dict[str, Tensor]]) -> dict[str, dict[str, Tensor]]:
        """Take the nodes routed here as picks of layer level+1 and sample level ``level``."""
        self._receive(level + 1, incoming)
        out = {}
        for trainer, plan in self.plans.items():
            picks = self._sample(plan, level, self.full_csr)
            if picks["ids"].numel():
                out[trainer] = picks
        return out

    @rpc(incoming="index", returns="control")
    def request_keys(self, incoming: dict[str, dict[str, Tensor]]) -> dict[str, Tensor]:
        """Secure aggregation: take the first layer's picks routed here (``propagate`` does without
        it), make a fresh key pair for every request this client takes part in and return the public
        keys, by request name."""
        self._receive(1, incoming)
        for plan in self.plans.values():
            plan.masking = RequestMasking.create()
        return {name: plan.masking.public_key() for name, plan in self.plans.items()}

    @rpc(peers="control")
    def request_peers(self, peers: dict[str, Tensor]) -> None:
        """Each request's public keys as the server relays them (one row per party, no names)."""
        for name, table in peers.items():
            self.plans[name].masking.agree(table)

    @rpc(incoming="index", remote="embedding", counts="index", mask_to="index", unmask="index",
         returns={"sums": "embedding", "counts": "index"})
    def propagate(self, layer: int, incoming: dict[str, dict[str, Tensor]] | None = None,
                  remote: dict[str, Tensor] | None = None, counts: dict[str, Tensor] | None = None,
                  mask_to: dict[str, Tensor] | None = None, unmask: dict[str, Tensor] | None = None) -> dict:
        """Receive the cross-owner sums for layer ``layer-1`` (Eq. 6) and return this owner's
        partial sums for layer ``layer`` (Eq. 5): one vector per (target, owner) pair. Secure
        aggregation: ``mask_to`` names every pair's recipient (a row of the request's key table),
        ``unmask`` which masked vectors went into each received sum (see ``RequestMasking``)."""
        self._receive(layer, incoming or {})
        self._store(layer - 1, remote or {}, counts or {}, unmask)
        sums, sizes = {}, {}
        for trainer, plan in self.plans.items():
            plan.form(layer - 1, self.x.size(0))
            if layer not in plan.serve_pair:
                continue
            pair, src = plan.serve_pair[layer], plan.serve_src[layer]
            backprop = self.remote_backprop and layer > 1  # raw features (layer 1) have no gradient
            h_in = plan.inputs(layer - 1, self.model, self.features)
            rows = dense_rows(h_in if backprop else h_in.detach(), src)
            scale = source_scale(self.model, plan.degree[plan.nodes[layer - 1][src]])
            rows = rows if scale is None else rows * scale
            if self.privacy.dp is not None:  # every row's influence on a sum bounded by max_norm
                rows = clip(rows, self.privacy.dp.max_norm)
            npairs = int(pair.max()) + 1
            total = torch.zeros(npairs, rows.size(1)).index_add_(0, pair, rows)
            size = torch.bincount(pair, minlength=npairs)
            if layer == 1 and self.min_aggregate > 1:
                # Raw features leave only inside sums of at least ``min_aggregate`` rows that are
                # non-zero as summed (after dropout); a withheld pair sends count 0 and no vector.
                nonzero = torch.bincount(pair, weights=(rows != 0).any(1).double(), minlength=npairs)
                size[nonzero < self.min_aggregate] = 0
            if self.privacy.dp is not None:
                total = gaussian(total, self.privacy.dp)
            if plan.masking is not None:  # fixed point, masked for the recipient: the server learns nothing
                encoded = encode(total, torch.ones(npairs, dtype=torch.long), len(plan.masking.peers))
                total = plan.masking.mask(encoded, mask_to[trainer], layer)
            if bool((size == 0).any()):
                total = total[size > 0]
            if backprop:
                plan.sent[layer] = total
            sums[trainer], sizes[trainer] = total.detach(), size
        return {"sums": sums, "counts": sizes}

    @rpc(remote="embedding", counts="index", unmask="index",
         returns={"gradient": "gradient", "loss": "control", "masked": "gradient"})
    def finish(self, remote: dict[str, Tensor], counts: dict[str, Tensor], keep: bool = False,
               unmask: dict[str, Tensor] | None = None, round_index: int | None = None) -> dict[str, Any]:
        """Eq. (7)-(8) on the batch with the last layer's cross-owner sums; return the gradient."""
        self._store(self.levels, remote, counts, unmask)
        plan = self.plans[OWN]
        out = self._gradient(plan, retain=self.remote_backprop)
        if keep:
            self.reuse = plan.reusable()
        if not self.remote_backprop:
            self.plans = {}
        return self._upload(out, round_index)

    @rpc(grads="gradient", returns={"sums": "gradient", "gradient": "gradient"})
    def backward(self, level: int, grads: dict[str, Tensor] | None = None) -> dict[str, Any]:
        """App. H.1, one level down: backpropagate the gradients of the sums this owner served for
        layer ``level + 1``; return the gradients of the cross-owner sums it received for level
        ``level`` or, at level 1, its share of the parameters' gradient (and release the plans)."""
        if level == self.levels:
            self.model.zero_grad(set_to_none=True)  # the trainer's own share went up with ``finish``
        for trainer, grad in (grads or {}).items():
            torch.autograd.backward(self.plans[trainer].sent[level + 1], grad, retain_graph=True)
        if level > 1:
            return {"sums": {trainer: _grad(plan.remote_sum[level]) for trainer, plan in self.plans.items()
                             if level in plan.remote_sum and plan.remote_sum[level].requires_grad}}
        self.plans = {}
        params = dict(self.model.named_parameters())
        if all(p.grad is None for p in params.values()):
            return {}
        return {"gradient": {name: _grad(p) for name, p in params.items()}}

    def _receive(self, layer: int, incoming: dict[str, dict[str, Tensor]]) -> None:
        for trainer, msg in incoming.items():
            grad = trainer == OWN or self.remote_backprop
            plan = self.plans.setdefault(trainer, Plan(grad, self.degree["full"]))
            plan.incoming[layer] = (msg["u"], msg["pair"])

    def _store(self, layer: int, remote: dict[str, Tensor], counts: dict[str, Tensor],
               unmask: dict[str, Tensor] | None = None) -> None:
        """Keep the cross-owner sums of level ``layer``: one count per target with remote picks, one
        vector per target whose count is not zero (targets whose every pair was withheld get none);
        masked sums are unmasked and decoded first."""
        for trainer, rows in remote.items():
            plan, count = self.plans[trainer], counts[trainer]
            if unmask is not None:
                target, sender, rank = unmask.get(trainer, torch.zeros(3, 0, dtype=torch.long))  # none: no row
                row = torch.cumsum(count > 0, 0) - 1  # a target's row among those sent a vector
                rows = decode(plan.masking.unmask(rows, torch.stack([row[target], sender, rank]), layer)).float()
            plan.remote_rows[layer] = plan.remote_rows[layer][count > 0]
            if self.remote_backprop and layer > 1:
                rows.requires_grad_(True)  # its gradient goes back to the owners (``backward``)
            plan.remote_sum[layer], plan.remote_count[layer] = rows, count[count > 0]


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
                                  "beside the sums does not")


class CrossClientProtocol(Protocol):
    """Server of the cross-client family: gradient averaging every iteration (one round = one
    iteration), each client training locally, across clients, or on a reused neighbourhood."""

    scenario = "horizontal"
    Options = CrossClientOptions
    client_class: type[CrossClient] = CrossClient
    models: tuple[str, ...] = SPLITTABLE
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
        if privacy.secure_aggregation and len(self.clients) < 2:
            raise ConfigError(f"{self.name}: privacy.secure_aggregation needs at least 2 clients, got "
                              f"{len(self.clients)} (partition.num_clients)")
        dp = privacy.dp
        self.accountant = ReleaseAccountant(dp, part.owner.numel()) if dp is not None else None
        # One Gaussian gradient upload per client and iteration, composed with the row releases.
        self.uploads = Accountant(dp) if dp is not None else None

    def start(self) -> None:
        if self.cfg.privacy.secure_aggregation:  # pairwise keys for the masked gradient uploads
            exchange_keys(self.transport, self.clients)

    def build(self, num_features: int, num_classes: int) -> None:
        with torch.random.fork_rng():
            torch.manual_seed(self.cfg.seed)
            self.model = make_model(self.cfg.model, num_features, num_classes)
        self.optimizer = self.server_optimizer()

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
    def iterate(self, round_index: int, modes: list[str], keep: bool = False) -> dict[str, float]:
        """Every client starts from the global parameters in its mode; cross-client trainers then
        run Algorithm 2 together; the server averages all gradients and takes one optimiser step."""
        state = self.model.state_dict()
        masking = {"round_index": round_index} if self.cfg.privacy.secure_aggregation else {}
        if self.uploads is not None:  # counted before any client releases its gradient
            self.uploads.step(1.0)
        replies = self.transport.call_many(self.clients, "begin", per_target=[{"mode": m} for m in modes],
                                           state=state, **masking)
        results = [r for r in replies if "gradient" in r or "masked" in r]
        trainers = {name: r for name, r, m in zip(self.clients, replies, modes) if m == "cross" and "targets" in r}
        remote_share = None
        if trainers:
            crossed, remote_share = self.cross_chain(trainers, keep, masking)
            results += crossed
        stats = self.apply(results, remote_share)
        return stats | self.epsilons()

    def epsilons(self) -> dict[str, float]:
        """DP: epsilon so far for one node's data, over its client's gradient uploads and its own row's
        releases in the exchanged sums (and each part alone)."""
        if self.accountant is None:
            return {}
        return {"epsilon": self.accountant.epsilon(self.uploads.rates), "epsilon_model": self.uploads.epsilon(),
                "epsilon_embedding": self.accountant.epsilon()}

    def cross_chain(self, trainers: dict[str, dict[str, Tensor]], keep: bool, masking: dict[str, int] | None = None
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
            {key: handles.to(c, v) for key, v in call.items()} for c, call in zip(names, finish)], keep=keep,
            **(masking or {})) if "gradient" in r or "masked" in r]
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

        assembly = Assembly(routes, self.clients)
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
            self.record_releases(routes, sizes)
        if peer_of is not None:
            unmask = self.senders(routes, channels, peer_of, sizes)
        return *assembly.result(), sizes, unmask

    # ---- the memory budget of a cross-client step ---------------------------------------------------------
    def reply_bytes(self, layer: int, routes: dict[str, LayerRoute]) -> tuple[Tensor, int]:
        """Upper bounds, before any owner replies, of each owner's ``propagate`` reply for layer
        ``layer`` (a vector per pair that can carry one, a count per pair) and of the per-target sums
        the server assembles from all of them (a row per target that can receive a vector, a count per
        target), in bytes. Vectors have the layer's input width, in int64 when masked."""
        dtype = torch.int64 if self.cfg.privacy.secure_aggregation else torch.float32
        width = _first_linear(self.model, layer - 1).weight.size(1) * dtype.itemsize
        fewest = self.opts.min_aggregate if layer == 1 else 1  # first-layer pairs below it are withheld
        owners = torch.arange(len(self.clients))
        replies, assembled = torch.zeros(len(self.clients), dtype=torch.long), 0
        for route in routes.values():
            sendable = route.sendable(fewest)
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

    def record_releases(self, routes: dict[str, LayerRoute], sizes: dict[str, dict]) -> None:
        """DP: one release for every node whose row is in a noised sum that was sent."""
        for trainer, route in routes.items():
            self.accountant.record(route.pick_ids[self.released(route, trainer, sizes)[route.pick_pair]])

    def count_withheld(self, requests: dict[str, dict], sizes: dict[str, dict]) -> None:
        """First-layer pairs (and the picks in them) that their owner withheld (count 0)."""
        for owner, by_trainer in sizes.items():
            for trainer, size in by_trainer.items():
                picks = torch.bincount(requests[owner][trainer]["pair"], minlength=size.numel())
                self.first_layer["pairs"] += size.numel()
                self.first_layer["withheld_pairs"] += int((size == 0).sum())
                self.first_layer["picks"] += int(picks.sum())
                self.first_layer["withheld_picks"] += int(picks[size == 0].sum())

    def apply(self, results: list[dict[str, Any]], remote_share: dict[str, Tensor] | None = None) -> dict[str, float]:
        """θ ← θ − α · mean of the clients' gradients (through the configured optimiser); a trainer's
        gradient includes the remote owners' share when they backpropagate (summed over trainers)."""
        if not results:
            return {"train_loss": math.nan}
        self.optimizer.zero_grad()
        if "masked" in results[0]:  # secure aggregation: only the sum [sum gradient, clients, sum loss]
            total = decode(ring_sum(torch.stack([r["masked"] for r in results])))
            count = float(total[-2])
            if count <= 0:
                return {"train_loss": math.nan}
            params = list(self.model.parameters())
            for p, g in zip(params, total[:-2].split([p.numel() for p in params])):
                p.grad = (g / count).to(p.dtype).view_as(p)
            self.optimizer.step()
            return {"train_loss": float(total[-1]) / count, "clients": count}
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
        dp = {} if self.accountant is None else self.epsilons() | {"delta": self.accountant.delta}
        return {
            "bytes_cross_client": sum(per_round.values()),
            "cross_client_iterations": sum(1 for b in per_round.values() if b),
            "withheld_pair_fraction": first["withheld_pairs"] / first["pairs"] if first["pairs"] else None,
            "withheld_pick_fraction": first["withheld_picks"] / first["picks"] if first["picks"] else None,
        } | dp

    def state_dict(self) -> dict[str, Any]:
        dp = {"dp_releases": self.accountant.releases.clone(),
              "dp_rates": list(self.uploads.rates)} if self.accountant is not None else {}
        return super().state_dict() | {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                                       "first_layer": dict(self.first_layer)} | dp

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.first_layer = dict(state["first_layer"])
        if self.accountant is not None:
            self.accountant.releases = state["dp_releases"].clone()
            self.uploads.rates = list(state["dp_rates"])
