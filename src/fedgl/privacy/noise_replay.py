"""The audit's replay of DP noise: is the noise a party added computable from the run's config?

Noise drawn from a stream seeded by the config seed can be drawn again by anyone holding the config
(every party, the driver), and subtracting it leaves the clean release. The auditor regenerates each
candidate party stream as fedgl's DP derived it from the seed (``replay_stream``: the derivation is
kept here, apart from the mechanism's code, so the audit keeps testing it when the mechanism
changes) and, for every floating-point tensor a party sent, draws a tensor of the same shape and
dtype from it. The noise is replayed when the message correlates with the draw far beyond chance
(correlation above ``SIGMAS`` / sqrt(n) of n entries, and at least ``MIN_CORRELATION``); the message
minus the fitted multiple of the draw is then the clean release, which the other attacks read.

Streams are followed per sender in message order; a draw the party made without sending it (e.g. an
evaluation's releases, which are not recorded: a GLASU client draws once per aggregation level and
once for its scores) is skipped by trying up to ``SKIP`` draws ahead. A
sender none of whose first ``PROBE`` messages fits any candidate stream is not tried further.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..comm.ledger import SERVER
from .attacks import AttackResult, Flow, describe, flow_list
from .record import Message

SIGMAS, MIN_CORRELATION, MIN_ENTRIES = 8.0, 0.05, 64
SKIP, PROBE = 8, 8
PARTY_SEED_STRIDE = 100_003  # the protocols seed party m with seed * 100_003 + m + 1


def replay_stream(seed: int) -> torch.Generator:
    """The noise stream of a party whose seed is ``seed``, derived as fedgl's DP derived it from the
    seed: SHA-256 of ``"fedgl dp noise {seed}"``, the first 8 bytes shifted right by one bit."""
    digest = hashlib.sha256(f"fedgl dp noise {seed}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)


def candidate_seeds(seed: int, parties: int) -> list[int]:
    """The config seed and the seeds the protocols give their first ``parties`` parties."""
    return [seed, *(seed * PARTY_SEED_STRIDE + m + 1 for m in range(parties))]


def fit(message: Tensor, draw: Tensor) -> Tensor | None:
    """``message`` minus its least-squares multiple of ``draw`` when the two correlate beyond chance."""
    m, z = message.double().flatten(), draw.double().flatten()
    norms = float(m.norm() * z.norm())
    if not norms:
        return None
    corr = float(m @ z) / norms
    if corr < max(MIN_CORRELATION, SIGMAS / m.numel() ** 0.5):
        return None
    scale = float(m @ z) / float(z @ z)
    return (message.double() - scale * draw.double()).to(message.dtype)


@dataclass
class Sender:
    """One sender's candidate streams (one once a stream has fitted) and its messages tried so far."""

    streams: dict[int, torch.Generator]
    tried: int = 0
    locked: bool = False


@dataclass
class NoiseReplay:
    """Replays candidate noise streams over every sender's floating-point payloads."""

    seeds: list[int]
    senders: dict[str, Sender] = field(default_factory=dict)
    hits: Counter[Flow] = field(default_factory=Counter)  # payloads whose noise was replayed, by flow
    attacked: int = 0

    def _try(self, gen: torch.Generator, t: Tensor) -> Tensor | None:
        """The clean tensor if one of the next ``SKIP`` draws fits (the stream then stays after it)."""
        state = gen.get_state()
        for _ in range(SKIP):
            clean = fit(t, torch.randn(t.shape, dtype=t.dtype, generator=gen))
            if clean is not None:
                return clean
        gen.set_state(state)
        return None

    def add(self, msg: Message) -> Message | None:
        """``msg`` with every payload whose noise was replayed replaced by its clean value (None if none)."""
        if msg.sender == SERVER:
            return None
        sender = self.senders.setdefault(msg.sender, Sender({s: replay_stream(s) for s in self.seeds}))
        clean: dict = {}
        for path, t in msg.tensors.items():
            if not t.is_floating_point() or t.layout != torch.strided or t.numel() < MIN_ENTRIES:
                continue
            self.attacked += 1
            if not sender.locked and sender.tried >= PROBE:
                continue
            sender.tried += 1
            for seed, gen in list(sender.streams.items()):
                value = self._try(gen, t)
                if value is not None:
                    sender.streams, sender.locked = {seed: gen}, True
                    clean[path] = value
                    self.hits[(msg.sender, msg.receiver, msg.method)] += 1
                    break
        if not clean:
            return None
        return Message(msg.session, msg.seq, msg.round, msg.sender, msg.receiver, msg.method,
                       {**msg.tensors, **clean}, msg.values)

    def result(self) -> AttackResult:
        flows = flow_list(self.hits, "payloads")
        if not self.attacked:
            return AttackResult("noise_replay", 0, 0, "no noised payload to replay (no DP, or none sent)")
        notes = ("no payload's noise is drawn from a stream the config seed gives" if not flows else
                 "noise replayed from the config seed in " + describe(flows, "payloads"))
        return AttackResult("noise_replay", self.attacked, sum(self.hits.values()), notes,
                            {"flows": flows, "seeds_tried": len(self.seeds)})
