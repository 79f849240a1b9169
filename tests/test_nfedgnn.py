"""nFedGNN and CNFGNN: split-model equivalence, batched optimiser, exact ledger counts, accuracy."""

from __future__ import annotations

import os

import pytest
import torch
from torch.nn import functional as F
from torch_geometric.data import Data

from fedgl.comm import LocalTransport
from fedgl.config import build_config
from fedgl.errors import ConfigError
from fedgl.evaluation import Evaluator
from fedgl.models import build_model, prepare_graph
from fedgl.models.split_node import (
    BatchedOptimizer,
    SplitGAT,
    SplitGCN,
    UserFeatures,
    init_support_weights,
    laplacian_penalty,
    prepare_server_graph,
    project,
    support_gradient,
)
from fedgl.protocols.cnfgnn import CNFGNN
from fedgl.protocols.nfedgnn import NFedGNN
from fedgl.runner import run

PAPER_CORA_GCN_MB = 34.06  # Table 1, nFedGNN, GCN, Cora


def _root() -> str:
    root = os.environ.get("FEDGL_DATA_ROOT")
    if not root:
        pytest.skip("FEDGL_DATA_ROOT is not set: real datasets unavailable")
    return root


@pytest.fixture(scope="module")
def cora() -> Data:
    from fedgl.data import load_dataset

    return load_dataset("cora", _root())


