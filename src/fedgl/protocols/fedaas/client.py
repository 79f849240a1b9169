"""FedAAS's client party: local steps on its shard, the history store of remote partials, and the
partials it serves to other clients at a sync."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from ...comm import rpc
from ...config import ModelConfig, TrainConfig
from ...models.split_attention import NEGATIVE_SLOPE, Partial, SplitAttentionNet
from ...optim import optimizer_step, restart_optimizer
from ...privacy import PrivacyConfig
from ...privacy.dp import PrivateRelease, clip
from ...privacy.bonawitz import SecAggClient
from ...sampling import CSR, sample_neighbors, sample_weighted
from ..aggregation import SecureSumParty
from ..fedavg.client import private_reply
from ..fedavg.group import flat_state, state_from_row
from ..horizontal.shared import HorizontalClient
from .fanout_policy import FanoutPolicy
from .options import FedAASOptions
from .schedule import ratio_picks

# HorizontalClient builds a backbone from a ModelConfig; FedAAS replaces it with its split model.
PLACEHOLDER = ModelConfig(name="sage", hidden=1, layers=1, dropout=0.0)


@dataclass
class Step:
    """One local step's sampled computation: per layer the needed rows, the local edges (own ids), the remote picks
    (target own id, remote column) at a sync, remote partials, and the layer inputs computed so far."""

    batch: Tensor
    edges: list[tuple[Tensor, Tensor]]
    rows: list[Tensor]  # per layer, the own nodes whose output is needed
    picks: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict)
    logits: dict[int, Tensor] = field(default_factory=dict)  # with phi: e_vw of each remote candidate in picks
    remote: dict[int, tuple[Tensor, Partial]] = field(default_factory=dict)
    hs: list[Tensor] = field(default_factory=list)


def _rows(csr: CSR) -> Tensor:
    return torch.repeat_interleave(torch.arange(csr.num_nodes), csr.degree())


class FedAASClient(SecureSumParty, HorizontalClient):
    """A FedAAS client: trains on its shard, keeps the history store, serves partials to others."""


    def __init__(self, name: str, seed: int, shard: Any, train: TrainConfig, num_features: int, num_classes: int,
                 opts: dict[str, Any], index: int = 0, privacy: PrivacyConfig | None = None):
        super().__init__(name, seed, shard, PLACEHOLDER, num_features, num_classes)
        self.privacy = privacy or PrivacyConfig()
        self.secagg = SecAggClient.create(index) if self.privacy.secure_aggregation else None
        self.dp = self.privacy.dp
        self.private = PrivateRelease(self.dp, seed) if self.dp is not None else None
        self.origin: Tensor | None = None  # θ_t as flat_state, the start of this round's update
        self.opts = FedAASOptions.model_validate(opts)
        self.train_cfg = train
        self.model = SplitAttentionNet(num_features, self.opts.widths, num_classes, self.opts.aggregate,
                                       self.opts.root)
        n, remote = self.x.size(0), self.remote_ids.numel()
        self.n = n
        self.local_edges = (self.local_csr.col, _rows(self.local_csr))
        cross = torch.stack([torch.searchsorted(self.remote_ids, shard.cross_edges[1]) + n, shard.cross_edges[0]])
        self.cross_csr = CSR.from_edge_index(cross, n + remote)
        # each edge's row in the client's own graphs, made once: attention sampling needs it at every step
        self.edge_rows = {name: _rows(getattr(self, name)) for name in ("local_csr", "full_csr", "cross_csr")}
        layers = len(self.opts.widths)
        # The history store (§4.1): a key a_src·W_q h_w per remote neighbour (0 until seen), and per
        # own node the remote partial received at its last sync, for every layer that crosses clients.
        self.keys = {layer: torch.zeros(remote) for layer in range(1, layers)}
        # A partial is in its layer's output width, or in its input width when the receiver projects it.
        offset = 1 if self.opts.remote_projection == "receiver" else 0
        self.exact = self.opts.query_gradient == "exact" and self.opts.aggregate == "attention"
        self.stored = {layer: Partial(torch.zeros(n, self.opts.widths[layer - offset]), torch.zeros(n),
                                      torch.full((n,), float("-inf")),
                                      *((torch.zeros(n, self.opts.widths[layer - offset]), torch.zeros(n))
                                        if self.exact else ())) for layer in range(1, layers)}
        self.optimizer: torch.optim.Optimizer | None = None
        self.policy = FanoutPolicy(self.opts.policy_choices, self.opts.policy_cost, self.generator) \
            if self.opts.fanout_policy == "learned" else None
        self.queue: list[Tensor] = []
        self.losses: list[float] = []
        self.step: Step | None = None

    # ---- sampling -------------------------------------------------------------------------------
    def reference(self, top: Tensor, upto: int) -> Tensor:
        """Layer ``upto``'s inputs at own nodes ``top`` (zero elsewhere) with the current model, every
        local edge and the stored remote partials: what an owner serves and a trainer scores with."""
        rows, edges = [None] * upto, [None] * upto
        need = torch.unique(top)
        for layer in reversed(range(upto)):
            dst, col = self._hop(self.local_csr, need, -1)
            rows[layer], edges[layer] = need, (col, dst)
            need = torch.unique(torch.cat([need, col]))
        history = self.opts.between_sync == "history"
        h = self.features
        with torch.no_grad():
            for layer in range(upto):
                remote = (torch.arange(self.n), self.stored[layer]) if history and layer in self.stored else None
                h = self.model.layer(layer, h, *edges[layer], self._remote(layer, remote), rows[layer])
        return h

    def _weights(self, layer: int, csr: CSR, need: Tensor) -> Tensor:
        """Eq. 10's p_vw up to each row's normaliser, aligned with ``csr.col`` (valid on rows ``need``)."""
        e, rows = self._logits(layer, csr, need), self._edge_rows(csr)
        top = torch.full((csr.num_nodes,), float("-inf")).scatter_reduce(0, rows, e, "amax")
        return torch.exp(e - top[rows])

    def _edge_rows(self, csr: CSR) -> Tensor:
        """Each edge's row of ``csr``: kept for the client's own graphs, which sampling scores at every step."""
        name = next((name for name in self.edge_rows if getattr(self, name) is csr), None)
        return _rows(csr) if name is None else self.edge_rows[name]

    @torch.no_grad()
    def _logits(self, layer: int, csr: CSR, need: Tensor) -> Tensor:
        """Eq. 9's e_vw aligned with ``csr.col`` (valid on rows ``need``): scores of own nodes from their
        current embeddings, of remote ones from the stored keys."""
        if layer == 0:
            h = self.features
        else:
            _, col = self._hop(self.local_csr, need, -1)
            h = self.reference(torch.cat([need, col]), layer)
        query, key = self.model.query_key(layer, h)
        if layer > 0:
            key = torch.cat([key, self.keys[layer]])
        return F.leaky_relu(query[self._edge_rows(csr)] + key[csr.col], NEGATIVE_SLOPE)

    def _hop(self, csr: CSR, need: Tensor, fanout: int, layer: int | None = None) -> tuple[Tensor, Tensor]:
        """(target own id, column) of up to ``fanout`` picks per node of ``need`` (-1: all), weighted
        by attention scores of layer ``layer`` when given."""
        if need.numel() == 0 or csr.num_edges == 0:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        if layer is None or fanout < 0:
            sub = sample_neighbors(csr, need, [fanout], self.generator)
        else:
            sub = sample_weighted(csr, need, [fanout], self._weights(layer, csr, need), self.generator)
        src, dst = sub.blocks[0].edge_index
        return need[dst], sub.n_id[src]

    def _ratio(self, need: Tensor, layer: int, exchange: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """The phi rule at the client: (target own id, column) of max(⌊φ |N(v) ∩ V_k|⌋, 1) local picks
        per node of ``need`` and, when ``exchange``, of every remote candidate, followed by the remote
        candidates' logits (attention) for the server, which draws the per-owner counts."""
        csr = self.full_csr if exchange else self.local_csr
        start = csr.rowptr[need]
        counts = csr.rowptr[need + 1] - start
        seg = torch.repeat_interleave(torch.arange(need.numel()), counts)
        pos = torch.arange(seg.numel()) + torch.repeat_interleave(start - (torch.cumsum(counts, 0) - counts), counts)
        col = csr.col[pos]
        logits = self._logits(layer, csr, need)[pos] if self.opts.sampling == "attention" and pos.numel() else None
        local = col < self.n
        keep = ratio_picks(seg[local], self.opts.phi, self.generator, None if logits is None else logits[local])
        picked = torch.cat([local.nonzero().flatten()[keep], (~local).nonzero().flatten()])
        return need[seg[picked]], col[picked], None if logits is None else logits[~local]

    def _sample(self, batch: Tensor, exchange: bool) -> Step:
        """Top-down: the batch's neighbourhood, layer L to 1; remote picks kept only at a sync."""
        o = self.opts
        fanouts = o.fanouts if o.sampling != "all" else [-1] * len(o.fanouts)
        if self.policy is not None:
            fanouts = [self.policy.choose(len(self.losses) / (o.batches * o.local_epochs))] * len(o.fanouts)
        split = o.local_fanouts is not None and o.sampling != "all"
        crossing = exchange or (o.between_sync == "history" and o.interval != "never")
        need, layers = torch.unique(batch), self.model.num_layers
        step = Step(batch, [None] * layers, [None] * layers)  # type: ignore[list-item]
        for layer in reversed(range(layers)):
            weighted = layer if o.sampling == "attention" else None
            local_fanout = o.local_fanouts[layer] if split else fanouts[layer]
            if o.phi is not None:  # at a sync, every remote candidate: the server draws from them per owner
                dst, col, logits = self._ratio(need, layer, exchange and layer > 0)
                parts = [(dst, col)]
                if logits is not None:
                    step.logits[layer] = logits
            elif layer == 0 or not crossing:
                parts = [self._hop(self.local_csr, need, local_fanout, weighted)]
            elif split:
                parts = [self._hop(self.local_csr, need, local_fanout, weighted),
                         self._hop(self.cross_csr, need, o.cross_fanouts[layer], weighted)]
            else:
                parts = [self._hop(self.full_csr, need, fanouts[layer], weighted)]
            dst, col = (torch.cat(t) for t in zip(*parts))
            local = col < self.n
            step.rows[layer], step.edges[layer] = need, (col[local], dst[local])
            if exchange and layer > 0:
                step.picks[layer] = (dst[~local], col[~local])
            need = torch.unique(torch.cat([need, col[local]]))
        return step

    # ---- the step ---------------------------------------------------------------------------------
    def _remote(self, layer: int, remote: tuple[Tensor, Partial] | None) -> tuple[Tensor, Partial] | None:
        """Remote partials as the layer merges them: projected by the receiver's current θ when the
        owners sent Σ h_w (``remote_projection: receiver``)."""
        if remote is None or self.opts.remote_projection == "owner":
            return remote
        rows, part = remote
        project = (lambda t: None if t is None else self.model.project(layer, t))
        return rows, Partial(project(part.num), part.den, part.shift, project(part.dnum), part.dden)

    def _advance(self, step: Step, upto: int) -> None:
        """Compute layer inputs ``hs[0..upto]`` (with gradients)."""
        if not step.hs:
            step.hs = [self.features]
        while len(step.hs) <= upto:
            layer = len(step.hs) - 1
            step.hs.append(self.model.layer(layer, step.hs[-1], *step.edges[layer],
                                            self._remote(layer, step.remote.get(layer)), step.rows[layer]))

    def _complete(self, step: Step) -> float:
        self._advance(step, self.model.num_layers)
        logits = self.model.head(step.hs[-1][step.batch])
        loss = F.cross_entropy(logits, self.y[step.batch])
        self.optimizer.zero_grad()
        loss.backward()
        optimizer_step(self.optimizer)
        self.losses.append(float(loss.detach()))
        if self.policy is not None:
            self.policy.learn(self.losses[-1], float((logits.argmax(1) == self.y[step.batch]).float().mean()))
        return self.losses[-1]

    def _receive(self, layer: int, remote: dict[str, Tensor] | None, counts: Tensor | None) -> None:
        """Take the merged partials of this step's layer-``layer`` targets; store them and the keys."""
        step = self.step
        if remote is None or layer not in step.picks:
            return
        targets, cols = step.picks[layer]
        rows = torch.unique(targets)
        if self.opts.aggregate == "mean":
            part = Partial(remote["num"], counts.float(), torch.zeros(rows.numel()))
        else:
            part = Partial(remote["num"], remote["den"], remote["shift"], remote.get("dnum"), remote.get("dden"))
        step.remote[layer] = (rows, part)
        store = self.stored[layer]
        store.num[rows], store.den[rows], store.shift[rows] = part.num, part.den, part.shift
        if self.exact:
            store.dnum[rows], store.dden[rows] = part.dnum, part.dden
        if "keys" in remote:
            seen = ~torch.isnan(remote["keys"])
            self.keys[layer][cols[seen] - self.n] = remote["keys"][seen]

    # ---- remote calls -----------------------------------------------------------------------------
    @rpc(state="model", returns={"num_train": "control"})
    def start(self, state: dict[str, Tensor], train: bool = True) -> dict[str, Any]:
        """Load θ_t; a training client also gets a fresh Adam and this round's shuffled batches."""
        self.model.load_state_dict(state)
        # θ_t as one row is needed only for a private upload (its update from θ_t); 14 MB a client on CS
        self.origin = flat_state(state) if self.privacy.requested() else None
        self.losses, self.queue, self.step = [], [], None
        if train:
            self.optimizer = restart_optimizer(self.optimizer, list(self.model.parameters()), self.train_cfg)
            size = max(1, math.ceil(self.train_idx.numel() / self.opts.batches))
            for _ in range(self.opts.local_epochs):
                order = self.train_idx[torch.randperm(self.train_idx.numel(), generator=self.generator)]
                chunks = list(order.split(size))
                self.queue += chunks + [order[:0]] * (self.opts.batches - len(chunks))
        return {"num_train": int(self.train_idx.numel())}

    @rpc(returns={"loss": "control"})
    def local(self, steps: int) -> dict[str, Any]:
        """``steps`` steps without messages: local picks plus the stored remote partials (history)."""
        crossing = self.opts.between_sync == "history" and self.opts.interval != "never"
        for _ in range(steps):
            batch = self.queue.pop(0)
            if batch.numel() == 0:
                continue
            step = self._sample(batch, exchange=False)
            if crossing:
                step.remote = {l: (torch.arange(self.n), p) for l, p in self.stored.items()}
            self._complete(step)
        return {}

    @rpc(remote="embedding", counts="index",
         returns={"targets": "index", "ids": "index", "query": "embedding", "logits": "embedding"})
    def request(self, layer: int, remote: dict[str, Tensor] | None = None, counts: Tensor | None = None) -> dict:
        """A sync step up to layer ``layer``: its remote picks (target, global id) and each target's
        query a_dst·W h_v; the partials of the layer below arrive with this call."""
        if layer == 1:
            batch = self.queue.pop(0)
            self.step = self._sample(batch, exchange=True) if batch.numel() else None
        if self.step is None:
            return {}
        self._receive(layer - 1, remote, counts)
        self._advance(self.step, layer)
        targets, cols = self.step.picks[layer]
        if targets.numel() == 0:
            return {}
        query = self._query(layer, self.step.hs[layer][torch.unique(targets)].detach())
        out = {"targets": targets, "ids": self.remote_ids[cols - self.n], "query": query.detach()}
        if layer in self.step.logits:  # phi: the server draws each owner's share of the candidates
            out["logits"] = self.step.logits[layer].detach()
        return out

    @torch.no_grad()
    def _query(self, layer: int, h: Tensor) -> Tensor:
        """Each target's query a_dst·W h; under DP (attention) a_dst·clip(W h), noised at its bound
        |a_dst| max_norm. In mean mode a_dst is zero and the query carries nothing."""
        if self.dp is None or self.opts.aggregate == "mean":
            return self.model.query_key(layer, h)[0]
        a = self.model.att_dst[layer]
        query = clip(self.model.project(layer, h), self.dp.max_norm) @ a
        return self.private.noised(query, float(a.norm()) * self.dp.max_norm)

    @torch.no_grad()
    def private_partials(self, layer: int, h: Tensor, query: Tensor, pair: Tensor, npairs: int
                         ) -> tuple[Partial, Tensor]:
        """``model.serve`` under DP. Each pick's row (z = W h, or h when the receiver projects) is
        clipped to max_norm C and its key a·row taken from the clipped row, so |key| <= |a| C. Mean: the
        pair sums Σ row noised at scale σ C. Attention: a pick's term is exp(e - b) [row, 1] with
        b = LeakyReLU(query + |a| C) >= e, so its norm is at most sqrt(C² + 1) and the pair sums are noised
        at σ sqrt(C² + 1). Keys are noised at σ |a| C. Then, on the noised sums and public bounds only: a den
        into the range a true one has, and the pair sent as its mean (clipped to the C-ball), den 1 and shift
        b + log den, the same partial in a form that does not underflow (the sums are taken in float64)."""
        model, bound = self.model, self.dp.max_norm
        projected = self.opts.remote_projection == "owner"
        rows = clip(model.project(layer, h) if projected else h, bound)
        direction = model.att_src[layer] if projected else model.weights[layer] @ model.att_src[layer]
        keys = rows @ direction
        count = torch.bincount(pair, minlength=npairs).to(rows.dtype)
        if self.opts.aggregate == "mean":
            num = self.private.noised(torch.zeros(npairs, rows.size(1)).index_add_(0, pair, rows))
            return Partial(clip(num, (count * bound).unsqueeze(1)), count, torch.zeros(npairs)), keys
        kappa = float(direction.norm())
        top = F.leaky_relu(query + kappa * bound, NEGATIVE_SLOPE)
        low = F.leaky_relu(query - kappa * bound, NEGATIVE_SLOPE)
        gap = (F.leaky_relu(query[pair] + keys, NEGATIVE_SLOPE) - top[pair]).double()
        weight = torch.exp(gap).unsqueeze(1)
        terms = torch.cat([rows.double() * weight, weight], 1)
        sums = self.private.noised(torch.zeros(npairs, terms.size(1), dtype=terms.dtype).index_add_(0, pair, terms),
                                   math.hypot(bound, 1.0))
        den = sums[:, -1].clamp(min=count.double() * torch.exp((low - top).double()), max=count.double())
        mean = clip(sums[:, :-1] / den.unsqueeze(1), bound).to(rows.dtype)
        return (Partial(mean, torch.ones(npairs), (top.double() + den.log()).to(rows.dtype)),
                self.private.noised(keys, kappa * bound))

    @rpc(incoming="index", query="embedding",
         returns={"num": "embedding", "den": "embedding", "shift": "embedding", "keys": "embedding", "count": "index",
                  "dnum": "embedding", "dden": "embedding"})
    def serve(self, layer: int, incoming: dict[str, dict[str, Tensor]], query: dict[str, Tensor]) -> dict:
        """Owner side of Eq. 11: per (target, this owner) pair, the partial over the picked nodes with
        this client's current model; pairs summing fewer than ``min_pair_rows`` rows are withheld."""
        h = self.reference(torch.cat([req["u"] for req in incoming.values()]), layer)
        out: dict[str, dict[str, Tensor]] = {}
        mean = self.opts.aggregate == "mean"
        for trainer, req in incoming.items():
            u, pair = req["u"], req["pair"]
            npairs = int(pair.max()) + 1
            if self.dp is not None:
                part, keys = self.private_partials(layer, h[u], query[trainer], pair, npairs)
            else:
                with torch.no_grad():
                    part, keys = self.model.serve(layer, h[u], query[trainer], pair, npairs,
                                                  projected=self.opts.remote_projection == "owner", slopes=self.exact)
            count = torch.bincount(pair, minlength=npairs)
            held = count < self.opts.min_pair_rows
            part.num[held], part.den[held], part.shift[held] = 0.0, 0.0, float("-inf")
            count[held] = 0
            reply = {"num": part.num, "count": count} if mean else \
                {"num": part.num, "den": part.den, "shift": part.shift}
            if self.exact:
                part.dnum[held], part.dden[held] = 0.0, 0.0
                reply |= {"dnum": part.dnum, "dden": part.dden}
            if self.opts.sampling == "attention":
                reply["keys"] = torch.where(held[pair], float("nan"), keys)
            for key, value in reply.items():
                out.setdefault(key, {})[trainer] = value
        return out

    @rpc(remote="embedding", counts="index", returns={"loss": "control"})
    def finish(self, remote: dict[str, Tensor] | None = None, counts: Tensor | None = None) -> dict:
        """Complete the sync step with the last layer's partials and take the Adam step."""
        if self.step is None:
            return {}
        self._receive(self.model.num_layers - 1, remote, counts)
        loss = self._complete(self.step)
        self.step = None
        return {"loss": loss}

    @rpc(summands="control", returns={"state": "model", "num_train": "control", "loss": "control"})
    def upload(self, summands: int = 0) -> dict[str, Any]:
        """The trained model (under DP: θ_t plus its clipped, noised update); under secure aggregation
        nothing: ``[w θ, w, w loss]`` is kept encoded (fedavg's ``private_reply``) for the secure sum of
        ``summands`` clients that follows, w the client's averaging weight (0 without training nodes)."""
        num_train = int(self.train_idx.numel())
        loss = sum(self.losses) / len(self.losses) if self.losses else math.nan
        state = self.model.state_dict()
        if not self.privacy.requested():
            return {"state": state, "num_train": num_train, "loss": loss}
        weight = (num_train if self.opts.weighting == "nodes" else 1) if num_train else 0
        reply = private_reply(flat_state(state).unsqueeze(0), self.origin.unsqueeze(0), torch.tensor([weight]),
                              torch.tensor([loss if weight else 0.0], dtype=torch.float64), self.privacy,
                              [self.private], summands)
        if "encoded" in reply:
            self.secure_value = reply["encoded"][0]
            return {}
        return {"state": state_from_row(reply["state"][0], state), "num_train": num_train, "loss": loss}
