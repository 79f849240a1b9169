"""FedAAS (fedaas.txt, Algorithm 1): FedAvg with attention-guided cross-client neighbour sampling and
adaptive embedding synchronisation, plus its baselines as presets of the same code.

Each round the server sends θ_t to m clients; each takes ``local_epochs × batches`` Adam steps from a
fresh optimiser on mini-batches of its training nodes, then the server averages the models
(weighted by training nodes). Steps run in lock-step across clients. At a *sync* step (step j with
j mod τ = 0) a client samples its batch's neighbourhood with probabilities from Eq. 9-10 (scores
from its current embeddings for its own nodes, from stored keys for remote ones), the owners of the
remote picks return one projected partial per (target, owner) pair (Eq. 11, projected by the owner's
own current model), the server merges the pairs per target, and the client stores the result in its
history. At other steps no message crosses: the client reuses the stored remote partials
(``between_sync: history``, §4.1) or uses none (``drop``, the authors' code). Layer 1 is always
local, so raw features never leave their owner. The server moves τ between τ_min and τ_0 from a
loss (§5.3: the paper's ceil rule or the code's monotone rule).

A sync step is three phases (L = 2): ``request`` (picks and one query scalar per target, kinds
``index``/``embedding``), ``serve`` (the owners' partials and one key scalar per pick), ``finish``
(the merged partials to the trainer, which completes its step). Remote partials are constants in
the trainer's backward pass (ARCHITECTURE.md, "Gradients through remote embeddings are stopped").
The GraphFed and FedGraph reconstructions are presets whose own pieces live in ``similarity.py`` and
``fanout_policy.py``.

Optional rules: ``phi`` (the paper's ratio rule in place of fan-outs; the server, the one party that
knows every node's owner, draws each owner's share of a target's remote candidates), ``tau0: grid``
(τ_0 from one trial round per candidate on restored copies of every party and the server) and, with
``privacy.secure_aggregation``, masked uploads of which the server decodes only the sum (FedAvg's
``private_reply``). With ``privacy.dp`` a client's upload is its update clipped and noised (FedAvg's
``private_reply`` again), every row an owner puts into a pair partial and every key and query crossing
at a sync is clipped and noised (``FedAASClient.private_partials``), and the server composes the rounds
of uploads with the most released node's count (docs/privacy.md, FedAAS).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_validator
from torch import Tensor
from torch.nn import functional as F
from torch_geometric.data import Data

from ..comm import rpc
from ..config import ModelConfig, TrainConfig
from ..errors import ConfigError
from ..evaluation import Evaluator
from ..models import as_model_input
from ..models.split_attention import NEGATIVE_SLOPE, Partial, SplitAttentionNet, merge_into
from ..optim import make_optimizer
from ..partition import horizontal_from_config
from ..privacy import PrivacyConfig
from ..privacy.dp import Accountant, ReleaseAccountant, clip, gaussian, noise_generator
from ..privacy.secure_aggregation import MaskedParty, MaskingClient, decode, exchange_keys, ring_sum
from ..sampling import CSR, sample_neighbors, sample_weighted
from .base import Protocol, ProtocolOptions
from .fedavg import private_reply, weighted_average
from .fedavg_group import flat_state, state_from_row
from .fanout_policy import FanoutPolicy
from .horizontal_client import FEATURE_DENSITY, HorizontalClient
from .routing import Router
from .similarity import SimilarityAverager

EXCHANGE = ("request", "serve", "finish")  # the methods carrying cross-client traffic
# HorizontalClient builds a backbone from a ModelConfig; FedAAS replaces it with its split model.
PLACEHOLDER = ModelConfig(name="sage", hidden=1, layers=1, dropout=0.0)


class FedAASOptions(ProtocolOptions):
    widths: list[int] = Field([256, 128], description="hidden widths; layer 1 is local, later layers cross clients")
    aggregate: Literal["attention", "mean"] = Field("attention", description=(
        "attention: a one-head GAT-v1 softmax over the sampled neighbours (Eq. 9 as the layer's score); mean: "
        "Eq. 11 read as a GraphSAGE mean"))
    root: bool = Field(True, description=(
        "the target's own embedding gets a weight of its own outside the aggregation (GraphSAGE's W_r); "
        "false (attention only): GAT's self loop inside the softmax"))
    sampling: Literal["attention", "uniform", "all"] = "attention"
    fanouts: list[int] = Field([10, 10], description="picks per node per layer, local and remote jointly; -1 all")
    phi: float | None = Field(None, gt=0, le=1, description=(
        "the paper's ratio rule instead of fanouts: per target max(floor(phi |N(v) in V_k|), 1) local picks and, "
        "per remote owner q, max(floor(phi |N(v) in V_q|), 1) picks, which the server draws (it knows the owners)"))
    local_fanouts: list[int] | None = Field(None, description="with cross_fanouts: separate local/remote picks")
    cross_fanouts: list[int] | None = None
    interval: int | Literal["adaptive", "never"] = "adaptive"
    interval_rule: Literal["paper", "code"] = "paper"
    sync_counter: Literal["global", "round"] = Field("global", description=(
        "global: Algorithm 1's count i, kept by the server across rounds, +1 per step, a sync when it reaches τ "
        "(then 0); round: the authors' code, a sync at steps j ≡ 0 (mod τ) of every round, so step 0 always syncs"),
        json_schema_extra={"earlier": "round"})  # what runs saved before this option existed did
    tau0: int | Literal["grid"] = Field(10, description=(
        "the first interval; grid: each of 1, 2, 5, 10 tried for one round from the same state, the one whose "
        "server loss falls fastest per simulated second kept (its cost charged to round 0)"))
    tau_min: int = Field(2, ge=1)
    interval_loss: Literal["server", "train"] = Field("server", description=(
        "server: the global model's loss on the held-out test nodes (paper); train: clients' training loss"))
    between_sync: Literal["history", "drop"] = "history"
    remote_projection: Literal["owner", "receiver"] = Field("owner", description=(
        "owner: pairs carry Σ θ_q h_w (Eq. 11); receiver: Σ h_w, projected by the receiver's current θ at "
        "every use (the code's), so a stored aggregate follows the model"))
    query_gradient: Literal["stopped", "exact"] = Field("stopped", description=(
        "attention: received partials are constants in the backward pass (stopped), or owners also send "
        "their slope-weighted sums so the gradient through the target's query is exact (one more vector "
        "and scalar per pair)"))
    batches: int = Field(10, ge=1, description="mini-batches per local epoch")
    local_epochs: int = Field(1, ge=1)
    client_fraction: float = Field(1.0, gt=0, le=1, description="m / K, clients drawn each round")
    weighting: Literal["nodes", "uniform"] = "nodes"
    min_pair_rows: int = Field(1, ge=1, description="owners withhold (target, owner) pairs summing fewer rows")
    fanout_policy: Literal["fixed", "learned"] = Field("fixed", description=(
        "fixed: fanouts; learned: each client's actor-critic picks every step's fan-out from policy_choices "
        "(the FedGraph reconstruction)"))
    policy_choices: list[int] = Field([2, 5, 10, 15, 20], min_length=2)
    policy_cost: float = Field(0.1, ge=0, description="reward = Δ batch accuracy - policy_cost × fan-out / max choice")
    personalize: Literal["none", "similarity"] = Field("none", description=(
        "none: every client starts a round from the global average; similarity: from an average weighted by "
        "how alike the models behave on a random probe graph (the GraphFed reconstruction)"))
    similarity_temperature: float = Field(0.1, gt=0, description="T of the similarity weights exp(-(1 - cos) / T)")

    @field_validator("interval")
    @classmethod
    def _positive(cls, value):
        if isinstance(value, int) and value < 1:
            raise ValueError("interval must be >= 1, 'adaptive' or 'never'")
        return value

    @field_validator("tau0")
    @classmethod
    def _tau0(cls, value):
        if isinstance(value, int) and value < 1:
            raise ValueError("tau0 must be >= 1 or 'grid'")
        return value

    @field_validator("widths", "fanouts", "local_fanouts", "cross_fanouts")
    @classmethod
    def _counts(cls, value):
        if value is not None and (not value or any(v == 0 or v < -1 for v in value)):
            raise ValueError("entries must be positive or -1 (all)")
        return value

    @field_validator("policy_choices")
    @classmethod
    def _choices(cls, value):
        if any(v < 1 for v in value):
            raise ValueError("entries must be positive fan-outs")
        return value

    @model_validator(mode="after")
    def _consistent(self):
        layers = len(self.widths)
        if len(self.fanouts) != layers:
            raise ValueError(f"fanouts needs one entry per layer of widths ({layers})")
        if (self.local_fanouts is None) != (self.cross_fanouts is None):
            raise ValueError("local_fanouts and cross_fanouts go together")
        if self.local_fanouts is not None and not len(self.local_fanouts) == len(self.cross_fanouts) == layers:
            raise ValueError(f"local_fanouts and cross_fanouts need {layers} entries each")
        if self.aggregate == "mean" and not self.root:
            raise ValueError("aggregate 'mean' always has a root weight (GraphSAGE): root false needs 'attention'")
        if self.aggregate == "mean" and self.sampling == "attention":
            raise ValueError("aggregate 'mean' has no attention scores: use sampling 'uniform' or 'all'")
        if self.fanout_policy == "learned" and (self.sampling == "all" or self.local_fanouts is not None):
            raise ValueError("fanout_policy 'learned' picks one fan-out per step: use sampling 'uniform' or "
                             "'attention' without local_fanouts/cross_fanouts")
        if self.phi is not None and (self.sampling == "all" or self.local_fanouts is not None
                                     or self.fanout_policy == "learned"):
            raise ValueError("phi sets every pick count itself: use sampling 'uniform' or 'attention', without "
                             "local_fanouts/cross_fanouts or fanout_policy 'learned'")
        if self.tau0 == "grid" and (self.interval != "adaptive" or self.interval_loss != "server"):
            raise ValueError("tau0 'grid' ranks intervals by the server's loss: it needs interval 'adaptive' and "
                             "interval_loss 'server'")
        if isinstance(self.tau0, int) and self.tau_min > self.tau0:
            raise ValueError(f"tau_min ({self.tau_min}) exceeds tau0 ({self.tau0})")
        return self


def next_interval(rule: str, losses: list[float], tau: int, tau0: int, tau_min: int) -> int:
    """τ for the next round from the losses F_0, ..., F_t (§5.3).

    paper: ⌈sqrt(F_t / F_0) τ_0⌉ clipped to [τ_min, τ_0]; code: τ is kept after a round that lowered
    the loss, else max(τ_min, min(τ - 1, ⌊sqrt(F_t / F_0) τ_0⌋)), so it never grows."""
    ratio = math.sqrt(max(losses[-1], 0.0) / losses[0]) if losses[0] > 0 else 1.0
    if rule == "paper":
        return min(tau0, max(tau_min, math.ceil(ratio * tau0)))
    if len(losses) > 1 and losses[-1] < losses[-2]:
        return tau
    return max(tau_min, min(tau - 1, int(ratio * tau0)))


def sync_steps(counter: str, tau: int | None, steps: int, count: int) -> tuple[set[int], int]:
    """The round's sync steps (0-based) and the count after it. global: Algorithm 1's count i, carried
    from round to round (i += 1 per step; a sync once i reaches τ, which may have shrunk meanwhile, then
    i = 0); round: the authors' code, steps j ≡ 0 (mod τ) of the round. τ None: no sync."""
    if tau is None:
        return set(), count
    if counter == "round":
        return {j for j in range(steps) if j % tau == 0}, count
    syncs = set()
    for j in range(steps):
        count += 1
        if count >= tau:
            syncs.add(j)
            count = 0
    return syncs, count


