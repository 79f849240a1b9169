"""Backbones: agreement with PyG's own layers, block/full-graph and sparse/dense equivalence, Cora."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.utils import add_self_loops

from fedgl.errors import ConfigError
from fedgl.models import (
    MODEL_NAMES,
    GraphSAGE,
    as_model_input,
    build_model,
    prepare_graph,
    select_rows,
)
from fedgl.models.graph import feature_dropout
from fedgl.sampling import CSR, full_neighborhood, sample_layerwise, sample_neighbors

NUM_NODES, IN_DIM, OUT_DIM = 60, 40, 5


@pytest.fixture(scope="module")
def graph() -> tuple[torch.Tensor, torch.Tensor]:
    """A directed graph (so in- and out-neighbours differ) and ~4%-dense non-negative features."""
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, NUM_NODES, (2, 300), generator=gen)
    edge_index = torch.unique(edge_index[:, edge_index[0] != edge_index[1]], dim=1)
    mask = torch.rand(NUM_NODES, IN_DIM, generator=gen) < 0.04
    x = mask * torch.rand(NUM_NODES, IN_DIM, generator=gen)
    return edge_index, x


def _model(name: str, dropout: float = 0.5, **kwargs):
    options = {"heads": 4} if name == "gat" else {}
    return build_model(name, IN_DIM, 16, OUT_DIM, dropout=dropout, seed=3, **{**options, **kwargs})


def _pyg_reference(model, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
    """The same network run through each PyG layer's own ``forward`` (eval mode)."""
    h = h0 = F.relu(model.input(x)) if model.name == "gcnii" else x
    for index, conv in enumerate(model.layers):
        if model.name in ("gcn", "gcnii"):
            reference = copy.deepcopy(conv)
            reference.normalize, reference.add_self_loops = True, True
            h = reference(h, edge_index) if model.name == "gcn" else reference(h, h0, edge_index)
        elif model.name == "gat":
            h = conv(h, add_self_loops(edge_index)[0])
        else:
            h = conv(h, edge_index)
        if index < model.num_layers - 1 or model.name == "gcnii":
            h = F.elu(h) if model.name == "gat" else F.relu(h)
    return model.output(h) if model.name == "gcnii" else h


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_backbones_match_pyg_layers(graph, name: str) -> None:
    edge_index, x = graph
    model = _model(name).eval()
    with torch.no_grad():
        out = model(x, prepare_graph(edge_index, NUM_NODES, name))
        assert out.shape == (NUM_NODES, OUT_DIM)
        assert torch.allclose(out, _pyg_reference(model, x, edge_index), atol=1e-5)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_full_neighbourhood_blocks_equal_full_graph(graph, name: str) -> None:
    """Same outputs, and (dropout off) the same parameter gradients, for a loss on the seeds."""
    edge_index, x = graph
    model = _model(name, dropout=0.0)
    seeds = torch.tensor([3, 10, 11, 42, 57])
    target = torch.arange(seeds.numel()) % OUT_DIM
    sub = full_neighborhood(CSR.from_edge_index(edge_index, NUM_NODES), seeds, model.num_layers)

    def gradients(logits: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        F.cross_entropy(logits, target).backward()
        return [p.grad.clone() for p in model.parameters()]

    full = model(x, prepare_graph(edge_index, NUM_NODES, name))[seeds]
    full_grads = gradients(full)
    blocks = model.forward_blocks(x[sub.n_id], sub.blocks)
    assert blocks.shape == (seeds.numel(), OUT_DIM)
    assert torch.allclose(blocks, full, atol=1e-5)
    for a, b in zip(gradients(blocks), full_grads):
        assert torch.allclose(a, b, atol=1e-5)
    model.eval()
    with torch.no_grad():
        assert torch.allclose(
            model.forward_blocks(x[sub.n_id], sub.blocks),
            model(x, prepare_graph(edge_index, NUM_NODES, name))[seeds],
            atol=1e-5,
        )


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("num_layers", [1, 3])
def test_sampled_blocks_train(graph, name: str, num_layers: int) -> None:
    edge_index, x = graph
    model = _model(name, num_layers=num_layers).train()
    seeds = torch.arange(0, NUM_NODES, 4)
    csr = CSR.from_edge_index(edge_index, NUM_NODES)
    sub = sample_neighbors(csr, seeds, [3] * num_layers, torch.Generator().manual_seed(1))
    out = model.forward_blocks(select_rows(as_model_input(x), sub.n_id), sub.blocks)
    assert out.shape == (seeds.numel(), OUT_DIM)
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    assert model(x, prepare_graph(edge_index, NUM_NODES, name)).shape == (NUM_NODES, OUT_DIM)


def test_layerwise_blocks_only_feed_gcn_operators(graph) -> None:
    edge_index, x = graph
    seeds = torch.arange(10)
    csr = CSR.from_edge_index(edge_index, NUM_NODES)
    sub = sample_layerwise(csr, seeds, [20, 30], torch.Generator().manual_seed(2))
    for name in MODEL_NAMES:
        model = _model(name)
        if name in ("gcn", "gcnii"):
            assert model.forward_blocks(x[sub.n_id], sub.blocks).shape == (seeds.numel(), OUT_DIM)
        else:
            with pytest.raises(ConfigError, match="gcn"):
                model.forward_blocks(x[sub.n_id], sub.blocks)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_sparse_and_dense_features_agree(graph, name: str) -> None:
    edge_index, x = graph
    model = _model(name, dropout=0.0).train()
    prepared = prepare_graph(edge_index, NUM_NODES, name)
    target = torch.arange(NUM_NODES) % OUT_DIM
    results = []
    for features in (x, as_model_input(x), x.to_sparse_coo()):
        model.zero_grad()
        out = model(features, prepared)
        F.cross_entropy(out, target).backward()
        results.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    (dense_out, dense_grads), *sparse = results
    for out, grads in sparse:
        assert torch.allclose(out, dense_out, atol=1e-5)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, dense_grads))


