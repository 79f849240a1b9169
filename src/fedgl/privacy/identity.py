"""Long-term Ed25519 identities and the roster that pins them: what lets a client tell a peer's round
keys from the server's.

Each client holds one signing key; every per-round key it publishes, and the list of survivors it
agrees to, is signed, so a key or a list the server substitutes fails verification against the
table of identity keys the client trusts. That table must not come from the server: a server that
relays it can put its own key in any client's row and then sign as that client. So a client pins a
``Roster`` (row j = client j's public key) it receives from outside the server: from the run's driver
as it places the client's shard (a simulation), or inside its own shard file (``fedgl partition``),
with its private key read from its own folder (``read_identity``). ``fedgl keys`` writes an
organisation's own key pair and a federation's roster file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..errors import ConfigError, RunFailed
from ..files import make_folder, write_atomically
from .masks import require

SIGNATURE_BYTES = 64
PUBLIC_KEY_BYTES = 32
ROSTER_FORMAT = "fedgl-roster-1"
KEY_FILE, PUBLIC_FILE = "identity.key", "identity.pub"  # a party's private key, its public key in hex


@dataclass
class Identity:
    """A client's Ed25519 signing key as raw bytes; its party declares it secret, so it is never
    checkpointed (a pinned identity is read again from its file, or dealt again, when the party is made)."""

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

    def write(self, folder: Path, replace: bool = False) -> Path:
        """``folder/identity.key`` (PKCS#8 PEM, readable by its owner only; an existing key is replaced
        only when asked) and ``folder/identity.pub`` (the public key in hex, for the federation's roster)."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        make_folder(folder, mode=0o700)  # a file in the way, no permission: one line, not a traceback
        pem = Ed25519PrivateKey.from_private_bytes(self.private).private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        path = folder / KEY_FILE
        if replace:
            path.unlink(missing_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise ConfigError(f"{path} exists; an identity key is never overwritten") from None
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        (folder / PUBLIC_FILE).write_text(self.public().hex() + "\n")
        return path


def read_identity(path: str | Path) -> Identity:
    """The Ed25519 key of the PEM file ``path``, which must be readable by its owner only."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    try:
        mode, pem = path.stat().st_mode & 0o777, path.read_bytes()
    except OSError as err:
        raise ConfigError(f"identity key {path} cannot be read ({err.strerror or err}); write one with "
                          f"`fedgl keys new --out {path.parent}`") from None
    if mode & 0o077:
        raise ConfigError(f"identity key {path} is readable by others (mode {mode:o}); `chmod 600` it")
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"identity key {path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"identity key {path} is not an Ed25519 key")
    return Identity(key.private_bytes_raw())


@dataclass(frozen=True)
class Roster:
    """Every client's public identity key by client index: the table a client pins and compares
    whatever the server relays with."""

    keys: tuple[bytes, ...]

    @classmethod
    def of(cls, identities: list[Identity]) -> "Roster":
        return cls(tuple(identity.public() for identity in identities))

    @classmethod
    def from_table(cls, table: Tensor) -> "Roster":
        raw = table.to(torch.uint8).cpu().contiguous().numpy().tobytes()
        return cls(tuple(raw[j * PUBLIC_KEY_BYTES : (j + 1) * PUBLIC_KEY_BYTES] for j in range(table.size(0))))

    def table(self) -> Tensor:
        """The roster as a ``[clients, 32]`` uint8 tensor (how it travels in constructor arguments and
        shard files)."""
        return torch.frombuffer(bytearray(b"".join(self.keys)), dtype=torch.uint8).view(len(self.keys), -1).clone()

    def check_own(self, index: int, identity: Identity) -> None:
        """Refuse a private key that is not the roster's entry for client ``index``."""
        if index >= len(self.keys) or self.keys[index] != identity.public():
            raise ConfigError(f"client {index}'s identity key is not the roster's key for client {index} "
                              f"(another client's key, or a roster of another federation)")

    def check_relayed(self, index: int, table: Tensor) -> None:
        """Refuse, as client ``index``, an identity table that differs from this pinned roster."""
        relayed = Roster.from_table(table).keys if table.dim() == 2 and table.size(-1) == PUBLIC_KEY_BYTES else ()
        if relayed != self.keys:
            differ = [j for j, key in enumerate(self.keys) if j >= len(relayed) or relayed[j] != key]
            first = f"client {differ[0]}'s key" if differ else "its size"
            raise RunFailed(f"secure aggregation: client {index} refuses: the identity table the server relayed "
                            f"differs from its pinned roster ({first} substituted)")

    def write(self, path: Path) -> bytes:
        """The roster as JSON (row j: client j's key in hex); returns the bytes written."""
        data = json.dumps({"format": ROSTER_FORMAT, "keys": [key.hex() for key in self.keys]}, indent=1).encode()
        write_atomically(path, lambda fh: fh.write(data))
        return data


def read_roster(path: str | Path, clients: int) -> Roster:
    """The roster file ``path`` of a federation of ``clients``: one 32-byte Ed25519 key each, all distinct."""
    try:
        data = json.loads(Path(path).read_text())
        keys = tuple(bytes.fromhex(key) for key in data["keys"]) if data.get("format") == ROSTER_FORMAT else None
    except OSError as err:
        raise ConfigError(f"roster {path} cannot be read ({err.strerror or err})") from None
    except (ValueError, TypeError, KeyError, AttributeError):
        keys = None
    if keys is None or any(len(key) != PUBLIC_KEY_BYTES for key in keys) or len(set(keys)) != len(keys):
        raise ConfigError(f"roster {path} is not a {ROSTER_FORMAT} file of distinct 32-byte keys in hex "
                          f"(write it with `fedgl keys roster`)")
    if len(keys) != clients:
        raise ConfigError(f"roster {path} has {len(keys)} keys; this federation has {clients} clients")
    return Roster(keys)


def read_public(path: str | Path) -> bytes:
    """The public key of an ``identity.pub`` file (hex)."""
    try:
        key = bytes.fromhex(Path(path).read_text().strip())
    except OSError as err:
        raise ConfigError(f"public key {path} cannot be read ({err.strerror or err})") from None
    except ValueError:
        key = b""
    if len(key) != PUBLIC_KEY_BYTES:
        raise ConfigError(f"public key {path} is not a 32-byte key in hex (an identity.pub of `fedgl keys new`)")
    return key


def verify(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is the owner of ``public``'s signature of ``message``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True
