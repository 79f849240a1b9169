"""FedAvg over horizontal subgraphs, ignoring cross-client edges (the "local only" baseline).

Each round the server samples a fraction of the clients, sends them the global model, each trains
``local_epochs`` on its own subgraph (cross-client edges are invisible to it) and returns its model;
the server averages them weighted by training-node count. This is FedSage in swift-fedgnn.txt and
FedLocal in fedaas.txt.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field
from torch_geometric.data import Data

from ..comm import Party, rpc
from ..config import ModelConfig, TrainConfig
from ..evaluation import Evaluator
from ..partition import partition_horizontal
from ..training import LocalTrainer, make_model
from .base import Protocol, ProtocolOptions


class FedAvgOptions(ProtocolOptions):
    local_epochs: int = Field(3, ge=1)
    batch_size: int | None = Field(None, ge=1, description="training nodes per local step; default full batch")
    client_fraction: float = Field(1.0, gt=0, le=1, description="share of clients sampled each round")


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


def weighted_average(states: list[dict[str, torch.Tensor]], weights: torch.Tensor) -> dict[str, torch.Tensor]:
    w = (weights / weights.sum()).tolist()
    return {key: sum(wi * s[key].float() for wi, s in zip(w, states)).to(states[0][key].dtype) for key in states[0]}


class FedAvg(Protocol):
    name = "fedavg"
    scenario = "horizontal"
    Options = FedAvgOptions

    def setup(self, data: Data) -> None:
        p = self.cfg.partition
        self.partition_stats = (part := partition_horizontal(
            data, p.num_clients, p.method, seed=self.cfg.seed, alpha=p.alpha, edge_drop=p.edge_drop
        )).stats
        self.model = make_model(self.cfg.model, data.num_features, int(data.num_classes))
        self.clients = self.transport.spawn(FedAvgClient, [
            dict(name=f"client{m}", seed=self.cfg.seed * 100_003 + m + 1, shard=shard, model=self.cfg.model,
                 train=self.cfg.train, num_features=data.num_features, num_classes=int(data.num_classes),
                 local_epochs=self.opts.local_epochs, batch_size=self.opts.batch_size)
            for m, shard in enumerate(part.shards)
        ])

    def sample_clients(self) -> list[str]:
        k = max(1, round(self.opts.client_fraction * len(self.clients)))
        if k == len(self.clients):
            return self.clients
        chosen = torch.randperm(len(self.clients), generator=self.generator)[:k].sort().values
        return [self.clients[i] for i in chosen]

    def train_round(self, round_index: int) -> dict[str, float]:
        replies = self.transport.call_many(self.sample_clients(), "train", state=self.model.state_dict())
        weights = torch.tensor([float(r["num_train"]) for r in replies])
        if weights.sum() > 0:
            self.model.load_state_dict(weighted_average([r["state"] for r in replies], weights))
            loss = float((torch.tensor([r["loss"] for r in replies]) * weights).sum() / weights.sum())
        else:
            loss = float("nan")
        return {"train_loss": loss}

    def predict(self, evaluator: Evaluator) -> torch.Tensor:
        return evaluator.full_graph_logits(self.model, self.cfg.model.name)

    def state_dict(self) -> dict:
        return super().state_dict() | {"model": self.model.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.model.load_state_dict(state["model"])
