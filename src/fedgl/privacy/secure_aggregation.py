"""Secure aggregation's fixed-point ring and its pairwise masks without dropout recovery.

Each client encodes its vector in fixed point as int64 and adds, for every other participant j of the
round, ``+mask(s_ij)`` if i < j else ``-mask(s_ij)``. All arithmetic is in the ring Z_2^64 (int64 with
wrap-around), so the masks cancel exactly in the server's sum, which decodes to the plain sum; each
masked vector alone is uniform over the ring whatever the data. The pairwise secret s_ij is the whole
32-byte X25519 output between i's and j's keys (published through the server); every mask is that
secret through HKDF-SHA256 with the message's index, expanded with ChaCha20 (``masks``), and a client
refuses an index it has masked under before.

``MaskingClient`` has no recovery: a participant lost after the keys are agreed leaves its masks in
the sum. The dropout-tolerant protocol with a threshold (Bonawitz et al., CCS 2017: double masking,
Shamir shares, signed keys) is ``bonawitz`` and its transport flow ``fedgl.protocols.aggregation``.

Fixed point: a value x is ``round(x * 2^FRACTION_BITS)``, multiplied by the client's integer weight.
A sum of n messages cannot overflow when every message has magnitude below 2^63 / n; ``encode``
checks that bound (``limit``) and refuses a larger value instead of wrapping it.

``RequestMasking`` is the one-way variant for sums whose total must stay hidden from the server too
(Swift's cross-client sums): each vector is masked for its recipient only, and the recipient, not the
server's sum, removes the masks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..comm import Transport, rpc
from ..errors import RunFailed
from .masks import KeyPair, LabelGuard, default_key_agreement, derive, stream

__all__ = ["KeyPair", "default_key_agreement"]  # re-exported: callers name them from here

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


@dataclass
class MaskingClient:
    """One client's side of pairwise masking: its key pair, its id among the clients, the pairwise
    secrets derived from the published public keys and the indices it has masked under."""

    index: int
    keys: KeyPair
    pair_secrets: dict[int, bytes] = field(default_factory=dict)
    num_clients: int = 0
    guard: LabelGuard | None = None

    def __post_init__(self) -> None:
        self.guard = self.guard or LabelGuard(f"client {self.index}")

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
        None = every client); a second message under the same ``round_index`` is refused."""
        if not self.num_clients:
            raise RunFailed(f"secure aggregation: client {self.index} has no pairwise secrets (no key exchange)")
        peers = list(range(self.num_clients)) if participants is None else participants.tolist()
        check_participants(peers, self.num_clients, self.index, MIN_PARTICIPANTS, f"client {self.index}")
        self.guard.claim(round_index)
        out = encoded.cpu().clone()  # masks are drawn on the CPU, where the message leaves from
        for j in peers:
            if j != self.index:
                noise = stream(self.pair_secrets[j], out.numel(), b"fedgl pairwise mask", round_index)
                out += (noise if self.index < j else -noise).view(out.shape)
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
