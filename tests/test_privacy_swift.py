"""Privacy of the Swift-FedGNN family's cross-client sums: opaque request handles, secure aggregation
with masks only the recipient removes, and DP on the exchanged embeddings with its accountant."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from fedgl.config import build_config
from fedgl.errors import ConfigError
from fedgl.privacy import secure_aggregation as sa
from fedgl.privacy.dp import gaussian_epsilon
from fedgl.protocols.horizontal.routing import OWN
from fedgl.runner import Run
from support.masks import top_bits

M = 4


def config(protocol: dict, privacy: dict | None = None, model: str = "sage", rounds: int = 3, seed: int = 0,
           dropout: float = 0.5, features: int = 16) -> dict:
    return {
        "seed": seed,
        "dataset": {"name": "synthetic", "options": {"num_nodes": 400, "num_features": features, "avg_degree": 6}},
        "model": {"name": model, "hidden": 8, "layers": 2, "dropout": dropout},
        "partition": {"num_clients": M, "method": "metis"},
        "protocol": protocol, "privacy": privacy or {},
        "train": {"rounds": rounds, "lr": 0.01}, "eval": {"every": 1}, "network": {"compute": "ignore"},
    }


def observed(cfg: dict, tmp_path) -> tuple[Run, list[tuple]]:
    """Run ``cfg``; every training message as (round, sender, receiver, method, payload)."""
    job = Run(build_config(cfg), tmp_path)
    seen: list[tuple] = []
    job.transport.observers.append(lambda r, src, dst, method, payload, evaluating: None if evaluating
                                   else seen.append((r, src, dst, method, payload)))
    job.result = job.execute(progress=False)
    return job, seen


def keys_and_strings(obj):
    """Every dict key and string inside a payload."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from keys_and_strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from keys_and_strings(v)
    elif isinstance(obj, str):
        yield obj


# ---- opaque routing -----------------------------------------------------------------------------------
@pytest.mark.parametrize("privacy", [{}, {"secure_aggregation": True}])
def test_no_message_names_the_training_client(tmp_path, privacy):
    """Requests travel under random per-round handles: no message to a client carries another
    client's name; a client's own request is called ``own``; handles never repeat across rounds."""
    job, seen = observed(config({"name": "fedgnn-g", "fanouts": [3, 3]}, privacy), tmp_path)
    names = set(job.protocol.clients)
    handles_by_round: dict[int, set] = {}
    for r, src, dst, method, payload in seen:
        if method in ("begin", "route", "propagate", "finish", "request_keys", "request_peers"):
            party = dst if src == "server" else src
            words = set(keys_and_strings(payload))
            assert not words & names, (method, party)
            handles = {w for w in words if len(w) == 16 and all(ch in "0123456789abcdef" for ch in w)}
            handles_by_round.setdefault(r, set()).update(handles)
    assert all(len(h) == M for h in handles_by_round.values())  # one per trainer, seen by the other clients
    rounds = list(handles_by_round.values())
    assert all(not (a & b) for a, b in itertools.combinations(rounds, 2))
    assert all(set(p["remote"]) <= {OWN} for _, src, _, m, p in seen if m == "finish" and src == "server")
    assert any(p["remote"] for _, src, _, m, p in seen if m == "finish" and src == "server")


# ---- secure aggregation -------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol, model", [({"name": "fedgnn-g", "fanouts": [3, 3]}, "sage"),
                                             ({"name": "swift", "K": 2, "I": 2}, "gcn"),
                                             ({"name": "fedgnn-pns", "initial_interval": 2}, "gin")])
def test_secure_swift_ends_where_plain_swift_ends(tmp_path, protocol, model):
    plain_job, plain = observed(config(protocol, model=model), tmp_path / "plain")
    job, secure = observed(config(protocol, {"secure_aggregation": True}, model=model), tmp_path / "secure")
    for row, secure_row in zip(plain_job.result.metrics, job.result.metrics, strict=True):
        for key in ("train_loss", "val_accuracy", "val_loss", "test_accuracy", "test_loss"):
            assert secure_row[key] == pytest.approx(row[key], abs=1e-5), key
    kinds, plain_kinds = job.result.summary["bytes_by_kind"], plain_job.result.summary["bytes_by_kind"]
    assert kinds["embedding"] > plain_kinds["embedding"] and kinds["control"] > plain_kinds["control"]
    # Each gradient upload is a secure sum's masked input, int64 (twice float32's bytes) with two more
    # entries: count and loss; no gradient travels in the clear.
    replies = [p for _, src, _, m, p in secure if src != "server" and m in ("begin", "finish")]
    masked = [p for _, src, _, m, p in secure if src != "server" and m == "secagg_input"]
    assert len(masked) == M * 3 and not any("gradient" in p for p in replies)
    assert kinds["model"] == plain_kinds["model"] and kinds["gradient"] == 2 * plain_kinds["gradient"] + 16 * M * 3
    keys = [m for _, _, _, m, _ in secure if m in ("request_keys", "request_peers")]
    assert keys and job.result.summary["bytes_cross_client"] > plain_job.result.summary["bytes_cross_client"]


