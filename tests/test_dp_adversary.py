"""DP against the adversary fedgl has: the server, which holds the run's config, chooses who takes part,
sees who did and reads the counts that travel in the clear. Its noise must be beyond the server's
reach, and epsilon must be stated for it: no amplification by sampling, substitution sensitivity,
a node's reach through the rows that carry it."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from scipy import stats

from fedgl.cli import main
from fedgl.config import build_config
from fedgl.privacy.config import DPConfig
from fedgl.privacy.dp import SUBSTITUTION, DPAccountant, Guarantee, PrivateRelease, gaussian_epsilon
from fedgl.privacy.noise import NoiseStream
from fedgl.protocols.fedavg.group import flat_state
from fedgl.runner import Run

dpa = pytest.importorskip("dp_accounting")
from dp_accounting import rdp  # noqa: E402

M = 4


def reference(events: list[tuple[float, int]], delta: float = 1e-5, rate: float = 1.0) -> float:
    """Epsilon straight from dp-accounting: ``count`` Gaussian events of each noise multiplier."""
    accountant = rdp.RdpAccountant()
    for sigma, count in events:
        event = dpa.GaussianDpEvent(sigma)
        accountant.compose(event if rate == 1 else dpa.PoissonSampledDpEvent(rate, event), count)
    return accountant.get_epsilon(delta)


def fedavg(dp: dict, rounds: int = 2, **protocol) -> dict:
    return {"dataset": {"name": "synthetic"}, "partition": {"num_clients": M}, "train": {"rounds": rounds},
            "network": {"compute": "ignore"}, "protocol": {"name": "fedavg", "group_size": 1, **protocol},
            "privacy": {"dp": dp}}


def released(tmp_path, name: str, dp: dict) -> tuple[Run, torch.Tensor, torch.Tensor]:
    """A FedAvg round as the server sees it: the global model it sent and every client's reply."""
    job = Run(build_config(fedavg(dp)), tmp_path / name)
    state = job.protocol.model.state_dict()
    replies = job.transport.call_many(job.protocol.clients, "train", state=state)
    return job, flat_state(state), torch.stack([flat_state(r["state"]) for r in replies])


