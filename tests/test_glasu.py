"""GLASU: one client equals centralized training; several clients (stale updates and exact split
learning) equal an independent dense re-implementation, message by message and byte by byte; the
one-label-holder variant, silence of parties training alone, config errors, backends, and that every
baseline learns."""

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
from fedgl.models.split_vertical import aggregate, client_graph, features, make_block, sample_below
from fedgl.protocols.glasu.server import Glasu
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


def test_a_full_batch_with_full_neighbourhoods_keeps_its_plan_and_trains_as_if_rebuilt():
    """With every training node in the batch and every neighbour sampled, the sets repeat from round to
    round: each client keeps its plan (the same blocks and input rows, with their transposes) and
    trains bitwise as a client that rebuilds them every round."""
    cfg = config(SYNTHETIC, {"K": 2, "Q": 2, "S": 10_000, "sampling": "full"})
    kept, _ = build(cfg)
    rebuilt, _ = build(cfg)
    clients = [kept.transport._parties[f"client{m}"] for m in range(3)]
    plans = []
    for r in (1, 2, 3):
        for m in range(3):
            rebuilt.transport._parties[f"client{m}"]._memo.clear()
        assert kept.train_round(r)["train_loss"] == rebuilt.train_round(r)["train_loss"]
        plans.append([c._memo["plan"][1:] for c in clients])
    assert all(p == plans[0] for p in plans[1:])  # the same objects, round after round
    assert torch.equal(kept.predict(None), rebuilt.predict(None))


# ---- the ledger against analytic counts -----------------------------------------------------------
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


@pytest.mark.parametrize("protocol_options,partition", [({"K": 0}, {}), ({"K": 2}, {"num_clients": 1})],
                         ids=["standalone", "centralized"])
def test_parties_training_alone_send_nothing(protocol_options, partition):
    """Standalone clients and the single party of a centralized run send no byte; the loss the runner
    logs is read as evaluation traffic, outside the training totals."""
    protocol, _ = build(config(SYNTHETIC, {**protocol_options, "batches": 3}, partition=partition))
    losses = [protocol.train_round(r)["train_loss"] for r in (1, 2, 3)]
    ledger = protocol.transport.ledger
    assert ledger.total() == 0 and ledger.messages() == ledger.messages(kind="eval") > 0
    assert losses[-1] < losses[0]


# ---- sampling --------------------------------------------------------------------------------------
def test_mean_aggregation_sums_in_client_order():
    """Agg's mean adds the parts in client order, without stacking them: the same bits as torch's
    stacked mean (sequential up to 17 parts), so committed GLASU runs keep their trajectories."""
    generator = torch.Generator().manual_seed(0)
    for m in (1, 2, 3, 7, 17):
        parts = [torch.randn(300, 64, generator=generator) for _ in range(m)]
        assert torch.equal(aggregate(parts, "mean"), torch.stack(parts).mean(0))
    assert torch.equal(aggregate(parts[:2], "concat"), torch.cat(parts[:2], dim=1))


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
    ({"backward": "exact", "Q": 2}, {}, {}, "needs Q=1 and K>=1"),
    ({"backward": "exact", "Q": 1, "K": 0}, {}, {}, "needs Q=1 and K>=1"),
])
def test_bad_settings_are_config_errors(protocol, model, partition, message):
    with pytest.raises(ConfigError, match=message):
        build(config(SYNTHETIC, protocol, model=model, partition=partition))


# ---- backends, accuracy, example --------------------------------------------------------------------
@pytest.mark.ray
@pytest.mark.parametrize("options", [{"K": 1, "Q": 2}, {"K": 2, "Q": 1, "backward": "exact"}], ids=["local", "exact"])
def test_local_and_ray_backends_agree(ray_session, tmp_path, options):
    results = {}
    for backend in ("local", "ray"):
        cfg = config(SYNTHETIC, {**options, "S": 8, "batches": 2}, model={"dropout": 0.3},
                     partition={"label_holder": 0}, train={"rounds": 3}, backend={"name": backend})
        results[backend] = run(cfg, tmp_path / backend)
    local, ray = results["local"], results["ray"]
    for a, b in zip(local.metrics, ray.metrics):
        assert a["train_loss"] == b["train_loss"] and a["test_accuracy"] == b["test_accuracy"]
        assert a["bytes_total"] == b["bytes_total"]


