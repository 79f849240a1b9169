"""GLASU: the split model equals centralized training, the ledger matches the analytic message
counts, the one-label-holder variant, standalone silence, config errors, backends and accuracy."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from fedgl.comm import NetworkModel, make_transport
from fedgl.config import build_config, load_config
from fedgl.data import load_dataset
from fedgl.errors import ConfigError
from fedgl.models.split_vertical import client_graph, features, make_block, sample_below
from fedgl.protocols.glasu import Glasu
from fedgl.runner import run

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "glasu-cora.yaml"
SYNTHETIC = {"name": "synthetic", "options": {"num_nodes": 300, "num_features": 24, "num_classes": 3}}


def config(dataset: dict, protocol: dict, model: dict | None = None, partition: dict | None = None,
           **sections) -> object:
    return build_config({
        "dataset": dataset,
        "partition": {"num_clients": 3, **(partition or {})},
        "model": {"name": "gcn", "hidden": 16, "layers": 2, "dropout": 0.0, **(model or {})},
        "protocol": {"name": "glasu", "batches": 1, **protocol},
        "network": {"compute": "ignore"},
        **sections,
    })


def build(cfg, data=None, backend: str = "local"):
    data = data if data is not None else load_dataset(cfg.dataset.name, cfg.dataset.data_root, seed=cfg.seed,
                                                      **cfg.dataset.options)
    transport = make_transport(backend, NetworkModel(compute="ignore"))
    protocol = Glasu(cfg, transport)
    protocol.setup(data)
    return protocol, data


def cora(data_root: Path) -> dict:
    return {"name": "cora", "data_root": str(data_root)}


# ---- M = 1, K = L, Q = 1, full neighbourhoods is centralized training -------------------------------
def reference_model(backbone: str, net, in_dim: int, hidden: int, layers: int) -> torch.nn.Module:
    """A centralized PyG model of the same architecture, holding the client's initial weights."""
    from torch_geometric.nn import GATConv, GCN2Conv, GCNConv

    class Reference(torch.nn.Module):
        def __init__(self):
            super().__init__()
            widths = [in_dim] + [hidden] * (layers - 1)
            if backbone == "gcn":
                self.convs = torch.nn.ModuleList(GCNConv(w, hidden) for w in widths)
                for conv, lin, bias in zip(self.convs, net.lins, net.biases):
                    conv.lin.weight.data.copy_(lin.weight)
                    conv.bias.data.copy_(bias)
            elif backbone == "gcnii":
                self.lin0 = copy.deepcopy(net.project)
                self.convs = torch.nn.ModuleList(GCN2Conv(hidden, 0.1, 0.5, l + 1) for l in range(layers))
                for conv, weight in zip(self.convs, net.weights):
                    conv.weight1.data.copy_(weight)
            else:
                self.convs = torch.nn.ModuleList(GATConv(w, hidden // 4, heads=4) for w in widths)
                for conv, mine in zip(self.convs, net.convs):
                    for name in ("att_src", "att_dst", "bias"):
                        getattr(conv, name).data.copy_(getattr(mine, name))
                    conv.lin.weight.data.copy_(mine.lin.weight)
            self.head = copy.deepcopy(net.head)

        def forward(self, x, edge_index):
            if backbone == "gcnii":
                x = x0 = F.relu(self.lin0(x))
                for conv in self.convs:
                    x = F.relu(conv(x, x0, edge_index))
            else:
                act = F.relu if backbone == "gcn" else F.elu
                for conv in self.convs:
                    x = act(conv(x, edge_index))
            return self.head(x)

    return Reference()


@pytest.mark.parametrize("backbone", ["gcn", "gcnii", "gat"])
def test_one_client_full_aggregation_trains_exactly_as_centralized(data_root, backbone):
    layers, hidden = 3, 16
    cfg = config(cora(data_root), {"K": layers, "Q": 1, "S": 10_000, "sampling": "full"},
                 model={"name": backbone, "layers": layers, "hidden": hidden},
                 partition={"num_clients": 1, "edge_keep": 1.0},
                 train={"lr": 0.01, "weight_decay": 5e-4})
    protocol, data = build(cfg)
    net = protocol.transport._parties["client0"].net
    reference = reference_model(backbone, net, data.num_features, hidden, layers)
    optimizer = torch.optim.Adam(reference.parameters(), lr=0.01, weight_decay=5e-4)
    mask = data.train_mask
    for r in range(1, 7):
        loss = F.cross_entropy(reference(data.x, data.edge_index)[mask], data.y[mask])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert protocol.train_round(r)["train_loss"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
    logits = protocol.predict(None)
    reference.eval()
    with torch.no_grad():
        assert torch.allclose(logits, reference(data.x, data.edge_index), atol=1e-4)


# ---- the ledger against the analytic count ---------------------------------------------------------
def embedding_bytes(ledger, round_index: int) -> int:
    return sum(row["bytes"] for row in ledger.rows() if row["round"] == round_index and row["kind"] == "embedding")


@pytest.mark.parametrize("K,Q,aggregation", [(1, 4, "mean"), (2, 2, "mean"), (4, 1, "mean"), (2, 3, "concat")])
def test_embedding_bytes_match_the_analytic_count(K, Q, aggregation):
    M, S, h, batches, L = 3, 8, 16, 3, 4
    cfg = config(SYNTHETIC, {"K": K, "Q": Q, "S": S, "batches": batches, "fanout": 2, "aggregation": aggregation},
                 model={"layers": L, "hidden": h})
    protocol, _ = build(cfg)
    ledger = protocol.transport.ledger
    for r in (1, 2):
        ledger.round = r
        rows = protocol.train_round(r)["embedding_rows"]
        down_width = h * (M if aggregation == "concat" else 1)
        # each client sends H_m^+ (rows x h) and receives H (rows x h, or M h when concatenated) per level
        assert embedding_bytes(ledger, r) == 4 * M * (h + down_width) * rows
        if K == 1:
            assert rows == S * batches  # only the mini-batch itself is aggregated
        # the batch goes to every client; each union level costs the clients' sets up and the union down
        assert ledger.messages(kind="embedding") == 2 * K * M * batches * r
    assert ledger.total(kind="gradient") == 0


def test_communication_saving_factor_is_measured():
    """Embedding messages per local update fall by exactly Q L / K; bytes fall by a measured factor."""
    L, batches = 4, 4

    def per_update(K: int, Q: int) -> tuple[float, float]:
        protocol, _ = build(config(SYNTHETIC, {"K": K, "Q": Q, "S": 8, "batches": batches, "fanout": 2},
                                   model={"layers": L}))
        protocol.train_round(1)
        ledger, updates = protocol.transport.ledger, batches * Q
        return ledger.messages(kind="embedding") / updates, ledger.total(kind="embedding") / updates

    base_messages, base_bytes = per_update(L, 1)
    lazy_messages, lazy_bytes = per_update(2, 4)
    assert base_messages / lazy_messages == pytest.approx(4 * L / 2)
    assert base_bytes / lazy_bytes > 4 * L / 2  # lazy levels skip the widest (lowest) layers too


# ---- one label holder (Appendix B.2) ---------------------------------------------------------------
def test_one_label_holder_broadcasts_the_output_gradient():
    M, S, h, batches = 3, 8, 16, 2
    cfg = config(SYNTHETIC, {"K": 1, "Q": 3, "S": S, "batches": batches},
                 model={"hidden": h}, partition={"label_holder": 1}, train={"lr": 0.05})
    protocol, data = build(cfg)
    parties = protocol.transport._parties
    assert parties["client1"].net.head is not None
    assert parties["client0"].net.head is None and parties["client0"].y is None
    assert protocol.train_nodes is None  # the server never sees the training ids
    ledger = protocol.transport.ledger
    losses = []
    for r in range(1, 16):
        ledger.round = r
        losses.append(protocol.train_round(r)["train_loss"])
    # dL/dH[L] goes holder -> server (S x h) and server -> each other client
    assert ledger.total(kind="gradient") == 4 * S * h * M * batches * 15
    # the holder's batch ids go up once and down to the M - 1 others
    assert ledger.total(kind="index") == 8 * S * M * batches * 15
    assert sum(losses[-3:]) < sum(losses[:3])
    logits = protocol.predict(None)
    assert logits.shape == (data.num_nodes, int(data.num_classes))


def test_standalone_clients_never_communicate():
    protocol, _ = build(config(SYNTHETIC, {"K": 0, "batches": 3}))
    protocol.train_round(1)
    by_kind = protocol.transport.ledger.by_kind(include_eval=False)
    assert sum(v for k, v in by_kind.items() if k != "control") == 0


# ---- sampling --------------------------------------------------------------------------------------
def test_sampler_and_blocks():
    from torch_geometric.nn.conv.gcn_conv import gcn_norm
    from torch_geometric.utils import to_dense_adj

    generator = torch.Generator().manual_seed(0)
    edges = torch.randint(0, 200, (2, 1500), generator=generator)
    edge_index = torch.cat([edges, edges.flip(0)], 1)
    graph = client_graph(edge_index, 200)
    targets = torch.arange(20)
    torch.manual_seed(0)
    nodewise = sample_below(graph, targets, 2, "nodewise")
    layerwise = sample_below(graph, targets, 3, "layerwise")
    full = sample_below(graph, targets, 1, "full")
    for nodes in (nodewise, layerwise, full):  # targets first, then neighbours of the targets only
        assert torch.equal(nodes[:20], targets) and set(nodes.tolist()) <= set(full.tolist())
    assert nodewise.numel() <= 20 * 3 and layerwise.numel() == min(20 * 4, full.numel())

    norm_index, norm_weight = gcn_norm(torch.unique(edge_index, dim=1), num_nodes=200)
    dense = to_dense_adj(norm_index.flip(0), edge_attr=norm_weight, max_num_nodes=200)[0]  # rows = targets

    def as_dense(block):
        dense_block = torch.zeros(block.num_out, block.num_in)
        return dense_block.index_put_((block.row, block.col), block.weight, accumulate=True)

    exact = make_block(graph, targets, full, "scaled")
    assert torch.allclose(as_dense(exact), dense[targets][:, full])  # full neighbourhoods: the GCN rows exactly
    sampled = make_block(graph, targets, nodewise, "scaled")
    has_neighbour = torch.bincount(sampled.row, minlength=20) > 1
    assert torch.allclose(as_dense(sampled).sum(1)[has_neighbour], dense[targets].sum(1)[has_neighbour])
    store = features((torch.rand(50, 40, generator=generator) < 0.05).float())
    assert store.dense is None and store.select(torch.tensor([3, 1])).crow.numel() == 3


# ---- configuration errors --------------------------------------------------------------------------
@pytest.mark.parametrize("protocol,model,partition,message", [
    ({"K": 5}, {}, {}, "exceeds the number of layers"),
    ({"agg_layers": [1]}, {}, {}, "must include the last layer"),
    ({"K": 2, "agg_layers": [2]}, {}, {}, "disagrees"),
    ({"aggregation": "concat"}, {"name": "gcnii"}, {}, "concat"),
    ({"eval_client": 7}, {}, {}, "not a client"),
    ({"K": 0}, {}, {"label_holder": 0}, "needs labels at every client"),
    ({"eval_client": 0}, {}, {"label_holder": 1}, "holds no labels"),
    ({"fanout": [2, 2, 2]}, {}, {}, "fanout"),
    ({}, {"name": "sage"}, {}, "allowed: gcn, gat, gcnii, gcnres"),
    ({}, {"name": "gcnii", "options": {"beta": 1}}, {}, "not understood"),
    ({}, {}, {"method": "metis"}, "not a vertical partition"),
    ({"fanout": 0}, {}, {}, "fanout"),
])
def test_bad_settings_are_config_errors(protocol, model, partition, message):
    with pytest.raises(ConfigError, match=message):
        build(config(SYNTHETIC, protocol, model=model, partition=partition))


# ---- backends, accuracy, example --------------------------------------------------------------------
@pytest.mark.ray
def test_local_and_ray_backends_agree(ray_session, tmp_path):
    results = {}
    for backend in ("local", "ray"):
        cfg = config(SYNTHETIC, {"K": 1, "Q": 2, "S": 8, "batches": 2}, model={"dropout": 0.3},
                     partition={"label_holder": 0}, train={"rounds": 3}, backend={"name": backend})
        results[backend] = run(cfg, tmp_path / backend)
    local, ray = results["local"], results["ray"]
    for a, b in zip(local.metrics, ray.metrics):
        assert a["train_loss"] == b["train_loss"] and a["test_accuracy"] == b["test_accuracy"]
        assert a["bytes_total"] == b["bytes_total"]


def test_glasu_beats_standalone_on_cora(data_root, tmp_path):
    """A short GLASU-4 run (3 clients, 2-layer GCN, K = 1) against clients that never communicate."""
    accuracy = {}
    for label, K in (("glasu", 1), ("standalone", 0)):
        cfg = config(cora(data_root), {"K": K, "Q": 4, "S": 32, "batches": 10, "fanout": 5, "sampling": "nodewise"},
                     model={"hidden": 64, "dropout": 0.5}, partition={"num_clients": 5},
                     train={"rounds": 6, "lr": 0.01})
        accuracy[label] = run(cfg, tmp_path / label).summary["test_accuracy"]
    assert accuracy["glasu"] >= 0.74
    assert accuracy["glasu"] - accuracy["standalone"] >= 0.08


def test_example_config_runs(data_root, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDGL_DATA_ROOT", str(data_root))
    cfg = load_config(EXAMPLE, ["train.rounds=1", "protocol.batches=2"])
    assert (cfg.protocol["K"], cfg.protocol["Q"], cfg.protocol["S"], cfg.partition.num_clients,
            cfg.model.name, cfg.model.layers) == (2, 4, 16, 3, "gcnii", 4)
    summary = run(cfg, tmp_path).summary
    assert summary["rounds"] == 1 and summary["bytes_by_kind"]["embedding"] > 0


def test_bench_tasks_build_valid_configs():
    from fedgl.bench.core import variant_config
    from fedgl.bench.glasu import TASKS

    assert {"glasu-table2", "glasu-table3", "glasu-table4", "glasu-table5", "glasu-figure3"} <= set(TASKS)
    for task in TASKS.values():
        for variant in task.variants:
            cfg = variant_config(task, variant, 0, task.quick)
            assert cfg.protocol_name == "glasu"


def test_runtime_saving_is_relative_to_the_first_variant_of_each_seed():
    from fedgl.bench.glasu import RuntimeSaving

    saving = RuntimeSaving(num_variants=3)
    times = {0: (10.0, 20.0), 1: (8.0, 16.0), 2: (5.0, 10.0)}  # variant -> simulated seconds per seed
    out = [saving({"seed": seed, "sim_time_s": times[v][seed]})["runtime_saving_pct"]
           for v in range(3) for seed in (0, 1)]
    assert out == pytest.approx([0, 0, 20, 20, 50, 50])
    assert saving({"seed": 0, "sim_time_s": 4.0})["runtime_saving_pct"] == 0  # a new sweep starts over
