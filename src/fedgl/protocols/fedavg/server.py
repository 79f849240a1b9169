"""FedAvg's server: samples the clients of a round, sends them the global model and averages what
they return (weighted by training nodes; with secure aggregation the decoded result of ``secure_sum``)."""

from __future__ import annotations

from typing import Any, Callable, Collection

import torch
from pydantic import Field
from torch_geometric.data import Data

from ...comm import Transport
from ...config import RunConfig
from ...errors import ConfigError, RunFailed
from ...evaluation import Evaluator
from ...partition import horizontal_from_config
from ...models import make_model
from ...privacy.dp import CLIENT_UPDATES, DPAccountant
from ..aggregation import check_secure_round, secure_sum, trust_identities
from ..base import Protocol, ProtocolOptions
from .client import FedAvgClient, FedAvgGroup
from .group import flat_state, groupable, state_from_row


class FedAvgOptions(ProtocolOptions):
    local_epochs: int = Field(3, ge=1)
    batch_size: int | None = Field(None, ge=1, description="training nodes per local step; default full batch")
    client_fraction: float = Field(1.0, gt=0, le=1, description="share of clients sampled each round")
    group_size: int | None = Field(None, ge=1, description=(
        "clients per party; a party of several trains its gcn or sage clients as one batched computation "
        "(same trajectories and model bytes, a fraction of the per-operation overhead); 1 = one party per "
        "client; default: one group of all clients when the backbone is gcn or sage, training is full-batch "
        "and every client trains every round, else one party per client"))


def weighted_average(states: list[dict[str, torch.Tensor]], weights: torch.Tensor) -> dict[str, torch.Tensor]:
    w = (weights / weights.sum()).tolist()
    return {key: sum(wi * s[key].float() for wi, s in zip(w, states)).to(states[0][key].dtype) for key in states[0]}