def sums_seen_by_server(cfg: dict, tmp_path) -> tuple[torch.Tensor, torch.Tensor]:
    """Every partial sum an owner sent up and every total the server forwarded, first layer only."""
    _, seen = observed(cfg, tmp_path)
    width = cfg["dataset"]["options"]["num_features"]
    up, down = [], []
    for _, src, dst, method, payload in seen:
        if method == "propagate" and src != "server":
            up += [t for t in payload["sums"].values() if t.numel() and t.size(1) == width]
        if method == "propagate" and src == "server" and payload.get("remote"):
            down += [t for t in payload["remote"].values() if t.numel() and t.size(1) == width]
    return torch.cat(up), torch.cat(down)


def test_what_the_server_sees_of_the_sums_is_uniform_whatever_the_features(tmp_path, repeatable_keys):
    """Under secure aggregation every first-layer partial sum and every forwarded total is int64 and
    uniform over the ring, with the same distribution for two different feature matrices (same keys),
    while the values they carry differ; the plain sums are far from uniform once encoded."""
    protocol = {"name": "fedgnn-g", "fanouts": [4, 4]}
    views = []
    for seed in (0, 1):
        repeatable_keys()  # the same keys, in the same order, in both federations
        views.append(sums_seen_by_server(config(protocol, {"secure_aggregation": True}, seed=seed, rounds=1,
                                                features=64), tmp_path / f"s{seed}"))
    for up, down in views:
        assert up.dtype == down.dtype == torch.int64
        for sent in (up, down):
            assert stats.chisquare(np.bincount(top_bits(sent), minlength=16)).pvalue > 1e-6
    assert stats.ks_2samp(views[0][0].flatten().double().numpy(), views[1][0].flatten().double().numpy()).pvalue > 1e-6
    plain_up, _ = sums_seen_by_server(config(protocol, seed=0, rounds=1, features=64), tmp_path / "plain")
    encoded = sa.encode(plain_up.double(), torch.ones(plain_up.size(0), dtype=torch.long), M)
    assert stats.chisquare(np.bincount(top_bits(encoded), minlength=16)).pvalue < 1e-12


def test_masked_gradient_uploads_are_uniform(tmp_path, repeatable_keys):
    """Under secure aggregation every gradient the server receives is an int64 row uniform over the
    ring; the plain gradients, encoded the same way, are not."""
    protocol = {"name": "swift", "K": 2, "I": 2}
    _, secure = observed(config(protocol, {"secure_aggregation": True}, rounds=2), tmp_path / "s")
    masked = torch.cat([p for _, src, _, m, p in secure if src != "server" and m == "secagg_input"])
    assert masked.dtype == torch.int64
    assert stats.chisquare(np.bincount(top_bits(masked), minlength=16)).pvalue > 1e-6
    _, plain = observed(config(protocol, rounds=2), tmp_path / "p")
    grads = torch.cat([torch.cat([g.flatten() for g in p["gradient"].values()]) for _, src, _, m, p in plain
                       if src != "server" and m in ("begin", "finish") and "gradient" in p])
    encoded = sa.encode(grads.double().unsqueeze(0), torch.ones(1, dtype=torch.long), M)
    assert stats.chisquare(np.bincount(top_bits(encoded), minlength=16)).pvalue < 1e-12


def test_privacy_options_refuse_remote_backprop_and_llcg(tmp_path):
    with pytest.raises(ConfigError, match="remote_backprop: false"):
        Run(build_config(config({"name": "swift", "remote_backprop": True}, {"secure_aggregation": True})), tmp_path)
    with pytest.raises(ConfigError, match="protocol llcg does not implement it"):
        build_config(config({"name": "llcg"}, {"secure_aggregation": True}))


