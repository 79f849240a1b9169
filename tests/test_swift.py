"""Swift-FedGNN and its baselines: exactness of the split computation, ledger counts against the
analytic formula, the special cases, the raw-feature audit and real-data accuracy (backends:
tests/test_equivalence.py)."""

from __future__ import annotations

import copy
import json
import dataclasses
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from fedgl.comm import LocalTransport
from fedgl.config import build_config, load_config
from fedgl.data import load_dataset
from fedgl.errors import ConfigError
from fedgl.partition import partition_horizontal
from fedgl.protocols.horizontal import shared
from fedgl.models.graph import prepare_graph
from fedgl.comm.payload import nbytes
from fedgl.protocols.horizontal.client import CrossClient
from fedgl.protocols.horizontal.server import CrossClientProtocol
from fedgl.protocols.horizontal.fedgnn_pns import PNSOptions, sampling_iterations
from fedgl.protocols.horizontal.llcg import LLCGClient
from fedgl.runner import Run
from fedgl.search import run
from support.spy import audited_rows

M = 4


def config(protocol: dict, model: str = "sage", rounds: int = 4, dropout: float = 0.0) -> dict:
    return {
        "dataset": {"name": "synthetic", "options": {"num_nodes": 400, "num_features": 16, "avg_degree": 6}},
        "model": {"name": model, "hidden": 8, "layers": 2, "dropout": dropout},
        "partition": {"num_clients": M, "method": "metis"},
        "protocol": protocol,
        "train": {"rounds": rounds, "lr": 0.01},
        "eval": {"every": 1},
        "network": {"compute": "ignore"},
    }


def built(protocol: dict, tmp_path, **kw) -> Run:
    return Run(build_config(config(protocol, **kw)), tmp_path)


def one_cross_step(job: Run, trainer: int = 0) -> dict:
    """Every client starts the iteration; client ``trainer`` runs Algorithm 2, the others Algorithm 3.
    Returns the trainer's reply, its gradient including the remote owners' share (if any)."""
    proto = job.protocol
    modes = ["local"] * M
    modes[trainer] = "cross"
    replies = job.transport.call_many(proto.clients, "begin", per_target=[{"mode": m} for m in modes],
                                      state=proto.model.state_dict())
    name = proto.clients[trainer]
    results, share = proto.cross_chain({name: replies[trainer]}, keep=False)
    if share:
        results[0]["gradient"] = {k: g + share[k] for k, g in results[0]["gradient"].items()}
    return results[0]


