"""The full-graph local training loop of the centralized reference and FedAvg clients."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ..config import TrainConfig
from ..models import as_model_input, prepare_graph
from ..optim import make_optimizer


class LocalTrainer:
    """A model, its optimiser and one party's graph, trained on that party's labelled nodes."""

    def __init__(self, model: nn.Module, model_name: str, x, edge_index, y, train_mask, train: TrainConfig | None):
        """``train`` None: the model is trained elsewhere (a FedAvg group's member), so no optimiser is made."""
        self.model = model
        self.x = as_model_input(x)
        self.graph = prepare_graph(edge_index, y.numel(), model_name)
        self.y = y
        self.train_idx = train_mask.nonzero().flatten()
        self.optimizer = make_optimizer(model.parameters(), train) if train is not None else None
        self._tensors = model.state_dict(keep_vars=True)  # live parameters and buffers, by name

    def get_state(self) -> dict[str, torch.Tensor]:
        """The model's parameters and buffers by name (``state_dict`` without its per-call module walk)."""
        return {name: tensor.detach() for name, tensor in self._tensors.items()}

    @torch.no_grad()
    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        """Copy ``state`` (the same names as ``get_state``) into the model in place."""
        if state.keys() != self._tensors.keys():
            raise ValueError(f"model state keys differ: got {sorted(state)}, expected {sorted(self._tensors)}")
        for name, tensor in self._tensors.items():
            tensor.copy_(state[name])

    def _step(self, idx: torch.Tensor) -> torch.Tensor:
        """One optimiser step on the nodes ``idx``; returns the detached loss (the model must be in
        training mode: ``train_epochs`` sets it once, not per step)."""
        self.optimizer.zero_grad()
        out = self.model(self.x, self.graph)
        loss = F.cross_entropy(out[idx], self.y[idx])
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def train_epochs(self, epochs: int, batch_size: int | None = None) -> float:
        """Full-batch steps, or shuffled mini-batches of training nodes; returns the mean loss."""
        self.model.train()
        losses = []
        for _ in range(epochs):
            if batch_size is None or batch_size >= self.train_idx.numel():
                losses.append(self._step(self.train_idx))
                continue
            order = self.train_idx[torch.randperm(self.train_idx.numel())]
            losses.extend(self._step(batch) for batch in order.split(batch_size))
        return torch.stack(losses).mean().item() if losses else 0.0
