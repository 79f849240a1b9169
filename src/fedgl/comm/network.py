"""A network model that turns measured bytes and compute time into a simulated clock.

Wall-clock time on a shared 2-core machine says little about a deployment with one machine per
party, so runtimes are reported on a simulated clock: a message costs ``latency + bytes / bandwidth``;
parties called together run in parallel and a phase ends when its slowest party ends. Compute time
is, by default, the CPU seconds the party's process spent on the call (``compute="cpu"``): unlike
elapsed time it does not grow when other work shares the cores. ``"measured"`` uses elapsed time and
``"ignore"`` zero, which makes the clock a deterministic function of bytes and messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NetworkModel:
    bandwidth_mbps: float = 1000.0  # 1 Gbps links, each party its own
    latency_ms: float = 1.0
    compute: str = "cpu"  # or "measured" (elapsed seconds) or "ignore"

    def transfer_s(self, nbytes: int) -> float:
        if nbytes == 0:
            return 0.0
        return self.latency_ms / 1e3 + nbytes * 8 / (self.bandwidth_mbps * 1e6)

    def compute_s(self, wall: float, cpu: float) -> float:
        """Simulated seconds of a computation that took ``wall`` elapsed and ``cpu`` CPU seconds."""
        return {"cpu": cpu, "measured": wall}.get(self.compute, 0.0)


@dataclass
class SimClock:
    """Simulated seconds since the run began.

    Inside ``lanes`` (a parallel block) each party accumulates its own time, and leaving the block
    advances the clock by the longest lane.
    """

    network: NetworkModel = field(default_factory=NetworkModel)
    now: float = 0.0
    _lanes: dict[str, float] | None = None

    def phase(self, party_times: dict[str, float]) -> None:
        """Parties working at once: the phase lasts as long as the slowest."""
        if not party_times:
            return
        if self._lanes is None:
            self.now += max(party_times.values())
        else:
            for party, t in party_times.items():
                self._lanes[party] = self._lanes.get(party, 0.0) + t

    def open_lanes(self) -> None:
        self._lanes = {}

    def close_lanes(self) -> None:
        lanes, self._lanes = self._lanes, None
        if lanes:
            self.now += max(lanes.values())