def in_edges(edge_index: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.isin(edge_index[1], targets)
    return edge_index[0, mask], edge_index[1, mask]


# ---- exactness of Eq. (5)-(8) ----------------------------------------------------------------------
@pytest.mark.parametrize("model, sparse, backprop", [
    ("sage", False, False), ("gin", False, False), ("gcn", False, False), ("sage", True, False), ("gin", True, False),
    ("sage", False, True), ("gin", True, True), ("gcn", True, True)])
def test_cross_client_step_equals_centralized_computation(tmp_path, monkeypatch, model, sparse, backprop):
    """With all neighbours and the whole training set as batch, the trainer's loss equals the
    centralized loss (the backbone's own full-graph layers). Its gradient equals the centralized
    gradient with the remote nodes' hidden embeddings held constant (the default stop-gradient) or,
    with ``remote_backprop`` (App. H.1), the centralized gradient itself. Computing on sparse
    feature rows changes nothing."""
    monkeypatch.setattr(shared, "FEATURE_DENSITY", 1.0 if sparse else 0.0)
    job = built({"name": "swift", "K": 1, "fanouts": [-1, -1], "batch_size": None, "min_aggregate": 1,
                 "remote_backprop": backprop}, tmp_path, model=model)
    result = one_cross_step(job, trainer=1)
    data = job.evaluator.data
    owner = job.protocol.router.owner
    reference = copy.deepcopy(job.protocol.model)
    graph = prepare_graph(data.edge_index, data.num_nodes, model)
    h1 = reference.forward_layer(0, data.x, graph)
    if not backprop:
        h1 = torch.where((owner == 1).unsqueeze(1), h1, h1.detach())
    out = reference.forward_layer(1, h1, graph)
    batch = ((owner == 1) & data.train_mask).nonzero().flatten()
    loss = F.cross_entropy(out[batch], data.y[batch])
    loss.backward()
    assert result["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    with torch.no_grad():  # evaluation runs the same network on the whole graph
        torch.testing.assert_close(job.protocol.predict(job.evaluator), reference(data.x, graph))
    for name, p in reference.named_parameters():
        torch.testing.assert_close(result["gradient"][name], p.grad, rtol=1e-4, atol=1e-6)


def test_local_step_is_the_cross_step_without_remote_neighbours(tmp_path):
    """Algorithm 3 is Algorithm 2 on a shard whose cross-client edges are removed."""
    cfg = build_config(config({"name": "swift"}))
    data = load_dataset("synthetic", num_nodes=400, num_features=16, avg_degree=6)
    shard = partition_horizontal(data, M, "metis").shards[0]
    isolated = dataclasses.replace(shard, cross_edges=torch.zeros(2, 0, dtype=torch.long))
    kwargs = dict(name="client0", seed=7, model=cfg.model, train=cfg.train, num_features=16,
                  num_classes=int(data.num_classes), batch_size=32, fanouts=[5, 3])
    state = CrossClient.create(shard=shard, **kwargs).model.state_dict()
    t = LocalTransport()
    t.spawn(CrossClient, [dict(kwargs, shard=shard), dict(kwargs, shard=isolated, name="client1")])
    local = t.call("client0", "begin", state=state, mode="local")
    picks = t.call("client1", "begin", state=state, mode="cross")
    assert picks["ids"].numel() == 0
    assert t.call("client1", "route", level=1, incoming={}) == {}
    crossed = t.call("client1", "finish", remote={}, counts={})
    assert local["loss"] == pytest.approx(crossed["loss"])
    for name in local["gradient"]:
        torch.testing.assert_close(local["gradient"][name], crossed["gradient"][name])


# ---- the ledger against the analytic count ------------------------------------------------------------
@pytest.mark.parametrize("min_aggregate, backprop", [(1, False), (2, False), (1, True)])
def test_ledger_counts_one_vector_per_target_and_remote_client(tmp_path, min_aggregate, backprop):
    """Embedding, index and remote-gradient bytes of one cross-client step against counts made
    independently on the global graph. With ``min_aggregate: 2`` a first-layer pair holding fewer
    than two non-zero feature rows sends no vector (only its count 0), and a target left with no
    pair gets none either."""
    job = built({"name": "swift", "K": 1, "fanouts": [-1, -1], "batch_size": None,
                 "min_aggregate": min_aggregate, "remote_backprop": backprop}, tmp_path)
    ledger = job.transport.ledger
    before = {k: ledger.total(kind=k) for k in ("embedding", "index")}
    one_cross_step(job, trainer=0)
    data, owner = job.evaluator.data, job.protocol.router.owner
    hidden, features = job.cfg.model.hidden, data.num_features
    nonzero = (data.x != 0).any(1)

    def layer(targets, need):
        src, dst = in_edges(data.edge_index, targets)
        remote = owner[src] != owner[dst]
        key = dst[remote] * M + owner[src[remote]]
        pairs, inverse = torch.unique(key, return_inverse=True)
        kept = torch.zeros(pairs.numel()).index_add_(0, inverse, nonzero[src[remote]].float()) >= need
        return (pairs.numel(), int(kept.sum()), torch.unique(dst[remote]).numel(),
                torch.unique(pairs[kept] // M).numel(), int(remote.sum()), torch.unique(torch.cat([targets, src])),
                torch.unique(owner[src[remote]][torch.isin(key, pairs[kept])]).numel())

    batch = ((owner == 0) & data.train_mask).nonzero().flatten()
    p2, _, t2, _, e2, level1, owners2 = layer(batch, 0)
    p1, kept1, t1, kept_t1, e1, _, _ = layer(level1, min_aggregate)
    embedding = 4 * (hidden * (p2 + t2) + features * (kept1 + kept_t1))  # up: one per pair; down: one per target
    index = 8 * (4 * e2 + 4 * e1 + p2 + t2 + p1 + t1)  # picks up and routed down (2 ids each), counts
    assert ledger.total(kind="embedding") - before["embedding"] == embedding
    assert ledger.total(kind="index") - before["index"] == index
    assert p1 + p2 < e1 + e2  # aggregation sends fewer vectors than there are remote neighbours
    if min_aggregate == 2:
        assert kept1 < p1  # the rule withholds some pairs here, and they cost no vector
    up = sum(r["bytes"] for r in ledger.rows() if r["kind"] == "embedding" and r["direction"] == "up")
    assert up == 4 * (hidden * p2 + features * kept1)
    grads = ledger.total(methods=("backward",), kinds=("gradient",))
    params = sum(p.numel() for p in job.protocol.model.parameters())
    # a gradient per target up and per pair down, then each second-layer owner's share of the parameters'
    assert grads == (4 * (hidden * (t2 + p2) + params * owners2) if backprop else 0)


def test_withheld_pairs_send_no_zero_vectors(tmp_path, monkeypatch):
    """Under dropout, no first-layer vector on the wire is all zeros, and every withheld pair is
    counted in the summary; with ``min_aggregate: 1`` nothing is withheld."""
    sent: list[torch.Tensor] = []
    original = LocalTransport._execute

    def spy(self, calls):
        out = original(self, calls)
        for (_, method, kwargs), (result, _) in zip(calls, out):
            if method == "propagate":
                sent.extend(t for t in result["sums"].values())
                sent.extend(t for t in (kwargs.get("remote") or {}).values())
            if method == "finish":
                sent.extend(kwargs["remote"].values())
        return out

    monkeypatch.setattr(LocalTransport, "_execute", spy)
    res = run(build_config(config({"name": "fedgnn-g", "fanouts": [3, 3]}, rounds=2, dropout=0.5)), tmp_path / "a")
    first = [t for t in sent if t.size(1) == 16]
    assert first and all(bool((t != 0).any(1).all()) for t in first)
    assert 0 < res.summary["withheld_pick_fraction"] < 1 and 0 < res.summary["withheld_pair_fraction"] < 1
    single = run(build_config(config({"name": "fedgnn-g", "fanouts": [3, 3], "min_aggregate": 1}, rounds=2)),
                 tmp_path / "b")
    assert single.summary["withheld_pick_fraction"] == 0


# ---- special cases are configurations ---------------------------------------------------------------
def trajectory(cfg: dict, tmp_path) -> list[tuple]:
    """(loss, validation accuracy, bytes so far) after every round, without writing a results folder."""
    job = Run(build_config(cfg), tmp_path)
    rows = []
    for r in range(1, job.cfg.train.rounds + 1):
        job.transport.set_round(r)
        row = job.evaluate(r, job.protocol.train_round(r), 0.0)
        rows.append((row["train_loss"], row["val_accuracy"], row["bytes_total"]))
    return rows


def test_fedgnn_g_crosses_every_client_and_k0_none(tmp_path):
    """FedGNN-G: every client trains with cross-client neighbours at every iteration; K = 0 (how
    FedSage is run) moves no cross-client byte, and its traffic is the model exchange alone."""
    full = run(build_config(config({"name": "fedgnn-g"}, rounds=3)), tmp_path / "g")
    assert [r["cross_clients"] for r in full.metrics] == [M] * 3
    assert full.summary["cross_client_iterations"] == 3
    local = run(build_config(config({"name": "swift", "K": 0}, rounds=3)), tmp_path / "k0")
    assert local.summary["bytes_cross_client"] == 0 and local.summary["cross_client_iterations"] == 0
    kinds = local.summary["bytes_by_kind"]
    params = sum(p.numel() for p in built({"name": "swift", "K": 0}, tmp_path / "m").protocol.model.parameters())
    assert kinds["model"] == kinds["gradient"] == 3 * M * 4 * params


def test_swift_crosses_k_clients_every_i_iterations(tmp_path):
    res = run(build_config(config({"name": "swift", "K": 2, "I": 3}, rounds=7)), tmp_path)
    crossed = {r["round"]: r["cross_clients"] for r in res.metrics}
    assert crossed == {1: 2, 2: 0, 3: 0, 4: 2, 5: 0, 6: 0, 7: 2}
    ledger = [r for r in (res.out_dir / "ledger.jsonl").read_text().splitlines() if '"embedding"' in r]
    assert {int(r.split('"round": ')[1].split(",")[0]) for r in ledger} == {1, 4, 7}
    assert res.summary["cross_client_iterations"] == 3
    rows = [json.loads(r) for r in (res.out_dir / "ledger.jsonl").read_text().splitlines()]
    sampled_and_summed = sum(r["bytes"] for r in rows if r["kind"] in ("embedding", "index"))
    levels = sum(r["bytes"] for r in rows if r["method"] in ("route", "propagate") and r["kind"] == "control")
    assert res.summary["bytes_cross_client"] == sampled_and_summed + levels > 0


def test_pns_samples_on_a_shrinking_schedule_and_reuses_in_between(tmp_path):
    options = PNSOptions(name="fedgnn-pns", initial_interval=4, decay=0.5, min_interval=1)
    assert sampling_iterations(options, 12) == [0, 4, 6, 7, 8, 9, 10, 11]
    res = run(build_config(config({"name": "fedgnn-pns", "initial_interval": 4, "decay": 0.5, "min_interval": 1},
                                  rounds=8)), tmp_path)
    crossed = [r["round"] for r in res.metrics if r["cross_clients"]]
    assert crossed == [1, 5, 7, 8]
    assert res.summary["cross_client_iterations"] == 4


def test_pns_reuse_recomputes_the_cross_client_neighbourhood(tmp_path):
    """A reuse step at unchanged parameters gives exactly the loss and gradient of the cross-client
    step it reuses (same batch, neighbours and remote sums), which a local step does not."""
    job = built({"name": "fedgnn-pns"}, tmp_path)
    proto = job.protocol
    state = proto.model.state_dict()
    replies = job.transport.call_many(proto.clients, "begin", per_target=[{"mode": "cross"}] * M, state=state)
    crossed, _ = proto.cross_chain({c: r for c, r in zip(proto.clients, replies) if "targets" in r}, keep=True)
    reused = [r for r in job.transport.call_many(proto.clients, "begin", per_target=[{"mode": "reuse"}] * M,
                                                 state=state) if "gradient" in r]
    local = [r for r in job.transport.call_many(proto.clients, "begin", per_target=[{"mode": "local"}] * M,
                                                state=state) if "gradient" in r]
    assert len(crossed) == len(reused) == len(local) > 0
    for cross, reuse, alone in zip(crossed, reused, local):
        assert reuse["loss"] == pytest.approx(cross["loss"], rel=1e-6)
        for name, g in cross["gradient"].items():
            torch.testing.assert_close(reuse["gradient"][name], g)
    assert any(abs(a["loss"] - c["loss"]) > 1e-4 for a, c in zip(local, crossed))


# ---- privacy audit ----------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [{"name": "fedgnn-g"}, {"name": "swift", "K": 2, "I": 1},
                                      {"name": "fedgnn-pns", "initial_interval": 2}])
def test_no_raw_feature_row_leaves_its_owner(tmp_path, monkeypatch, protocol):
    assert audited_rows(config(protocol, rounds=3), tmp_path, monkeypatch) == []


def test_audit_detects_single_row_aggregates_and_llcg_feature_fetches(tmp_path, monkeypatch):
    """The audit is sensitive: allowing one-row sums leaks rows, and LLCG's correction ships rows
    to the server by design (never to another client)."""
    leaks = audited_rows(config({"name": "fedgnn-g", "min_aggregate": 1}, rounds=1), tmp_path / "a", monkeypatch)
    assert any(method == "propagate" for _, _, method in leaks)
    llcg = audited_rows(config({"name": "llcg", "local_steps": 2}, rounds=2), tmp_path / "b", monkeypatch)
    assert llcg and {(dst, method) for _, dst, method in llcg} == {("server", "rows")}


# ---- the memory budget of a cross-client step ------------------------------------------------------
def planned(monkeypatch) -> list[dict]:
    """Every aggregation phase as ``owner_batches`` plans it: the bytes the server holds besides the
    replies (sums to forward and the bound on the sums it assembles), each owner's reply bound and
    the batches of owners."""
    plans: list[dict] = []
    original = CrossClientProtocol.owner_batches

    def spy(self, layer, targets, routes, held):
        replies, assembled = self.reply_bytes(layer, routes)
        batches = original(self, layer, targets, routes, held)
        plans.append({"fixed": held + assembled, "replies": [int(replies[self.router.index[c]]) for c in targets],
                      "batches": batches})
        return batches

    monkeypatch.setattr(CrossClientProtocol, "owner_batches", spy)
    return plans


def unbatched(cfg: dict, folder, monkeypatch) -> tuple:
    """``cfg``'s run under the default budget (one batch per phase here) and the tightest budget
    (MiB) under which every phase of it still fits, owner by owner: each phase's fixed bytes plus
    its largest single reply."""
    plans = planned(monkeypatch)
    result = run(build_config(cfg), folder)
    assert all(len(p["batches"]) == 1 for p in plans)
    return result, max(p["fixed"] + max(p["replies"]) for p in plans) / 2**20


def without_timings(row: dict) -> dict:
    """A metrics row or summary without what the machine's speed decides (wall and CPU seconds)."""
    return {k: v for k, v in row.items() if k not in ("wall_time_s", "wall_ms_per_round", "compute_s_by_party")}


@pytest.mark.parametrize("protocol, model, privacy", [
    ({"name": "fedgnn-g", "fanouts": [5, 3]}, "sage", {}),
    ({"name": "fedgnn-g", "fanouts": [5, 3], "remote_backprop": True}, "gcn", {}),
    ({"name": "swift", "K": 3, "I": 1, "fanouts": [4, 4]}, "gin", {"secure_aggregation": True}),
    ({"name": "fedgnn-pns", "initial_interval": 2, "fanouts": [5, 3]}, "sage",
     {"dp": {"noise_multiplier": 0.5, "max_norm": 1.0, "replayable_noise": True}})])
def test_a_budget_that_batches_the_owners_changes_no_result(tmp_path, monkeypatch, protocol, model, privacy):
    """Under the tightest budget the server asks the owners in several batches and drops each
    batch's replies once added in; metrics, ledger and summary equal the unbatched run's bit for
    bit (each target's vectors are added in the same owner order)."""
    cfg = config(protocol, model=model, rounds=3, dropout=0.5) | {"privacy": privacy}
    whole, budget = unbatched(cfg, tmp_path / "whole", monkeypatch)
    plans = planned(monkeypatch)
    cfg["protocol"]["memory_budget_mb"] = budget
    batched = run(build_config(cfg), tmp_path / "batched")
    assert max(len(p["batches"]) for p in plans) > 1
    assert [without_timings(r) for r in batched.metrics] == [without_timings(r) for r in whole.metrics]
    assert (batched.out_dir / "ledger.jsonl").read_text() == (whole.out_dir / "ledger.jsonl").read_text()
    assert without_timings(batched.summary) == without_timings(whole.summary)


def test_the_budget_bounds_what_the_server_holds_on_the_wire(tmp_path, monkeypatch):
    """Measured from the messages themselves: in every aggregation phase, the sums and counts the
    server forwards into it (from the layer below) and out of it (to the next layer or the trainers)
    plus its largest batch of owner replies stay within the budget; unbatched, they exceed it."""
    cfg = config({"name": "fedgnn-g", "fanouts": [5, 3]}, rounds=2, dropout=0.5)
    _, budget = unbatched(cfg, tmp_path / "plan", monkeypatch)

    def held(protocol: dict, folder) -> list[int]:
        job = Run(build_config(cfg | {"protocol": protocol}), folder)
        forwarded: dict[tuple, int] = {}  # (round, layer the sums go into) -> bytes
        batches: dict[tuple, list[int]] = {}  # (round, layer) -> reply bytes of each batch
        phase: list = [None, "down"]  # the current (round, layer) and the direction of its last message

        def observe(r, src, dst, method, message, evaluating):
            if evaluating or method not in ("propagate", "finish"):
                return
            if src == "server":
                key = (r, message["layer"] if method == "propagate" else job.cfg.model.layers + 1)
                forwarded[key] = forwarded.get(key, 0) + nbytes(message.get("remote")) + nbytes(message["counts"])
                if phase != [key, "down"]:
                    batches.setdefault(key, []).append(0)  # a new phase, or the next batch of this one
                phase[:] = [key, "down"]
            elif method == "propagate":
                batches[phase[0]][-1] += nbytes(message)
                phase[1] = "up"

        job.transport.observers.append(observe)
        job.execute(progress=False)
        return [forwarded.get((r, layer), 0) + forwarded[(r, layer + 1)] + max(sizes)
                for (r, layer), sizes in batches.items() if layer <= job.cfg.model.layers]

    batched = held(cfg["protocol"] | {"memory_budget_mb": budget}, tmp_path / "batched")
    assert max(batched) <= budget * 2**20 < max(held(cfg["protocol"], tmp_path / "whole"))


def test_a_step_that_cannot_fit_the_budget_is_one_config_error(tmp_path):
    """One owner's reply is one message: when it alone does not fit beside the sums, the run stops
    with one line naming the option and the budget the step needs."""
    with pytest.raises(ConfigError, match=r"^protocol\.memory_budget_mb=0\.001 is too small for one cross-client "
                                          r"step: layer 1 needs .* set it to at least [0-9.]+ ") as err:
        run(build_config(config({"name": "fedgnn-g", "memory_budget_mb": 0.001})), tmp_path)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="memory_budget_mb"):
        build_config(config({"name": "fedgnn-g", "memory_budget_mb": 0}))


