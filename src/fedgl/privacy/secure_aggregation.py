"""Secure aggregation by pairwise additive masks (Bonawitz et al., CCS 2017, without the dropout recovery).

Each client encodes its vector in fixed point as int64 and adds, for every other participant j of the
round, ``+PRG(s_ij)`` if i < j else ``-PRG(s_ij)``. All arithmetic is in the ring Z_2^64 (int64 with
wrap-around), so the masks cancel exactly in the server's sum, which decodes to the plain sum; each
masked vector alone is uniform over the ring whatever the data. The pairwise secret s_ij comes from a
key agreement through the server: each client publishes a public key, the server relays the table,
and i and j derive the same secret from their own private key and the other's public key (X25519 from
``cryptography`` when installed, otherwise Diffie-Hellman over the 2048-bit MODP group of RFC 3526).

Fixed point: a value x is ``round(x * 2^FRACTION_BITS)``, multiplied by the client's integer weight.
A sum of n messages cannot overflow when every message has magnitude below 2^63 / n; ``encode``
checks that bound (``limit``) and refuses a larger value instead of wrapping it.

The PRG is ``torch.Generator`` (Mersenne Twister) seeded with 64 bits derived per round from s_ij: it
makes the message flow, the byte counts and the cancellation real, but it is not a cryptographically
secure generator; a deployment would use a stream cipher (e.g. AES-CTR) keyed with s_ij.

``RequestMasking`` is the one-way variant for sums whose total must stay hidden from the server too
(Swift's cross-client sums): each vector is masked for its recipient only, and the recipient, not the
server's sum, removes the masks.
"""

from __future__ import annotations

import hashlib
import importlib.util
import secrets
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..comm import Transport, rpc
from ..errors import RunFailed

FRACTION_BITS = 32
SCALE = float(2**FRACTION_BITS)
INT64_LOW, INT64_HIGH = -(2**63), 2**63 - 1

# RFC 3526, group 14: the 2048-bit MODP prime (generator 2), a published standard constant.
MODP_2048 = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A08798E3404DD"
    "EF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
    "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA48361C55D39A69163FA8FD24CF5F"
    "83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804F1746C08CA18217C32905E462E36CE3B"
    "E39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6955817183995497CEA956AE515D2261898FA0510"
    "15728E5A8AACAA68FFFFFFFFFFFFFFFF", 16)
MODP_BYTES = 256


def default_key_agreement() -> str:
    """``x25519`` when the ``cryptography`` package is installed, else ``modp2048``."""
    return "x25519" if importlib.util.find_spec("cryptography") is not None else "modp2048"


@dataclass
class KeyPair:
    """One client's key-agreement secret. Only raw bytes and ints are kept, so a party holding it
    checkpoints like any other state."""

    scheme: str
    private: bytes

    @classmethod
    def generate(cls, scheme: str | None = None) -> "KeyPair":
        scheme = scheme or default_key_agreement()
        if scheme == "x25519":
            from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

            return cls(scheme, X25519PrivateKey.generate().private_bytes_raw())
        if scheme == "modp2048":
            return cls(scheme, (2 + secrets.randbelow(MODP_2048 - 3)).to_bytes(MODP_BYTES, "big"))
        raise ValueError(f"unknown key agreement {scheme!r}; allowed: x25519, modp2048")

    def public(self) -> bytes:
        if self.scheme == "x25519":
            return self._x25519().public_key().public_bytes_raw()
        return pow(2, int.from_bytes(self.private, "big"), MODP_2048).to_bytes(MODP_BYTES, "big")

    def shared(self, peer_public: bytes) -> bytes:
        """The secret this client shares with the owner of ``peer_public``."""
        if self.scheme == "x25519":
            from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

            return self._x25519().exchange(X25519PublicKey.from_public_bytes(peer_public))
        peer = int.from_bytes(peer_public, "big")
        if not 2 <= peer <= MODP_2048 - 2:
            raise RunFailed("secure aggregation: a peer's Diffie-Hellman public key is out of range")
        return pow(peer, int.from_bytes(self.private, "big"), MODP_2048).to_bytes(MODP_BYTES, "big")

    def _x25519(self):
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        return X25519PrivateKey.from_private_bytes(self.private)


def pair_secret(shared: bytes) -> bytes:
    """s_ij: the key-agreement output through a hash (hashlib), 32 bytes."""
    return hashlib.sha256(b"fedgl secure aggregation pair secret\x00" + shared).digest()