class FedAvg(Protocol):
    name = "fedavg"
    scenario = "horizontal"
    Options = FedAvgOptions
    can_skip_parties = True  # averaging goes on over the clients that remain

    def __init__(self, cfg: RunConfig, transport: Transport):
        super().__init__(cfg, transport)
        self.privacy = cfg.privacy
        self.sums = 0  # secure sums run so far: each one's label, never used twice
        # the parties that do not answer a step ("input": the upload) of a round; the server's timeouts
        # (a run in one process never times out, so None: everyone answers)
        self.absent: Callable[[int, str], Collection[str]] | None = None

    def build(self, num_features: int, num_classes: int) -> None:
        self.model = make_model(self.cfg.model, num_features, num_classes)

    def setup(self, data: Data) -> None:
        self.build(data.num_features, int(data.num_classes))
        self.partition_stats = (part := horizontal_from_config(data, self.cfg.partition, self.cfg.seed)).stats
        self.num_clients = len(part.shards)
        clients = [
            dict(name=f"client{m}", seed=self.cfg.seed * 100_003 + m + 1, shard=shard, model=self.cfg.model,
                 train=self.cfg.train, num_features=data.num_features, num_classes=int(data.num_classes),
                 local_epochs=self.opts.local_epochs, batch_size=self.opts.batch_size, index=m, privacy=self.privacy)
            for m, shard in enumerate(part.shards)
        ]
        self.alive = torch.ones(self.num_clients, dtype=torch.bool)
        dp = self.privacy.dp  # every round a client takes part in is a full release of its update
        self.accountant = DPAccountant(dp, torch.arange(self.num_clients), CLIENT_UPDATES) if dp is not None else None
        if self.privacy.secure_aggregation:
            check_secure_round(self.privacy, self.sample_size(), "fedavg",
                               "partition.num_clients x protocol.client_fraction")
        self.size = size = self.group_size()  # clients per party: client m is member m % size of party m // size
        if size == 1:
            self.clients = self.transport.spawn(FedAvgClient, clients)
        else:
            self.clients = self.transport.spawn(FedAvgGroup, [
                dict(name=f"group{g}", seed=members[0]["seed"], members=members, train=self.cfg.train,
                     local_epochs=self.opts.local_epochs, privacy=self.privacy)
                for g, members in enumerate(clients[i : i + size] for i in range(0, len(clients), size))
            ])

    def start(self) -> None:
        if self.privacy.secure_aggregation:
            trust_identities(self.transport, self.clients, self.privacy)

    def group_size(self) -> int:
        """Clients per party (see ``FedAvgOptions.group_size``)."""
        batchable = groupable(self.cfg.model.name) and self.opts.batch_size is None
        size = self.opts.group_size
        if size is None:
            whole = batchable and self.sample_size() == self.num_clients and not self.privacy.secure_aggregation
            return self.num_clients if whole else 1
        if size > 1 and self.privacy.secure_aggregation:
            raise ConfigError(f"fedavg group_size {size}: privacy.secure_aggregation needs one party per client "
                              f"(each holds its own secrets); use group_size 1")
        if size > 1 and not batchable:
            raise ConfigError(f"fedavg group_size {size} needs a gcn or sage backbone and full-batch training "
                              f"(batch_size unset), got model '{self.cfg.model.name}' and batch_size "
                              f"{self.opts.batch_size}; use group_size 1")
        return min(size, self.num_clients)

    def sample_size(self) -> int:
        return max(1, round(self.opts.client_fraction * self.num_clients))

    def sample_clients(self) -> torch.Tensor:
        """Ids of the clients training this round, ascending (drawn with the server's generator from
        the clients not lost)."""
        alive = self.alive.nonzero().flatten()
        k = min(self.sample_size(), alive.numel())
        if k == alive.numel():
            return alive
        return alive[torch.randperm(alive.numel(), generator=self.generator)[:k]].sort().values

    def drop_parties(self, names: list[str]) -> None:
        for name in names:
            party = self.clients.index(name)
            self.alive[party * self.size : (party + 1) * self.size] = False
        if not self.alive.any():
            raise RunFailed("fedavg lost every client")

    def train_round(self, round_index: int) -> dict[str, float]:
        chosen = self.sample_clients()
        stats = {}
        if self.accountant is not None:  # counted before any client releases its update
            self.accountant.charge(nodes=chosen)
            stats["epsilon"] = self.accountant.epsilon()
        state = self.model.state_dict()
        secure = {"summands": chosen.numel()} if self.privacy.secure_aggregation else {}
        out = (self.train_groups if self.size > 1 else self.train_clients)(chosen, state, secure)
        if secure:
            total = self.secure_total(chosen, round_index)  # [sum w * model, sum w, sum w * loss]
            if total[-2] <= 0:
                return {"train_loss": float("nan"), **stats}
            average, loss = total[:-2] / total[-2], float(total[-1] / total[-2])
        else:
            arrived = torch.tensor([self.clients[p] not in self.gone(round_index, "input")
                                    for p in chosen.div(self.size, rounding_mode="floor").tolist()])
            rows, weights = out["state"][arrived], out["num_train"][arrived].to(out["state"].dtype)
            if weights.sum() <= 0:
                return {"train_loss": float("nan"), **stats}
            average = (weights / weights.sum()) @ rows
            loss = float((out["loss"][arrived].to(rows.dtype) * weights).sum() / weights.sum())
        self.model.load_state_dict(state_from_row(average, state))
        return {"train_loss": loss, **stats}

    def gone(self, round_index: int, step: str) -> set[str]:
        return set(self.absent(round_index, step)) if self.absent is not None else set()

    def secure_total(self, chosen: torch.Tensor, round_index: int) -> torch.Tensor:
        """The decoded sum of the chosen clients' encoded rows that stay to the end of the secure sum."""
        self.sums += 1
        total, _ = secure_sum(self.transport, [self.clients[i] for i in chosen.tolist()], chosen.tolist(), self.sums,
                              self.privacy.secure_threshold(chosen.numel()), lambda step: self.gone(round_index, step))
        return total

    def train_clients(self, chosen: torch.Tensor, state: dict[str, torch.Tensor],
                      secure: dict[str, Any]) -> dict[str, torch.Tensor]:
        """One party per client: the global ``state`` to each; their replies stacked in the order of
        ``chosen`` (models as ``flat_state`` rows, training-node counts, losses; nothing under secure
        aggregation, where the clients keep their rows for ``secure_total``)."""
        replies = self.transport.call_many([self.clients[i] for i in chosen], "train", state=state, **secure)
        if secure:
            return {}
        return {"state": torch.stack([flat_state(r["state"]) for r in replies]),
                "num_train": torch.tensor([r["num_train"] for r in replies]),
                "loss": torch.tensor([r["loss"] for r in replies])}

    def train_groups(self, chosen: torch.Tensor, state: dict[str, torch.Tensor],
                     secure: dict[str, Any]) -> dict[str, torch.Tensor]:
        """As ``train_clients`` with client groups (never under secure aggregation): one call per group
        holding chosen clients, one row of the global model per chosen member (``users`` names them
        unless all are chosen)."""
        row = flat_state(state)
        parties = chosen.div(self.size, rounding_mode="floor")
        targets, calls = [], []
        for party in sorted(set(parties.tolist())):
            members = chosen[parties == party] - party * self.size
            everyone = members.numel() == min(self.size, self.num_clients - party * self.size)
            targets.append(self.clients[party])
            calls.append({"state": row.expand(members.numel(), -1), "users": None if everyone else members})
        replies = self.transport.call_many(targets, "train", per_target=calls)
        if len(replies) == 1:  # a single group: its rows as they came
            return replies[0]
        return {key: torch.cat([r[key] for r in replies]) for key in replies[0]}

    def predict(self, evaluator: Evaluator) -> torch.Tensor:
        return evaluator.full_graph_logits(self.model, self.cfg.model.name)

    def summary(self) -> dict[str, Any]:
        if self.accountant is None:
            return {}
        return self.accountant.summary()

    def state_dict(self) -> dict:
        dp = {"dp": self.accountant.state()} if self.accountant is not None else {}
        return super().state_dict() | {"model": self.model.state_dict(), "alive": self.alive.clone(),
                                       "sums": self.sums} | dp

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.model.load_state_dict(state["model"])
        self.alive = state["alive"].clone()
        self.sums = max(self.sums, state.get("sums", 0))  # a retry keeps labels used after the checkpoint
        if self.accountant is not None:
            self.accountant.load_state(state["dp"])
