"""FedAvg over horizontal subgraphs, ignoring cross-client edges (the "local only" baseline).

Each round the server samples a fraction of the clients, sends them the global model, each trains
``local_epochs`` on its own subgraph (cross-client edges are invisible to it) and returns its model;
the server averages them weighted by training-node count: FedLocal-style local-only training (the
Swift paper's FedSage is ``swift`` with ``K: 0``, which keeps Swift's batches and gradient averaging).

Clients are parties of their own (``FedAvgClient``) or members of a ``FedAvgGroup``, a party that
trains several GCN/GraphSAGE clients as one batched computation (``protocols/fedavg_group.py``) with the
same trajectories and the same model bytes: each member's model travels as its own row of a
``Rows("model")`` payload and the ledger attributes it to that member.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch_geometric.data import Data

from .fedavg_group import ClientGroupTrainer, flat_state, groupable, state_from_row
from ..comm import Party, Rows, rpc
from ..config import ModelConfig, TrainConfig
from ..errors import ConfigError, RunFailed
from ..evaluation import Evaluator
from ..partition import horizontal_from_config
from ..optim import make_model
from .local_training import LocalTrainer
from .base import Protocol, ProtocolOptions


class FedAvgOptions(ProtocolOptions):
    local_epochs: int = Field(3, ge=1)
    batch_size: int | None = Field(None, ge=1, description="training nodes per local step; default full batch")
    client_fraction: float = Field(1.0, gt=0, le=1, description="share of clients sampled each round")
    group_size: int | None = Field(None, ge=1, description=(
        "clients per party; a party of several trains its gcn or sage clients as one batched computation "
        "(same trajectories and model bytes, a fraction of the per-operation overhead); 1 = one party per "
        "client; default: one group of all clients when the backbone is gcn or sage, training is full-batch "
        "and every client trains every round, else one party per client"))


class FedAvgClient(Party):
    def __init__(self, name: str, seed: int, shard: Any, model: ModelConfig, train: TrainConfig,
                 num_features: int, num_classes: int, local_epochs: int, batch_size: int | None):
        super().__init__(name, seed)
        net = make_model(model, num_features, num_classes)
        self.trainer = LocalTrainer(net, model.name, shard.x, shard.edge_index, shard.y, shard.train_mask, train)
        self.num_train = int(shard.train_mask.sum())
        self.local_epochs = local_epochs
        self.batch_size = batch_size

    @rpc(state="model", returns={"state": "model", "num_train": "control", "loss": "control"})
    def train(self, state: dict[str, torch.Tensor]) -> dict[str, Any]:
        self.trainer.set_state(state)
        loss = self.trainer.train_epochs(self.local_epochs, self.batch_size) if self.num_train else 0.0
        return {"state": self.trainer.get_state(), "num_train": self.num_train, "loss": loss}


class FedAvgGroup(Party):
    """Several FedAvg clients in one party, trained as one batched computation.

    Each member is first built as the ``FedAvgClient`` it stands for (its own seed, model
    initialisation, prepared graph and the RNG state it would train with); the group then keeps
    only what ``ClientGroupTrainer`` needs. The rows of every ``Rows`` payload are the members listed
    in ``users`` (all members when None), in that order.
    """

    def __init__(self, name: str, seed: int, members: list[dict[str, Any]], train: TrainConfig, local_epochs: int):
        super().__init__(name, seed)
        clients = [FedAvgClient.create(**kwargs) for kwargs in members]
        # ``_rng_state`` is the torch RNG state each client party would carry into its first call.
        self.trainer = ClientGroupTrainer([c.trainer for c in clients], [c._rng_state for c in clients], train)
        self.num_train = torch.tensor([c.num_train for c in clients])
        self.local_epochs = local_epochs

    @rpc(state=Rows("model"), users="index",
         returns={"state": Rows("model"), "num_train": Rows("control"), "loss": Rows("control")})
    def train(self, state: torch.Tensor, users: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``state`` holds one ``flat_state`` row per listed member (``users``; None = all)."""
        self.trainer.set_rows(state, users)
        num_train = self.num_train if users is None else self.num_train[users]
        members = torch.arange(self.num_train.numel()) if users is None else users
        loss = torch.zeros(members.numel(), dtype=torch.float64)  # 8 bytes each, as a client's float
        training = num_train > 0
        if bool(training.any()):
            loss[training] = self.trainer.train_epochs(self.local_epochs, members[training]).double()
        return {"state": self.trainer.get_rows(users), "num_train": num_train, "loss": loss}


