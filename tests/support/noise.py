"""Checking a noise sample against the Gaussian it should come from."""

from __future__ import annotations

import pytest
import torch


def gaussian_noise(noise: torch.Tensor, std: float) -> None:
    """``noise`` has mean 0 and standard deviation ``std``, each within five standard errors of its
    estimate (the draws come from the OS, so the bounds must hold for any draw but a rare one)."""
    n = noise.numel()
    assert abs(float(noise.mean())) < 5 * std / n**0.5
    assert float(noise.std()) == pytest.approx(std, rel=5 / (2 * n) ** 0.5)
