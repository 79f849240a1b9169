"""The ``privacy`` section of a run: secure aggregation and differential privacy, both off by default.

A protocol states here which options it implements (``SUPPORTED``); asking another protocol for one
is a one-line ``ConfigError`` naming the protocol, raised while the config is validated. This module
imports nothing from the protocols, so ``fedgl.config`` can use it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, ConfigDict, Field, ValidationInfo, model_validator

from ..errors import ConfigError
from ..options import Settings

# protocol name -> the privacy options its code implements
SUPPORTED: dict[str, tuple[str, ...]] = {
    "fedavg": ("secure_aggregation", "dp"),
    # GLASU: its mean aggregation masked; DP on every representation a client sends
    "glasu": ("secure_aggregation", "dp"),
    # FedAAS's model averages (and, with DP, its exchanged partials), in every preset that averages one
    # global model (GraphFed's server mixes each client's own model, so it has no sum to mask)
    **dict.fromkeys(("fedaas", "fedcross", "fedaas-pns", "fedlocal", "fedall", "fedaas1", "fedaas2",
                     "fedgraph-recon"), ("secure_aggregation", "dp")),
    # the Swift-FedGNN family's cross-client sums (protocols/horizontal/); LLCG sends raw rows by design
    "swift": ("secure_aggregation", "dp"),
    "fedgnn-g": ("secure_aggregation", "dp"),
    "fedgnn-pns": ("secure_aggregation", "dp"),
    # nFedGNN: DP on every latent a user sends; CNFGNN also on every weight a user uploads
    "nfedgnn": ("dp",),
    "cnfgnn": ("dp",),
}


class DPConfig(Settings):
    """Gaussian mechanism on what a client releases (FedAvg, FedAAS: its model update; the Swift family,
    FedAAS: each row it sums for another client; GLASU: each node's row of its representations): clip to
    ``max_norm`` (L2), add N(0, (noise_multiplier * max_norm)^2) to every coordinate (FedAAS's attention
    terms carry one more coordinate, see docs/privacy.md), from each party's own operating-system keyed
    stream; epsilon is reported at ``delta`` against the server (docs/privacy.md)."""

    noise_multiplier: float = Field(gt=0, description="noise standard deviation over max_norm")
    max_norm: float = Field(gt=0, description="L2 bound every client update (Swift, FedAAS, GLASU: every row sent) "
                                              "is clipped to")
    delta: float = Field(1e-5, gt=0, lt=1, description="the delta epsilon is reported at")
    replayable_noise: bool = Field(False, description=(
        "for tests only, not private: draw the noise from the run's seed (which the server holds) instead of "
        "each party's own operating-system keyed stream, so the same config gives the same noise"))

    def warning(self) -> str | None:
        """The line a run with replayable noise prints: its noise protects nothing."""
        if not self.replayable_noise:
            return None
        return ("privacy.dp.replayable_noise is on: the noise is derived from the seed in the config, so the "
                "server can regenerate and subtract it; this run is not private (the switch is for tests)")


class SecureAggregationConfig(Settings):
    """Secure aggregation with its dropout threshold (``secure_aggregation: true`` is this with the defaults)."""

    threshold: int | None = Field(None, ge=2, description=(
        "clients that must stay to the end of a secure sum for it to be unmasked (fewer stop the round); "
        "it must exceed (n + collusion) / 2 and collusion, n the round's clients; default: the smallest such"))
    collusion: int = Field(0, ge=0, description=(
        "clients that may collude with the server: the threshold must exceed (n + collusion) / 2 and collusion"))
    identities: Literal["pinned", "relayed"] = Field("pinned", description=(
        "pinned: every client pins the roster of identity keys it gets outside the server (the driver as it "
        "places the shards, or its shard file) and refuses any other; relayed: the server collects and relays "
        "the table (trust on first use: a server that substitutes it can unmask; for comparison only)"))
    roster: str | None = Field(None, description=(
        "a federation's own roster file (`fedgl keys roster`), pinned by `fedgl partition` instead of keys it "
        "makes; each organisation keeps its private key beside its shard (`fedgl keys new`)"))

    @model_validator(mode="after")
    def _pinned_roster(self) -> "SecureAggregationConfig":
        if self.roster is not None and self.identities != "pinned":
            raise ConfigError("privacy.secure_aggregation.roster is pinned by its clients: it needs identities: pinned")
        return self


class PrivacyConfig(Settings):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
    secure_aggregation: SecureAggregationConfig | bool = Field(False, union_mode="left_to_right", description=(
        "additive masks: the server sees only masked sums (Swift: not even those); true, or "
        "{threshold: t, collusion: c, identities: pinned | relayed, roster: path}"))
    dp: DPConfig | None = Field(None, description="differential privacy on model updates and exchanged "
                                                 "embeddings; null = off")
    record_messages: bool = Field(False, description=(
        "write every message's payload to <out>/messages/ so `fedgl audit` can attack what crossed"))

    def secure_settings(self) -> SecureAggregationConfig:
        """The secure-aggregation settings (``true`` gives the defaults)."""
        value = self.secure_aggregation
        return value if isinstance(value, SecureAggregationConfig) else SecureAggregationConfig()

    def secure_threshold(self, clients: int) -> int:
        """The threshold of a secure sum over ``clients``: the configured one, else the smallest that
        exceeds (clients + collusion) / 2 (and so the collusion, for any collusion below ``clients``)."""
        settings = self.secure_settings()
        return settings.threshold if settings.threshold is not None else (clients + settings.collusion) // 2 + 1

    def requested(self) -> list[str]:
        """The options this section turns on."""
        return [name for name, on in (("secure_aggregation", self.secure_aggregation), ("dp", self.dp)) if on]


def _supported_by_protocol(privacy: PrivacyConfig, info: ValidationInfo) -> PrivacyConfig:
    """Refuse options the run's protocol does not implement (the protocol section is validated first)."""
    protocol = info.data.get("protocol")
    if protocol is None:  # the protocol section itself was invalid and is reported instead
        return privacy
    name = str(protocol.get("name", "")).lower()
    missing = [option for option in privacy.requested() if option not in SUPPORTED.get(name, ())]
    if missing:
        offered = ", ".join(f"{p} ({', '.join(o)})" for p, o in SUPPORTED.items())
        raise ConfigError(f"privacy.{missing[0]}: protocol {name} does not implement it; supported: {offered}")
    return privacy


# The type of ``RunConfig.privacy``: it must be declared after ``protocol``.
PrivacySection = Annotated[PrivacyConfig, AfterValidator(_supported_by_protocol)]
