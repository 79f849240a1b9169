"""Mask streams a server cannot predict: a 32-byte secret through HKDF-SHA256, expanded with ChaCha20.

Every mask is ``stream(secret, size, purpose, *label)``: the key-agreement output (or a self-mask seed)
goes through HKDF-SHA256 with ``purpose`` and the integer ``label`` (round, message, layer, ...) in its
``info``, so two labels, two purposes or two secrets give independent 256-bit ChaCha20 keys; the
keystream read as int64 is uniform over the ring Z_2^64. No seed is public, so recomputing a mask needs
the secret itself, not just the indices, the round or the public keys.

``LabelGuard`` is a client's refusal to use a label twice under the same secrets: a second message
masked with the same stream would reveal the difference of the two messages.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..errors import ConfigError, RunFailed

KEY_BYTES = 32
PUBLIC_BYTES = 32


def require() -> None:
    """Stop at setup, in one line, when the ``cryptography`` package (the privacy extra) is missing;
    the functions below import it where they use it, so fedgl loads without it."""
    if importlib.util.find_spec("cryptography") is None:
        raise ConfigError("privacy.secure_aggregation needs the cryptography package: pip install 'fedgl[privacy]'")


def derive(secret: bytes, purpose: bytes, *label: int) -> bytes:
    """A 32-byte key for ``purpose`` and ``label`` from ``secret`` (HKDF-SHA256, the label in ``info``)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    info = purpose + b"\x00" + b"".join(int(x).to_bytes(8, "big", signed=True) for x in label)
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(secret)


def stream(secret: bytes, size: int, purpose: bytes, *label: int) -> Tensor:
    """``size`` int64 values, uniform over Z_2^64: the ChaCha20 keystream under ``derive(secret, ...)``.
    The key is used for this one stream only, so the nonce is fixed."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    cipher = Cipher(algorithms.ChaCha20(derive(secret, purpose, *label), bytes(16)), mode=None)
    raw = cipher.encryptor().update(bytes(8 * size))
    return torch.frombuffer(bytearray(raw), dtype=torch.int64) if size else torch.zeros(0, dtype=torch.int64)


@dataclass
class KeyPair:
    """An X25519 key pair kept as raw bytes, so a party holding it checkpoints like any other state.
    ``scheme`` is always ``"x25519"``, the only agreement."""

    scheme: str
    private: bytes

    @classmethod
    def generate(cls) -> "KeyPair":
        require()
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        return cls("x25519", X25519PrivateKey.generate().private_bytes_raw())

    def public(self) -> bytes:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        return X25519PrivateKey.from_private_bytes(self.private).public_key().public_bytes_raw()

    def shared(self, peer_public: bytes) -> bytes:
        """The 32-byte secret this key shares with the owner of ``peer_public``."""
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

        if len(peer_public) != PUBLIC_BYTES:
            raise RunFailed(f"secure aggregation: a peer's public key has {len(peer_public)} bytes, not 32")
        peer = X25519PublicKey.from_public_bytes(peer_public)
        return X25519PrivateKey.from_private_bytes(self.private).exchange(peer)


@dataclass
class LabelGuard:
    """The labels a client has masked under; a second use of one is refused."""

    owner: str
    used: list[str] = field(default_factory=list)  # strings: a party checkpoint keeps them as they are

    def claim(self, *label: int) -> None:
        key = ":".join(map(str, label))
        if key in self.used:
            raise RunFailed(f"secure aggregation: {self.owner} refuses to mask twice under index {key} "
                            f"(the same masks would reveal the difference of the two messages)")
        self.used.append(key)
