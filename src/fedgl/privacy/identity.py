"""Long-term Ed25519 identities: what lets a client tell a peer's round keys from the server's.

Each client holds one signing key for the whole run; the table of their verification keys is
distributed once at setup and trusted from then on (a deployment would take it from a PKI). Every
per-round key a client publishes, and the list of survivors it agrees to, is signed, so a key or a
list the server substitutes fails verification.
"""

from __future__ import annotations

from dataclasses import dataclass

from .masks import require

SIGNATURE_BYTES = 64


@dataclass
class Identity:
    """A client's Ed25519 signing key, kept as raw bytes so its party checkpoints it as plain state."""

    private: bytes

    @classmethod
    def generate(cls) -> "Identity":
        require()
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return cls(Ed25519PrivateKey.generate().private_bytes_raw())

    def public(self) -> bytes:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return Ed25519PrivateKey.from_private_bytes(self.private).public_key().public_bytes_raw()

    def sign(self, message: bytes) -> bytes:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        return Ed25519PrivateKey.from_private_bytes(self.private).sign(message)


def verify(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is the owner of ``public``'s signature of ``message``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