def toy_graph(n: int = 40, f: int = 12, c: int = 3, seed: int = 0) -> Data:
    """A small random graph with sparse non-negative features and a few training labels."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, f, generator=g) < 0.3).float() * torch.rand(n, f, generator=g)
    src = torch.randint(0, n, (3 * n,), generator=g)
    dst = torch.randint(0, n, (3 * n,), generator=g)
    keep = src != dst
    both = torch.cat([torch.stack([src, dst]), torch.stack([dst, src])], 1)[:, keep.repeat(2)]
    edge_index = torch.unique(both, dim=1)
    y = torch.randint(0, c, (n,), generator=g)
    order = torch.randperm(n, generator=g)
    masks = [torch.zeros(n, dtype=torch.bool) for _ in range(3)]
    masks[0][order[:10]] = True
    masks[1][order[10:20]] = True
    masks[2][order[20:]] = True
    return Data(x=x, y=y, edge_index=edge_index, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                num_classes=c)


def split_config(protocol: str, rounds: int, model: str = "gcn", **extra) -> dict:
    hidden, dropout, lr = (16, 0.5, 0.1) if model == "gcn" else (8, 0.6, 0.01)  # GAT: 2 heads of 4
    return {
        "dataset": {"name": "cora"},
        "protocol": {"name": protocol, **extra},
        "model": {"name": model, "hidden": hidden, "layers": 2, "dropout": dropout,
                  "options": {"heads": 2} if model == "gat" else {}},
        "train": {"rounds": rounds, "lr": lr, "weight_decay": 5e-4},
        "eval": {"every": min(rounds, 10)},
        "network": {"compute": "ignore"},
    }


def train(cls, data: Data, rounds: int, **options):
    """Set a protocol up on ``data`` and run ``rounds`` rounds; returns it, its transport and the losses."""
    protocol, transport = setup_protocol(cls, data, **options)
    losses = []
    for r in range(1, rounds + 1):
        transport.set_round(r)
        losses.append(protocol.train_round(r)["train_loss"])
    return protocol, transport, losses


def setup_protocol(cls, data: Data, **cfg_extra):
    cfg = build_config(split_config(cls.name, 3, **cfg_extra))
    torch.manual_seed(cfg.seed)  # the server's dropout draws, as the runner seeds them
    transport = LocalTransport()
    protocol = cls(cfg, transport)
    protocol.setup(data)
    return protocol, transport


# ---- the split model ---------------------------------------------------------------------------------
def test_split_gcn_with_one_shared_weight_is_the_centralized_gcn(cora):
    """Encoding-then-aggregation with W_i = W for every user gives the centralized GCN's logits and
    gradients (the backbone the centralized protocol trains)."""
    torch.manual_seed(0)
    features = UserFeatures.from_dense(cora.x, normalize=True)
    x = torch.zeros(cora.num_nodes, cora.num_features).index_put_((features.row, features.col), features.val)
    central = build_model("gcn", cora.num_features, 16, 7, 2, dropout=0.5).eval()
    weight, dense = init_support_weights(features, 16, shared=True)
    server = SplitGCN(16, 16, 7, 2, dropout=0.5).eval()
    first, second = central.layers
    with torch.no_grad():
        first.lin.weight.copy_(dense.T)
        first.bias.copy_(torch.randn(16))
        second.bias.copy_(torch.randn(7))
        server.bias0.copy_(first.bias)
        server.lins[0].weight.copy_(second.lin.weight)
        server.biases[0].copy_(second.bias)

    z = project(features, weight, None, features.row, None, cora.num_nodes).requires_grad_()
    split_logits = server(z, prepare_server_graph(cora.edge_index, cora.num_nodes))
    central_logits = central(x, prepare_graph(cora.edge_index, cora.num_nodes, "gcn"))
    torch.testing.assert_close(split_logits, central_logits, atol=1e-5, rtol=1e-4)

    idx = cora.train_mask
    F.cross_entropy(split_logits[idx], cora.y[idx]).backward()
    F.cross_entropy(central_logits[idx], cora.y[idx]).backward()
    per_user = support_gradient(features, z.grad, None, features.row, None)
    summed = torch.zeros_like(dense).index_add_(0, features.col, per_user)  # sum over users of dL/dW_i
    torch.testing.assert_close(summed, first.lin.weight.grad.T, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(server.bias0.grad, first.bias.grad, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(server.lins[0].weight.grad, second.lin.weight.grad, atol=1e-6, rtol=1e-4)
    torch.testing.assert_close(server.biases[0].grad, second.bias.grad, atol=1e-6, rtol=1e-4)


def test_split_gat_with_one_shared_weight_is_the_centralized_gat():
    """Per-user head weights + server-side attention = the centralized GAT backbone."""
    data = toy_graph()
    torch.manual_seed(1)
    heads, width = 4, 20
    features = UserFeatures.from_dense(data.x, normalize=False)
    central = build_model("gat", data.num_features, width, 3, 2, dropout=0.6, heads=heads).eval()
    weight, dense = init_support_weights(features, width, shared=True)
    server = SplitGAT(heads, width // heads, width, 3, 2, dropout=0.6).eval()
    first, second = central.layers
    with torch.no_grad():
        first.lin.weight.copy_(dense.T)
        first.bias.copy_(torch.randn(width))
        server.att_src.copy_(first.att_src.squeeze(0))
        server.att_dst.copy_(first.att_dst.squeeze(0))
        server.bias0.copy_(first.bias)
        server.convs[0].load_state_dict(second.state_dict())
    z = project(features, weight, None, features.row, None, data.num_nodes)
    split_logits = server(z, prepare_server_graph(data.edge_index, data.num_nodes))
    central_logits = central(data.x, prepare_graph(data.edge_index, data.num_nodes, "gat"))
    torch.testing.assert_close(split_logits, central_logits, atol=1e-5, rtol=1e-4)


def test_laplacian_penalty_counts_every_neighbour_pair_and_self():
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    graph = prepare_server_graph(edge_index, 3)
    z = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 2.0]])
    # pairs (0,1),(1,0): 1 each; (1,2),(2,1): 4 each; normaliser sum |N_i| = 4 edges + 3 self = 7
    assert laplacian_penalty(z, graph, 1, True).item() == pytest.approx(10 / 7)
    two_heads = torch.cat([z, -z], 1)
    assert laplacian_penalty(two_heads, graph, 2, True).item() == pytest.approx(20 / 7)
    assert laplacian_penalty(two_heads, graph, 2, False).item() == pytest.approx(0.0)


# ---- the vectorised user population -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_batched_optimizer_follows_each_users_own_torch_optimizer(kind):
    """Per-user rows on the support, partial participation: every user as if alone with torch.optim."""
    data = toy_graph(n=6, f=5)
    features = UserFeatures.from_dense(data.x, normalize=False)
    weight, _ = init_support_weights(features, 3, shared=False, generator=torch.Generator().manual_seed(0))
    dense = torch.zeros(6, 5, 3).index_put_((features.row, features.col), weight)
    refs = [torch.nn.Parameter(dense[i].clone()) for i in range(6)]
    make = torch.optim.Adam if kind == "adam" else torch.optim.SGD
    opts = [make([p], lr=0.1, weight_decay=5e-4) for p in refs]
    batched = BatchedOptimizer(weight, features.row, 6, kind, 0.1, 5e-4)
    g = torch.Generator().manual_seed(1)
    for users in (None, torch.tensor([1, 4]), None, torch.tensor([0, 1, 5])):
        idx = features.entries(users)
        rows = 6 if users is None else users.numel()
        pos = features.positions(users, idx)
        latent_grad = torch.randn(rows, 3, generator=g)
        batched.step(weight, support_gradient(features, latent_grad, idx, pos, None), idx, users)
        for r, i in enumerate(range(6) if users is None else users.tolist()):
            x_i = data.x[i]
            refs[i].grad = torch.outer(x_i, latent_grad[r])
            opts[i].step()
    for i in range(6):
        mine = features.row == i
        torch.testing.assert_close(weight[mine], refs[i].detach()[features.col[mine]], atol=1e-6, rtol=1e-5)


def test_cnfgnn_users_upload_the_models_a_dense_simulation_gives():
    """The shared rows for absent features reproduce per-user dense weights with their own Adam."""
    data = toy_graph(n=8, f=6)
    protocol, transport = setup_protocol(CNFGNN, data)
    users = transport._parties["users"]
    start = users.common.clone()
    refs = [torch.nn.Parameter(start.clone()) for _ in range(8)]
    opts = [torch.optim.Adam([p], lr=0.1, weight_decay=5e-4) for p in refs]
    x = torch.zeros(8, 6).index_put_((users.features.row, users.features.col), users.features.val)
    users.dropout = 0.0
    for _ in range(2):
        latents = users.embed()
        torch.testing.assert_close(latents, torch.stack([x[i] @ refs[i].detach() for i in range(8)]))
        grad = torch.randn(8, protocol.shape.latent_dim)
        users.update(grad.clone())
        for i in range(8):
            refs[i].grad = torch.outer(x[i], grad[i])
            opts[i].step()
        uploaded = users.upload()
        torch.testing.assert_close(uploaded, torch.stack([p.detach() for p in refs]), atol=1e-6, rtol=1e-5)
        average = uploaded.mean(0)
        users.receive(average.expand(8, *average.shape))
        with torch.no_grad():
            for p in refs:
                p.copy_(average)


# ---- communication ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cora_200(cora, tmp_path_factory):
    """nFedGNN, split GCN, the paper's settings and the default lambda, 200 rounds on Cora."""
    return run(build_config(split_config("nfedgnn", 200)), tmp_path_factory.mktemp("cora200"), data=cora)