def seeded(seed: int) -> torch.Generator:
    """The attacker's copy of how fedgl's DP derived a party's noise stream from its seed before the
    noise came from the operating system (and still does with ``replayable_noise``)."""
    digest = hashlib.sha256(f"fedgl dp noise {seed}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)


# ---- the noise ---------------------------------------------------------------------------------------------
def test_a_noise_stream_is_standard_normal_and_never_repeats():
    stream = NoiseStream(bytes(range(32)))  # a fixed key: the test is not left to chance
    first, second = stream.normal((20_000,), torch.float64), stream.normal((20_000,), torch.float64)
    assert stats.kstest(first.numpy(), "norm").pvalue > 1e-6
    assert not torch.equal(first, second)
    assert not torch.equal(NoiseStream.fresh().normal((8,)), NoiseStream.fresh().normal((8,)))
    assert torch.equal(NoiseStream.from_seed(5).normal((8,)), NoiseStream.from_seed(5).normal((8,)))


def test_two_runs_of_one_dp_config_release_different_noise(tmp_path):
    dp = {"noise_multiplier": 1.0, "max_norm": 0.05}
    _, _, a = released(tmp_path, "a", dp)
    _, _, b = released(tmp_path, "b", dp)
    assert float((a - b).norm(dim=1).min()) > 0.05
    _, _, c = released(tmp_path, "c", dp | {"replayable_noise": True})
    _, _, d = released(tmp_path, "d", dp | {"replayable_noise": True})
    assert torch.equal(c, d)  # the test switch: the config alone fixes the noise


@pytest.mark.parametrize("replayable", [False, True])
def test_the_server_replaying_the_noise_from_the_config_recovers_nothing(tmp_path, replayable):
    """The server knows the config, hence every party's seed (it spawned them with it): it regenerates
    the noise a seed-derived stream would have drawn and subtracts it. With the test switch on this
    recovers every clipped update exactly (the attack works); with the OS-keyed streams it recovers
    noise: the estimate is uncorrelated with the true update."""
    sigma, bound = 1.0, 0.05
    dp = {"noise_multiplier": sigma, "max_norm": bound}
    job, start, sent = released(tmp_path, "run", dp | {"replayable_noise": replayable})
    seeds = [job.cfg.seed * 100_003 + m + 1 for m in range(M)]  # how the server seeds its clients
    guess = torch.stack([torch.randn(start.shape, generator=seeded(s)) * (sigma * bound) for s in seeds])
    estimate = sent - start - guess
    # the true clipped updates, from the same clients with negligible noise (training draws are the party's own)
    _, _, quiet = released(tmp_path, "quiet", {"noise_multiplier": 1e-9, "max_norm": bound})
    truth = quiet - start
    cosine = torch.nn.functional.cosine_similarity(estimate.double(), truth.double(), dim=1)
    if replayable:
        assert bool((cosine > 0.999).all())
    else:
        assert float(cosine.abs().max()) < 0.1


def test_a_replayable_run_says_its_noise_is_not_private(tmp_path, capsys):
    dp = ["--set", "privacy.dp.noise_multiplier=1", "--set", "privacy.dp.max_norm=1"]
    args = ["run", "--dataset", "synthetic", "--rounds", "1", "--quiet", *dp]
    assert main([*args, "--set", "privacy.dp.replayable_noise=true", "--out", str(tmp_path / "r")]) == 0
    assert "not private" in capsys.readouterr().err
    assert "not private" in json.loads((tmp_path / "r" / "summary.json").read_text())["dp_noise"]
    assert main([*args, "--out", str(tmp_path / "os")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert "operating system" in json.loads((tmp_path / "os" / "summary.json").read_text())["dp_noise"]


# ---- the accounting ----------------------------------------------------------------------------------------
def test_the_load_composes_as_dp_accounting_composes_the_releases():
    dp = DPConfig(noise_multiplier=1.5, max_norm=1.0)
    accountant = DPAccountant(dp, torch.tensor([0, 0, 1, 1, 1]), Guarantee("a", "b"), parts=("x", "y"))
    assert accountant.epsilon() == 0.0
    accountant.charge("x", nodes=torch.tensor([0, 3, 3]))
    accountant.charge("y", clients=torch.tensor([1]), multiple=torch.tensor([3.0]))
    # node 3: two substitution releases of its own, one of sensitivity 3 bounds through its client
    assert accountant.load().tolist() == [4.0, 0.0, 9.0, 17.0, 9.0]
    assert accountant.epsilon() == pytest.approx(reference([(1.5 / 2, 2), (1.5 / 3, 1)]), rel=1e-6)
    assert accountant.epsilons()["epsilon_y"] == pytest.approx(reference([(1.5 / 3, 1)]), rel=1e-6)


def test_a_release_clips_and_noises_at_its_bound():
    release = PrivateRelease(DPConfig(noise_multiplier=2.0, max_norm=0.5), seed=0)
    rows = torch.randn(4000, 3) * 10
    out = release(rows)
    residual = out - release.clip(rows)
    assert float(release.clip(rows).norm(dim=1).max()) <= 0.5 * (1 + 1e-6)
    assert float(residual.std()) == pytest.approx(1.0, rel=0.05)  # noise_multiplier x max_norm


def test_epsilon_has_no_amplification_when_the_server_samples(tmp_path):
    """Half the clients a round, chosen by the server: each round a client took part in is a full
    Gaussian release of sensitivity 2 C, and epsilon is that of the client chosen most often."""
    sigma, rounds = 1.3, 4
    job = Run(build_config(fedavg({"noise_multiplier": sigma, "max_norm": 1.0}, rounds, client_fraction=0.5)),
              tmp_path / "s")
    summary = job.execute(progress=False).summary
    taken = {}
    for row in job.transport.ledger.rows():
        if row["method"] == "train" and row["src"] == "server":
            taken[row["dst"]] = taken.get(row["dst"], 0) + 1
    most = max(taken.values())
    assert summary["epsilon"] == pytest.approx(reference([(sigma / SUBSTITUTION, most)]), rel=1e-6)
    assert summary["epsilon"] > reference([(sigma, rounds)], rate=0.5)  # the amplified figure it replaces
    assert "chooses" in summary["dp_threat_model"] and "client-level" in summary["dp_adjacency"]


# ---- the Swift family: counts in the clear, neighbours inside hidden rows --------------------------------------
def swift(tmp_path, name: str, fanouts: list[int], sigma: float = 2.0) -> tuple[Run, list[tuple]]:
    cfg = {"dataset": {"name": "synthetic", "options": {"num_nodes": 300, "num_features": 16, "avg_degree": 6}},
           "model": {"name": "sage", "hidden": 8, "layers": len(fanouts), "dropout": 0.0},
           "partition": {"num_clients": M, "method": "metis"}, "network": {"compute": "ignore"},
           "protocol": {"name": "fedgnn-g", "fanouts": fanouts, "min_aggregate": 1},
           "privacy": {"dp": {"noise_multiplier": sigma, "max_norm": 1.0}}, "train": {"rounds": 2}}
    job = Run(build_config(cfg), tmp_path / name)
    seen: list[tuple] = []
    job.transport.observers.append(lambda r, src, dst, method, payload, evaluating: None if evaluating
                                   else seen.append((r, src, dst, method, payload)))
    job.result = job.execute(progress=False)
    return job, seen


def exchange_load(job: Run, seen: list[tuple]) -> torch.Tensor:
    """Each node's load from the messages alone: (2)² per first-layer sum sent holding its row, and, for
    every hidden-layer sum of n rows its owner sent, (2 n)² (any row may carry the node)."""
    router = job.protocol.router
    owners = {name: c for c, name in enumerate(job.protocol.clients)}
    local = {c: (router.owner == c).nonzero().flatten() for c in owners.values()}
    ids = {c: torch.empty_like(n).index_copy_(0, router.local_index[n], n) for c, n in local.items()}
    picks = {(r, dst, req): p["incoming"][req] for r, src, dst, m, p in seen
             if src == "server" and m == "propagate" and p.get("layer") == 1 and p.get("incoming")
             for req in p["incoming"]}
    calls = [(r, dst, p["layer"]) for r, src, dst, m, p in seen if src == "server" and m == "propagate"]
    replies = [p for _, src, _, m, p in seen if m == "propagate" and src != "server"]
    nodes = torch.zeros(router.owner.numel(), dtype=torch.float64)
    clients = torch.zeros(M, dtype=torch.float64)
    for (r, owner, layer), reply in zip(calls, replies):
        for req, size in reply["counts"].items():
            if layer == 1:
                msg = picks[(r, owner, req)]
                nodes.index_add_(0, ids[owners[owner]][msg["u"][size[msg["pair"]] > 0]],
                                 torch.full((int((size[msg["pair"]] > 0).sum()),), 4.0, dtype=torch.float64))
            else:
                clients[owners[owner]] += float(((SUBSTITUTION * size[size > 0]) ** 2).sum())
    return nodes + clients[router.owner]


def test_counts_in_the_clear_make_each_raw_row_a_substitution(tmp_path):
    """One layer: only raw rows cross, each sum's count beside it, so a node's row is released with
    sensitivity 2 C per sum (add/remove would change the count the server reads)."""
    sigma = 2.0
    job, seen = swift(tmp_path, "one", [3], sigma)
    load = exchange_load(job, seen)
    most = int(load.max() / 4)
    assert most > 1
    summary = job.result.summary
    assert summary["epsilon_embedding"] == pytest.approx(reference([(sigma / 2, most)]), rel=1e-6)
    assert summary["epsilon_embedding"] > reference([(sigma, most)])  # what C alone would claim
    assert "substitution" in summary["dp_sensitivity"] and "node-level" in summary["dp_adjacency"]


def test_the_neighbour_bound_raises_epsilon_with_the_fanout(tmp_path):
    """Two layers: a hidden-layer sum of n rows may carry any node of its owner n times over, so it costs
    (2 n)² to each; sums grow with the fan-out of the layer above, and so does epsilon."""
    sigma = 2.0
    epsilons = []
    for fanout in (2, 8):
        job, seen = swift(tmp_path, f"f{fanout}", [3, fanout], sigma)
        load = exchange_load(job, seen)
        summary = job.result.summary
        assert summary["epsilon_embedding"] == pytest.approx(gaussian_epsilon(sigma, float(load.max()), 1e-5),
                                                             rel=1e-6)
        epsilons.append(summary["epsilon_embedding"])
    assert epsilons[1] > epsilons[0]


@pytest.mark.parametrize("protocol", ["glasu", "nfedgnn"])
def test_every_dp_summary_names_adjacency_sensitivity_and_threat(tmp_path, protocol):
    cfg = {"dataset": {"name": "synthetic", "options": {"num_nodes": 200, "num_features": 16}},
           "protocol": {"name": protocol, **({"lam": 1.0} if protocol == "nfedgnn" else {})},
           "network": {"compute": "ignore"}, "train": {"rounds": 1},
           "partition": {"num_clients": M},
           "privacy": {"dp": {"noise_multiplier": 1.0, "max_norm": 1.0}}}
    summary = Run(build_config(cfg), tmp_path / protocol).execute(progress=False).summary
    assert summary["epsilon"] > 0
    for key in ("dp_adjacency", "dp_sensitivity", "dp_threat_model", "dp_noise"):
        assert isinstance(summary[key], str) and summary[key]
    assert "not private" not in summary["dp_noise"]
