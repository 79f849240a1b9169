"""GNN backbones and the graph inputs they consume; ``make_model``: every party builds its model here."""

from torch import nn

from fedgl.config import ModelConfig
from fedgl.models.backbones import GAT, GCN, GCNII, GIN, MODEL_NAMES, Backbone, GraphSAGE, build_model
from fedgl.models.graph import (
    GraphInput,
    SparseOperator,
    as_model_input,
    prepare_block,
    prepare_graph,
    select_rows,
)


def make_model(model: ModelConfig, in_dim: int, num_classes: int) -> nn.Module:
    """The backbone a run's ``model`` section describes."""
    return build_model(model.name, in_dim, model.hidden, num_classes, model.layers, model.dropout, **model.options)


__all__ = [
    "GAT",
    "GCN",
    "GCNII",
    "GIN",
    "MODEL_NAMES",
    "Backbone",
    "GraphInput",
    "GraphSAGE",
    "SparseOperator",
    "as_model_input",
    "build_model",
    "make_model",
    "prepare_block",
    "prepare_graph",
    "select_rows",
]
