"""nFedGNN and CNFGNN with differential privacy: every latent a user sends (training and scoring), and
CNFGNN's every weight upload, is clipped and noised, and epsilon counts every one of those releases."""

from __future__ import annotations

import pytest
import torch

from fedgl.config import build_config
from fedgl.runner import Run
from fedgl.search import run
from support.noise import gaussian_noise

# lr 0.01: at nFedGNN's own 0.1 three rounds on 200 nodes leave logits so close that noise of 1e-9 flips them
BASE = {"dataset": {"options": {"num_nodes": 200}}, "train": {"rounds": 3, "lr": 0.01},
        "network": {"compute": "ignore"}, "protocol": {"name": "nfedgnn", "lam": 1.0, "user_fraction": 0.5}}


def dp(noise_multiplier: float, max_norm: float) -> dict:
    return BASE | {"privacy": {"dp": {"noise_multiplier": noise_multiplier, "max_norm": max_norm}}}


def first_latents(cfg: dict, tmp_path) -> torch.Tensor:
    """The latents the users send in round 1."""
    job = Run(build_config(cfg), tmp_path)
    seen = []
    job.transport.observers.append(
        lambda r, src, dst, method, payload, evaluating: seen.append(payload) if method == "embed" and src == "users"
        else None)
    job.protocol.train_round(1)
    return seen[0]


def test_what_leaves_a_user_is_its_clipped_latent_plus_gaussian_noise(tmp_path):
    plain = first_latents(BASE, tmp_path / "plain")
    max_norm, sigma = 0.5, 0.3
    sent = first_latents(dp(sigma / max_norm, max_norm), tmp_path / "dp")
    norms = plain.norm(dim=1, keepdim=True)
    assert bool((norms > max_norm).any())  # the bound binds
    noise = sent - plain * (max_norm / norms.clamp_min(max_norm))
    gaussian_noise(noise, sigma)


def test_negligible_noise_and_no_clipping_leave_the_run_as_it_was(tmp_path):
    plain = run(build_config(BASE), tmp_path / "plain").metrics
    private = run(build_config(dp(1e-9, 1e3)), tmp_path / "dp").metrics
    for a, b in zip(plain, private, strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=1e-6)


def test_epsilon_counts_every_training_and_scoring_release(tmp_path):
    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting import rdp

    job = Run(build_config(dp(1.2, 1.0) | {"train": {"rounds": 4}, "eval": {"every": 2}}), tmp_path)
    chosen = []  # the users the server asked for a latent in each training round
    job.transport.observers.append(lambda r, src, dst, method, payload, evaluating: chosen.append(payload["users"])
                                   if method == "embed" and src == "server" and not evaluating else None)
    result = job.execute(progress=False)
    most = int(torch.bincount(torch.cat(chosen)).max())  # half the users a round, drawn by the server
    accountant = rdp.RdpAccountant()
    # no amplification: each round a user took part in, and each of the 2 scorings, is a full release of
    # sensitivity 2 max_norm (its row substituted)
    accountant.compose(dp_accounting.GaussianDpEvent(1.2 / 2), most + 2)
    assert result.summary["epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-6)
    assert result.summary["delta"] == 1e-5 and "epsilon" in result.metrics[-1]


def test_a_cnfgnn_upload_is_the_adopted_weight_plus_a_clipped_noised_update(tmp_path):
    """Round 1's uploads against the plain run's: the same adopted weight, the update clipped to
    max_norm over the whole matrix, plus noise of the configured std; epsilon counts a latent and an
    upload per round."""
    cnfgnn = {"protocol": {"name": "cnfgnn"}, "train": {"rounds": 1}}

    def uploads(cfg: dict, folder) -> tuple[torch.Tensor, torch.Tensor, dict]:
        job = Run(build_config(cfg), folder)
        seen = []
        job.transport.observers.append(lambda r, src, dst, method, payload, evaluating: seen.append(payload)
                                       if method == "upload" and src == "users" else None)
        reference = job.transport.snapshot()["users"]["reference"].clone()
        stats = job.protocol.train_round(1)
        return torch.cat(seen), reference, stats

    plain, reference, _ = uploads(BASE | cnfgnn, tmp_path / "plain")
    max_norm, sigma = 0.05, 0.02
    sent, same_reference, stats = uploads(dp(sigma / max_norm, max_norm) | cnfgnn, tmp_path / "dp")
    assert torch.equal(reference, same_reference)
    update = (plain - reference).flatten(1)
    norms = update.norm(dim=1, keepdim=True)
    assert bool((norms > max_norm).any())
    noise = (sent - reference).flatten(1) - update * (max_norm / norms.clamp_min(max_norm))
    assert abs(float(noise.mean())) < 1e-3 and float(noise.std()) == pytest.approx(sigma, rel=0.05)
    from fedgl.privacy.dp import gaussian_epsilon

    # a latent and an upload, each of sensitivity 2 max_norm
    assert stats["epsilon"] == pytest.approx(gaussian_epsilon(sigma / max_norm, 2 * 2**2, 1e-5), rel=1e-9)
