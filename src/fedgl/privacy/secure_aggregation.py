"""Secure aggregation's fixed-point ring, the checks every masking client makes, and one-way masks.

Fixed point: a value x is ``round(x * 2^FRACTION_BITS)``, multiplied by the client's integer weight, as
int64; all arithmetic is in the ring Z_2^64 (int64 with wrap-around), so masks added by the clients
cancel or are removed exactly and the server decodes the plain sum. A sum of n messages cannot
overflow when every message has magnitude below 2^63 / n; ``encode`` checks that bound (``limit``)
and refuses a larger value instead of wrapping it.

The dropout-tolerant sum with a threshold (Bonawitz et al., CCS 2017: double masking, Shamir shares,
signed keys) is ``bonawitz``, its transport flow ``fedgl.protocols.aggregation``; it takes its pairwise
secret (``pair_secret``: the whole 32-byte X25519 output, bound to its use by HKDF) and its refusal
of a bad participant list (``check_participants``) from here.

``RequestMasking`` is the one-way variant for sums whose total must stay hidden from the server too
(Swift's cross-client sums): each vector is masked for its recipient only, and the recipient, not the
server's sum, removes the masks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..errors import RunFailed
from .masks import KeyPair, LabelGuard, derive, stream

__all__ = ["KeyPair"]  # re-exported: callers name it from here

FRACTION_BITS = 32
SCALE = float(2**FRACTION_BITS)
MIN_PARTICIPANTS = 3  # with two, each client could subtract its own value from the sum


def pair_secret(shared: bytes) -> bytes:
    """s_ij: the whole 32-byte key-agreement output, bound to its use by HKDF."""
    return derive(shared, b"fedgl pairwise secret")


def check_participants(peers: list[int], num_clients: int, me: int, minimum: int, who: str) -> None:
    """Refuse a participant list with a repeated id, an id out of range, without ``me`` or shorter than
    ``minimum``: one line naming the problem."""
    problem = (f"repeats client {next(p for p in peers if peers.count(p) > 1)}" if len(set(peers)) != len(peers)
               else f"names client {max(peers)} of {num_clients}" if peers and (max(peers) >= num_clients
                                                                               or min(peers) < 0)
               else f"leaves out client {me} itself" if me not in peers
               else f"has {len(peers)} clients, fewer than {minimum}" if len(peers) < minimum else None)
    if problem is not None:
        raise RunFailed(f"secure aggregation: {who} refuses a participant list that {problem}")


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


# ---- one-way masks to a recipient (Swift's cross-client sums) ------------------------------------------
def one_way_secret(keys: KeyPair, sender: bytes, recipient: bytes) -> bytes:
    """The secret of the channel sender -> recipient, derived by either end (its own private key, the
    other's public key); naming both ends in order keeps the two directions' masks apart."""
    own = keys.public()
    peer = recipient if own == sender else sender
    return derive(keys.shared(peer), b"fedgl one-way mask" + sender + recipient)


def stream_rows(secret: bytes, label: int, ranks: Tensor, width: int) -> Tensor:
    """Rows ``ranks`` of the int64 mask stream of a channel for ``label`` (a fresh stream per label)."""
    rows = int(ranks.max()) + 1 if ranks.numel() else 0
    return stream(secret, rows * width, b"fedgl one-way stream", label).view(rows, width)[ranks]


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
    guard: LabelGuard = field(default_factory=lambda: LabelGuard("a request's sender"))

    @classmethod
    def create(cls) -> "RequestMasking":
        return cls(KeyPair.generate())

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
        """``encoded`` (int64 rows) plus, for row i, the next row of the stream to peer ``to[i]``; each
        ``label`` is sent under once."""
        self.guard.claim(label)
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
