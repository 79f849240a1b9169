"""GNN backbones and the graph inputs they consume."""

from fedgl.models.backbones import GAT, GCN, GCNII, GIN, MODEL_NAMES, Backbone, GraphSAGE, build_model
from fedgl.models.graph import (
    GraphInput,
    SparseOperator,
    as_model_input,
    prepare_block,
    prepare_graph,
    select_rows,
)

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
    "prepare_block",
    "prepare_graph",
    "select_rows",
]
