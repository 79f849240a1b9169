"""GLASU's options and what they mean for a run: the aggregation levels, the fan-out per layer and the
feature blocks of the vertical partition."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ...config import PartitionConfig
from ...errors import ConfigError
from ..base import ProtocolOptions

VERTICAL_BLOCKS = ("contiguous", "random")


class GlasuOptions(ProtocolOptions):
    K: int | None = Field(None, ge=0, description="number of aggregation layers, uniformly spaced with the last "
                                                  "always included; 0 = standalone; default every other layer")
    agg_layers: list[int] | None = Field(None, description="explicit aggregation layers I (1-based, must hold the "
                                                           "last layer L); overrides the uniform spacing")
    Q: int = Field(4, ge=1, description="local updates per joint inference (stale updates; 1 = none)")
    backward: Literal["local", "exact"] = Field(
        "local", description="local: each client differentiates its own loss with the others' representations "
                             "held fixed (GLASU); exact: split learning ([9]), the server back-propagates "
                             "through every aggregation and returns each client its gradient (needs Q = 1)")
    S: int = Field(16, ge=1, description="mini-batch size: training nodes per GLASU round")
    batches: int = Field(16, ge=1, description="GLASU rounds (mini-batches) per training round (between evaluations)")
    fanout: int | list[int] = Field(3, description="sampled neighbours per node (layerwise: on average); one value or "
                                                   "one per layer, input layer first")
    sampling: Literal["layerwise", "nodewise", "full"] = Field(
        "layerwise", description="layerwise: uniform from the neighbours of the level above (paper); nodewise: up to "
                                 "fanout per node (authors' code); full: every neighbour")
    adjacency: Literal["scaled", "induced"] = Field(
        "scaled", description="scaled: rows of the client's normalised adjacency, rescaled to full-row sums (paper); "
                              "induced: normalised inside the sampled subgraph with self-loop weight 2 (authors' code)")
    aggregation: Literal["mean", "concat"] = "mean"
    graph: bool = Field(True, description="false: identity adjacency on every client (conventional vertical FL)")
    inference: Literal["full", "sampled"] = Field(
        "full", description="full: score every node with its full neighbourhood; sampled: through the training "
                            "pipeline, in batches of S with sampled neighbourhoods (the authors' evaluation; "
                            "clients that never aggregate only: K = 0 or one client)")
    train_clients: Literal["all", "scoring"] = Field(
        "all", description="clients that never aggregate (K = 0): train all, or only those whose classifiers "
                           "score the nodes (the same scores for less compute: each party has its own RNG stream)")
    eval_client: int | None = Field(None, ge=0, description="client whose classifier scores the nodes; default the "
                                                            "mean of every label holder's logits (client 0 if K = 0)")
    lr_decay_every: int | None = Field(None, ge=1, description="multiply the learning rate by lr_decay every this many "
                                                               "training rounds (the authors' schedule)")
    lr_decay: float = Field(0.25, gt=0, le=1)

    @model_validator(mode="after")
    def _consistent(self) -> "GlasuOptions":
        fanouts = self.fanout if isinstance(self.fanout, list) else [self.fanout]
        if not fanouts or min(fanouts) < 1:
            raise ValueError("fanout must be a positive integer or a non-empty list of them")
        if self.agg_layers is not None:
            if self.K is not None and self.K != len(self.agg_layers):
                raise ValueError(f"K={self.K} disagrees with agg_layers {self.agg_layers}")
            if not self.agg_layers or min(self.agg_layers) < 1 or len(set(self.agg_layers)) != len(self.agg_layers):
                raise ValueError("agg_layers must be distinct layer numbers >= 1 (1-based)")
        if self.backward == "exact" and (self.Q != 1 or self.K == 0):
            raise ValueError(f"backward exact is split learning: it needs Q=1 and K>=1, got Q={self.Q}, K={self.K}")
        return self

    def unread(self) -> dict[str, str]:
        """Options this configuration never reads, each with why (``fedgl.session.unread_settings``)."""
        reasons = {}
        if self.lr_decay_every is None:
            reasons["lr_decay"] = "lr_decay_every is unset, so the learning rate never decays"
        if self.sampling == "full":
            reasons["fanout"] = "sampling full takes every neighbour"
        elif not self.graph:
            reasons["fanout"] = "graph false samples no neighbours"
        return reasons


def aggregation_levels(opts: GlasuOptions, num_layers: int) -> list[int]:
    """The aggregation levels I (1-based layer numbers, ascending), checked against L."""
    L = num_layers
    if opts.agg_layers is not None:
        levels = sorted(opts.agg_layers)
        if levels[-1] != L:
            raise ConfigError(f"protocol.agg_layers {opts.agg_layers} must include the last layer L={L} "
                              f"(and stay within 1..{L})")
        return levels
    K = max(1, L // 2) if opts.K is None else opts.K
    if K > L:
        raise ConfigError(f"protocol.K={K} exceeds the number of layers model.layers={L}; allowed: 0..{L}")
    return [k * L // K for k in range(1, K + 1)]


def layer_fanouts(opts: GlasuOptions, num_layers: int) -> list[int]:
    if isinstance(opts.fanout, int):
        return [opts.fanout] * num_layers
    if len(opts.fanout) != num_layers:
        raise ConfigError(f"protocol.fanout lists {len(opts.fanout)} values for model.layers={num_layers}; "
                          f"give one value or {num_layers}")
    return list(opts.fanout)


def vertical_blocks(partition: PartitionConfig) -> str:
    """The feature-block method (contiguous where the config leaves it unset: ``Glasu.paper_sections``)."""
    if partition.method not in VERTICAL_BLOCKS:
        raise ConfigError(f"partition.method {partition.method!r} is not a vertical partition; "
                          f"allowed: {', '.join(VERTICAL_BLOCKS)}")
    return partition.method
