"""Differential privacy in FedAAS (model updates and the partials, keys and queries of a sync) and GLASU
(every representation a client sends): clipping and noise on the messages themselves, and epsilon
recomputed with dp-accounting from release counts read off the messages."""

from __future__ import annotations

import copy

import pytest
import torch

from fedgl.config import build_config
from fedgl.errors import ConfigError
from fedgl.privacy.config import SUPPORTED
from fedgl.protocols.fedavg.group import flat_state
from fedgl.runner import Run
from support.noise import gaussian_noise

dpa = pytest.importorskip("dp_accounting")

FEDAAS_PRESETS = ("fedaas", "fedcross", "fedaas-pns", "fedlocal", "fedall", "fedaas1", "fedaas2", "fedgraph-recon")


def reference_epsilon(noise_multiplier: float, load: float, delta: float = 1e-5) -> float:
    """Epsilon of Gaussian releases whose squared sensitivities (in units of the noise's bound) add up to
    ``load``, straight from dp-accounting's RDP accountant."""
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant()
    accountant.compose(dpa.GaussianDpEvent(noise_multiplier / load**0.5))
    return accountant.get_epsilon(delta)


def fedaas(privacy: dict, rounds: int = 2, **protocol) -> dict:
    return {"dataset": {"name": "synthetic", "options": {"num_nodes": 150, "num_features": 16, "avg_degree": 6}},
            "partition": {"num_clients": 3, "method": "random"},
            "protocol": {"name": "fedaas", "widths": [16, 8], "fanouts": [4, 4], "interval_loss": "train",
                         "batches": 4, "interval": 1, **protocol},
            "train": {"rounds": rounds, "lr": 0.01, "weight_decay": 0.0}, "network": {"compute": "ignore"},
            "threads": 1, "privacy": privacy}


def glasu(privacy: dict, rounds: int = 2, **protocol) -> dict:
    return {"dataset": {"name": "synthetic"}, "partition": {"num_clients": 3, "method": "contiguous"},
            "train": {"rounds": rounds}, "network": {"compute": "ignore"}, "threads": 1,
            "protocol": {"name": "glasu", "K": 2, "batches": 4, **protocol}, "privacy": privacy}


def observed(cfg: dict, folder) -> tuple[Run, list[tuple]]:
    """Run ``cfg``; every message as (round, sender, receiver, method, payload, evaluating), the payload
    copied as it was sent (the server's model tensors change later)."""
    job = Run(build_config(cfg), folder)
    seen: list[tuple] = []
    job.transport.observers.append(lambda *message: seen.append(copy.deepcopy(message)))
    job.result = job.execute(progress=False)
    return job, seen


def dp(noise_multiplier: float, max_norm: float, **options) -> dict:
    return {"dp": {"noise_multiplier": noise_multiplier, "max_norm": max_norm, **options}}


def test_fedaas_presets_and_glasu_offer_dp():
    for name in (*FEDAAS_PRESETS, "glasu"):
        assert "dp" in SUPPORTED[name]
        build_config({"protocol": {"name": name}, "privacy": dp(1.0, 1.0)})


