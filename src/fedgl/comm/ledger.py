"""The communication ledger: every measured message, by round, direction, party and kind.

Messages are aggregated as they arrive into totals keyed by ``(round, sender, receiver, kind,
method)`` (bytes and message count; ``method`` is the party method called, so a protocol can tell,
e.g., its cross-client phases from its model exchange), which keeps the ledger small even for thousands of users: a vectorised
user group is one party whose per-user shares are summed into per-member vectors.
Evaluation traffic is recorded under the kind ``eval`` and left out of training totals.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch

SERVER = "server"
EVAL = "eval"


@dataclass
class Ledger:
    round: int = 0
    _totals: dict[tuple[int, str, str, str, str], list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    _members: dict[tuple[str, str], torch.Tensor] = field(default_factory=dict)
    # Running sums the runner reads every round, so that reading them does not scan every entry so far
    # (which would make a run quadratic in its rounds): bytes per kind, and training bytes per round.
    _kinds: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _rounds: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    def record(self, src: str, dst: str, kind: str, nbytes: int, messages: int = 1, method: str = "") -> None:
        entry = self._totals[(self.round, src, dst, kind, method)]
        entry[0] += nbytes
        entry[1] += messages
        self._kinds[kind] += nbytes
        if kind != EVAL:
            self._rounds[self.round] += nbytes

    def record_members(self, group: str, direction: str, members: torch.Tensor, bytes_each: int) -> None:
        """Attribute ``bytes_each`` to each listed member of a user group (direction 'up' or 'down')."""
        key = (group, direction)
        size = int(members.max()) + 1 if members.numel() else 0
        current = self._members.get(key, torch.zeros(0, dtype=torch.long))
        if current.numel() < size:
            current = torch.cat([current, current.new_zeros(size - current.numel())])
        self._members[key] = current.index_add_(0, members, torch.full_like(members, bytes_each))

    # ---- queries -------------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        """Every aggregated entry, for writing to disk."""
        return [
            {"round": r, "src": s, "dst": d, "direction": direction(s, d), "kind": k, "method": m, "bytes": b,
             "messages": n}
            for (r, s, d, k, m), (b, n) in sorted(self._totals.items())
        ]

    def total(self, *, kind: str | None = None, include_eval: bool = False,
              methods: tuple[str, ...] | None = None, kinds: tuple[str, ...] | None = None) -> int:
        """Bytes of the messages matching every filter given (``methods``/``kinds``: any of them)."""
        if kind is None and kinds is None and methods is None:
            return sum(b for k, b in self._kinds.items() if include_eval or k != EVAL)
        return sum(
            b
            for (_, _, _, k, m), (b, _) in self._totals.items()
            if (kind is None or k == kind)
            and (kinds is None or k in kinds)
            and (methods is None or m in methods)
            and (include_eval or k != EVAL)
        )

    def by_method(self) -> dict[str, dict[str, int]]:
        """Training bytes per called method and kind."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for (_, _, _, k, m), (b, _) in self._totals.items():
            if k != EVAL:
                out[m][k] += b
        return {m: dict(sorted(kinds.items())) for m, kinds in sorted(out.items())}

    def by_kind(self, include_eval: bool = True) -> dict[str, int]:
        return {k: b for k, b in sorted(self._kinds.items()) if include_eval or k != EVAL}

    def by_direction(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for (_, s, d, k, _), (b, _) in self._totals.items():
            if k != EVAL:
                out[direction(s, d)] += b
        return dict(out)

    def round_bytes(self, round_index: int) -> int:
        """Training bytes of one round."""
        return self._rounds.get(round_index, 0)

    def by_round(self) -> dict[int, int]:
        """Training bytes per round."""
        return dict(sorted(self._rounds.items()))

    def by_party(self) -> dict[str, dict[str, int]]:
        """Training bytes each non-server party sent ('up') and received ('down')."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: {"up": 0, "down": 0})
        for (_, s, d, k, _), (b, _) in self._totals.items():
            if k == EVAL:
                continue
            if s != SERVER:
                out[s]["up"] += b
            if d != SERVER:
                out[d]["down"] += b
        return dict(out)

    def messages(self, *, kind: str | None = None) -> int:
        return sum(n for (_, _, _, k, _), (_, n) in self._totals.items() if kind is None or k == kind)

    def member_bytes(self, group: str, direction: str) -> torch.Tensor | None:
        return self._members.get((group, direction))

    def state_dict(self) -> dict:
        return {"round": self.round, "totals": dict(self._totals), "members": dict(self._members)}

    def load_state_dict(self, state: dict) -> None:
        self.round = state["round"]
        self._totals = defaultdict(lambda: [0, 0], {k: list(v) for k, v in state["totals"].items()})
        self._members = dict(state["members"])
        self._kinds, self._rounds = defaultdict(int), defaultdict(int)
        for (r, _, _, k, _), (b, _) in self._totals.items():
            self._kinds[k] += b
            if k != EVAL:
                self._rounds[r] += b


def direction(src: str, dst: str) -> str:
    if src == SERVER:
        return "down"
    if dst == SERVER:
        return "up"
    return "peer"