GRID = (1, 2, 5, 10)  # the τ_0 candidates of ``tau0: grid`` (spec A7)


def ratio_picks(segment: Tensor, phi: float, generator: torch.Generator, logits: Tensor | None = None) -> Tensor:
    """Which candidates are picked: in every segment (candidates sharing a ``segment`` id) of c of them,
    max(⌊φ c⌋, 1) drawn without replacement with probabilities ∝ exp(logit) (uniform without logits):
    the smallest Exp(1) / exp(logit) keys of each segment (Efraimidis-Spirakis), one sort for all."""
    if segment.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    _, seg, counts = torch.unique(segment, return_inverse=True, return_counts=True)
    quota = torch.floor(phi * counts.double() + 1e-9).long().clamp(min=1)  # 1e-9: φ c exact despite rounding
    keys = torch.empty(segment.numel(), dtype=torch.float64).exponential_(generator=generator).log()
    if logits is not None:
        keys = keys - logits.double()
    order = torch.argsort(keys)
    order = order[torch.argsort(seg[order], stable=True)]
    rank = torch.arange(order.numel()) - (torch.cumsum(counts, 0) - counts)[seg[order]]
    keep = torch.zeros(segment.numel(), dtype=torch.bool)
    keep[order[rank < quota[seg[order]]]] = True
    return keep


