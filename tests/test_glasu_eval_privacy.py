"""GLASU's evaluation under DP, attacked by the server: a scoring client's logits of every node score
the H[L] the server computed itself, so unprotected they give away the client's classifier head (trained
on its labels) by least squares. Under DP they leave the client as its representations do (each row
clipped and noised from its own stream) and the accountant charges them."""

from __future__ import annotations

import pytest
import torch
from support.configs import TINY, merge
from support.noise import gaussian_noise
from support.wire import messages, tap

from fedgl.comm.ledger import SERVER
from fedgl.config import build_config
from fedgl.runner import Run

CLIENTS = ("client0", "client1", "client2")


def glasu(rounds: int = 1, **protocol) -> dict:
    """Three clients, every one holding labels (so every one scores), two aggregation levels."""
    return merge(TINY, {"train": {"rounds": rounds},
                        "protocol": {"name": "glasu", "K": 2, "batches": 1, "S": 8, **protocol}})


def dp(noise_multiplier: float, max_norm: float, **options) -> dict:
    pytest.importorskip("dp_accounting")
    return {"privacy": {"dp": {"noise_multiplier": noise_multiplier, "max_norm": max_norm, **options}}}


def run(cfg: dict, folder):
    """The whole run, scoring included, with the server's view of every message."""
    job = Run(build_config(cfg), folder)
    wire = tap(job)
    job.result = job.execute(progress=False)
    return job, wire


def last_scoring(wire, client: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(H[L] the server sent ``client`` to score, the logits it got back) at the last evaluation."""
    scoring = messages(wire, method="infer", scoring=True)
    h = [m.tensors[("h",)] for m in scoring if (m.sender, m.receiver) == (SERVER, client) and m.under("h")]
    logits = [m.tensors[("logits",)] for m in scoring if m.sender == client and m.under("logits")]
    return h[-1].double(), logits[-1].double()


def head_error(job, wire, client: str) -> float:
    """The server's attack: least squares of ``client``'s logits on [H[L], 1] gives its head [W | b];
    the error is on the rows the server holds, ||[H, 1] (recovered - true)|| over ||[H, 1] true||
    (hidden units dead on every node are not identifiable, nor do they score anything)."""
    h, logits = last_scoring(wire, client)
    rows = torch.cat([h, torch.ones(h.size(0), 1, dtype=h.dtype)], 1)
    recovered = torch.linalg.lstsq(rows, logits, driver="gelsd").solution
    head = job.transport._parties[client].net.head
    true = torch.cat([head.weight.detach(), head.bias.detach().unsqueeze(1)], 1).double().T
    return float((rows @ (recovered - true)).norm() / (rows @ true).norm())


def test_a_server_solving_a_scorers_logits_for_its_head_recovers_it_only_without_dp(tmp_path):
    """Plain: every client's head comes out exact. DP at sigma 4, C 1: far from every client's head
    (each logit row clipped to C and noised with std 4 C); with the release removed it would be
    exact again, the server holding H[L] exactly."""
    job, wire = run(glasu(), tmp_path / "plain")
    assert all(head_error(job, wire, c) < 1e-4 for c in CLIENTS)
    job, wire = run(merge(glasu(), dp(4.0, 1.0)), tmp_path / "dp")
    assert all(head_error(job, wire, c) > 0.5 for c in CLIENTS)


def test_glasu_scores_leave_each_client_clipped_to_max_norm(tmp_path):
    """With negligible noise, every logit row a client sends is clipped, as its representations are."""
    bound = 0.1
    _, wire = run(merge(glasu(), dp(1e-9, bound)), tmp_path / "clip")
    rows = torch.cat([last_scoring(wire, c)[1] for c in CLIENTS])
    assert float(rows.norm(dim=1).max()) <= bound * (1 + 1e-5)
    assert float(rows.norm(dim=1).median()) > 0.9 * bound  # the plain logits are larger: clipping acts


def scores(cfg: dict, folder) -> torch.Tensor:
    """Every client's logits at the last evaluation of a run of ``cfg``, one row per client and node."""
    _, wire = run(cfg, folder)
    return torch.cat([last_scoring(wire, c)[1] for c in CLIENTS])


def test_two_runs_of_one_dp_config_score_with_independent_noise(tmp_path):
    """The scores' noise comes from each client's OS-keyed stream: two runs of one config release
    logits that differ by two independent draws, std sqrt(2) sigma C per coordinate (the clipped rows
    differ by at most 2 C, nothing beside it), unless the test switch replays the noise from the
    config, which makes the runs equal."""
    sigma, bound = 1e3, 1e-4
    a, b = (scores(merge(glasu(), dp(sigma, bound)), tmp_path / name) for name in ("a", "b"))
    gaussian_noise(a - b, 2**0.5 * sigma * bound)
    replayed = merge(glasu(), dp(sigma, bound, replayable_noise=True))
    assert torch.equal(scores(replayed, tmp_path / "c"), scores(replayed, tmp_path / "d"))


def reference_epsilon(noise_multiplier: float, load: float, delta: float = 1e-5) -> float:
    """Straight from dp-accounting's RDP accountant: Gaussian releases whose squared sensitivities (in
    units of the noise's bound) add up to ``load``."""
    import dp_accounting
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier / load**0.5))
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("protocol", [{}, {"eval_client": 1}, {"K": 0}], ids=["joint", "eval_client", "standalone"])
def test_glasu_epsilon_charges_every_row_a_client_sends_scores_included(tmp_path, protocol):
    """Read off the wire: every set of n rows (H_m^+ or logits) a client sends costs every node
    (2 sqrt(n))^2 = 4 n, training and scoring alike; standalone, the scores are all that is sent."""
    sigma = 3.0
    job, wire = run(merge(glasu(rounds=2, **protocol), dp(sigma, 1.0)), tmp_path / "run")
    sent = [t for c in wire if c.message.sender != SERVER for t in c.message.tensors.values() if t.is_floating_point()]
    scores = [m for m in messages(wire, method="infer", scoring=True) if m.under("logits")]
    assert len(scores) == 2 * (3 if not protocol else 1)
    load = sum(4.0 * t.size(0) for t in sent)
    assert job.result.summary["epsilon"] == pytest.approx(reference_epsilon(sigma, load))