# ---- FedAAS ----------------------------------------------------------------------------------------
def test_fedaas_clips_what_it_sends(tmp_path):
    """Every upload is θ_t plus an update of norm max_norm (all are clipped here), every attention
    partial an owner sends has its mean in the max_norm ball, every mean-mode sum is within count x
    max_norm; the plain run's updates and partials are far larger."""
    bound = 0.05
    job, seen = observed(fedaas(dp(1e-9, bound)), tmp_path / "attention")
    starts = {dst: flat_state(p["state"]) for _, src, dst, m, p, e in seen if m == "start" and src == "server"}
    uploads = [(src, flat_state(p["state"])) for _, src, _, m, p, e in seen if m == "upload" and src != "server"]
    assert uploads  # ``starts`` holds the last round's
    norms = torch.tensor([float((row - starts[src]).norm()) for src, row in uploads[-3:]])
    assert torch.allclose(norms, torch.full_like(norms, bound), rtol=1e-3)
    partials = [p["num"][t][p["shift"][t] > -float("inf")] for _, src, _, m, p, _ in seen
                if m == "serve" and src != "server" for t in p["num"]]
    sent = torch.cat(partials)
    assert sent.size(0) > 10 and float(sent.norm(dim=1).max()) <= bound * (1 + 1e-5)

    _, plain = observed(fedaas({}), tmp_path / "plain")
    plain_sent = torch.cat([p["num"][t] / p["den"][t].unsqueeze(1) for _, src, _, m, p, _ in plain
                            if m == "serve" and src != "server" for t in p["num"]]).nan_to_num()
    assert float(plain_sent.norm(dim=1).max()) > 10 * bound

    _, mean = observed(fedaas(dp(1e-9, bound), aggregate="mean", sampling="uniform"), tmp_path / "mean")
    ratios = torch.cat([p["num"][t].norm(dim=1) / p["count"][t].clamp(min=1) for _, src, _, m, p, _ in mean
                        if m == "serve" and src != "server" for t in p["num"]])
    assert ratios.numel() > 10 and float(ratios.max()) <= bound * (1 + 1e-5)


def test_fedaas_noise_has_the_configured_scale(tmp_path):
    """Updates clipped to almost nothing carry only noise, of std noise_multiplier x max_norm per
    coordinate; keys and queries of rows clipped to zero carry noise of std noise_multiplier x |a| x max_norm."""
    sigma, bound = 1e4, 1e-4
    job, seen = observed(fedaas(dp(sigma, bound), rounds=1), tmp_path / "run")
    start = next(flat_state(p["state"]) for _, src, _, m, p, _ in seen if m == "start" and src == "server")
    noise = torch.cat([flat_state(p["state"]) - start for _, src, _, m, p, _ in seen
                       if m == "upload" and src != "server"])
    assert noise.numel() > 2000
    gaussian_noise(noise, sigma * bound)

    client = job.transport._parties["client0"]
    zero = torch.zeros(20_000, 16)
    keys = client.private_partials(1, zero, torch.zeros(20_000), torch.arange(20_000), 20_000)[1]
    queries = client._query(1, zero)
    for values, vector in ((keys, client.model.att_src[1]), (queries, client.model.att_dst[1])):
        expected = 1e4 * float(vector.norm()) * bound
        assert float(values.std()) == pytest.approx(expected, rel=0.05)


