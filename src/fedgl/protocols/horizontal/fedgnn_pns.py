"""FedGNN-PNS (Du & Wu, 2022) as described in swift-fedgnn.txt, Section 6 and Appendix D.1.

Every client samples its cross-client neighbourhood periodically, at a frequency that grows as
training goes on, and in the iterations in between reuses the most recent sample: the same batch,
the same sampled neighbours and the cross-client sums received then, with its own nodes recomputed
under the current parameters. Gradients are averaged every iteration, as in Swift-FedGNN.

The sampling iterations are t_0 = 0 and t_{j+1} = t_j + max(min_interval,
ceil(initial_interval * decay^j)): long reuse periods early, sampling every ``min_interval``
iterations late. The paper only says that FedGNN-PNS "increases the frequency of graph data
communication" as training progresses (Appendix D.1); the original derives its interval from a
convergence/runtime trade-off that neither swift-fedgnn.txt nor implementation-facts.md gives. The
defaults (20, 0.8, 2) are therefore our assumption, not a published setting. Cross-client sums
travel as in Swift-FedGNN (aggregated per target and owner) rather than as raw neighbour features,
so the raw features stay with their owners here too.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, model_validator

from .server import CrossClientOptions, CrossClientProtocol


class PNSOptions(CrossClientOptions):
    # Assumed constants (no published values; see the module docstring).
    initial_interval: int = Field(20, ge=1, description="iterations between the first two samplings")
    decay: float = Field(0.8, gt=0, le=1, description="factor shrinking the interval after each sampling")
    min_interval: int = Field(2, ge=1, description="shortest interval between samplings")

    @model_validator(mode="after")
    def _schedule(self):
        if self.min_interval > self.initial_interval:  # the interval would never start above its floor
            raise ValueError(f"min_interval ({self.min_interval}) exceeds initial_interval ({self.initial_interval})")
        return self


def interval(options: PNSOptions, j: int) -> int:
    """Iterations between the j-th and the (j+1)-th sampling."""
    return max(options.min_interval, math.ceil(options.initial_interval * options.decay ** j))


def sampling_iterations(options: PNSOptions, until: int) -> list[int]:
    """The iterations (0-based, below ``until``) at which clients sample cross-client neighbours."""
    out, t = [], 0
    while t < until:
        out.append(t)
        t += interval(options, len(out) - 1)
    return out


class FedGNNPNS(CrossClientProtocol):
    name = "fedgnn-pns"
    Options = PNSOptions

    def setup(self, data) -> None:
        super().setup(data)
        self.next_sampling, self.samplings = 0, 0

    def train_round(self, round_index: int) -> dict[str, float]:
        t = round_index - 1
        sampling = t >= self.next_sampling
        if sampling:
            self.next_sampling = t + interval(self.opts, self.samplings)
            self.samplings += 1
        modes = ["cross" if sampling else "reuse"] * len(self.clients)
        return self.iterate(modes, keep=sampling) | {"cross_clients": float(len(self.clients) * sampling)}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"next_sampling": self.next_sampling, "samplings": self.samplings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.next_sampling, self.samplings = state["next_sampling"], state["samplings"]
