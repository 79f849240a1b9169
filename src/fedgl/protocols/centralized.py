"""Centralized training: one party holds the whole graph; no communication.

The reference every paper compares with. One round is ``local_epochs`` optimisation steps.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch_geometric.data import Data

from .. import device as devices
from ..evaluation import Evaluator
from ..models import make_model
from .local_training import LocalTrainer
from .base import Protocol, ProtocolOptions


class CentralizedOptions(ProtocolOptions):
    local_epochs: int = Field(1, ge=1, description="optimisation steps (epochs) per round")
    batch_size: int | None = Field(None, ge=1, description="training nodes per step; default full batch")


class Centralized(Protocol):
    name = "centralized"
    scenario = "central"
    Options = CentralizedOptions

    def setup(self, data: Data) -> None:
        model = make_model(self.cfg.model, data.num_features, int(data.num_classes)).to(self.device)
        x, edge_index, y, train_mask = devices.move((data.x, data.edge_index, data.y, data.train_mask), self.device)
        with devices.working_on(self.device):
            self.trainer = LocalTrainer(model, self.cfg.model.name, x, edge_index, y, train_mask, self.cfg.train)

    def train_round(self, round_index: int) -> dict[str, float]:
        with devices.working_on(self.device):
            return {"train_loss": self.trainer.train_epochs(self.opts.local_epochs, self.opts.batch_size)}

    def predict(self, evaluator: Evaluator) -> torch.Tensor:
        return evaluator.full_graph_logits(self.trainer.model, self.cfg.model.name)

    def state_dict(self) -> dict:
        return super().state_dict() | {
            "model": self.trainer.model.state_dict(),
            "optimizer": self.trainer.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.trainer.model.load_state_dict(state["model"])
        self.trainer.optimizer.load_state_dict(state["optimizer"])
