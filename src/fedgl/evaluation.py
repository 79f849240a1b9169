"""The scoring harness.

Scoring needs the ground truth of every node, which no single party holds in a federation. The
``Evaluator`` sits outside the parties: protocols hand it logits (or, for protocols with a global
model, the model to run on the whole graph) and it returns metrics. It never feeds data back into
training.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F
from torch_geometric.data import Data

from .errors import DataError
from .metrics import classification_metrics
from .models import as_model_input, prepare_graph

SPLITS = ("val", "test")  # what the runner reports; scoring the train split every round costs as much again


def check_scored(data: Data) -> None:
    """Refuse a split without training nodes (a run would learn nothing yet report scores) or without
    validation or test nodes, on which every score would be NaN."""
    empty = [split for split in ("train", *SPLITS) if not bool(getattr(data, f"{split}_mask").any())]
    if empty:
        names = {"train": "training", "val": "validation", "test": "test"}
        where = "dataset.split / dataset.options.train_per_class" if "train" in empty else "dataset.split"
        raise DataError(f"the dataset's split leaves no {' and no '.join(names[s] for s in empty)} nodes; "
                        f"give {'each' if len(empty) > 1 else 'it'} some ({where})")


def on_cpu(model: nn.Module) -> nn.Module:
    """The model itself, or a CPU copy of one trained on another device: scoring runs here, where the
    ground truth is."""
    if all(p.device.type == "cpu" for p in model.parameters()):
        return model
    return copy.deepcopy(model).cpu()


class Evaluator:
    def __init__(self, data: Data):
        check_scored(data)
        self.data = data
        self.num_classes = int(data.num_classes)
        self._x = as_model_input(data.x)
        self._graphs: dict[str, object] = {}

    @torch.no_grad()
    def full_graph_logits(self, model: nn.Module, model_name: str) -> torch.Tensor:
        """Run a global model on the whole graph (all edges, all features)."""
        if model_name not in self._graphs:
            self._graphs[model_name] = prepare_graph(self.data.edge_index, self.data.num_nodes, model_name)
        model = on_cpu(model)
        was_training = model.training
        model.eval()
        out = model(self._x, self._graphs[model_name])
        model.train(was_training)
        return out

    @torch.no_grad()
    def edge_logits(self, model: nn.Module) -> torch.Tensor:
        """Run a global model called as ``model(features, edge_index)`` on the whole graph (FedAAS's
        split attention net, which builds its own edge terms)."""
        model = on_cpu(model)
        was_training = model.training
        model.eval()
        out = model(self._x, self.data.edge_index)
        model.train(was_training)
        return out

    def score(self, logits: torch.Tensor) -> dict[str, float]:
        """Accuracy, macro-F1, AUC and cross-entropy loss on the validation and test nodes."""
        out = {}
        for split in SPLITS:
            mask = getattr(self.data, f"{split}_mask")
            for metric, value in classification_metrics(logits[mask], self.data.y[mask], self.num_classes).items():
                out[f"{split}_{metric}"] = value
            out[f"{split}_loss"] = float(F.cross_entropy(logits[mask].float(), self.data.y[mask]))
        return out
