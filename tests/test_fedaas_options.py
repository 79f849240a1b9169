"""FedAAS's optional rules: the φ selection rule, ``tau0: grid`` and secure aggregation of the model
averages, each checked against an independent computation or an equivalent plain run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch_geometric.data import Data

from fedgl.config import build_config
from fedgl.errors import ConfigError
from fedgl.privacy.config import SUPPORTED
from fedgl.protocols.fedaas.client import FedAASClient
from fedgl.protocols.fedaas.schedule import GRID, ratio_picks
from fedgl.protocols.fedavg.group import flat_state
from fedgl.protocols.horizontal.routing import Router
from fedgl.results import read_jsonl
from fedgl.runner import Run
from fedgl.search import run
from support.configs import fedaas as config
from support.masks import top_bits
from support.runs import compare_runs, run_resumed

SHARED = ["fedaas", "fedcross", "fedaas-pns", "fedlocal", "fedall", "fedaas1", "fedaas2", "fedgraph-recon"]


# ---- the φ rule ------------------------------------------------------------------------------------
def hand_made_graph() -> Data:
    """24 nodes, undirected: i ~ j when (ij + i + j) mod 3 = 0 or |i - j| = 1 (degrees 1 to 9)."""
    n = 24
    i, j = torch.triu_indices(n, n, 1)
    keep = ((i * j + i + j) % 3 == 0) | (j - i == 1)
    edges = torch.stack([i[keep], j[keep]])
    every = torch.ones(n, dtype=torch.bool)
    return Data(x=torch.randn(n, 16, generator=torch.Generator().manual_seed(0)),
                edge_index=torch.cat([edges, edges.flip(0)], 1), y=torch.arange(n) % 2, train_mask=every,
                val_mask=every, test_mask=every, num_classes=2, name="hand-made")


def rule(phi: float, count: int) -> int:
    return max(math.floor(phi * count), 1) if count else 0


@pytest.mark.parametrize("sampling", ["attention", "uniform"])
def test_phi_rule_counts_per_part_and_per_owner(tmp_path, monkeypatch, sampling):
    """One sync step of client 0 over its whole shard: at every layer each node has
    max(⌊φ |N(v) ∩ V_k|⌋, 1) local picks and, at the crossing layer, max(⌊φ |N(v) ∩ V_q|⌋, 1) picks
    at every other owner q, counted here from the global graph and the owner map."""
    phi = 0.5
    data = hand_made_graph()
    cfg = config({"phi": phi, "sampling": sampling, "interval": 1, "batches": 1})
    job = Run(build_config(cfg), tmp_path, data=data)
    proto, transport = job.protocol, job.transport
    routed, steps = [], []
    route, complete = Router.route, FedAASClient._complete
    monkeypatch.setattr(Router, "route", lambda self, picks: routed.append(picks) or route(self, picks))
    monkeypatch.setattr(FedAASClient, "_complete",
                        lambda self, step: (steps.append((self.name, step)), complete(self, step))[1])
    transport.call_many(proto.clients, "start", state=proto.model.state_dict())
    proto.sync(proto.clients)

    owner, (src, dst) = proto.router.owner, data.edge_index
    party = transport._parties["client0"]
    ids = party.global_ids

    def neighbours(v: int, q: int) -> set[int]:
        return set(src[(dst == v) & (owner[src] == q)].tolist())

    step = next(s for name, s in steps if name == "client0")
    seen = []
    for layer in range(2):
        col, target = step.edges[layer]
        for row in step.rows[layer].tolist():
            mine = ids[col[target == row]].tolist()
            expected = neighbours(int(ids[row]), 0)
            assert len(mine) == rule(phi, len(expected)) and set(mine) <= expected
            seen.append((len(expected), len(mine)))
    picks = routed[0]["client0"]["client0"]
    targets, remote = ids[picks["targets"]], picks["ids"]
    for v in ids[step.rows[1]].tolist():
        for q in range(1, 3):
            expected = neighbours(v, q)
            mine = remote[(targets == v) & (owner[remote] == q)].tolist()
            assert len(mine) == rule(phi, len(expected)) and set(mine) <= expected
            seen.append((len(expected), len(mine)))
    # the graph exercises every branch of the rule: none, the floor of 1, and a real reduction
    assert {(0, 0), (1, 1)} <= set(seen) and any(1 < k < c for c, k in seen)


def test_ratio_picks_draw_in_proportion_to_exp_logits():
    """4,000 segments of the same five logits, φ = 0.2 (one pick each): pick frequencies follow
    softmax(logits) (chi-square), and φ = 0.4 picks two distinct candidates per segment."""
    logits = torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.0])
    segments = torch.arange(4000).repeat_interleave(5)
    keep = ratio_picks(segments, 0.2, torch.Generator().manual_seed(0), logits.repeat(4000))
    counts = keep.view(4000, 5).sum(0).double()
    expected = 4000 * torch.softmax(logits.double(), 0)
    assert stats.chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-6
    assert stats.chisquare(counts.numpy()).pvalue < 1e-12  # far from uniform: the test can fail
    two = ratio_picks(segments, 0.4, torch.Generator().manual_seed(1), logits.repeat(4000))
    assert bool((two.view(4000, 5).sum(1) == 2).all())


# ---- tau0: grid --------------------------------------------------------------------------------------
def held_out(protocol: dict, rounds: int = 3) -> dict:
    cfg = config({"interval_loss": "server", "batches": 10, **protocol}, rounds=rounds)
    cfg["partition"] |= {"client_nodes": "train", "method": "stratified"}
    return cfg


@pytest.mark.slow
def test_tau0_grid_keeps_the_fastest_tau_and_continues_from_the_state_it_started_from(tmp_path):
    """The grid's trial of τ is round 1 of a run started at ``tau0: τ``: the same server loss and the
    same simulated seconds. It keeps the τ with the lowest (F_τ - F_0) / seconds; after it, the run is
    that τ's plain run round for round (the parties and the server were restored exactly), plus the
    grid's traffic in round 0 and its time on the clock."""
    grid = run(build_config(held_out({"tau0": "grid", "tau_min": 1})), tmp_path / "grid")
    measured = grid.summary["tau0_grid"]
    assert sorted(measured) == list(GRID)
    plain = {}
    for t in GRID:
        job = Run(build_config(held_out({"tau0": t, "tau_min": 1})), tmp_path / str(t))
        plain[t] = job.execute(progress=False)
        f0 = job.protocol.losses[0]  # the initial model's server loss
        first = plain[t].metrics[0]
        assert measured[t]["loss"] == pytest.approx(first["interval_loss"], abs=1e-6), t
        assert measured[t]["seconds"] == pytest.approx(first["sim_time_s"], rel=1e-9), t  # a plain clock starts at 0
        assert measured[t]["rate"] == pytest.approx((first["interval_loss"] - f0) / first["sim_time_s"], rel=1e-5)
    rates = {t: m["rate"] for t, m in measured.items()}
    assert len(set(rates.values())) > 1  # the choice is not a tie
    best = min(rates, key=rates.get)
    assert grid.summary["tau0"] == best
    same = plain[best]
    for a, b in zip(grid.metrics, same.metrics, strict=True):
        for key in ("train_loss", "interval_loss", "val_accuracy", "test_loss", "tau", "bytes_round"):
            assert a[key] == b[key], key
    ledger = read_jsonl(tmp_path / "grid" / "ledger.jsonl")
    assert {"start", "request", "serve", "finish", "upload"} <= {row["method"] for row in ledger if row["round"] == 0}
    assert not [row for row in read_jsonl(tmp_path / str(best) / "ledger.jsonl") if row["round"] == 0]
    spent = sum(m["seconds"] for m in measured.values())
    assert grid.metrics[-1]["sim_time_s"] == pytest.approx(same.metrics[-1]["sim_time_s"] + spent, rel=1e-9)