@pytest.mark.parametrize("dataset", ["cora", "citeseer"])
def test_every_baseline_learns(data_root, dataset):
    """The bench's presets (Cent., StAl., Sim., GLASU-1, GLASU-4) on a 2-layer GCN: within 20
    mini-batches the training loss falls by a fifth and test accuracy is 20 points above the majority
    class. (Which baseline is better is the bench's question, not this test's.)"""
    import json

    from fedgl.bench.glasu import CENTRALIZED, GLASU_1, GLASU_4, LAYERS, SIMULATED, STANDALONE
    from fedgl.config import apply_override

    data = load_dataset(dataset, str(data_root))
    chance = torch.bincount(data.y[data.test_mask]).max().item() / int(data.test_mask.sum())
    accuracy = {}
    for label, preset in {"Cent.": CENTRALIZED, "StAl.": STANDALONE, "Sim.": SIMULATED, "GLASU-1": GLASU_1,
                          "GLASU-4": GLASU_4}.items():
        raw = {"dataset": cora(data_root) | {"name": dataset},
               "partition": {"num_clients": 3, "method": "random", "edge_keep": 0.8},
               "model": {"name": "gcn", "layers": 2, "hidden": 32, "dropout": 0.5},
               "protocol": {"name": "glasu", "K": 1, "S": 64, "batches": 5, "fanout": 5},
               "train": {"lr": 0.05},
               "network": {"compute": "ignore"}}
        for key, value in preset.items():  # the presets aggregate at every layer of a 4-layer model
            apply_override(raw, f"{key}={json.dumps(2 if key == 'protocol.K' and value == LAYERS else value)}")
        protocol, _ = build(build_config(raw), data)
        losses = [protocol.train_round(r)["train_loss"] for r in range(1, 5)]
        assert losses[-1] < 0.8 * losses[0], (label, losses)
        with protocol.transport.evaluation():
            predicted = protocol.predict(None).argmax(1)
        accuracy[label] = (predicted == data.y)[data.test_mask].float().mean().item()
    assert min(accuracy.values()) > chance + 0.2, accuracy


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

    assert {"glasu-table2-cora", "glasu-table2-citeseer", "glasu-table2-pubmed", "glasu-table3", "glasu-table4",
            "glasu-table5", "glasu-figure3"} <= set(TASKS)
    for task in TASKS.values():
        for variant in task.variants:
            cfg = variant_config(task, variant, 0, task.quick)
            assert cfg.protocol_name == "glasu"


def test_figure3_task_overlays_the_backbones_curves(tmp_path):
    from fedgl.bench.core import run_task
    from fedgl.bench.glasu import TASKS

    synthetic = {"dataset.name": "synthetic", "dataset.split": "default"}
    result = run_task(TASKS["glasu-figure3"], tmp_path, quick=True, only=["gcnii", "gcn lr"], overrides=synthetic)
    assert [row["variant"] for row in result["rows"]] == ["gcnii", "gcn lr 0.001"]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_runtime_saving_is_relative_to_the_first_variant_of_each_seed():
    from fedgl.bench.glasu import RuntimeSaving

    saving = RuntimeSaving(num_variants=3)
    times = {0: (10.0, 20.0), 1: (8.0, 16.0), 2: (5.0, 10.0)}  # variant -> simulated seconds per seed
    out = [saving({"seed": seed, "sim_time_s": times[v][seed]})["runtime_saving_pct"]
           for v in range(3) for seed in (0, 1)]
    assert out == pytest.approx([0, 0, 20, 20, 50, 50])
    assert saving({"seed": 0, "sim_time_s": 4.0})["runtime_saving_pct"] == 0  # a new sweep starts over


