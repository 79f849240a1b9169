"""Secure aggregation that survives dropouts (Bonawitz et al., CCS 2017), one client's side and the
server's unmasking arithmetic; the message flow through the transport is ``fedgl.protocols.aggregation``.

One round, labelled by an index the client never accepts twice:

0. ``advertise``: two fresh X25519 pairs, c (masks) and s (encrypting shares), their public halves
   signed with the client's long-term Ed25519 identity (``identity``).
1. ``share_keys``: given the signed keys of the round's clients U1 (each signature checked against the
   trusted identity table, so a key the server substitutes is refused), the client draws its self-mask
   seed b_i, splits b_i and its c private key into t-of-|U1| Shamir shares and encrypts each peer's
   pair with ChaCha20-Poly1305 under a key agreed from the s keys; the server only routes them.
2. ``masked_input``: y_i = x_i + PRG(b_i) + sum over U2 \\ {i} of +-PRG(s_ij) in Z_2^64, U2 the clients
   whose shares arrived; s_ij from the c keys, PRG = HKDF + ChaCha20 (``masks``).
3. ``consent``: the client signs the list U3 of clients whose masked inputs the server kept.
4. ``reveal``: after checking every signature it is shown is over that same list (at least t of
   them), the client reveals, for each j in U2, the share of b_j if j is in U3, else the share of j's
   c key, never both for one client: the server then removes the self-masks of the survivors and the
   pairwise masks between survivors and the dropped, and learns the survivors' sum alone.

Fewer than t clients at any step stops the round before anything is revealed.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..errors import RunFailed
from . import shamir
from .identity import SIGNATURE_BYTES, Identity, verify
from .masks import PUBLIC_BYTES, KeyPair, LabelGuard, derive, stream
from .secure_aggregation import MIN_PARTICIPANTS, check_participants, pair_secret

SIGNED_KEYS = 2 * PUBLIC_BYTES + SIGNATURE_BYTES  # c public, s public, signature
NONCE = 12
SEALED = NONCE + 2 * shamir.SHARE_BYTES + 16  # nonce, the two shares, the AEAD tag


def valid_threshold(threshold: int, clients: int, collusion: int = 0) -> bool:
    """Whether t-of-``clients`` protects against a server colluding with ``collusion`` clients: with
    t <= (n + c) / 2 the server and its c clients could complete two disjoint consent sets (each with
    its own survivor list) and unmask a client's input; with t <= c they would reconstruct alone."""
    return threshold >= 2 and 2 * threshold > clients + collusion and threshold > collusion


def pair_mask(secret: bytes, size: int, label: int) -> Tensor:
    return stream(secret, size, b"fedgl secagg pair mask", label)


def self_mask(seed: bytes, size: int, label: int) -> Tensor:
    return stream(seed, size, b"fedgl secagg self mask", label)


def _ids(values) -> bytes:
    return b"".join(int(v).to_bytes(8, "big") for v in values)


def keys_message(label: int, index: int, c_public: bytes, s_public: bytes) -> bytes:
    return b"fedgl secagg keys" + _ids([label, index]) + c_public + s_public


def survivors_message(label: int, survivors: list[int]) -> bytes:
    return b"fedgl secagg survivors" + _ids([label, *survivors])


def as_bytes(t: Tensor) -> bytes:
    return t.to(torch.uint8).cpu().numpy().tobytes()


def as_tensor(raw: bytes) -> Tensor:
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.zeros(0, dtype=torch.uint8)


@dataclass
class Session:
    """One round's secrets and views; dropped once the client has revealed."""

    label: int
    c: KeyPair | None
    s: KeyPair | None
    seed: bytes | None = None  # (never b"": an empty bytes value does not load from a weights-only checkpoint)
    threshold: int = 0
    u1: list[int] = field(default_factory=list)
    c_public: dict[int, bytes] = field(default_factory=dict)
    s_public: dict[int, bytes] = field(default_factory=dict)
    own_shares: tuple[int, int] = (0, 0)
    u2: list[int] = field(default_factory=list)
    sealed: dict[int, bytes] = field(default_factory=dict)
    u3: list[int] = field(default_factory=list)
    answered: dict[str, tuple[bytes, Tensor]] = field(default_factory=dict)