# ---- configuration errors -------------------------------------------------------------------------
@pytest.mark.parametrize("protocol, model, match", [
    ({"name": "swift", "fanouts": [10]}, "sage", "fanouts"),
    ({"name": "swift", "K": M + 1}, "sage", "exceeds"),
    ({"name": "fedgnn-g"}, "gat", "element-wise"),
    ({"name": "llcg"}, "gcn", "allowed: sage, gin"),
    ({"name": "llcg", "server_fanouts": [5]}, "sage", "server_fanouts"),
])
def test_bad_settings_are_config_errors(tmp_path, protocol, model, match):
    with pytest.raises(ConfigError, match=match):
        built(protocol, tmp_path, model=model)


def test_bad_options_are_rejected_before_running():
    with pytest.raises(ConfigError, match="fanouts"):
        build_config(config({"name": "swift", "fanouts": [0, 5]}))
    with pytest.raises(ConfigError, match="protocol.I"):
        build_config(config({"name": "swift", "I": 0}))
    with pytest.raises(ConfigError, match="K"):
        build_config(config({"name": "fedgnn-g", "K": 2}))


# ---- LLCG -------------------------------------------------------------------------------------------
def test_llcg_sends_only_training_labels():
    """The correction's ``rows`` call returns labels of the requested training nodes only."""
    cfg = build_config(config({"name": "llcg"}))
    data = load_dataset("synthetic", num_nodes=400, num_features=16, avg_degree=6)
    shard = partition_horizontal(data, M, "metis").shards[0]
    client = LLCGClient.create(name="client0", seed=1, shard=shard, model=cfg.model, train=cfg.train,
                               num_features=16, num_classes=int(data.num_classes), batch_size=32, fanouts=[5, 3])
    asked = torch.arange(shard.num_nodes)
    reply = client.rows(features=asked[:3], labels=asked)
    assert torch.equal(reply["train"], shard.train_mask.nonzero().flatten())
    assert torch.equal(reply["y"], shard.y[shard.train_mask])
    assert 0 < reply["y"].numel() < shard.num_nodes