def test_fedaas_partials_equal_plain_ones_without_noise_or_clipping(tmp_path):
    """With noise near zero and max_norm above every row, an owner's private partial is the plain one
    (in the form mean, den 1, shift = log-sum-exp of the logits), and a whole run ends where the plain
    run ends."""
    job = Run(build_config(fedaas(dp(1e-12, 3.0))), tmp_path / "parts")
    client = job.transport._parties["client0"]
    gen = torch.Generator().manual_seed(0)
    h = (0.3 * torch.randn(40, 16, generator=gen)).relu()
    query, pair = torch.randn(8, generator=gen), torch.arange(40) % 8
    private, keys = client.private_partials(1, h, query, pair, 8)
    with torch.no_grad():
        plain, plain_keys = client.model.serve(1, h, query, pair, 8)
    assert float(client.model.project(1, h).norm(dim=1).max()) < 3.0  # nothing clipped
    assert torch.allclose(keys, plain_keys, atol=1e-6)
    assert torch.allclose(private.shift, plain.shift + plain.den.log(), atol=1e-5)
    assert torch.allclose(private.num, plain.num / plain.den.unsqueeze(1), atol=1e-5)

    for protocol, max_norm in (({}, 8.0), ({"aggregate": "mean", "sampling": "uniform"}, 1e6)):
        noisy = Run(build_config(fedaas(dp(1e-12, max_norm), **protocol)), tmp_path / f"dp{max_norm}")
        plain = Run(build_config(fedaas({}, **protocol)), tmp_path / f"plain{max_norm}")
        a, b = noisy.execute(progress=False).metrics[-1], plain.execute(progress=False).metrics[-1]
        for key in ("train_loss", "test_accuracy", "test_loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), (protocol, key)


def exchange_load(job: Run, seen: list[tuple]) -> torch.Tensor:
    """A FedAAS run's exchange load per client, read off the messages: an owner computes every partial
    with its own model, so a partial of n picks costs (2 n)^2 to every node of its owner, each pick's key
    2^2 more, and each query a trainer sends 2^2 to every node of the trainer."""
    index = {name: c for c, name in enumerate(job.protocol.clients)}
    load = torch.zeros(len(index), dtype=torch.float64)
    calls = [(dst, p) for _, src, dst, m, p, e in seen if m == "serve" and src == "server"]
    replies = [p for _, src, _, m, p, e in seen if m == "serve" and src != "server"]
    for (owner, call), reply in zip(calls, replies):
        for trainer, request in call["incoming"].items():
            sent = reply["shift"][trainer] > -float("inf")
            rows = torch.bincount(request["pair"], minlength=sent.numel())[sent].double()
            load[index[owner]] += float(((2 * rows) ** 2).sum()) + 4 * float(rows.sum())
    for _, src, _, m, p, e in seen:
        if m == "request" and src != "server" and p:
            load[index[src]] += 4 * torch.unique(p["targets"]).numel()
    return load


def test_fedaas_epsilon_is_the_accountants_for_the_runs_releases(tmp_path):
    sigma, rounds = 2.0, 3
    job, seen = observed(fedaas(dp(sigma, 1.0), rounds=rounds), tmp_path / "run")
    load = exchange_load(job, seen)
    assert float(load.max()) > 4 * rounds
    summary = job.result.summary  # every client uploads every round: 2^2 each, to all its nodes
    assert summary["epsilon_model"] == pytest.approx(reference_epsilon(sigma, 4 * rounds))
    assert summary["epsilon_embedding"] == pytest.approx(reference_epsilon(sigma, float(load.max())))
    assert summary["epsilon"] == pytest.approx(reference_epsilon(sigma, 4 * rounds + float(load.max())))
    assert summary["delta"] == 1e-5 and "node-level" in summary["dp_adjacency"]
    per_round = [row["epsilon"] for row in job.result.metrics]
    assert per_round == sorted(per_round) and per_round[-1] == summary["epsilon"]
    assert "epsilon" not in Run(build_config(fedaas({}, rounds=1)), tmp_path / "p").execute(progress=False).summary


def test_fedaas_dp_composes_with_secure_aggregation_and_resumes(tmp_path):
    """The masked sum decodes to the same noised average: the same run, the same budget; a resumed
    run reports the budget of an uninterrupted one."""
    privacy = dp(0.05, 1.0, replayable_noise=True)  # the same noise in both runs
    alone = Run(build_config(fedaas(privacy, rounds=3)), tmp_path / "dp").execute(progress=False)
    both = fedaas(privacy | {"secure_aggregation": True}, rounds=3) | {"checkpoint_every": 1}
    masked = Run(build_config(both), tmp_path / "both").execute(progress=False)
    assert masked.metrics[-1]["train_loss"] == pytest.approx(alone.metrics[-1]["train_loss"], rel=1e-4)
    assert masked.summary["epsilon"] == pytest.approx(alone.summary["epsilon"])
    Run(build_config(both | {"train": {"rounds": 2, "lr": 0.01, "weight_decay": 0.0}}),
        tmp_path / "resumed").execute(progress=False)
    job = Run(build_config(both), tmp_path / "resumed")
    assert job.resume()
    assert job.execute(progress=False).summary["epsilon"] == pytest.approx(masked.summary["epsilon"])


def test_fedaas_refuses_what_dp_does_not_cover(tmp_path):
    for protocol in ({"phi": 0.5}, {"query_gradient": "exact"}):
        with pytest.raises(ConfigError, match="privacy.dp does not noise"):
            Run(build_config(fedaas(dp(1.0, 1.0), **protocol)), tmp_path / "x")


# ---- GLASU -------------------------------------------------------------------------------------------
def test_glasu_sends_clipped_rows_with_noise_of_the_configured_scale(tmp_path):
    bound = 0.1
    _, seen = observed(glasu(dp(1e-9, bound)), tmp_path / "clip")
    sent = [p for _, src, _, m, p, _ in seen if m == "forward" and src != "server"]
    sent += [p["h"] for _, src, _, m, p, _ in seen if m == "infer" and src != "server" and "h" in p]
    rows = torch.cat(sent)
    assert rows.size(0) > 1000 and float(rows.norm(dim=1).max()) <= bound * (1 + 1e-5)
    assert float(rows.norm(dim=1).median()) > 0.9 * bound  # the plain rows are larger: clipping acts

    sigma, tiny = 1e5, 1e-5
    _, seen = observed(glasu(dp(sigma, tiny), rounds=1), tmp_path / "noise")
    noise = torch.cat([p.flatten() for _, src, _, m, p, _ in seen if m == "forward" and src != "server"])
    assert noise.numel() > 10_000 and float(noise.std()) == pytest.approx(sigma * tiny, rel=0.03)


def test_glasu_epsilon_is_the_accountants_for_the_runs_releases(tmp_path):
    """Releases per node from the messages: the node sets the server sends with ``sample`` and
    ``forward`` (one row per node and level), every node at every level of each joint inference, and
    every node's logits from each scoring client."""
    sigma = 3.0
    job, seen = observed(glasu(dp(sigma, 1.0), rounds=2), tmp_path / "run")
    n, clients = job.protocol.num_nodes, len(job.protocol.clients)
    load = 0.0  # every client's n rows come from its own trained model: (2 sqrt(n))^2 for every node
    for _, src, dst, m, p, evaluating in seen:
        if dst == "client0" and m in ("sample", "forward") and p.get("targets") is not None:
            load += clients * 4 * p["targets"].numel()
        if dst == "client0" and m == "infer" and p.get("h") is None:  # a joint inference starts
            load += clients * 4 * n * len(job.protocol.levels)
        if m == "infer" and src != "server" and "logits" in p:  # a scorer's logits of every node
            load += 4 * p["logits"].size(0)
    summary = job.result.summary
    assert summary["epsilon"] == pytest.approx(reference_epsilon(sigma, load))
    assert summary["delta"] == 1e-5
    assert [row["epsilon"] for row in job.result.metrics] == sorted(row["epsilon"] for row in job.result.metrics)


def test_glasu_dp_is_the_plain_run_without_noise_and_composes_with_secure_aggregation(tmp_path):
    plain = Run(build_config(glasu({})), tmp_path / "plain").execute(progress=False).metrics[-1]
    quiet = Run(build_config(glasu(dp(1e-9, 1e3))), tmp_path / "quiet").execute(progress=False).metrics[-1]
    for key in ("train_loss", "test_loss", "test_accuracy"):
        assert quiet[key] == pytest.approx(plain[key], abs=1e-4), key
    noisy = Run(build_config(glasu(dp(0.5, 1.0, replayable_noise=True))), tmp_path / "noisy").execute(progress=False)
    masked = Run(build_config(glasu(dp(0.5, 1.0, replayable_noise=True) | {"secure_aggregation": True})),
                 tmp_path / "masked").execute(progress=False)
    assert masked.metrics[-1]["train_loss"] == pytest.approx(noisy.metrics[-1]["train_loss"], rel=1e-4)
    assert masked.summary["epsilon"] == noisy.summary["epsilon"]
    assert noisy.metrics[-1]["train_loss"] != pytest.approx(plain["train_loss"], abs=1e-3)


def test_glasu_refuses_dp_where_gradients_would_leave_unnoised(tmp_path):
    with pytest.raises(ConfigError, match="privacy.dp noises the representations"):
        Run(build_config(glasu(dp(1.0, 1.0), backward="exact", Q=1)), tmp_path / "exact")
    cfg = glasu(dp(1.0, 1.0))
    cfg["partition"]["label_holder"] = 0
    with pytest.raises(ConfigError, match="privacy.dp noises the representations"):
        Run(build_config(cfg), tmp_path / "holder")
