"""Gaussian noise for differential privacy, from a cryptographic stream no other party can replay.

Noise a server could regenerate protects nothing: it would subtract it. A party's ``NoiseStream`` is
therefore ChaCha20 keyed with 32 bytes from the operating system (``os.urandom``), drawn when the
party is made and never sent; its keystream gives uniform 53-bit numbers, turned into normal ones by
the Box-Muller transform in torch (vectorised, float64). The stream lives apart from the party's
torch random state, so a run with noise makes the same sampling and dropout draws as without it.

``from_seed`` (``privacy.dp.replayable_noise``, tests only) draws instead from the stream fedgl's DP
used before: a torch generator seeded with SHA-256 of the party's seed. The same config then gives
the same noise, which tests comparing exact runs need, and which makes the noise worthless against
anyone who has the config (the server): ``fedgl audit``'s noise replay and tests/test_dp_adversary.py
recover it. Runs with it say so in their summary (``dp_noise``).
"""

from __future__ import annotations

import hashlib
import math
import os

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

BLOCK = 64  # bytes of ChaCha20 keystream per block counter step


class NoiseStream:
    """A party's own noise: ChaCha20 keystream from ``key``, read block by block (``block`` is the next
    unused block); or, replayable, a seeded torch ``generator`` (checkpointed by its state). The key and
    its position are secret state: never written to a checkpoint, nor rolled back by ``hold``/``roll_back``,
    so a resumed party draws from a fresh key and a rolled-back one goes on where it was: no draw repeats."""

    secret_state = frozenset({"key", "block"})

    def __init__(self, key: bytes | None, generator: torch.Generator | None = None):
        if (key is None) == (generator is None) or (key is not None and len(key) != 32):
            raise ValueError("a noise stream needs a 32-byte key or, replayable, a generator")
        self.key = key
        self.block = 0
        self.generator = generator

    @classmethod
    def fresh(cls) -> "NoiseStream":
        """Keyed from the operating system's randomness: nobody, the party's own config included, can
        reproduce it."""
        return cls(os.urandom(32))

    @classmethod
    def from_seed(cls, seed: int) -> "NoiseStream":
        """Drawn from ``seed`` (tests only): anyone who knows the seed regenerates every draw."""
        digest = hashlib.sha256(f"fedgl dp noise {seed}".encode()).digest()
        return cls(None, torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1))

    def _bytes(self, count: int) -> bytes:
        blocks = -(-count // BLOCK)
        nonce = self.block.to_bytes(4, "little") + bytes(12)  # 32-bit block counter, then a zero nonce
        if self.block + blocks >= 2**32:
            raise OverflowError("noise stream exhausted (2^32 blocks); make a fresh one")
        self.block += blocks
        encryptor = Cipher(algorithms.ChaCha20(self.key, nonce), mode=None).encryptor()
        return encryptor.update(bytes(blocks * BLOCK))[:count]

    def uniform(self, count: int) -> torch.Tensor:
        """``count`` float64 values uniform on (0, 1], 53 random bits each."""
        words = torch.frombuffer(bytearray(self._bytes(8 * count)), dtype=torch.int64)
        return ((words >> 11) & ((1 << 53) - 1)).double().add_(1.0).mul_(2.0 ** -53)

    def normal(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype = torch.float32,
               device: torch.device | str | None = None) -> torch.Tensor:
        """Standard normal values of ``shape`` (Box-Muller: two per pair of uniforms)."""
        if self.key is None:  # replayable; a keyed stream never reads a generator a checkpoint brought
            return torch.randn(shape, generator=self.generator, dtype=dtype, device="cpu").to(device)
        count = math.prod(shape)
        pairs = -(-count // 2)
        u = self.uniform(2 * pairs).view(2, pairs)
        radius = torch.sqrt(-2.0 * torch.log(u[0]))
        angle = (2 * math.pi) * u[1]
        z = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:count]
        return z.view(shape).to(dtype=dtype, device=device)