@pytest.mark.parametrize("dataset", ["synthetic", "citeseer"])
def test_llcg_learns(tmp_path, request, dataset):
    """LLCG's training loss falls and its corrected model beats chance, on two datasets."""
    cfg = config({"name": "llcg", "local_steps": 5}, rounds=20 if dataset == "synthetic" else 10)
    cfg["eval"] = {"every": 5}
    if dataset != "synthetic":
        cfg["dataset"] = {"name": dataset, "data_root": str(request.getfixturevalue("data_root"))}
    res = run(build_config(cfg), tmp_path)
    losses = [r["train_loss"] for r in res.metrics]
    assert losses[-1] < 0.8 * losses[0]
    assert res.summary["best_val_accuracy"] > 0.45  # chance: 0.25 (synthetic), 0.17 (CiteSeer)
    kinds = res.summary["bytes_by_kind"]  # the correction's fetches: rows, labels, neighbour lists, fanouts
    fanouts = sum(r["bytes"] for r in map(json.loads, (res.out_dir / "ledger.jsonl").read_text().splitlines())
                  if r["method"] == "neighbours" and r["kind"] == "control")
    assert res.summary["bytes_cross_client"] == kinds["embedding"] + kinds["label"] + kinds["index"] + fanouts


# ---- real data --------------------------------------------------------------------------------------
def test_swift_learns_citeseer(data_root, tmp_path):
    cfg = {
        "dataset": {"name": "citeseer", "data_root": str(data_root)},
        "model": {"name": "sage", "hidden": 32, "layers": 2, "dropout": 0.5},
        "partition": {"num_clients": 10, "method": "metis"},
        "protocol": {"name": "swift", "I": 5, "K": 5},
        "train": {"rounds": 10, "lr": 0.02},
        "eval": {"every": 5},
        "network": {"compute": "ignore"},
    }
    res = run(build_config(cfg), tmp_path)
    assert res.summary["best_val_accuracy"] > 0.6  # paper, Table 8: 66.0
    assert res.summary["bytes_by_kind"]["embedding"] > 0