def test_ledger_for_cora_gcn_over_200_rounds_is_the_analytic_count(cora, cora_200):
    users, latent, rounds = cora.num_nodes, 16, 200
    one_way = users * latent * 4 * rounds
    summary = cora_200.summary
    print(f"\nnFedGNN Cora GCN, 200 rounds: ledger up {summary['bytes_by_direction']['up'] / 2**20:.2f} MiB "
          f"(= {one_way / 1e6:.2f} MB), down {summary['bytes_by_direction']['down'] / 2**20:.2f} MiB; "
          f"paper Table 1: {PAPER_CORA_GCN_MB} MB")
    assert summary["bytes_by_direction"] == {"up": one_way, "down": one_way}
    assert summary["bytes_by_kind"] == {"embedding": one_way, "gradient": one_way}
    assert summary["bytes_total"] == 2 * one_way
    # the paper's 40.61 / 240.69 MB for CiteSeer / PubMed are N x 16 x 4 x 200 bytes in MiB; the same
    # count for Cora is 33.06 MiB, one unit below the printed 34.06
    assert one_way / 2**20 == pytest.approx(33.06, abs=0.005)


def test_every_user_is_charged_its_own_rows_under_partial_participation():
    data = toy_graph()
    _, transport, _ = train(NFedGNN, data, 4, user_fraction=0.25)
    k = round(0.25 * data.num_nodes)
    per_round = k * 16 * 4
    kinds = transport.ledger.by_kind(include_eval=False)
    assert kinds == {"embedding": 4 * per_round, "gradient": 4 * per_round,
                     "index": 4 * 2 * k * 8}  # the participant list goes with both calls
    assert int(transport.ledger.member_bytes("users", "up").sum()) == 4 * per_round