# ---- differential privacy -----------------------------------------------------------------------------
def released_rows(job: Run, seen: list[tuple]) -> torch.Tensor:
    """Releases per node counted from the messages alone: the picks routed to each owner per
    (round, request, layer) and the counts the owner returned (a pair with count 0 sent nothing)."""
    router = job.protocol.router
    global_id = {}
    for c, name in enumerate(job.protocol.clients):
        nodes = (router.owner == c).nonzero().flatten()
        global_id[name] = torch.empty_like(nodes).index_copy_(0, router.local_index[nodes], nodes)
    picks = {}
    for r, src, dst, method, payload in seen:
        if src == "server" and method in ("route", "propagate") and payload.get("incoming"):
            layer = payload["level"] + 1 if method == "route" else 1
            for request, msg in payload["incoming"].items():
                picks[(r, dst, request, layer)] = msg
    counts = torch.zeros(router.owner.numel(), dtype=torch.long)
    calls = [(r, dst, p["layer"]) for r, src, dst, m, p in seen if src == "server" and m == "propagate"]
    replies = [(r, src, p) for r, src, dst, m, p in seen if m == "propagate" and src != "server"]
    for (r, owner, layer), (_, _, reply) in zip(calls, replies):
        for request, size in reply["counts"].items():
            msg = picks[(r, owner, request, layer)]
            sent = size[msg["pair"]] > 0
            counts += torch.bincount(global_id[owner][msg["u"][sent]], minlength=counts.numel())
    return counts


def test_dp_clips_rows_noises_sums_and_reports_the_accountants_epsilon(tmp_path):
    pytest.importorskip("dp_accounting")
    dp = {"noise_multiplier": 1e-6, "max_norm": 0.2}
    job, seen = observed(config({"name": "fedgnn-g", "fanouts": [3, 3], "min_aggregate": 1}, {"dp": dp},
                                dropout=0.0), tmp_path / "dp")
    first = [(p["sums"], p["counts"]) for _, src, _, m, p in seen if m == "propagate" and src != "server"]
    ratios = [float((s.norm(dim=1) / c[c > 0]).max()) for sums, counts in first for k, s in sums.items()
              for c in [counts[k]] if s.numel()]
    assert max(ratios) <= 0.2 * (1 + 1e-3)  # every row clipped to max_norm before it is summed
    releases = released_rows(job, seen)
    assert int(releases.max()) > 1
    per_round = [row["epsilon"] for row in job.result.metrics]
    assert per_round == sorted(per_round) and per_round[0] < per_round[-1]
    # every gradient upload clipped to max_norm too: one more release per iteration for every node
    uploads = [torch.cat([g.flatten() for g in p["gradient"].values()]) for _, src, _, m, p in seen
               if src != "server" and m in ("begin", "finish") and "gradient" in p]
    assert len(uploads) == M * 3 and max(float(u.norm()) for u in uploads) <= 0.2 * (1 + 1e-3)
    summary = job.result.summary  # exact loads: tests/test_dp_adversary.py
    assert summary["epsilon_model"] == pytest.approx(gaussian_epsilon(1e-6, 3 * 2**2, 1e-5))
    assert summary["epsilon"] > summary["epsilon_embedding"] > gaussian_epsilon(1e-6, int(releases.max()) * 2**2, 1e-5)
    assert summary["delta"] == 1e-5
    # noise of std noise_multiplier x max_norm: a large noise changes what the trainers learn
    noisy, _ = observed(config({"name": "fedgnn-g", "fanouts": [3, 3]}, {"dp": {"noise_multiplier": 50.0,
                                                                                  "max_norm": 1.0}}), tmp_path / "n")
    plain, _ = observed(config({"name": "fedgnn-g", "fanouts": [3, 3]}), tmp_path / "p")
    assert noisy.result.metrics[-1]["train_loss"] != pytest.approx(plain.result.metrics[-1]["train_loss"], abs=1e-3)
    assert noisy.result.summary["epsilon"] < job.result.summary["epsilon"]


def test_a_private_swift_run_resumes_with_its_budget(tmp_path):
    pytest.importorskip("dp_accounting")
    privacy = {"dp": {"noise_multiplier": 1.0, "max_norm": 1.0, "replayable_noise": True}, "secure_aggregation": True}
    base = config({"name": "swift", "K": 2, "I": 1}, privacy) | {"checkpoint_every": 1}
    straight = Run(build_config(base | {"train": {"rounds": 3, "lr": 0.01}}), tmp_path / "a").execute(progress=False)
    Run(build_config(base | {"train": {"rounds": 2, "lr": 0.01}}), tmp_path / "b").execute(progress=False)
    job = Run(build_config(base | {"train": {"rounds": 3, "lr": 0.01}}), tmp_path / "b")
    assert job.resume()
    resumed = job.execute(progress=False)
    assert resumed.summary["epsilon"] == pytest.approx(straight.summary["epsilon"])
    assert resumed.metrics[-1]["test_accuracy"] == straight.metrics[-1]["test_accuracy"]