# ---- the examples -------------------------------------------------------------------------------------
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_examples_differ_only_in_the_protocol():
    swift, full = (load_config(EXAMPLES / f) for f in ("swift-pubmed.yaml", "fedgnn-g-pubmed.yaml"))
    assert {k: v for k, v in swift.model_dump().items() if k != "protocol"} == \
        {k: v for k, v in full.model_dump().items() if k != "protocol"}
    assert (swift.protocol["I"], swift.protocol["K"], full.protocol["name"]) == (10, 5, "fedgnn-g")
    assert swift.partition.num_clients == 10 and swift.partition.method == "metis" and swift.model.name == "sage"


# ---- bench tasks -------------------------------------------------------------------------------------
def test_bench_tasks_are_valid_configurations():
    from fedgl.bench.core import variant_config
    from fedgl.bench.swift import TASKS
    from fedgl.data.registry import DATASETS

    for task in TASKS.values():
        assert task.base["dataset"]["name"] in DATASETS  # every task can run where its data is present
        for variant in task.variants:
            cfg = variant_config(task, variant, 0, task.quick)
            assert cfg.protocol_name in ("swift", "fedgnn-g", "llcg", "fedgnn-pns")


def test_bench_columns_come_from_the_measured_totals():
    from fedgl.bench.swift import derive

    swift = derive({"rounds": 100, "bytes_total": 250e6, "bytes_cross_client": 50e6, "cross_client_iterations": 10,
                    "bytes_at_target": 2e9})
    assert swift == {"mb_per_step": 2.5, "mb_cross_per_step": 0.5, "mb_cross_per_comm_iteration": 5.0,
                     "gb_at_target": 2.0, "mb_at_target": 2000.0, "label_entropy": None}
    local = derive({"rounds": 100, "bytes_total": 200e6, "bytes_cross_client": 0, "cross_client_iterations": 0,
                    "bytes_at_target": None})
    assert local["mb_cross_per_comm_iteration"] is None and local["gb_at_target"] is None