def test_partial_participation_leaves_absent_users_untouched():
    data = toy_graph()
    protocol, transport = setup_protocol(NFedGNN, data, user_fraction=0.5)
    users = transport._parties["users"]
    before = users.weight.clone()
    chosen = protocol.sample_users()
    protocol.generator.manual_seed(protocol.cfg.seed)
    protocol.train_round(1)
    moved = (users.weight != before).any(1)
    owners_moved = torch.zeros(data.num_nodes, dtype=torch.bool)
    owners_moved[users.features.row[moved]] = True
    absent = torch.ones(data.num_nodes, dtype=torch.bool)
    absent[chosen] = False
    assert not owners_moved[absent].any()
    assert owners_moved[chosen].any()
    member = transport.ledger.member_bytes("users", "up")
    assert set(member[chosen].tolist()) == {16 * 4} and member[absent].sum() == 0


def test_cnfgnn_uploads_latents_and_whole_models_in_any_number_of_messages():
    data = toy_graph()
    n, f, d, rounds = data.num_nodes, data.num_features, 16, 3
    per_user_mb = f * d * 4 / 2**20
    runs = [train(CNFGNN, data, rounds), train(CNFGNN, data, rounds, message_mb=7 * per_user_mb)]
    expected_up = rounds * n * (d + f * d) * 4  # the paper's Table 1 count: latents and models, upload only
    for _, transport, _ in runs:
        assert transport.ledger.by_direction()["up"] == expected_up
        assert transport.ledger.total(kind="model") == 2 * rounds * n * f * d * 4  # uploads and broadcasts
    (one, t1, loss1), (chunked, t2, loss2) = runs
    assert loss1 == pytest.approx(loss2, rel=1e-5)  # equal up to the order of the float sums
    evaluator = Evaluator(data)
    with t1.evaluation(), t2.evaluation():
        torch.testing.assert_close(one.predict(evaluator), chunked.predict(evaluator), atol=1e-4, rtol=1e-4)


# ---- configuration -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, message", [
    ({"model": {"name": "sage"}}, "cannot be split"),
    ({"model": {"name": "gat", "layers": 1}}, "layers >= 2"),
    ({"model": {"name": "gcn", "options": {"heads": 2}}}, "not supported"),
])
def test_bad_split_models_are_config_errors(change, message):
    cfg = split_config("nfedgnn", 2)
    cfg["model"] |= change["model"]
    with pytest.raises(ConfigError, match=message):
        setup_protocol_from(cfg)


def setup_protocol_from(cfg: dict) -> None:
    NFedGNN(build_config(cfg), LocalTransport()).setup(toy_graph())


@pytest.mark.parametrize("option", [{"lam": -1}, {"user_fraction": 0}, {"reg_heads": "sum"}, {"user_fraction": 0.5,
                                                                                                "name": "cnfgnn"}])