def test_tau0_grid_is_not_searched_again_on_resume(tmp_path):
    options = {"tau0": "grid", "tau_min": 1, "batches": 4}
    straight = run(build_config(held_out(options, rounds=3)), tmp_path / "a")
    compare_runs(straight, run_resumed(held_out(options, rounds=3), tmp_path / "b", stop_after=2))


# ---- secure aggregation ------------------------------------------------------------------------------
def secure(cfg: dict) -> dict:
    return cfg | {"privacy": {"secure_aggregation": True}}


@pytest.mark.parametrize("name, options", [(name, {}) for name in SHARED] +
                         [("fedaas", {"client_fraction": 0.75, "weighting": "uniform"})])
def test_secure_aggregation_ends_where_the_plain_run_ends(tmp_path, name, options):
    """Every preset sharing FedAAS's averaging, and a round of 3 of 4 clients with uniform weights: the
    same metrics within 1e-5; each client's only upload is the masked [w θ, w, w loss] in int64."""
    cfg = config({"name": name, "batches": 2, **options}, clients=4)
    plain = run(build_config(cfg), tmp_path / "plain")
    job = Run(build_config(secure(cfg)), tmp_path / "secure")
    masked = job.execute(progress=False)
    for a, b in zip(plain.metrics, masked.metrics, strict=True):
        for key in ("train_loss", "val_accuracy", "val_loss", "test_accuracy", "test_loss", "test_macro_f1"):
            assert b[key] == pytest.approx(a[key], abs=1e-5), key
    params = flat_state(job.protocol.model.state_dict()).numel()
    chosen = 3 if options else 4
    for r in (1, 2):
        up = [row for row in job.transport.ledger.rows() if row["round"] == r and row["direction"] == "up"
              and row["kind"] == "model"]
        assert {row["method"] for row in up} == {"secagg_input"}
        assert sum(row["bytes"] for row in up) == chosen * 8 * (params + 2)
    assert {row["method"] for row in job.transport.ledger.rows()
            if row["round"] == 0} == set()  # identities are pinned as the parties are made: nothing relayed


