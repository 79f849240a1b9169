"""Key pairs from a fixed seed, for tests that must give the same verdict on every run (the protocols
draw their keys from the OS)."""

from __future__ import annotations

import hashlib

from fedgl.privacy import secure_aggregation as sa


def fixed_pair(scheme: str, i: int) -> sa.KeyPair:
    """Key pair number ``i`` of ``scheme``."""
    secret = hashlib.sha256(f"{scheme}{i}".encode()).digest()
    private = secret if scheme == "x25519" else (int.from_bytes(secret, "big") + 2).to_bytes(sa.MODP_BYTES, "big")
    return sa.KeyPair(scheme, private)