def round_seed(secret: bytes, round_index: int) -> int:
    """A fresh 64-bit PRG seed per round, so no mask is ever used twice."""
    digest = hashlib.sha256(secret + round_index.to_bytes(8, "big", signed=True)).digest()
    return int.from_bytes(digest[:8], "big")


def prg(seed: int, size: int) -> Tensor:
    """``size`` int64 values uniform over the ring (the whole int64 range but its top value)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(INT64_LOW, INT64_HIGH, (size,), dtype=torch.int64, generator=generator, device="cpu")


def limit(participants: int) -> float:
    """The largest magnitude one client's weighted value may have so that the sum of ``participants``
    messages stays inside int64."""
    return 2.0**63 / SCALE / participants


def encode(values: Tensor, weights: Tensor, participants: int) -> Tensor:
    """``round(values * 2^FRACTION_BITS) * weight`` per row as int64 (``values`` ``[k, D]`` float,
    ``weights`` ``[k]`` integer); refuses a row whose weighted magnitude reaches ``limit``."""
    weights = weights.to(torch.int64)
    largest = values.detach().abs().amax(1).double() * weights.double()
    bound = limit(participants)
    if bool((largest >= bound).any()) or not bool(largest.isfinite().all()):
        raise RunFailed(f"secure aggregation: a client value of magnitude {float(largest.max()):.3g} is outside "
                        f"the fixed-point range +-{bound:.3g} for {participants} clients")
    return torch.round(values.detach().double() * SCALE).to(torch.int64) * weights.unsqueeze(1)


def decode(total: Tensor) -> Tensor:
    """The float64 value of an int64 fixed-point sum."""
    return total.double() / SCALE


def ring_sum(masked: Tensor) -> Tensor:
    """The server's sum of the clients' int64 rows (``[k, D]``), wrapping in Z_2^64."""
    return masked.sum(0, dtype=torch.int64)


@dataclass
class MaskingClient:
    """One client's side of secure aggregation: its key pair, its id among the clients, and the
    pairwise secrets derived from the published public keys."""

    index: int
    keys: KeyPair
    pair_secrets: dict[int, bytes] = field(default_factory=dict)
    num_clients: int = 0

    @classmethod
    def create(cls, index: int, scheme: str | None = None) -> "MaskingClient":
        return cls(index, KeyPair.generate(scheme))

    def public_key(self) -> Tensor:
        return torch.frombuffer(bytearray(self.keys.public()), dtype=torch.uint8)

    def agree(self, public_keys: Tensor) -> None:
        """Derive s_ij with every other client from the relayed table (row j = client j's public key)."""
        table = public_keys.to(torch.uint8).cpu().numpy().tobytes()
        width = public_keys.size(1)
        self.num_clients = public_keys.size(0)
        self.pair_secrets = {j: pair_secret(self.keys.shared(table[j * width : (j + 1) * width]))
                             for j in range(self.num_clients) if j != self.index}

    def mask(self, encoded: Tensor, participants: Tensor | None, round_index: int) -> Tensor:
        """``encoded`` plus the pairwise masks with every other participant of this round (ids;
        None = every client)."""
        if not self.num_clients:
            raise RunFailed(f"secure aggregation: client {self.index} has no pairwise secrets (no key exchange)")
        peers = list(range(self.num_clients)) if participants is None else participants.tolist()
        if len(peers) < 2:  # a "sum" of one message is that message: a client refuses to send it
            raise RunFailed(f"secure aggregation: client {self.index} was asked to mask with fewer than 2 "
                            f"participants, which would reveal its update")
        out = encoded.cpu().clone()  # masks are drawn on the CPU, where the message leaves from
        for j in peers:
            if j == self.index:
                continue
            noise = prg(round_seed(self.pair_secrets[j], round_index), out.numel())
            out += noise if self.index < j else -noise
        return out.to(encoded.device)


def exchange_keys(transport: Transport, parties: list[str]) -> None:
    """The key agreement through the server: every party's ``public_key`` (one key, or one row per
    member of a client group), then the whole table relayed to every client by ``agree`` (a group
    receives one copy per member, as its members would)."""
    replies = transport.call_many(parties, "public_key")
    grouped = replies[0].dim() == 2
    table = torch.cat(replies) if grouped else torch.stack(replies)
    calls = [{"public_keys": table.expand(len(keys), -1, -1) if grouped else table} for keys in replies]
    transport.call_many(parties, "agree", per_target=calls)


class MaskedParty:
    """The key-agreement methods of a party holding one client's ``masker``."""

    masker: MaskingClient | None

    @rpc(returns="control")
    def public_key(self) -> Tensor:
        return self.masker.public_key()

    @rpc(public_keys="control")
    def agree(self, public_keys: Tensor) -> None:
        self.masker.agree(public_keys)


# ---- one-way masks to a recipient (Swift's cross-client sums) ------------------------------------------
def one_way_secret(keys: KeyPair, sender: bytes, recipient: bytes) -> bytes:
    """The secret of the channel sender -> recipient, derived by either end (its own private key, the
    other's public key); naming both ends in order keeps the two directions' masks apart."""
    own = keys.public()
    peer = recipient if own == sender else sender
    return hashlib.sha256(b"fedgl one-way mask\x00" + keys.shared(peer) + sender + recipient).digest()


def stream_rows(secret: bytes, label: int, ranks: Tensor, width: int) -> Tensor:
    """Rows ``ranks`` of the int64 mask stream of a channel for ``label`` (a fresh stream per label)."""
    rows = int(ranks.max()) + 1 if ranks.numel() else 0
    return prg(round_seed(secret, label), rows * width).view(rows, width)[ranks]


def rank_within(groups: Tensor) -> Tensor:
    """Each entry's position among the entries of its group, in order."""
    order = torch.sort(groups, stable=True).indices
    sorted_groups = groups[order]
    _, counts = torch.unique_consecutive(sorted_groups, return_counts=True)
    starts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    rank = torch.empty_like(groups)
    rank[order] = torch.arange(groups.numel(), device=groups.device) - starts
    return rank


@dataclass
class RequestMasking:
    """One party's keys for one request: sums it sends are masked for their recipient, sums it receives
    are unmasked, with one-way masks from a key agreement between the two ends. The key pair is fresh
    per request and the server relays the request's public keys as a table (row = peer), without names.

    A sender adds to the k-th vector it sends to peer r in a phase the k-th row of the stream of the
    channel (self -> r); the server adds vectors of several senders per target and forwards them; the
    recipient, told which (sender, rank) pairs went into each of its targets, subtracts those rows. The
    server sees every vector and every total masked by rows it cannot compute."""

    keys: KeyPair
    peers: list[bytes] = field(default_factory=list)

    @classmethod
    def create(cls, scheme: str | None = None) -> "RequestMasking":
        return cls(KeyPair.generate(scheme))

    def public_key(self) -> Tensor:
        return torch.frombuffer(bytearray(self.keys.public()), dtype=torch.uint8)

    def agree(self, table: Tensor) -> None:
        raw = table.to(torch.uint8).cpu().numpy().tobytes()
        width = table.size(1)
        self.peers = [raw[i * width : (i + 1) * width] for i in range(table.size(0))]

    def _secret(self, peer: int, sending: bool) -> bytes:
        own = self.keys.public()
        return one_way_secret(self.keys, *((own, self.peers[peer]) if sending else (self.peers[peer], own)))

    def mask(self, encoded: Tensor, to: Tensor, label: int) -> Tensor:
        """``encoded`` (int64 rows) plus, for row i, the next row of the stream to peer ``to[i]``."""
        out, to = encoded.cpu().clone(), to.cpu()  # masks are drawn on the CPU
        rank = rank_within(to)
        for peer in to.unique().tolist():
            rows = to == peer
            out[rows] += stream_rows(self._secret(peer, True), label, rank[rows], encoded.size(1))
        return out.to(encoded.device)

    def unmask(self, masked: Tensor, pairs: Tensor, label: int) -> Tensor:
        """``masked`` (one int64 row per target) minus the masks of the vectors summed into each:
        ``pairs`` holds one column (target row, sender peer, the vector's rank in that sender's stream)
        per vector."""
        total = torch.zeros(masked.shape, dtype=masked.dtype, device="cpu")  # masks are drawn on the CPU
        target, sender, rank = pairs.cpu()
        for peer in sender.unique().tolist():
            rows = sender == peer
            total.index_add_(0, target[rows], stream_rows(self._secret(peer, False), label, rank[rows],
                                                          masked.size(1)))
        return masked - total.to(masked.device)