def weighted_average(states: list[dict[str, torch.Tensor]], weights: torch.Tensor) -> dict[str, torch.Tensor]:
    w = (weights / weights.sum()).tolist()
    return {key: sum(wi * s[key].float() for wi, s in zip(w, states)).to(states[0][key].dtype) for key in states[0]}


class FedAvg(Protocol):
    name = "fedavg"
    scenario = "horizontal"
    Options = FedAvgOptions
    can_skip_parties = True  # averaging goes on over the clients that remain

    def setup(self, data: Data) -> None:
        self.partition_stats = (part := horizontal_from_config(data, self.cfg.partition, self.cfg.seed)).stats
        self.model = make_model(self.cfg.model, data.num_features, int(data.num_classes))
        self.num_clients = len(part.shards)
        clients = [
            dict(name=f"client{m}", seed=self.cfg.seed * 100_003 + m + 1, shard=shard, model=self.cfg.model,
                 train=self.cfg.train, num_features=data.num_features, num_classes=int(data.num_classes),
                 local_epochs=self.opts.local_epochs, batch_size=self.opts.batch_size)
            for m, shard in enumerate(part.shards)
        ]
        self.alive = torch.ones(self.num_clients, dtype=torch.bool)
        self.size = size = self.group_size()  # clients per party: client m is member m % size of party m // size
        if size == 1:
            self.clients = self.transport.spawn(FedAvgClient, clients)
        else:
            self.clients = self.transport.spawn(FedAvgGroup, [
                dict(name=f"group{g}", seed=members[0]["seed"], members=members, train=self.cfg.train,
                     local_epochs=self.opts.local_epochs)
                for g, members in enumerate(clients[i : i + size] for i in range(0, len(clients), size))
            ])

    def group_size(self) -> int:
        """Clients per party (see ``FedAvgOptions.group_size``)."""
        batchable = groupable(self.cfg.model.name) and self.opts.batch_size is None
        size = self.opts.group_size
        if size is None:
            return self.num_clients if batchable and self.sample_size() == self.num_clients else 1
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
        state = self.model.state_dict()
        rows, num_train, losses = (self.train_groups if self.size > 1 else self.train_clients)(chosen, state)
        weights = num_train.to(rows.dtype)
        if weights.sum() > 0:
            self.model.load_state_dict(state_from_row((weights / weights.sum()) @ rows, state))
            loss = float((losses.to(rows.dtype) * weights).sum() / weights.sum())
        else:
            loss = float("nan")
        return {"train_loss": loss}

    def train_clients(self, chosen: torch.Tensor, state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """One party per client: the global ``state`` to each; their models as ``flat_state`` rows,
        training-node counts and losses, in the order of ``chosen``."""
        replies = self.transport.call_many([self.clients[i] for i in chosen], "train", state=state)
        return (torch.stack([flat_state(r["state"]) for r in replies]),
                torch.tensor([r["num_train"] for r in replies]), torch.tensor([r["loss"] for r in replies]))

    def train_groups(self, chosen: torch.Tensor, state: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """As ``train_clients`` with client groups: one call per group holding chosen clients, one
        row of the global model per chosen member (``users`` names them unless all are chosen)."""
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
            return replies[0]["state"], replies[0]["num_train"], replies[0]["loss"]
        return tuple(torch.cat([r[key] for r in replies]) for key in ("state", "num_train", "loss"))

    def predict(self, evaluator: Evaluator) -> torch.Tensor:
        return evaluator.full_graph_logits(self.model, self.cfg.model.name)

    def state_dict(self) -> dict:
        return super().state_dict() | {"model": self.model.state_dict(), "alive": self.alive.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.model.load_state_dict(state["model"])
        self.alive = state["alive"].clone()