def test_bench_task_writes_tables_figures_and_ratios(tmp_path):
    from fedgl.bench.core import BenchTask, Variant, run_task
    from fedgl.bench.swift import COLUMNS, derive, finish

    task = BenchTask(name="swift-tiny", description="synthetic", base=config({"name": "swift"}, rounds=1),
                     variants=[Variant("Swift-FedGNN", {"protocol.I": 2, "protocol.K": 2}),
                               Variant("FedGNN-G", {"protocol.name": "fedgnn-g"}),
                               Variant("FedSage", {"protocol.K": 0})],
                     columns=COLUMNS, seeds=1, derive=derive, finish=finish)
    result = run_task(task, tmp_path)
    assert (tmp_path / "figures.png").stat().st_size > 0 and (tmp_path / "table.md").exists()
    swift, full, local = (row["mb_per_step"]["mean"] for row in result["rows"])
    assert full > swift > local > 0  # cross-client iterations add embeddings to the same model traffic
    assert result["rows"][2]["mb_cross_per_comm_iteration"]["mean"] is None
    runs = {r["variant"]: r for r in json.loads((tmp_path / "results.json").read_text())}
    ratio = runs["FedGNN-G"]["bytes_cross_client"] / runs["Swift-FedGNN"]["bytes_cross_client"]
    line = next(x for x in (tmp_path / "ratios.md").read_text().splitlines() if x.startswith("| Swift-FedGNN"))
    assert line.split("|")[6].strip() == f"{ratio:.2f}"  # FedGNN-G ÷ Swift in cross-client bytes per step
    assert "| — |" in (tmp_path / "ratios.md").read_text()  # K = 0 sends no cross-client byte
