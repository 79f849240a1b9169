"""FedAAS's options (every preset is a change of their defaults, ``presets.py``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ..base import ProtocolOptions


class FedAASOptions(ProtocolOptions):
    widths: list[int] = Field([256, 128], description="hidden widths; layer 1 is local, later layers cross clients")
    aggregate: Literal["attention", "mean"] = Field("attention", description=(
        "attention: a one-head GAT-v1 softmax over the sampled neighbours (Eq. 9 as the layer's score); mean: "
        "Eq. 11 read as a GraphSAGE mean"))
    root: bool = Field(True, description=(
        "the target's own embedding gets a weight of its own outside the aggregation (GraphSAGE's W_r); "
        "false (attention only): GAT's self loop inside the softmax"))
    sampling: Literal["attention", "uniform", "all"] = "attention"
    fanouts: list[int] = Field([10, 10], description="picks per node per layer, local and remote jointly; -1 all")
    phi: float | None = Field(None, gt=0, le=1, description=(
        "the paper's ratio rule instead of fanouts: per target max(floor(phi |N(v) in V_k|), 1) local picks and, "
        "per remote owner q, max(floor(phi |N(v) in V_q|), 1) picks, which the server draws (it knows the owners)"))
    local_fanouts: list[int] | None = Field(None, description="with cross_fanouts: separate local/remote picks")
    cross_fanouts: list[int] | None = None
    interval: int | Literal["adaptive", "never"] = "adaptive"
    interval_rule: Literal["paper", "code"] = "paper"
    sync_counter: Literal["global", "round"] = Field("global", description=(
        "global: Algorithm 1's count i, kept by the server across rounds, +1 per step, a sync when it reaches τ "
        "(then 0); round: the authors' code, a sync at steps j ≡ 0 (mod τ) of every round, so step 0 always syncs"),
        json_schema_extra={"earlier": "round"})  # what runs saved before this option existed did
    tau0: int | Literal["grid"] = Field(10, description=(
        "the first interval; grid: each of 1, 2, 5, 10 tried for one round from the same state, the one whose "
        "server loss falls fastest per simulated second kept (its cost charged to round 0)"))
    tau_min: int = Field(2, ge=1)
    interval_loss: Literal["server", "train"] = Field("server", description=(
        "server: the global model's loss on the held-out test nodes (paper); train: clients' training loss"))
    between_sync: Literal["history", "drop"] = "history"
    remote_projection: Literal["owner", "receiver"] = Field("owner", description=(
        "owner: pairs carry Σ θ_q h_w (Eq. 11); receiver: Σ h_w, projected by the receiver's current θ at "
        "every use (the code's), so a stored aggregate follows the model"))
    query_gradient: Literal["stopped", "exact"] = Field("stopped", description=(
        "attention: received partials are constants in the backward pass (stopped), or owners also send "
        "their slope-weighted sums so the gradient through the target's query is exact (one more vector "
        "and scalar per pair)"))
    batches: int = Field(10, ge=1, description="mini-batches per local epoch")
    local_epochs: int = Field(1, ge=1)
    client_fraction: float = Field(1.0, gt=0, le=1, description="m / K, clients drawn each round")
    weighting: Literal["nodes", "uniform"] = "nodes"
    min_pair_rows: int = Field(1, ge=1, description="owners withhold (target, owner) pairs summing fewer rows")
    fanout_policy: Literal["fixed", "learned"] = Field("fixed", description=(
        "fixed: fanouts; learned: each client's actor-critic picks every step's fan-out from policy_choices "
        "(the FedGraph reconstruction)"))
    policy_choices: list[int] = Field([2, 5, 10, 15, 20], min_length=2)
    policy_cost: float = Field(0.1, ge=0, description="reward = Δ batch accuracy - policy_cost × fan-out / max choice")
    personalize: Literal["none", "similarity"] = Field("none", description=(
        "none: every client starts a round from the global average; similarity: from an average weighted by "
        "how alike the models behave on a random probe graph (the GraphFed reconstruction)"))
    similarity_temperature: float = Field(0.1, gt=0, description="T of the similarity weights exp(-(1 - cos) / T)")

    @field_validator("interval", "tau0")
    @classmethod
    def _positive(cls, value, info):
        if isinstance(value, int) and value < 1:
            allowed = {"interval": ">= 1, 'adaptive' or 'never'", "tau0": ">= 1 or 'grid'"}[info.field_name]
            raise ValueError(f"{info.field_name} must be {allowed}")
        return value

    @field_validator("widths", "fanouts", "local_fanouts", "cross_fanouts")
    @classmethod
    def _counts(cls, value):
        if value is not None and (not value or any(v == 0 or v < -1 for v in value)):
            raise ValueError("entries must be positive or -1 (all)")
        return value

    @field_validator("policy_choices")
    @classmethod
    def _choices(cls, value):
        if any(v < 1 for v in value):
            raise ValueError("entries must be positive fan-outs")
        return value

    @model_validator(mode="after")
    def _consistent(self):
        layers = len(self.widths)
        if len(self.fanouts) != layers:
            raise ValueError(f"fanouts needs one entry per layer of widths ({layers})")
        if (self.local_fanouts is None) != (self.cross_fanouts is None):
            raise ValueError("local_fanouts and cross_fanouts go together")
        if self.local_fanouts is not None and not len(self.local_fanouts) == len(self.cross_fanouts) == layers:
            raise ValueError(f"local_fanouts and cross_fanouts need {layers} entries each")
        if self.aggregate == "mean" and not self.root:
            raise ValueError("aggregate 'mean' always has a root weight (GraphSAGE): root false needs 'attention'")
        if self.aggregate == "mean" and self.sampling == "attention":
            raise ValueError("aggregate 'mean' has no attention scores: use sampling 'uniform' or 'all'")
        if self.fanout_policy == "learned" and (self.sampling == "all" or self.local_fanouts is not None):
            raise ValueError("fanout_policy 'learned' picks one fan-out per step: use sampling 'uniform' or "
                             "'attention' without local_fanouts/cross_fanouts")
        if self.phi is not None and (self.sampling == "all" or self.local_fanouts is not None
                                     or self.fanout_policy == "learned"):
            raise ValueError("phi sets every pick count itself: use sampling 'uniform' or 'attention', without "
                             "local_fanouts/cross_fanouts or fanout_policy 'learned'")
        if self.tau0 == "grid" and (self.interval != "adaptive" or self.interval_loss != "server"):
            raise ValueError("tau0 'grid' ranks intervals by the server's loss: it needs interval 'adaptive' and "
                             "interval_loss 'server'")
        if isinstance(self.tau0, int) and self.tau_min > self.tau0:
            raise ValueError(f"tau_min ({self.tau_min}) exceeds tau0 ({self.tau0})")
        return self

    def unread(self) -> dict[str, str]:
        """Options this configuration never reads, each with why (``fedgl.session.unread_settings``)."""
        reasons = {}
        if self.interval != "adaptive":
            reasons |= dict.fromkeys(("tau0", "tau_min", "interval_rule", "interval_loss"),
                                     f"only interval adaptive reads it, not {self.interval}")
        if self.interval == "never":
            reasons["sync_counter"] = "interval never has no syncs to count"
        if self.fanout_policy == "fixed":
            reasons |= dict.fromkeys(("policy_choices", "policy_cost"),
                                     "only fanout_policy learned reads it, not fixed")
        if self.personalize == "none":
            reasons["similarity_temperature"] = "only personalize similarity reads it, not none"
        return reasons
