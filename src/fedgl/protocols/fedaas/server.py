"""FedAAS's server: weighted FedAvg (optionally over masked uploads), the routing of a sync's picks and
partials (with the φ rule's per-owner draw), the interval rule and the τ₀ grid."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F
from torch_geometric.data import Data

from ...config import ModelConfig
from ...errors import ConfigError
from ...evaluation import Evaluator
from ...models import as_model_input
from ...models.split_attention import SplitAttentionNet, merge_into
from ...partition import horizontal_from_config
from ...privacy.dp import NODE_EXCHANGE, SUBSTITUTION, DPAccountant
from ..aggregation import check_secure_round, secure_sum, trust_identities
from ..base import Protocol
from ..fedavg.server import weighted_average
from ..fedavg.group import state_from_row
from ..horizontal.routing import Router
from ..horizontal.shared import FEATURE_DENSITY
from .client import FedAASClient
from .options import FedAASOptions
from .schedule import GRID, next_interval, ratio_picks, sync_steps
from .similarity import SimilarityAverager

EXCHANGE = ("request", "serve", "finish")  # the methods carrying cross-client traffic


class FedAAS(Protocol):
    name = "fedaas"
    scenario = "horizontal"
    Options = FedAASOptions
    sums = 0  # secure sums run so far (also when set up from a shard folder)

    @classmethod
    def paper_sections(cls, options: FedAASOptions) -> dict[str, dict[str, Any]]:
        # §7.1: "the test dataset is located at the FL server", whose interval loss reads it; the clients
        # hold the rest. (The authors' code keeps training nodes only, ``client_nodes: train``: on a
        # split labelling 20 nodes a class that leaves each client a few nodes and almost no edges.)
        held_out = options.interval == "adaptive" and options.interval_loss == "server"
        return {"partition": {"client_nodes": "non-test"}} if held_out else {}

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
        count = self.sample_size(len(part.shards))
        if self.secure:
            check_secure_round(self.cfg.privacy, count, self.name)
        dp = self.cfg.privacy.dp
        if dp is not None and (o.phi is not None or (o.query_gradient == "exact" and o.aggregate == "attention")):
            raise ConfigError(f"{self.name}: privacy.dp does not noise what phi (the trainers' logits) or "
                              f"query_gradient exact (the slope-weighted sums) sends; unset them")
        # DP: the model uploads and the releases at syncs, charged to the nodes each may carry
        self.accountant = DPAccountant(dp, part.owner, NODE_EXCHANGE, ("model", "embedding")) if dp else None
        options = o.model_dump()
        self.clients = self.transport.spawn(FedAASClient, [
            dict(name=f"client{m}", seed=self.cfg.seed * 100_003 + m + 1, shard=shard, train=self.cfg.train,
                 num_features=data.num_features, num_classes=num_classes, opts=options, index=m,
                 privacy=self.cfg.privacy)
            for m, shard in enumerate(part.shards)])
        self.router = Router(part.owner, part.local_index, self.clients)
        self.held_out = getattr(part, "server_shard", None)
        if o.interval == "adaptive" and o.interval_loss == "server":
            if self.held_out is None:
                raise ConfigError("protocol.interval_loss 'server' needs held-out nodes at the server "
                                  "(partition.client_nodes: non-test, train or train+val); or use interval_loss: train")
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
            trust_identities(self.transport, self.clients, self.cfg.privacy)

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
        for tau in GRID:
            began = transport.clock.now
            self.run_round(tau)
            seconds = transport.clock.now - began
            loss = self.server_loss()
            grid[tau] = {"loss": loss, "seconds": seconds, "rate": (loss - self.losses[0]) / seconds}
            transport.roll_back()
            # the trials' releases stay spent, and their secure sums' labels stay used (clients refuse a reuse)
            self.load_state_dict(copy.deepcopy(server) | self.dp_state() | {"sums": self.sums})
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
        loss, syncs = self.run_round(tau)
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
        return {} if self.accountant is None else self.accountant.epsilons()

    def run_round(self, tau: int | None) -> tuple[float | None, int]:
        """The chosen clients' local steps at interval ``tau`` (None: no sync) and the model average;
        returns the weighted training loss (None when no chosen client trained) and the number of sync
        steps."""
        o = self.opts
        steps = o.local_epochs * o.batches
        syncs, self.count = sync_steps(o.sync_counter, tau, steps, self.count)
        chosen = self.sample_clients()
        if self.accountant is not None:  # counted before any client releases its update
            self.accountant.charge("model", clients=torch.tensor([self.router.index[c] for c in chosen]))
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
        return self.average(chosen, state), len(syncs)

    def average(self, chosen: list[str], state: dict[str, Tensor]) -> float | None:
        """FedAvg of the chosen clients' models into θ_{t+1}: weighted in the clear, or decoded from the
        masked sum under secure aggregation (the server then sees no client's model, count or loss);
        returns the weighted training loss, None when no chosen client trained."""
        o = self.opts
        if self.secure:
            self.transport.call_many(chosen, "upload", summands=len(chosen))
            self.sums += 1  # each secure sum's label, never used twice
            total, _ = secure_sum(self.transport, chosen, [self.router.index[c] for c in chosen], self.sums,
                                  self.cfg.privacy.secure_threshold(len(chosen)))  # [Σ w θ, Σ w, Σ w loss]
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
            if self.accountant is not None and self.opts.aggregate == "attention":  # one query per target
                for c, r in picks.items():
                    queries = torch.unique(r["targets"]).numel()  # from the trainer's own model: all its nodes
                    self.accountant.charge("embedding", clients=torch.full((queries,), self.router.index[c]))
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
            if self.accountant is not None:
                self.record_releases(routes, served)
            remote = {trainer: self.combine(route, served, routed[trainer]["ids"], trainer, drawn.get(trainer))
                      for trainer, route in routes.items()}
        self.transport.call_many(chosen, "finish", per_target=[
            {"remote": remote.get(c, {}).get("remote"), "counts": remote.get(c, {}).get("counts")} for c in chosen])

    def record_releases(self, routes: dict, served: dict[str, dict]) -> None:
        """DP: a partial sent (not withheld) sums n rows its owner computed with its own model, so every row
        may carry any node of the owner: 2 n C for all of them; with attention sampling each pick's key is
        one more release (2 C) of the same kind."""
        sent = "count" if self.opts.aggregate == "mean" else "shift"
        for trainer, route in routes.items():
            held = route.pair_counts.nonzero().flatten()
            released = torch.cat([served[self.clients[c]][sent][trainer] for c in held.tolist()])
            released = released > (0 if sent == "count" else -math.inf)
            owner = torch.repeat_interleave(held, route.pair_counts[held])
            rows = torch.bincount(route.pick_pair, minlength=released.numel()).double()
            self.accountant.charge("embedding", clients=owner[released], multiple=SUBSTITUTION * rows[released])
            if self.opts.sampling == "attention":
                self.accountant.charge("embedding", clients=owner[route.pick_pair][released[route.pick_pair]])

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
        dp = {} if self.accountant is None else self.accountant.summary()
        return {"bytes_embedding": ledger.total(methods=EXCHANGE, kinds=("embedding", "index")),
                "bytes_model": ledger.total(kinds=("model",)), "bytes_code_convention": sent,
                "tau_by_round": self.taus, **({"tau0": self.tau0, "tau0_grid": self.grid} if self.grid else {})} | dp

    def predict(self, evaluator: Evaluator) -> Tensor:
        return evaluator.edge_logits(self.model)

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"model": self.model.state_dict(), "tau": self.tau, "tau0": self.tau0,
                                       "grid": dict(self.grid), "losses": list(self.losses), "taus": list(self.taus),
                                       "count": self.count, "personal": dict(self.personal),
                                       "sums": self.sums} | self.dp_state()

    def dp_state(self) -> dict[str, Any]:
        """The budget spent (the accountant's loads)."""
        return {} if self.accountant is None else {"dp": self.accountant.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.model.load_state_dict(state["model"])
        self.tau, self.tau0, self.grid = state["tau"], state["tau0"], dict(state["grid"])
        self.losses, self.taus, self.count = state["losses"], state["taus"], state["count"]
        self.personal = dict(state["personal"])
        self.sums = max(self.sums, state.get("sums", 0))  # a retry keeps labels used after the checkpoint
        if self.accountant is not None:
            self.accountant.load_state(state["dp"])