# ---- several clients against an independent reference ----------------------------------------------
class Recorder:
    """Wraps ``transport.call_many`` to keep every call's arguments and results (the messages)."""

    def __init__(self, transport):
        self.calls, self._call_many = [], transport.call_many
        transport.call_many = self

    def __call__(self, targets, method, per_target=None, **shared):
        results = self._call_many(targets, method, per_target=per_target, **shared)
        args = [{**shared, **(per_target[i] if per_target else {})} for i in range(len(targets))]
        self.calls.append((method, args, results))
        return results


class Reference:
    """GLASU on dense full-graph tensors, written from the paper's algorithms with plain torch ops:
    client m's layer is ReLU(Â_m H W^T + b) with Â_m = D^-1/2 (A_m + I) D^-1/2 of its own edges; the
    server averages (or concatenates) the clients' outputs at the aggregation levels. With full
    neighbourhoods the rows of the mini-batch depend only on rows the sampled sets hold, so full-graph
    rows are the truth."""

    def __init__(self, shards, nets, levels, layers, lr, weight_decay, concat, holder):
        self.M, self.levels, self.L, self.concat = len(shards), levels, layers, concat
        self.heads = range(self.M) if holder is None else [holder]  # the label holders
        n = shards[0].x.size(0)
        self.x = [shard.x.double() for shard in shards]
        self.y = shards[self.heads[0]].y
        self.neighbours, self.adjacency = [], []
        for shard in shards:
            a = torch.zeros(n, n, dtype=torch.float64)
            a[shard.edge_index[1], shard.edge_index[0]] = 1.0  # row = target
            a.fill_diagonal_(0.0)
            self.neighbours.append(a > 0)
            a = a + torch.eye(n, dtype=torch.float64)
            d = a.sum(1).rsqrt()
            self.adjacency.append(d[:, None] * a * d[None, :])
        self.params = [[p.detach().double().clone().requires_grad_() for p in
                        [*(lin.weight for lin in net.lins), *net.biases,
                         *((net.head.weight, net.head.bias) if net.head else ())]]
                       for net in nets]
        self.optimizers = [torch.optim.SGD(p, lr=lr, weight_decay=weight_decay) for p in self.params]

    # -- the model
    def layers(self, m, h, start, stop):
        p = self.params[m]
        for l in range(start, stop):
            h = torch.relu(self.adjacency[m] @ (h @ p[l].t()) + p[self.L + l])
        return h

    def head(self, m, h):
        p = self.params[m]
        return h @ p[2 * self.L].t() + p[2 * self.L + 1]

    def joint(self):
        """The joint inference: every client's H_m^+ and the aggregate H at every aggregation level."""
        inputs, start, outs, agg = list(self.x), 0, {}, {}
        for level in self.levels:
            outs[level] = [self.layers(m, inputs[m], start, level) for m in range(self.M)]
            agg[level] = torch.cat(outs[level], 1) if self.concat else torch.stack(outs[level]).mean(0)
            inputs, start = [agg[level]] * self.M, level
        return outs, agg

    def predict(self):
        with torch.no_grad():
            _, agg = self.joint()
            return torch.stack([self.head(m, agg[self.L]) for m in self.heads]).mean(0)

    # -- the node sets (full neighbourhoods, the level above first, then the new nodes in id order)
    def below(self, m, top, start, stop):
        nodes = top
        for _ in range(start, stop, -1):
            new = self.neighbours[m][nodes].any(0)
            new[nodes] = False
            nodes = torch.cat([nodes, new.nonzero().flatten()])
        return nodes

    def sets(self, batch):
        """Client m's set at each lower aggregation level and the server's unions, top-down."""
        union, tops, client_sets = batch, {self.L: batch}, {}
        for upper, lower in zip(self.levels[::-1], self.levels[-2::-1]):
            client_sets[lower] = [self.below(m, union, upper, lower) for m in range(self.M)]
            rest = torch.cat(client_sets[lower])
            union = torch.cat([union, torch.unique(rest[~torch.isin(rest, union)])])
            tops[lower] = union
        return tops, client_sets

    # -- one GLASU round
    def share(self, h, m):
        """Client m's columns of a concatenated representation."""
        width = h.size(1) // self.M
        return h[:, m * width:(m + 1) * width]

    def stale_round(self, batch, Q):
        """Algorithms 3-4: joint inference, H_{-m} kept (H - H_m^+/M, or H with m's columns zeroed),
        then Q local steps per client on Agg(H_{-m}, fresh H_m^+). Without labels, a client's objective is
        <dL/dH[L], H_m[L]> with the label holder's gradient at the joint inference (Algorithm 7).
        Returns the mean loss of the label holders' steps, or of the holder's first step."""
        with torch.no_grad():
            outs, agg = self.joint()
        top = agg[self.L].clone().requires_grad_()
        ce = F.cross_entropy(self.head(self.heads[0], top)[batch], self.y[batch])
        grad = torch.autograd.grad(ce, top)[0]
        if self.concat:
            width = outs[self.L][0].size(1)
            others = [(torch.arange(width * self.M) // width != m).double() for m in range(self.M)]
            rest = {level: [agg[level] * others[m] for m in range(self.M)] for level in self.levels}
        else:
            rest = {level: [agg[level] - outs[level][m] / self.M for m in range(self.M)] for level in self.levels}
        losses = []
        for m in range(self.M):
            for _ in range(Q):
                h, start = self.x[m], 0
                for level in self.levels:
                    own = self.layers(m, h, start, level)
                    if self.concat:  # own columns in place of the zeroed ones
                        h = rest[level][m] + torch.cat([own if k == m else torch.zeros_like(own)
                                                        for k in range(self.M)], 1)
                    else:
                        h = rest[level][m] + own / self.M
                    start = level
                if m in self.heads:
                    loss = F.cross_entropy(self.head(m, h)[batch], self.y[batch])
                    losses.append(loss.item())
                else:
                    loss = (grad * h).sum()
                self.optimizers[m].zero_grad()
                loss.backward()
                self.optimizers[m].step()
        grads = {self.L: grad}
        return outs, agg, (losses[0] if len(self.heads) == 1 else sum(losses) / len(losses)), grads

    def exact_round(self, batch):
        """Split learning: one backward pass of the sum of the holders' losses through the joint model."""
        outs, agg = self.joint()
        for h in agg.values():
            h.retain_grad()
        losses = torch.stack([F.cross_entropy(self.head(m, agg[self.L])[batch], self.y[batch])
                              for m in self.heads])
        for optimizer in self.optimizers:
            optimizer.zero_grad()
        losses.sum().backward()
        grads = {level: h.grad.clone() for level, h in agg.items()}
        for optimizer in self.optimizers:
            optimizer.step()
        return outs, agg, losses.mean().item(), grads


def close(a, b):
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backward,aggregation,holder", [
    ("local", "mean", None), ("local", "concat", None), ("exact", "mean", None), ("exact", "concat", None),
    ("local", "mean", 1), ("exact", "mean", 1)])