# ---- the client ----------------------------------------------------------------------------------
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


class FedAASClient(MaskedParty, HorizontalClient):
    """A FedAAS client: trains on its shard, keeps the history store, serves partials to others."""

    def __init__(self, name: str, seed: int, shard: Any, train: TrainConfig, num_features: int, num_classes: int,
                 opts: dict[str, Any], index: int = 0, privacy: PrivacyConfig | None = None):
        super().__init__(name, seed, shard, PLACEHOLDER, num_features, num_classes)
        self.privacy = privacy or PrivacyConfig()
        self.masker = MaskingClient.create(index) if self.privacy.secure_aggregation else None
        self.dp = self.privacy.dp
        self.noise = noise_generator(seed) if self.dp is not None else None
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
        e = self._logits(layer, csr, need)
        top = torch.full((csr.num_nodes,), float("-inf")).scatter_reduce(0, _rows(csr), e, "amax")
        return torch.exp(e - top[_rows(csr)])

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
        return F.leaky_relu(query[_rows(csr)] + key[csr.col], NEGATIVE_SLOPE)

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
        self.optimizer.step()
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
        self.origin = flat_state(state)
        self.losses, self.queue, self.step = [], [], None
        if train:
            self.optimizer = make_optimizer(self.model.parameters(), self.train_cfg)
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
        return gaussian(query, self.dp, self.noise, float(a.norm()) * self.dp.max_norm)

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
        dp, model, bound = self.dp, self.model, self.dp.max_norm
        projected = self.opts.remote_projection == "owner"
        rows = clip(model.project(layer, h) if projected else h, bound)
        direction = model.att_src[layer] if projected else model.weights[layer] @ model.att_src[layer]
        keys = rows @ direction
        count = torch.bincount(pair, minlength=npairs).to(rows.dtype)
        if self.opts.aggregate == "mean":
            num = gaussian(torch.zeros(npairs, rows.size(1)).index_add_(0, pair, rows), dp, self.noise)
            return Partial(clip(num, (count * bound).unsqueeze(1)), count, torch.zeros(npairs)), keys
        kappa = float(direction.norm())
        top = F.leaky_relu(query + kappa * bound, NEGATIVE_SLOPE)
        low = F.leaky_relu(query - kappa * bound, NEGATIVE_SLOPE)
        gap = (F.leaky_relu(query[pair] + keys, NEGATIVE_SLOPE) - top[pair]).double()
        weight = torch.exp(gap).unsqueeze(1)
        terms = torch.cat([rows.double() * weight, weight], 1)
        sums = gaussian(torch.zeros(npairs, terms.size(1), dtype=terms.dtype).index_add_(0, pair, terms), dp,
                        self.noise, math.hypot(bound, 1.0))
        den = sums[:, -1].clamp(min=count.double() * torch.exp((low - top).double()), max=count.double())
        mean = clip(sums[:, :-1] / den.unsqueeze(1), bound).to(rows.dtype)
        return (Partial(mean, torch.ones(npairs), (top.double() + den.log()).to(rows.dtype)),
                gaussian(keys, dp, self.noise, kappa * bound))

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

    @rpc(participants="index", returns={"state": "model", "num_train": "control", "loss": "control", "masked": "model"})
    def upload(self, participants: Tensor | None = None, round_index: int = 0) -> dict[str, Any]:
        """The trained model (under DP: θ_t plus its clipped, noised update); under secure aggregation only
        ``[w θ, w, w loss]`` masked (fedavg's ``private_reply``), w the client's averaging weight (0
        without training nodes)."""
        num_train = int(self.train_idx.numel())
        loss = sum(self.losses) / len(self.losses) if self.losses else math.nan
        state = self.model.state_dict()
        if not self.privacy.requested():
            return {"state": state, "num_train": num_train, "loss": loss}
        weight = (num_train if self.opts.weighting == "nodes" else 1) if num_train else 0
        reply = private_reply(flat_state(state).unsqueeze(0), self.origin.unsqueeze(0), torch.tensor([weight]),
                              torch.tensor([loss if weight else 0.0], dtype=torch.float64), self.privacy,
                              [self.noise], [self.masker], participants, round_index)
        if "masked" in reply:
            return {"masked": reply["masked"][0]}
        return {"state": state_from_row(reply["state"][0], state), "num_train": num_train, "loss": loss}