def test_what_the_server_receives_from_a_fedaas_client_is_uniform_and_data_independent(tmp_path, repeatable_keys):
    """Two federations on different data, with the same keys: client 0's upload is uniform in both
    and the two have the same distribution, though the models they carry differ."""
    sent = []
    for seed in (0, 1):
        repeatable_keys()
        job = Run(build_config(secure(config({"widths": [64, 64]}) | {"seed": seed})), tmp_path / str(seed))
        proto, transport = job.protocol, job.transport
        seen = []
        transport._observe = lambda src, dst, method, payload: (
            seen.append(payload) if (src, method) == ("client0", "secagg_input") else None)
        proto.start()
        transport.call_many(proto.clients, "start", state=proto.model.state_dict())
        transport.call_many(proto.clients, "local", steps=1)
        proto.average(proto.clients, proto.model.state_dict())
        sent.append(seen[0])
        params = flat_state(proto.model.state_dict()).numel()
    assert sent[0].dtype == torch.int64 and sent[0].numel() == params + 2
    for payload in sent:
        assert stats.chisquare(np.bincount(top_bits(payload), minlength=16)).pvalue > 1e-6
    assert stats.ks_2samp(*(p.double().numpy() for p in sent)).pvalue > 1e-6
    assert not torch.equal(sent[0], sent[1])  # same keys and round, so the same masks: the data differ


def test_secure_aggregation_refuses_what_it_cannot_hide(tmp_path, monkeypatch):
    monkeypatch.setitem(SUPPORTED, "graphfed-recon", ("secure_aggregation",))
    with pytest.raises(ConfigError, match="personalize 'similarity' needs"):
        Run(build_config(secure(config({"name": "graphfed-recon"}))), tmp_path / "graphfed")
    with pytest.raises(ConfigError, match="at least 3 clients per sum .* got threshold 1 for 1 clients"):
        Run(build_config(secure(config({"client_fraction": 0.2}))), tmp_path / "one")


# ---- configuration -----------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol, match", [
    ({"phi": 0.5, "sampling": "all"}, "phi sets every pick count"),
    ({"phi": 0.5, "local_fanouts": [2, 2], "cross_fanouts": [2, 2]}, "phi sets every pick count"),
    ({"phi": 1.5}, "phi"),
    ({"tau0": "grid", "interval": 2}, "tau0 'grid'"),
    ({"tau0": "grid"}, "interval_loss 'server'"),
    ({"tau0": 0}, "tau0 must be"),
])
def test_bad_option_combinations_are_config_errors(protocol, match):
    with pytest.raises(ConfigError, match=match):
        build_config(config(protocol))