def test_several_clients_match_an_independent_reference(backward, aggregation, holder):
    """M = 3, L = 4, K = 2 (levels 2 and 4), Q = 3 (Q = 1 for exact split learning), full neighbourhoods,
    labels at every client or at client 1 only: every round's messages, losses, predictions and ledger
    bytes against a dense re-implementation."""
    from fedgl.partition import partition_vertical

    M, L, S, h, batches, Q = 3, 4, 6, 8, 2, (3 if backward == "local" else 1)
    concat = aggregation == "concat"
    w = M * h if concat else h  # width of the aggregate
    cfg = config(SYNTHETIC, {"K": 2, "Q": Q, "S": S, "batches": batches, "sampling": "full",
                             "backward": backward, "aggregation": aggregation},
                 model={"layers": L, "hidden": h}, partition={"method": "random", "label_holder": holder},
                 train={"optimizer": "sgd", "lr": 0.2, "weight_decay": 1e-3})
    protocol, data = build(cfg)
    transport = protocol.transport
    assert protocol.levels == [2, 4]
    nets = [transport._parties[f"client{m}"].net for m in range(M)]
    shards = partition_vertical(data, M, blocks="random", edge_keep=0.8, seed=cfg.seed, label_holder=holder).shards
    reference = Reference(shards, nets, [2, 4], L, lr=0.2, weight_decay=1e-3, concat=concat, holder=holder)
    heads = len(reference.heads)
    share = (lambda g, m: reference.share(g, m)) if concat else (lambda g, m: g / M)
    recorder = Recorder(transport)
    train = set(data.train_mask.nonzero().flatten().tolist())
    for r in (1, 2, 3):
        transport.set_round(r)
        recorder.calls.clear()
        loss = protocol.train_round(r)["train_loss"]
        expected = {"index": 0, "embedding": 0, "gradient": 0, "control": 0}
        calls, losses = iter(recorder.calls), []
        for _ in range(batches):
            if holder is not None:  # Algorithm 5: the label holder draws the batch
                method, args, returned = next(calls)
                assert method == "draw_batch"
                batch = returned[0]
            method, args, returned = next(calls)
            assert method == "sample"
            batch = args[0]["targets"] if holder is None else batch
            assert all(torch.equal(a["targets"], batch) for m, a in enumerate(args) if m != holder)
            assert len(set(batch.tolist())) == S and set(batch.tolist()) <= train
            tops, client_sets = reference.sets(batch)
            # sampling: each client's set at level 2 up, the union down with the forward call
            assert all(torch.equal(got, want) for got, want in zip(returned, client_sets[2]))
            method, args, returned = next(calls)
            assert method == "forward" and all(torch.equal(a["targets"], tops[2]) for a in args)
            U = tops[2].numel()
            expected["index"] += 8 * M * S + 8 * sum(s.numel() for s in client_sets[2]) + 8 * M * U
            if backward == "local":
                outs, agg, step_loss, grads = reference.stale_round(batch, Q)
            else:
                outs, agg, step_loss, grads = reference.exact_round(batch)
            losses.append(step_loss)
            # joint inference: H_m^+ up and H down at level 2, H_m^+ up at level 4
            assert all(close(got, want[tops[2]]) for got, want in zip(returned, outs[2]))
            method, args, returned = next(calls)
            assert method == "forward" and all(close(a["h"], agg[2][tops[2]]) for a in args)
            assert all(close(got, want[batch]) for got, want in zip(returned, outs[4]))
            down = M if backward == "local" else heads  # who receives H[4]
            expected["embedding"] += 4 * M * (h + w) * U + 4 * M * h * S + 4 * down * w * S
            expected["control"] += 8 * heads if backward == "exact" else 8 * M + (8 if holder is not None else 0)
            method, args, returned = next(calls)
            assert all(close(a["h"], agg[4][batch]) for a in args)
            if backward == "local" and holder is None:
                assert method == "local_update"
                continue
            # dL/dH[4] up from every label holder
            assert method == "head_gradient"
            assert close(sum(reply["grad"] for reply in returned), grads[4][batch])
            expected["gradient"] += 4 * heads * w * S
            if backward == "local":  # Algorithms 6-7: the gradient to the others, then their local steps
                method, args, returned = next(calls)
                assert method == "local_update" and args[holder] == {}
                assert all(close(a["h"], agg[4][batch]) and close(a["grad"], grads[4][batch])
                           for m, a in enumerate(args) if m != holder)
                expected["gradient"] += 4 * (M - 1) * w * S
                continue
            # split learning: each client's share of dL/dH[4] down, dL/dH[2] up, shares down
            method, args, returned = next(calls)
            assert method == "backward"
            assert all(close(a["grad"], share(grads[4][batch], m)) for m, a in enumerate(args))
            assert close(sum(returned), grads[2][tops[2]])
            method, args, returned = next(calls)
            assert method == "backward"
            assert all(close(a["grad"], share(grads[2][tops[2]], m)) for m, a in enumerate(args))
            assert returned == [None] * M
            expected["gradient"] += 4 * M * h * S + 4 * M * (h + w) * U
        assert next(calls, None) is None
        assert loss == pytest.approx(sum(losses) / len(losses), rel=1e-5)
        measured = {}
        for row in transport.ledger.rows():
            if row["round"] == r:
                measured[row["kind"]] = measured.get(row["kind"], 0) + row["bytes"]
        assert measured == {kind: size for kind, size in expected.items() if size}
        with transport.evaluation():
            assert close(protocol.predict(None), reference.predict())