# ---- the server ----------------------------------------------------------------------------------
class FedAAS(Protocol):
    name = "fedaas"
    scenario = "horizontal"
    Options = FedAASOptions

    @classmethod
    def paper_training(cls, model: str, optimizer: str) -> dict[str, Any]:
        # §7.1: Adam at 0.001, "weight decay to be zero"
        return {"lr": 0.001, "weight_decay": 0.0} if optimizer == "adam" else {}

    def build(self, num_features: int, num_classes: int) -> None:
        o = self.opts
        default = ModelConfig()
        given = sorted(k for k, v in self.cfg.model if v != getattr(default, k))
        if given:  # the model is protocol.widths, aggregate and root: a model section would be ignored
            raise ConfigError(f"{self.cfg.protocol_name} builds its model from protocol.widths, protocol.aggregate "
                              f"and protocol.root; remove {', '.join(f'model.{k}' for k in given)}")
        self.model = SplitAttentionNet(num_features, o.widths, num_classes, o.aggregate, o.root)
        if o.personalize == "similarity":
            self.scratch = copy.deepcopy(self.model)  # GraphFed: scores uploaded models on the probe graph

    def setup(self, data: Data) -> None:
        o = self.opts
        num_classes = int(data.num_classes)
        self.build(data.num_features, num_classes)
        part = horizontal_from_config(data, self.cfg.partition, self.cfg.seed)
        self.partition_stats = part.stats
        self.secure = self.cfg.privacy.secure_aggregation
        if self.secure and o.personalize == "similarity":
            raise ConfigError(f"{self.name}: privacy.secure_aggregation hides each client's model from the server, "
                              f"which personalize 'similarity' needs; use personalize 'none'")
        if self.secure and self.sample_size(len(part.shards)) < 2:
            raise ConfigError(f"{self.name}: privacy.secure_aggregation needs at least 2 clients per round, got "
                              f"{self.sample_size(len(part.shards))} (partition.num_clients x protocol.client_fraction)")
        dp = self.cfg.privacy.dp
        if dp is not None and (o.phi is not None or (o.query_gradient == "exact" and o.aggregate == "attention")):
            raise ConfigError(f"{self.name}: privacy.dp does not noise what phi (the trainers' logits) or "
                              f"query_gradient exact (the slope-weighted sums) sends; unset them")
        # DP: the rounds of model uploads (client-level) and every node's releases at syncs (node-level)
        self.rounds = Accountant(dp) if dp is not None else None
        self.releases = ReleaseAccountant(dp, part.owner.numel()) if dp is not None else None
        options = o.model_dump()
        self.clients = self.transport.spawn(FedAASClient, [
            dict(name=f"client{m}", seed=self.cfg.seed * 100_003 + m + 1, shard=shard, train=self.cfg.train,
                 num_features=data.num_features, num_classes=num_classes, opts=options, index=m,
                 privacy=self.cfg.privacy)
            for m, shard in enumerate(part.shards)])
        self.router = Router(part.owner, part.local_index, self.clients)
        # each client's own nodes by local index, as global ids (the queries' targets)
        self.own_ids = [(part.owner == c).nonzero().flatten() for c in range(len(self.clients))]
        self.own_ids = [ids[torch.argsort(part.local_index[ids])] for ids in self.own_ids]
        self.held_out = getattr(part, "server_shard", None)
        if o.interval == "adaptive" and o.interval_loss == "server":
            if self.held_out is None:
                raise ConfigError("protocol.interval_loss 'server' needs held-out nodes at the server "
                                  "(partition.client_nodes: train or train+val); or use interval_loss: train")
            self.held_out_x = as_model_input(self.held_out.x.float(), FEATURE_DENSITY)
            mask = self.held_out.test_mask
            self.held_out_rows = mask.nonzero().flatten() if bool(mask.any()) else torch.arange(mask.numel())
        self.tau0: int | None = o.tau0 if isinstance(o.tau0, int) else None  # None: the grid sets it
        self.grid: dict[int, dict[str, float]] = {}
        fixed = None if o.interval == "never" else o.interval
        self.tau: int | None = self.tau0 if o.interval == "adaptive" else fixed
        # GraphFed (reconstruction): each client's next model, mixed by model similarity.
        self.personal: dict[str, dict[str, Tensor]] = {}
        if o.personalize == "similarity":
            self.averager = SimilarityAverager(data.num_features, o.similarity_temperature, self.generator)
        self.losses: list[float] = []
        self.taus: list[int | None] = []
        self.count = 0  # Algorithm 1's i: steps since the last sync (sync_counter: global)

    def start(self) -> None:
        if self.secure:
            exchange_keys(self.transport, self.clients)

    # ---- the interval ---------------------------------------------------------------------------
    def server_loss(self) -> float:
        """The global model's cross-entropy on the held-out test nodes, over the edges among held-out
        nodes (the server's shard; the paper's "test loss")."""
        with torch.no_grad():
            logits = self.model(self.held_out_x, self.held_out.edge_index)
            return float(F.cross_entropy(logits[self.held_out_rows], self.held_out.y[self.held_out_rows]))

    def search_tau0(self) -> None:
        """``tau0: grid`` (spec A7): every τ of ``GRID`` trains one round from the same state, on copies
        (the parties' kept where they live by ``transport.hold``, the server's by its ``state_dict``, the
        torch RNG);
        τ_0 is the one whose server loss falls fastest per simulated second, i.e. with the lowest
        (F_τ - F_0) / seconds. The trials' messages and time count in round 0; afterwards every party
        and the server are back in the state the search started from."""
        transport = self.transport
        current = transport.ledger.round
        transport.set_round(0)
        transport.hold()  # every party keeps a copy of its state where it lives
        server, rng = copy.deepcopy(self.state_dict()), torch.get_rng_state()
        grid = {}
        for i, tau in enumerate(GRID):
            began = transport.clock.now
            self.run_round(tau, -1 - i)  # masks of its own: no training round uses a negative index
            seconds = transport.clock.now - began
            loss = self.server_loss()
            grid[tau] = {"loss": loss, "seconds": seconds, "rate": (loss - self.losses[0]) / seconds}
            transport.roll_back()
            self.load_state_dict(copy.deepcopy(server) | self.dp_state())  # the trials' releases stay spent
            torch.set_rng_state(rng)
            transport.idle()
        transport.set_round(current)
        self.grid = grid
        self.tau0 = self.tau = min(GRID, key=lambda t: grid[t]["rate"])

    def sample_size(self, num_clients: int) -> int:
        return max(1, round(self.opts.client_fraction * num_clients))

    def sample_clients(self) -> list[str]:
        k = self.sample_size(len(self.clients))
        if k == len(self.clients):
            return list(self.clients)
        chosen = torch.randperm(len(self.clients), generator=self.generator)[:k].sort().values
        return [self.clients[i] for i in chosen.tolist()]

    # ---- one round ------------------------------------------------------------------------------
    def train_round(self, round_index: int) -> dict[str, float]:
        o = self.opts
        server_loss = o.interval == "adaptive" and o.interval_loss == "server"
        if server_loss and not self.losses:
            self.losses.append(self.server_loss())  # F_0: the initial model
        if self.tau0 is None:
            self.search_tau0()
        tau = self.tau if self.model.num_layers > 1 else None
        loss, syncs = self.run_round(tau, round_index)
        if loss is None:
            return {"train_loss": math.nan, **self.spent()}
        if o.interval == "adaptive":
            self.losses.append(self.server_loss() if server_loss else loss)
            self.tau = next_interval(o.interval_rule, self.losses, self.tau, self.tau0, min(o.tau_min, self.tau0))
        self.taus.append(tau)
        ledger = self.transport.ledger
        return {"train_loss": loss, "tau": float(tau) if tau is not None else math.nan, "syncs": float(syncs),
                "bytes_embedding": float(ledger.total(methods=EXCHANGE, kinds=("embedding", "index"))),
                **({"interval_loss": self.losses[-1]} if o.interval == "adaptive" else {}), **self.spent()}

    def spent(self) -> dict[str, float]:
        """DP: epsilon so far for one node's data, over its client's uploads and its own releases at syncs
        (all Gaussian events of one noise multiplier, composed), and each of the two alone."""
        if self.rounds is None:
            return {}
        return {"epsilon": self.releases.epsilon(self.rounds.rates), "epsilon_model": self.rounds.epsilon(),
                "epsilon_embedding": self.releases.epsilon()}

    def run_round(self, tau: int | None, mask_round: int) -> tuple[float | None, int]:
        """The chosen clients' local steps at interval ``tau`` (None: no sync) and the model average
        (``mask_round`` keys the secure-aggregation masks); returns the weighted training loss (None
        when no chosen client trained) and the number of sync steps."""
        o = self.opts
        steps = o.local_epochs * o.batches
        syncs, self.count = sync_steps(o.sync_counter, tau, steps, self.count)
        chosen = self.sample_clients()
        if self.rounds is not None:  # counted before any client releases its update
            self.rounds.step(len(chosen) / len(self.clients))
        state = self.model.state_dict()
        serving = self.clients if syncs else chosen  # A13: owners not drawn serve with θ_t
        picked = set(chosen)
        self.transport.call_many(serving, "start", per_target=[
            {"train": c in picked, "state": self.personal.get(c, state)} for c in serving])
        j = 0
        while j < steps:
            if j in syncs:
                self.sync(chosen)
                j += 1
            else:
                run = next((k for k in range(j, steps) if k in syncs), steps) - j
                self.transport.call_many(chosen, "local", steps=run)
                j += run
        return self.average(chosen, state, mask_round), len(syncs)

    def average(self, chosen: list[str], state: dict[str, Tensor], mask_round: int) -> float | None:
        """FedAvg of the chosen clients' models into θ_{t+1}: weighted in the clear, or decoded from the
        masked sum under secure aggregation (the server then sees no client's model, count or loss);
        returns the weighted training loss, None when no chosen client trained."""
        o = self.opts
        if self.secure:
            everyone = len(chosen) == len(self.clients)
            ids = None if everyone else torch.tensor([self.router.index[c] for c in chosen])
            uploads = self.transport.call_many(chosen, "upload", participants=ids, round_index=mask_round)
            total = decode(ring_sum(torch.stack([r["masked"] for r in uploads])))  # [Σ w θ, Σ w, Σ w loss]
            if total[-2] <= 0:
                return None
            self.model.load_state_dict(state_from_row(total[:-2] / total[-2], state))
            return float(total[-1] / total[-2])
        uploads = self.transport.call_many(chosen, "upload")
        trained = [r for r in uploads if r["num_train"] > 0]
        if not trained:
            return None
        weights = torch.tensor([float(r["num_train"]) if o.weighting == "nodes" else 1.0 for r in trained])
        self.model.load_state_dict(weighted_average([r["state"] for r in trained], weights))
        if o.personalize == "similarity":
            self.personalize([c for c, r in zip(chosen, uploads) if r["num_train"] > 0],
                             [r["state"] for r in trained], weights)
        return float(sum(w * r["loss"] for w, r in zip((weights / weights.sum()).tolist(), trained)))

    def personalize(self, names: list[str], states: list[dict[str, Tensor]], sizes: Tensor) -> None:
        """GraphFed (reconstruction): each uploading client's next model is the uploads' average
        weighted by size and by how alike the models behave on the probe graph."""
        embeddings = torch.stack([self.averager.embedding(self.scratch, s) for s in states])
        mixed = self.averager.mix(states, self.averager.weights(embeddings, sizes))
        self.personal.update(zip(names, mixed))

    def sync(self, chosen: list[str]) -> None:
        """One sync step of every chosen client: per crossing layer a request and a serve phase, then
        the finish phase carrying the last layer's merged partials."""
        remote: dict[str, dict] = {}
        for layer in range(1, self.model.num_layers):
            replies = self.transport.call_many(chosen, "request", per_target=[
                {"remote": remote.get(c, {}).get("remote"), "counts": remote.get(c, {}).get("counts")}
                for c in chosen], layer=layer)
            picks = {c: r for c, r in zip(chosen, replies) if r}
            if self.releases is not None and self.opts.aggregate == "attention":  # one query per target
                for c, r in picks.items():
                    self.releases.record(self.own_ids[self.router.index[c]][torch.unique(r["targets"])])
            drawn = {c: self.draw(r) for c, r in picks.items()} if self.opts.phi is not None else {}
            routed = {c: {key: r[key][drawn[c]] if c in drawn else r[key] for key in ("targets", "ids")}
                      for c, r in picks.items()}
            requests, routes = self.router.route({c: {c: p} for c, p in routed.items()})
            owners = [c for c in self.clients if c in requests]
            queries: dict[str, dict[str, Tensor]] = {}
            for trainer, route in routes.items():
                starts = torch.cumsum(route.pair_counts, 0) - route.pair_counts
                for c in route.pair_counts.nonzero().flatten().tolist():
                    span = route.target_of_pair[starts[c]: starts[c] + route.pair_counts[c]]
                    queries.setdefault(self.clients[c], {})[trainer] = picks[trainer]["query"][span]
            served = dict(zip(owners, self.transport.call_many(owners, "serve", per_target=[
                {"incoming": requests[c], "query": queries[c]} for c in owners], layer=layer)))
            if self.releases is not None:
                self.record_releases(routes, served)
            remote = {trainer: self.combine(route, served, routed[trainer]["ids"], trainer, drawn.get(trainer))
                      for trainer, route in routes.items()}
        self.transport.call_many(chosen, "finish", per_target=[
            {"remote": remote.get(c, {}).get("remote"), "counts": remote.get(c, {}).get("counts")} for c in chosen])

    def record_releases(self, routes: dict, served: dict[str, dict]) -> None:
        """DP: one release for every pick in a pair partial that was sent (not withheld), and one more
        for its key when keys travel (attention sampling)."""
        sent = "count" if self.opts.aggregate == "mean" else "shift"
        for trainer, route in routes.items():
            owners = [self.clients[c] for c in route.pair_counts.nonzero().flatten().tolist()]
            released = torch.cat([served[c][sent][trainer] for c in owners]) > (0 if sent == "count" else -math.inf)
            picks = route.pick_ids[released[route.pick_pair]]
            self.releases.record(picks.repeat(2 if self.opts.sampling == "attention" else 1))

    def draw(self, reply: dict[str, Tensor]) -> Tensor:
        """The phi rule's remote half, at the server, the one party that knows every node's owner: of a
        target's n remote candidates at owner q, max(⌊φ n⌋, 1), weighted by the trainer's logits
        (attention) or uniform. Returns which of the trainer's candidates are picked."""
        segment = reply["targets"] * len(self.clients) + self.router.owner[reply["ids"]]
        return ratio_picks(segment, self.opts.phi, self.generator, reply.get("logits"))

    def combine(self, route, served: dict[str, dict], ids: Tensor, trainer: str,
                drawn: Tensor | None = None) -> dict[str, Any]:
        """Merge one trainer's pair partials per target (log-sum-exp, or sums in mean mode) and put
        the owners' keys back in the order of the trainer's picks (of its candidates when the server
        ``drawn`` the picks, NaN for those not picked)."""
        owners = [self.clients[c] for c in route.pair_counts.nonzero().flatten().tolist()]
        mean = self.opts.aggregate == "mean"
        num = torch.cat([served[c]["num"][trainer] for c in owners])
        if mean:
            den = torch.cat([served[c]["count"][trainer] for c in owners]).float()
            shift = torch.zeros_like(den)
        else:
            den = torch.cat([served[c]["den"][trainer] for c in owners])
            shift = torch.cat([served[c]["shift"][trainer] for c in owners])
        size = int(route.target_counts.sum())
        total = merge_into(num, den, shift, route.target_of_pair, size)
        out: dict[str, Any] = {"remote": {"num": total.num}}
        if mean:
            out["counts"] = total.den.round().long()
        else:
            out["remote"] |= {"den": total.den, "shift": total.shift}
        if self.opts.query_gradient == "exact" and not mean:  # slope-weighted sums merge at the same shifts
            moved = merge_into(torch.cat([served[c]["dnum"][trainer] for c in owners]),
                               torch.cat([served[c]["dden"][trainer] for c in owners]), shift,
                               route.target_of_pair, size)
            out["remote"] |= {"dnum": moved.num, "dden": moved.den}
        if self.opts.sampling == "attention":
            owner_of = self.router.owner[ids]
            keys = torch.empty(ids.numel())
            for c in owners:
                keys[owner_of == self.router.index[c]] = served[c]["keys"][trainer]
            if drawn is not None:
                keys = torch.full((drawn.numel(),), float("nan")).index_put((drawn,), keys)
            out["remote"]["keys"] = keys
        return out

    # ---- results, evaluation, checkpoints --------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Embedding bytes (the paper's communication cost) apart from model bytes, τ per round and, with
        ``tau0: grid``, what the grid measured per τ."""
        ledger = self.transport.ledger
        sent = sum(row["bytes"] for row in ledger.rows() if row["src"] != "server" and (
            row["kind"] == "model" or (row["method"] in EXCHANGE and row["kind"] in ("embedding", "index"))))
        dp = {} if self.rounds is None else self.spent() | {"delta": self.rounds.delta}
        return {"bytes_embedding": ledger.total(methods=EXCHANGE, kinds=("embedding", "index")),
                "bytes_model": ledger.total(kinds=("model",)), "bytes_code_convention": sent,
                "tau_by_round": self.taus, **({"tau0": self.tau0, "tau0_grid": self.grid} if self.grid else {})} | dp

    def predict(self, evaluator: Evaluator) -> Tensor:
        return evaluator.edge_logits(self.model)

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"model": self.model.state_dict(), "tau": self.tau, "tau0": self.tau0,
                                       "grid": dict(self.grid), "losses": list(self.losses), "taus": list(self.taus),
                                       "count": self.count, "personal": dict(self.personal)} | self.dp_state()

    def dp_state(self) -> dict[str, Any]:
        """The budget spent: rounds of uploads (their sampling rates) and every node's release count."""
        if self.rounds is None:
            return {}
        return {"dp_rates": list(self.rounds.rates), "dp_releases": self.releases.releases.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.model.load_state_dict(state["model"])
        self.tau, self.tau0, self.grid = state["tau"], state["tau0"], dict(state["grid"])
        self.losses, self.taus, self.count = state["losses"], state["taus"], state["count"]
        self.personal = dict(state["personal"])
        if self.rounds is not None:
            self.rounds.rates, self.releases.releases = list(state["dp_rates"]), state["dp_releases"].clone()


# ---- the baselines: presets of the same code (spec §5) --------------------------------------------
class FedCrossOptions(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "uniform"
    interval: int | Literal["adaptive", "never"] = 1
    local_fanouts: list[int] | None = [5, 5]
    cross_fanouts: list[int] | None = [5, 5]


class FedPNSOptions(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "uniform"
    interval: int | Literal["adaptive", "never"] = 2
    between_sync: Literal["history", "drop"] = "drop"


class FedLocalOptions(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "uniform"
    interval: int | Literal["adaptive", "never"] = "never"


class FedAllOptions(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "all"
    interval: int | Literal["adaptive", "never"] = 1


class FedAAS1Options(FedAASOptions):
    interval: int | Literal["adaptive", "never"] = 1


class FedAAS2Options(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "all"


class GraphFedReconOptions(FedCrossOptions):
    personalize: Literal["none", "similarity"] = "similarity"


class FedGraphReconOptions(FedAASOptions):
    sampling: Literal["attention", "uniform", "all"] = "uniform"
    interval: int | Literal["adaptive", "never"] = 1
    fanout_policy: Literal["fixed", "learned"] = "learned"


class FedCross(FedAAS):
    """Uniform 5 local + 5 cross-client picks per layer, synchronised at every step."""
    name, Options = "fedcross", FedCrossOptions


class FedPNS(FedAAS):
    """The FedAAS paper's FedPNS: uniform picks, cross-client every 2 steps, local-only in between
    (not fedgl's ``fedgnn-pns``, the Swift paper's version)."""
    name, Options = "fedaas-pns", FedPNSOptions


class FedLocal(FedAAS):
    """Federated GraphSAGE-style sampling inside each client only; cross-client neighbours ignored."""
    name, Options = "fedlocal", FedLocalOptions


class FedAll(FedAAS):
    """Every neighbour, synchronised at every step."""
    name, Options = "fedall", FedAllOptions


class FedAAS1(FedAAS):
    """Attention sampling without adaptive synchronisation (τ = 1)."""
    name, Options = "fedaas1", FedAAS1Options


class FedAAS2(FedAAS):
    """Adaptive synchronisation with every neighbour (no sampling)."""
    name, Options = "fedaas2", FedAAS2Options


class GraphFedRecon(FedAAS):
    """GraphFed, reconstructed (fedaas.txt gives no formula): FedCross's exchange with models
    personalised by similarity on a probe graph (``protocols/similarity.py``)."""
    name, Options = "graphfed-recon", GraphFedReconOptions


class FedGraphRecon(FedAAS):
    """FedGraph, reconstructed (fedaas.txt names a DRL sampling policy, nothing more): uniform picks
    synchronised at every step, each step's fan-out chosen by the client's actor-critic
    (``protocols/fanout_policy.py``)."""
    name, Options = "fedgraph-recon", FedGraphReconOptions
