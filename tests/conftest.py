"""Shared fixtures: the data root, a private cache folder, one Ray instance for the session, and
repeatable key pairs for secure aggregation."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import torch

# The test graphs are small: one thread is faster than two, and immune to oversubscription when the
# machine is busy. Ray hosts take the driver's thread count, so both backends match.
torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Processed dataset files go to a per-session folder, never into the user's cache."""
    os.environ.setdefault("FEDGL_CACHE", str(tmp_path_factory.mktemp("fedgl-cache")))


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = os.environ.get("FEDGL_DATA_ROOT")
    if not root:
        pytest.skip("FEDGL_DATA_ROOT is not set: real datasets unavailable")
    return Path(root)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance shared by every Ray test (starting Ray costs seconds)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=256 * 1024**2)
    yield ray
    ray.shutdown()


@pytest.fixture
def repeatable_keys(monkeypatch):
    """Every key pair a protocol generates comes from a fixed sequence instead of the OS, so the
    statistical tests on masked payloads give the same verdict on every run. The returned function
    restarts the sequence: two federations then hold the same keys."""
    from fedgl.privacy import secure_aggregation as sa
    from support.keys import fixed_pair

    sequence = [itertools.count()]
    monkeypatch.setattr(sa.KeyPair, "generate", classmethod(
        lambda cls: fixed_pair("x25519", next(sequence[0]))))
    return lambda: sequence.__setitem__(0, itertools.count())