def test_bad_options_are_config_errors(option):
    with pytest.raises(ConfigError):
        build_config({"protocol": {"name": "nfedgnn", **option}})


def test_train_config_is_used_on_both_sides():
    data = toy_graph()
    protocol, transport = setup_protocol(NFedGNN, data)
    users = transport._parties["users"]
    assert isinstance(protocol.server_optimizer, torch.optim.Adam)
    train = protocol.cfg.train
    assert (users.optimizer.kind, users.optimizer.lr, users.optimizer.weight_decay) == (
        train.optimizer, train.lr, train.weight_decay)


# ---- accuracy ---------------------------------------------------------------------------------------------------
def test_nfedgnn_reaches_the_papers_cora_accuracy(cora_200):
    """Section 4.2: the best nFedGNN accuracy for GCN on Cora is 71.9 %.

    Test accuracy at the best validation round; over seeds 0-11 it spans 66-74 % (seed 0: 70 %).
    The last round's accuracy swings too much with the paper's learning rate of 0.1 to test.
    """
    assert cora_200.summary["test_accuracy"] > 0.67


@pytest.mark.slow
def test_regulariser_and_nfedgnn_beat_their_alternatives_on_cora(cora, cora_200, tmp_path):
    """Figure 5: lambda > 0 beats lambda = 0; Figure 4: nFedGNN beats CNFGNN (same seed, 200 rounds)."""
    plain = run(build_config(split_config("nfedgnn", 200, lam=0.0)), tmp_path / "plain", data=cora).summary
    shared = run(build_config(split_config("cnfgnn", 200)), tmp_path / "cnfgnn", data=cora).summary
    regular = cora_200.summary
    assert regular["test_accuracy"] > plain["test_accuracy"] + 0.03
    assert regular["test_accuracy"] > shared["test_accuracy"] + 0.2


# ---- bench ---------------------------------------------------------------------------------------------------------
def test_bench_tasks_build_and_carry_table1():
    from fedgl.bench.core import variant_config
    from fedgl.bench.nfedgnn import TABLE1, TASKS

    users = {"citeseer": 3327, "pubmed": 19717, "chameleon": 2277, "squirrel": 5201, "wikics": 11701}
    for dataset, n in users.items():  # Table 1 is N x 16 (GCN) or 128 (GAT) floats x 4 B x 200 rounds, in MiB
        assert TABLE1[("nfedgnn", "gcn")][dataset] == pytest.approx(n * 16 * 800 / 2**20, abs=0.006)
        assert TABLE1[("nfedgnn", "gat")][dataset] == pytest.approx(n * 128 * 800 / 2**20, rel=3e-3)
    for task in TASKS.values():
        for variant in task.variants:
            cfg = variant_config(task, variant, 0, {})
            assert cfg.train.rounds == (20 if task.name == "nfedgnn-pubmed-round" else 200)


def test_bench_task_runs_and_plots_the_figure(cora, tmp_path, monkeypatch):
    from fedgl.bench.core import BenchTask, run_task
    from fedgl.bench.nfedgnn import TASKS, plot_results

    monkeypatch.setenv("FEDGL_DATA_ROOT", _root())
    fig4 = TASKS["nfedgnn-fig4-gcn"]
    task = BenchTask(**{**fig4.__dict__, "variants": [v for v in fig4.variants if v.label.startswith("cora")]})
    result = run_task(task, tmp_path, quick=True, overrides={"train.rounds": 2})
    upload = {row["variant"]: row["upload_mib"]["mean"] for row in result["rows"]}
    assert upload["cora nfedgnn"] == pytest.approx(2708 * 16 * 4 * 2 / 2**20)
    assert upload["cora cnfgnn"] == pytest.approx(2708 * (16 + 1433 * 16) * 4 * 2 / 2**20)
    assert plot_results(tmp_path).stat().st_size > 10_000