@dataclass
class SecAggClient:
    """One client's side of the dropout-tolerant protocol: its long-term identity, the trusted table
    of every client's identity key, the round indices it has used, the current round's session and
    how many clients may collude with the server (``collusion``, which the threshold must outweigh)."""

    index: int
    identity: Identity
    peers: list[bytes] = field(default_factory=list)
    guard: LabelGuard | None = None
    session: Session | None = None
    collusion: int = 0

    @classmethod
    def create(cls, index: int) -> "SecAggClient":
        return cls(index, Identity.generate(), guard=LabelGuard(f"client {index}"))

    def refuse(self, why: str) -> RunFailed:
        return RunFailed(f"secure aggregation: client {self.index} refuses: {why}")

    def trust(self, table: Tensor) -> None:
        """The identity table (row j = client j's Ed25519 key), taken once as authentic."""
        raw = as_bytes(table)
        self.peers = [raw[j * PUBLIC_BYTES : (j + 1) * PUBLIC_BYTES] for j in range(table.size(0))]

    def once(self, phase: str, label: int, args: list[Tensor], answer) -> Tensor:
        """``answer()`` for this phase of round ``label``; a repeated identical request gets the same
        reply (the server re-sends a phase when a party fails), a different one is refused."""
        if self.session is None or self.session.label != label:
            raise self.refuse(f"no round {label} under way")
        digest = hashlib.sha256(b"".join(a.detach().cpu().contiguous().numpy().tobytes() for a in args)).digest()
        if phase in self.session.answered:
            if self.session.answered[phase][0] != digest:
                raise self.refuse(f"a second, different {phase} request in round {label}")
            return self.session.answered[phase][1]
        reply = answer()
        self.session.answered[phase] = (digest, reply)
        return reply

    # ---- the four steps -------------------------------------------------------------------------
    def advertise(self, label: int) -> Tensor:
        """Fresh c and s key pairs for round ``label``, signed: ``[c public | s public | signature]``."""
        if self.session is not None and self.session.label == label and "advertise" in self.session.answered:
            return self.session.answered["advertise"][1]
        self.guard.claim(label)
        self.session = Session(label, KeyPair.generate(), KeyPair.generate())
        c_pub, s_pub = self.session.c.public(), self.session.s.public()
        signed = as_tensor(c_pub + s_pub + self.identity.sign(keys_message(label, self.index, c_pub, s_pub)))
        self.session.answered["advertise"] = (b"advertise", signed)
        return signed

    def share_keys(self, label: int, ids: Tensor, table: Tensor, threshold: int) -> Tensor:
        """The sealed shares of b_i and c_i for every other client of U1 (``ids``, rows of ``table``)."""
        return self.once("share", label, [ids, table, torch.tensor(threshold)],
                         lambda: self._share_keys(ids.tolist(), as_bytes(table), threshold))

    def _share_keys(self, u1: list[int], raw: bytes, threshold: int) -> Tensor:
        session = self.session
        if not valid_threshold(threshold, len(u1), self.collusion):
            raise self.refuse(f"a threshold of {threshold} for {len(u1)} clients (it must exceed half of them plus "
                              f"the {self.collusion} that may collude, and {self.collusion})")
        check_participants(u1, len(self.peers), self.index, max(threshold, MIN_PARTICIPANTS), f"client {self.index}")
        for k, j in enumerate(u1):
            row = raw[k * SIGNED_KEYS : (k + 1) * SIGNED_KEYS]
            c_pub, s_pub, signature = row[:PUBLIC_BYTES], row[PUBLIC_BYTES : 2 * PUBLIC_BYTES], row[2 * PUBLIC_BYTES :]
            if not verify(self.peers[j], signature, keys_message(session.label, j, c_pub, s_pub)):
                raise self.refuse(f"client {j}'s round keys do not carry its signature (substituted?)")
            session.c_public[j], session.s_public[j] = c_pub, s_pub
        session.u1, session.threshold, session.seed = u1, threshold, secrets.token_bytes(32)
        shares = shamir.share([session.seed, session.c.private], [j + 1 for j in u1], threshold)
        sealed = []
        for j, (b_share, c_share) in zip(u1, shares):
            if j == self.index:
                session.own_shares = (b_share, c_share)
                continue
            nonce = os.urandom(NONCE)
            body = shamir.to_bytes(b_share) + shamir.to_bytes(c_share)
            sealed.append(nonce + self._aead(j).encrypt(nonce, body, _ids([session.label, self.index, j])))
        return as_tensor(b"".join(sealed)).view(len(sealed), SEALED)

    def _aead(self, j: int):
        """The ChaCha20-Poly1305 cipher of this client and j for this round (from their s keys)."""
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

        shared = self.session.s.shared(self.session.s_public[j])
        return ChaCha20Poly1305(derive(shared, b"fedgl secagg share key", self.session.label))

    def masked_input(self, label: int, value: Tensor, senders: Tensor, sealed: Tensor) -> Tensor:
        """y_i for the clients U2 (``senders``) whose sealed shares for this client (rows of ``sealed``,
        in the order of ``senders`` without this client) arrived."""
        return self.once("input", label, [senders, sealed],
                         lambda: self._masked_input(value, senders.tolist(), as_bytes(sealed)))

    def _masked_input(self, value: Tensor, u2: list[int], raw: bytes) -> Tensor:
        session = self.session
        check_participants(u2, len(self.peers), self.index, session.threshold, f"client {self.index}")
        if not set(u2) <= set(session.u1):
            raise self.refuse(f"clients {sorted(set(u2) - set(session.u1))} were not in the round")
        others = [j for j in u2 if j != self.index]
        session.sealed = {j: raw[k * SEALED : (k + 1) * SEALED] for k, j in enumerate(others)}
        session.u2 = u2
        out = value.cpu().to(torch.int64).flatten().clone()  # masks are drawn on the CPU
        out += self_mask(session.seed, out.numel(), session.label)
        for j in others:
            mask = pair_mask(pair_secret(session.c.shared(session.c_public[j])), out.numel(), session.label)
            out += mask if self.index < j else -mask
        return out.view(value.shape)

    def consent(self, label: int, survivors: Tensor) -> Tensor:
        """This client's signature of U3, the clients whose masked inputs the server kept."""
        return self.once("consent", label, [survivors], lambda: self._consent(survivors.tolist()))

    def _consent(self, u3: list[int]) -> Tensor:
        session = self.session
        check_participants(u3, len(self.peers), self.index, session.threshold, f"client {self.index}")
        if not set(u3) <= set(session.u2):
            raise self.refuse(f"clients {sorted(set(u3) - set(session.u2))} sent no shares")
        session.u3 = sorted(u3)
        return as_tensor(self.identity.sign(survivors_message(session.label, session.u3)))

    def reveal(self, label: int, signers: Tensor, signatures: Tensor, survived: Tensor, dropped: Tensor) -> Tensor:
        """One share per client of U2: of b_j for ``survived``, of c_j for ``dropped`` (rows in that
        order), once the signatures of ``signers`` are all over this client's U3."""
        reply = self.once("reveal", label, [signers, signatures, survived, dropped],
                          lambda: self._reveal(signers.tolist(), as_bytes(signatures), survived.tolist(),
                                               dropped.tolist()))
        # the round's secrets are dropped once revealed; only the reply stays, for a repeated request
        self.session = Session(label, None, None, answered={"reveal": self.session.answered["reveal"]})
        return reply

    def _reveal(self, signers: list[int], signatures: bytes, survived: list[int], dropped: list[int]) -> Tensor:
        session = self.session
        both = set(survived) & set(dropped)
        if both:
            raise self.refuse(f"a request for both shares of client {min(both)}")
        if sorted(survived) != session.u3 or sorted(dropped) != sorted(set(session.u2) - set(session.u3)):
            raise self.refuse("a reveal request whose survivors are not the list it signed")
        if len(set(signers)) < session.threshold or not set(signers) <= set(session.u3):
            raise self.refuse(f"{len(set(signers))} consistency signatures, fewer than {session.threshold}")
        message = survivors_message(session.label, session.u3)
        for k, j in enumerate(signers):
            if not verify(self.peers[j], signatures[k * SIGNATURE_BYTES : (k + 1) * SIGNATURE_BYTES], message):
                raise self.refuse(f"client {j} signed a different survivor list")
        rows = [self._share_of(j, 0) for j in survived] + [self._share_of(j, 1) for j in dropped]
        return as_tensor(b"".join(map(shamir.to_bytes, rows))).view(len(rows), shamir.SHARE_BYTES)

    def _share_of(self, j: int, which: int) -> int:
        """This client's share of b_j (``which`` 0) or of c_j (1), opened from j's sealed pair."""
        if j == self.index:
            return self.session.own_shares[which]
        from cryptography.exceptions import InvalidTag

        sealed = self.session.sealed[j]
        try:
            body = self._aead(j).decrypt(sealed[:NONCE], sealed[NONCE:], _ids([self.session.label, j, self.index]))
        except InvalidTag:
            raise self.refuse(f"client {j}'s sealed shares fail authentication") from None
        return shamir.from_bytes(body[which * shamir.SHARE_BYTES : (which + 1) * shamir.SHARE_BYTES])


# ---- the server's side ------------------------------------------------------------------------------
def unmask(total: Tensor, label: int, revealers: list[int], shares: list[Tensor], survived: list[int],
           dropped: list[int], c_public: dict[int, bytes]) -> Tensor:
    """The survivors' plain ring sum from ``total`` (the sum of their masked inputs): b_j rebuilt for
    every survivor and c_j for every dropped client from the ``revealers``' shares (rows survived then
    dropped), then their self-masks and the pairwise masks between survivors and the dropped removed."""
    table = [[shamir.from_bytes(as_bytes(row)) for row in s] for s in shares]
    secrets_ = shamir.reconstruct([j + 1 for j in revealers], table)
    out, size = total.clone(), total.numel()
    for j, seed in zip(survived, secrets_):
        out -= self_mask(seed, size, label).view(total.shape)
    for d, c_private in zip(dropped, secrets_[len(survived):]):
        key = KeyPair("x25519", c_private)
        for k in survived:  # k added +mask when k < d
            mask = pair_mask(pair_secret(key.shared(c_public[k])), size, label).view(total.shape)
            out -= mask if k < d else -mask
    return out
