"""The Swift-FedGNN family's client party: trains on its horizontal shard, samples L hops across
clients and serves partial sums of its own rows to other clients' requests."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any, ContextManager

import torch
from torch import Tensor
from torch.nn import functional as F

from ...comm import rpc
from ...config import ModelConfig, TrainConfig
from ...models.graph import shared_transposes
from ...models.split_horizontal import source_scale
from ...privacy import PrivacyConfig
from ...privacy.dp import PrivateRelease
from ...privacy.bonawitz import SecAggClient
from ...privacy.secure_aggregation import RequestMasking, decode, encode
from ...sampling import CSR
from ..aggregation import SecureGradientSumParty
from .partial_sums import pick_sums
from .plan import OwnerPlan
from .routing import OWN
from .shared import HorizontalClient, sample_hop


def _grad(t: Tensor) -> Tensor:
    """The gradient accumulated in ``t`` (zeros where nothing reached it)."""
    return t.grad.detach().clone() if t.grad is not None else torch.zeros_like(t.detach())


# ---- the client ----------------------------------------------------------------------------------
class CrossClient(SecureGradientSumParty, HorizontalClient):
    """A client holding one horizontal shard: trains on it and serves partial sums to others."""


    def __init__(self, name: str, seed: int, shard: Any, model: ModelConfig, train: TrainConfig,
                 num_features: int, num_classes: int, batch_size: int | None, fanouts: list[int],
                 min_aggregate: int = 2, remote_backprop: bool = False, privacy: PrivacyConfig | None = None,
                 index: int = 0):
        super().__init__(name, seed, shard, model, num_features, num_classes)
        self.privacy = privacy or PrivacyConfig()
        self.secagg = SecAggClient.create(index) if self.privacy.secure_aggregation else None
        self.private = PrivateRelease(self.privacy.dp, seed) if self.privacy.dp is not None else None
        self.train_cfg = train
        self.batch_size = batch_size
        self.fanouts = list(fanouts)
        self.min_aggregate = min_aggregate
        self.remote_backprop = remote_backprop
        n = self.x.size(0)
        self.degree = {"local": self.local_csr.rowptr.diff().float(), "full": self.full_csr.rowptr.diff()[:n].float()}
        self.plans: dict[str, OwnerPlan] = {}
        self.reuse: OwnerPlan | None = None
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

    def _sample(self, plan: OwnerPlan, level: int, csr: CSR) -> dict[str, Tensor]:
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

    def _own_plan(self, csr: CSR) -> tuple[OwnerPlan, dict[str, Tensor]]:
        plan = OwnerPlan(True, self.degree["full" if csr is self.full_csr else "local"])
        plan.nodes[self.levels] = self._batch()
        return plan, self._sample(plan, self.levels, csr)

    def _local_plan(self) -> OwnerPlan:
        """Algorithm 3: a batch and its L-hop neighbourhood in the local subgraph only."""
        plan, _ = self._own_plan(self.local_csr)
        for level in range(self.levels - 1, 0, -1):
            self._sample(plan, level, self.local_csr)
        return plan

    def _loss(self, plan: OwnerPlan) -> Tensor:
        self.model.train()
        out = plan.embeddings(self.levels, self.model, self.features)
        return F.cross_entropy(out, self.y[plan.nodes[self.levels]])

    def _gradient(self, plan: OwnerPlan, retain: bool = False) -> dict[str, Any]:
        """Loss and parameter gradient on ``plan``'s batch (``retain``: keep the graph for remote backprop)."""
        self.model.zero_grad(set_to_none=False)
        loss = self._loss(plan)
        loss.backward(retain_graph=retain)
        grads = {name: p.grad.detach().clone() for name, p in self.model.named_parameters()}
        return {"gradient": grads, "loss": float(loss.detach())}

    def _upload(self, out: dict[str, Any]) -> dict[str, Any]:
        """The gradient as it leaves the client: with DP clipped to ``max_norm`` and noised; with secure
        aggregation nothing: the fixed-point row ``[w * gradient, w, w * loss]`` (w = 1, or 0 for a
        client without training nodes) is kept for the iteration's secure sum over all clients."""
        if not self.privacy.requested():
            return out
        flat = torch.cat([g.flatten() for g in out["gradient"].values()]) if out else \
            torch.cat([p.detach().flatten() for p in self.model.parameters()]).zero_()
        if self.privacy.dp is not None and out:
            flat = self.private(flat.unsqueeze(0))[0]
        if self.secagg is None:
            sizes = [g.numel() for g in out["gradient"].values()]
            return out | {"gradient": {name: part.view_as(g) for (name, g), part in
                                       zip(out["gradient"].items(), flat.split(sizes))}}
        values = torch.cat([flat.double(), torch.tensor([1.0, out.get("loss", 0.0)], dtype=torch.float64)])
        self.secure_value = encode(values.unsqueeze(0), torch.tensor([1 if out else 0]), len(self.secagg.peers))[0]
        return {}

    # ---- remote calls --------------------------------------------------------------------------
    @rpc(state="model", returns={"gradient": "gradient", "loss": "control", "targets": "index", "ids": "index"})
    def begin(self, state: dict[str, Tensor], mode: str) -> dict[str, Any]:
        """Start an iteration with the global parameters: 'local' (Algorithm 3) returns a gradient;
        'cross' (Algorithm 2) returns the batch's remote picks; 'reuse' recomputes the last
        cross-client neighbourhood with the remote sums received then (FedGNN-PNS)."""
        self.model.load_state_dict(state)
        self.plans = {}
        if self.train_idx.numel() == 0:  # under secure aggregation an empty client still adds its (zero) share
            return self._upload({}) if self.secagg is not None else {}
        if mode == "reuse":  # never a silent fallback to local training
            if self.reuse is None:
                raise RuntimeError(f"{self.name} has no cross-client neighbourhood to reuse; sample one first")
            return self._upload(self._gradient(self.reuse.reusable()))
        if mode != "cross":
            return self._upload(self._gradient(self._local_plan()))
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
         returns={"sums": "embedding", "counts": "index"}, handover=True)
    def propagate(self, layer: int, incoming: dict[str, dict[str, Tensor]] | None = None,
                  remote: dict[str, Tensor] | None = None, counts: dict[str, Tensor] | None = None,
                  mask_to: dict[str, Tensor] | None = None, unmask: dict[str, Tensor] | None = None) -> dict:
        """Receive the cross-owner sums for layer ``layer-1`` (Eq. 6) and return this owner's
        partial sums for layer ``layer`` (Eq. 5): one vector per (target, owner) pair. Secure
        aggregation: ``mask_to`` names every pair's recipient (a row of the request's key table),
        ``unmask`` which masked vectors went into each received sum (see ``RequestMasking``). Every
        sum in the reply is made for it alone, so it is handed over (``_serve``)."""
        self._receive(layer, incoming or {})
        self._store(layer - 1, remote or {}, counts or {}, unmask)
        sums, sizes = {}, {}
        with self._shared_transposes(layer):
            for trainer, plan in self.plans.items():
                plan.form(layer - 1, self.x.size(0))
                if layer in plan.serve_pair:
                    sums[trainer], sizes[trainer] = self._serve(plan, layer, mask_to[trainer] if mask_to else None)
        return {"sums": sums, "counts": sizes}

    def _shared_transposes(self, layer: int) -> ContextManager:
        """Sparse features: the weights that read them, transposed once for the first-layer products of
        every request this owner computes layer ``layer - 1`` for (only the first layer reads them)."""
        if layer != 2 or self.features.layout == torch.strided:
            return nullcontext()
        return shared_transposes([p for p in self.model.parameters() if p.dim() == 2 and p.size(1) == self.x.size(1)])

    def _serve(self, plan: OwnerPlan, layer: int, mask_to: Tensor | None) -> tuple[Tensor, Tensor]:
        """This owner's partial sums (Eq. 5) of the pairs ``plan`` asks of it at ``layer`` and the rows
        summed per pair (0: withheld, no vector). Noise and masks cover every pair, so then every sum is
        made; otherwise only the sums that are sent."""
        pair, src = plan.serve_pair[layer], plan.serve_src[layer]
        backprop = self.remote_backprop and layer > 1  # raw features (layer 1) have no gradient
        h_in = plan.inputs(layer - 1, self.model, self.features)
        scale = source_scale(self.model, plan.degree[plan.nodes[layer - 1][src]])
        # Raw features leave only inside sums of at least ``min_aggregate`` rows that are non-zero as
        # summed (after dropout); a withheld pair sends count 0 and no vector. Under DP every row's
        # influence on a sum is bounded by max_norm.
        every = self.private is not None or plan.masking is not None
        total, size = pick_sums(h_in if backprop else h_in.detach(), src, scale, pair,
                                self.min_aggregate if layer == 1 else 1, every,
                                self.private.clip if self.private is not None else None)
        if self.private is not None:
            total = self.private.noised(total)
        if plan.masking is not None:  # fixed point, masked for the recipient: the server learns nothing
            encoded = encode(total, torch.ones(size.numel(), dtype=torch.long), len(plan.masking.peers))
            total = plan.masking.mask(encoded, mask_to, layer)
        if every and bool((size == 0).any()):
            total = total[size > 0]
        if backprop:  # kept with its graph; the reply gets its own copy
            plan.sent[layer] = total
            return total.detach().clone(), size
        return total.detach(), size

    @rpc(remote="embedding", counts="index", unmask="index", returns={"gradient": "gradient", "loss": "control"})
    def finish(self, remote: dict[str, Tensor], counts: dict[str, Tensor], keep: bool = False,
               unmask: dict[str, Tensor] | None = None) -> dict[str, Any]:
        """Eq. (7)-(8) on the batch with the last layer's cross-owner sums; return the gradient."""
        self._store(self.levels, remote, counts, unmask)
        plan = self.plans[OWN]
        out = self._gradient(plan, retain=self.remote_backprop)
        if keep:
            self.reuse = plan.reusable()
        if not self.remote_backprop:
            self.plans = {}
        return self._upload(out)

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
            plan = self.plans.setdefault(trainer, OwnerPlan(grad, self.degree["full"]))
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
