"""Key pairs from a fixed seed, for tests that must give the same verdict on every run (the protocols
draw their keys from the OS)."""

from __future__ import annotations

import hashlib

from fedgl.privacy import secure_aggregation as sa


def fixed_pair(scheme: str, i: int) -> sa.KeyPair:
    """Key pair number ``i`` of ``scheme``."""
    return sa.KeyPair(scheme, hashlib.sha256(f"{scheme}{i}".encode()).digest())
