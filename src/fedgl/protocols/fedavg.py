"""FedAvg over horizontal subgraphs, ignoring cross-client edges (the "local only" baseline).

Each round the server samples a fraction of the clients, sends them the global model, each trains
``local_epochs`` on its own subgraph (cross-client edges are invisible to it) and returns its model;
the server averages them weighted by training-node count: FedLocal-style local-only training (the
Swift paper's FedSage is ``swift`` with ``K: 0``, which keeps Swift's batches and gradient averaging).

Clients are parties of their own (``FedAvgClient``) or members of a ``FedAvgGroup``, a party that
trains several GCN/GraphSAGE clients as one batched computation (``protocols/fedavg_group.py``) with the
same trajectories and the same model bytes: each member's model travels as its own row of a
``Rows("model")`` payload and the ledger attributes it to that member.

Privacy (``RunConfig.privacy``, ``fedgl.privacy``): with ``dp`` each client clips its update (its model
minus the global model it received) and adds Gaussian noise before anything leaves it; the server
tracks epsilon with the accountant. With ``secure_aggregation`` (one party per client) a client keeps
``[w * model, w, w * loss]`` (w its training-node count) in fixed point and the server sums them with
``protocols/aggregation.py``'s ``secure_sum`` (Bonawitz et al., with the configured threshold), so it
learns the weighted sums of the clients that stay to the end of the round and nothing per client.
"""

from __future__ import annotations

from typing import Any, Callable, Collection

import torch
from pydantic import Field
from torch_geometric.data import Data

from .aggregation import SecureSumParty, secure_sum, trust_identities
from .fedavg_group import ClientGroupTrainer, flat_state, groupable, state_from_row
from ..comm import Party, Rows, Transport, rpc
from ..config import ModelConfig, RunConfig, TrainConfig
from ..privacy import PrivacyConfig
from ..privacy.dp import Accountant, privatize
from ..privacy.bonawitz import SecAggClient
from ..privacy.secure_aggregation import MIN_PARTICIPANTS, encode
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


def private_reply(rows: torch.Tensor, start: torch.Tensor, num_train: torch.Tensor, loss: torch.Tensor,
                  privacy: PrivacyConfig, generators: list[torch.Generator | None],
                  summands: int) -> dict[str, torch.Tensor]:
    """What k clients release after training from ``start`` to ``rows`` (``flat_state`` rows): with DP
    the noised, clipped updates applied to ``start``; with secure aggregation the fixed-point rows
    ``[w * model, w, w * loss]`` (w = training nodes) for a secure sum of ``summands`` clients."""
    if privacy.dp is not None:
        rows = start + privatize(rows - start, privacy.dp, generators)
    if not privacy.secure_aggregation:
        return {"state": rows, "num_train": num_train, "loss": loss}
    values = torch.cat([rows.double(), torch.ones_like(loss).unsqueeze(1), loss.unsqueeze(1)], 1)
    return {"encoded": encode(values, num_train, summands)}


class FedAvgClient(SecureSumParty, Party):
    def __init__(self, name: str, seed: int, shard: Any, model: ModelConfig, train: TrainConfig | None,
                 num_features: int, num_classes: int, local_epochs: int, batch_size: int | None,
                 index: int = 0, privacy: PrivacyConfig | None = None):
        super().__init__(name, seed)
        net = make_model(model, num_features, num_classes)
        self.trainer = LocalTrainer(net, model.name, shard.x, shard.edge_index, shard.y, shard.train_mask, train)
        self.num_train = int(shard.train_mask.sum())
        self.local_epochs = local_epochs
        self.batch_size = batch_size
        self.privacy = privacy or PrivacyConfig()
        self.secagg = SecAggClient.create(index) if self.privacy.secure_aggregation else None

    @rpc(state="model", summands="control", returns={"state": "model", "num_train": "control", "loss": "control"})
    def train(self, state: dict[str, torch.Tensor], summands: int = 0) -> dict[str, Any]:
        """Local training from ``state``; the model is returned, or under secure aggregation kept
        encoded for the secure sum of ``summands`` clients that follows."""
        self.trainer.set_state(state)
        loss = self.trainer.train_epochs(self.local_epochs, self.batch_size) if self.num_train else 0.0
        trained = self.trainer.get_state()
        if not self.privacy.requested():
            return {"state": trained, "num_train": self.num_train, "loss": loss}
        reply = private_reply(flat_state(trained).unsqueeze(0), flat_state(state).unsqueeze(0),
                              torch.tensor([self.num_train]), torch.tensor([loss], dtype=torch.float64),
                              self.privacy, [None], summands)
        if "encoded" in reply:
            self.secure_value = reply["encoded"][0]
            return {}
        return {"state": state_from_row(reply["state"][0], trained), "num_train": self.num_train, "loss": loss}


class FedAvgGroup(Party):
    """Several FedAvg clients in one party, trained as one batched computation.

    Each member is first built as the ``FedAvgClient`` it stands for (its own seed, model
    initialisation, prepared graph and the RNG state it would train with); the group then keeps
    only what ``ClientGroupTrainer`` needs. The rows of every ``Rows`` payload are the members listed
    in ``users`` (all members when None), in that order.
    """

    def __init__(self, name: str, seed: int, members: list[dict[str, Any]], train: TrainConfig, local_epochs: int,
                 privacy: PrivacyConfig | None = None):
        super().__init__(name, seed)
        # Members are built without optimisers of their own: the group's optimiser trains them.
        device = torch.get_default_device()  # the group's, while it is made
        clients = [FedAvgClient.create(device, **(kwargs | {"train": None})) for kwargs in members]
        # The random state each client party would carry into its first call, on the group's device.
        states = [c._rng_state if c._device_rng_state is None else c._device_rng_state for c in clients]
        self.trainer = ClientGroupTrainer([c.trainer for c in clients], states, train)
        self.num_train = torch.tensor([c.num_train for c in clients])
        self.local_epochs = local_epochs
        self.privacy = privacy or PrivacyConfig()

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
        return private_reply(self.trainer.get_rows(users), state, num_train, loss, self.privacy,
                             [self.trainer.members[m].generator for m in members.tolist()], 0)


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
        self.accountant = Accountant(cfg.privacy.dp) if cfg.privacy.dp is not None else None
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
        if self.privacy.secure_aggregation:
            self.check_secure_round()
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
            trust_identities(self.transport, self.clients)

    def check_secure_round(self) -> None:
        """A secure sum needs 3 clients per round and no more than that for its threshold."""
        count, threshold = self.sample_size(), self.privacy.secure_threshold(self.sample_size())
        if count < MIN_PARTICIPANTS or threshold > count:
            raise ConfigError(f"fedavg: privacy.secure_aggregation needs at least {MIN_PARTICIPANTS} clients per "
                              f"round and no fewer than its threshold {threshold}, got {count} "
                              f"(partition.num_clients x protocol.client_fraction)")

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
            self.accountant.step(chosen.numel() / int(self.alive.sum()))
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
        return {"epsilon": self.accountant.epsilon(), "delta": self.accountant.delta}

    def state_dict(self) -> dict:
        dp = {"dp_rates": list(self.accountant.rates)} if self.accountant is not None else {}
        return super().state_dict() | {"model": self.model.state_dict(), "alive": self.alive.clone(),
                                       "sums": self.sums} | dp

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.model.load_state_dict(state["model"])
        self.alive = state["alive"].clone()
        self.sums = state.get("sums", 0)  # a checkpoint from before secure sums had labels
        if self.accountant is not None:
            self.accountant.rates = list(state["dp_rates"])