def test_sparse_input_dropout_drops_stored_values_only(graph) -> None:
    _, x = graph
    features = as_model_input(x)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        dropped = feature_dropout(features, 0.5, training=True)
    assert dropped.layout == torch.sparse_csr
    assert torch.equal(dropped.crow_indices(), features.crow_indices())
    assert torch.equal(dropped.col_indices(), features.col_indices())
    kept = dropped.values() != 0
    assert torch.allclose(dropped.values()[kept], 2 * features.values()[kept])
    assert 0.3 < kept.float().mean() < 0.7
    assert feature_dropout(features, 0.5, training=False) is features


def test_as_model_input_picks_layout_by_density(graph) -> None:
    _, x = graph
    sparse = as_model_input(x)
    assert sparse.layout == torch.sparse_csr and torch.equal(sparse.to_dense(), x)
    assert as_model_input(x, threshold=0.01).layout == torch.strided
    assert as_model_input(x.to_sparse_coo()).layout == torch.sparse_csr
    assert as_model_input(torch.ones(3, 4)).layout == torch.strided
    rows = torch.tensor([5, 0, 59, 5])
    assert torch.equal(select_rows(sparse, rows).to_dense(), x[rows])
    with pytest.raises(ConfigError, match="threshold"):
        as_model_input(x, threshold=2.0)


@pytest.mark.parametrize("name", ["gcn", "gcnii"])
def test_forward_layer_composes_to_forward(graph, name: str) -> None:
    edge_index, x = graph
    model = _model(name).eval()
    prepared = prepare_graph(edge_index, NUM_NODES, name)
    h0 = model.encode(x)
    h = h0
    for index in range(model.num_layers):
        h = model.forward_layer(index, h, prepared, h0)
    assert torch.allclose(model.decode(h), model(x, prepared))


def test_build_model_names_options_and_seed() -> None:
    assert isinstance(build_model("GraphSAGE", 4, 8, 2), GraphSAGE)
    assert build_model("GCN", 4, 8, 2).name == "gcn"
    assert len(build_model("gcnii", 4, 8, 2, num_layers=4).layers) == 4
    with pytest.raises(ConfigError, match="gcn, sage, gat, gcnii, gin, graphsage"):
        build_model("mlp", 4, 8, 2)
    with pytest.raises(ConfigError, match="num_layers"):
        build_model("gcn", 4, 8, 2, num_layers=0)
    with pytest.raises(ConfigError, match="dropout"):
        build_model("gcn", 4, 8, 2, dropout=1.0)
    with pytest.raises(ConfigError, match="allowed: heads"):
        build_model("gat", 4, 8, 2, alpha=0.1)
    with pytest.raises(ConfigError, match="heads"):
        build_model("gat", 4, 8, 2, heads=3)
    state = torch.random.get_rng_state()
    first, second = build_model("gat", 4, 8, 2, seed=5), build_model("gat", 4, 8, 2, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))


def test_graph_prepared_for_another_backbone_is_rejected(graph) -> None:
    edge_index, x = graph
    with pytest.raises(ConfigError, match="prepare_graph"):
        _model("gcn")(x, prepare_graph(edge_index, NUM_NODES, "sage"))
    assert prepare_graph(edge_index, NUM_NODES, "gcnii").kind == prepare_graph(edge_index, NUM_NODES, "GCN").kind


@pytest.fixture(scope="module")
def cora(data_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """Cora loaded by PyG from a private folder whose ``raw`` links to the read-only mirror."""
    raw = data_root / "planetoid" / "Cora" / "raw"
    if not raw.is_dir():
        pytest.skip(f"Cora raw files not found under {raw}")
    from torch_geometric.datasets import Planetoid

    base = tmp_path_factory.mktemp("planetoid")
    (base / "Cora").mkdir()
    (base / "Cora" / "raw").symlink_to(raw)
    return Planetoid(str(base), "Cora")[0]


def test_gcn_reaches_published_accuracy_on_cora(cora) -> None:
    """2-layer GCN (hidden 64), public split, Kipf & Welling settings: at least 80% test accuracy.

    Runs single-threaded: these kernels are too small to gain from a second OpenMP thread, and on
    a shared machine the thread barriers alone can make the run several times slower.
    """
    model = build_model("gcn", cora.num_features, 64, 7, dropout=0.5, seed=0)
    x = as_model_input(cora.x)
    prepared = prepare_graph(cora.edge_index, cora.num_nodes, "gcn")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            for _ in range(200):
                model.train()
                optimizer.zero_grad()
                F.cross_entropy(model(x, prepared)[cora.train_mask], cora.y[cora.train_mask]).backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    with torch.no_grad():
        prediction = model(x, prepared).argmax(1)
    accuracy = float((prediction[cora.test_mask] == cora.y[cora.test_mask]).float().mean())
    assert accuracy >= 0.80, f"test accuracy {accuracy:.3f}"
