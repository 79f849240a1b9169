"""Secure sums through the transport: the layer a protocol adds dropout-tolerant secure aggregation with.

Client side, ``SecureSumParty``: a mixin whose ``@rpc`` methods run one client's steps of Bonawitz et
al.'s protocol (``fedgl.privacy.bonawitz``); the protocol's client only builds ``self.secagg`` and,
before a sum, puts its fixed-point vector in ``self.secure_value``. Server side: ``trust_identities``
once at setup, then ``secure_sum`` for each sum. Every message is a ``transport.call_many`` to those
methods, so each is measured in the ledger: keys, signatures and shares as ``control``, the masked
vector as ``model`` (``gradient`` from a ``SecureGradientSumParty``).

Identities (``privacy.secure_aggregation.identities``): ``pinned`` (the default) gives every client
its identity and the roster of all clients' public keys as it is made, never through the server: the
driver deals them as it places the shards (``SecureSumParty.dealt``), or the client reads them from
its own shard (``fedgl partition``); the server then relays no table, and a client refuses any table
that differs from its roster. ``relayed`` is trust on first use through the server.

A client drops out of a step either because its party fails (``PartyFailure``: the step is sent again
to the others, who answer a repeated request with the reply they gave) or because the protocol says it
did not answer in time (``absent(step)`` names the parties it no longer waits for). Fewer than the
threshold at any step stops the round in one line, before any share is revealed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Collection

import torch
from torch import Tensor

from ..comm import Transport, rpc
from ..device import CPU
from ..errors import ConfigError, PartyFailure, RunFailed
from ..privacy.bonawitz import SecAggClient, as_bytes, unmask, valid_threshold
from ..privacy import PrivacyConfig
from ..privacy.identity import Identity, Roster, read_identity, read_roster
from ..privacy.secure_aggregation import MIN_PARTICIPANTS, decode, ring_sum

def check_secure_round(privacy: PrivacyConfig, count: int, who: str, source: str = "partition.num_clients") -> None:
    """Refuse at setup a secure sum over ``count`` clients that could not run or would not protect:
    fewer than 3 clients, a threshold above the count, or one at most (count + collusion) / 2 or at
    most the collusion (the server and its colluders could then unmask; the clients refuse it too);
    ``source``: the settings ``count`` comes from."""
    threshold, collusion = privacy.secure_threshold(count), privacy.secure_settings().collusion
    if count < MIN_PARTICIPANTS or threshold > count or not valid_threshold(threshold, count, collusion):
        raise ConfigError(f"{who}: privacy.secure_aggregation needs at least {MIN_PARTICIPANTS} clients per sum and "
                          f"a threshold above half of them plus the colluding clients, above the colluding clients "
                          f"and at most all, got threshold {threshold} for {count} clients with collusion "
                          f"{collusion} ({source})")


def pinned(privacy: Any) -> bool:
    """Whether clients made with these privacy settings pin their identity roster."""
    return isinstance(privacy, PrivacyConfig) and bool(privacy.secure_aggregation) and \
        privacy.secure_settings().identities == "pinned"


class SecureSumParty:
    """The secure-sum steps of a party holding one client's ``secagg`` state."""

    # identity and session keys, and the pinned roster (read again from where it came when the party
    # is made): never checkpointed
    secret_state = frozenset({"secagg", "roster"})

    secagg: SecAggClient | None
    secure_value: Tensor | None = None  # the int64 fixed-point vector the next sum takes from this client
    roster: Roster | None = None  # pinned: the only identity table this client trusts

    @classmethod
    def dealt(cls, configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Under pinned identities, each client's ``identity`` and everyone's ``roster`` added to its
        constructor arguments by the driver as it places the shards (not a message, so the server
        cannot alter it). The identities come from the OS; with a federation's ``roster`` file none is
        made here (each organisation holds its own key, read where its party is made from its shard)."""
        privacy = configs[0].get("privacy") if configs else None
        if not pinned(privacy):
            return configs
        indices = [c["index"] for c in configs]
        given = privacy.secure_settings().roster
        if given is not None:
            identities, roster = dict.fromkeys(indices), read_roster(given, len(configs))
        else:
            identities = {i: Identity.generate() for i in indices}
            roster = Roster.of([identities[i] for i in sorted(indices)])
        table = roster.table()
        private = {i: None if identity is None else identity.private for i, identity in identities.items()}
        return [{**c, "identity": private[c["index"]], "roster": table} for c in configs]

    @classmethod
    def create(cls, device: torch.device = CPU, identity: bytes | str | None = None, roster: Tensor | None = None,
               **kwargs: Any) -> Any:
        """The party, its client pinned to ``identity`` (its private key, or the path of its key file
        in a deployment) and ``roster`` when its privacy settings pin identities."""
        party = super().create(device, **kwargs)
        privacy = kwargs.get("privacy")
        if party.secagg is None or not isinstance(privacy, PrivacyConfig):
            return party
        party.secagg.collusion = privacy.secure_settings().collusion
        if pinned(privacy):
            party.pin(identity, roster)
        return party

    def pin(self, identity: bytes | str | None, roster: Tensor | None) -> None:
        """Take ``identity`` and trust ``roster`` alone, once the key is the roster's entry for this client."""
        index = self.secagg.index
        if roster is None:
            raise ConfigError(f"client {index}: privacy.secure_aggregation pins identities but its shard has no "
                              f"roster (written before rosters existed?); partition again")
        if identity is None:  # a federation's roster, in a simulation
            raise ConfigError(f"client {index}: privacy.secure_aggregation.roster names organisations' own keys, and "
                              f"a run in one process holds none of the organisations' keys: partition with it "
                              f"(`fedgl partition`) and run with backend.shards")
        own = read_identity(identity) if isinstance(identity, (str, Path)) else Identity(bytes(identity))
        pinned_roster = Roster.from_table(roster)
        pinned_roster.check_own(index, own)
        self.secagg.identity, self.secagg.peers, self.roster = own, list(pinned_roster.keys), pinned_roster

    @rpc(returns="control")
    def secagg_identity(self) -> Tensor:
        return torch.frombuffer(bytearray(self.secagg.identity.public()), dtype=torch.uint8)

    @rpc(table="control")
    def secagg_trust(self, table: Tensor) -> None:
        if self.roster is not None:  # pinned: the server's table can only repeat the roster
            self.roster.check_relayed(self.secagg.index, table)
        self.secagg.trust(table)

    @rpc(label="control", returns="control")
    def secagg_advertise(self, label: int) -> Tensor:
        return self.secagg.advertise(label)

    @rpc(label="control", ids="control", keys="control", threshold="control", returns="control")
    def secagg_share(self, label: int, ids: Tensor, keys: Tensor, threshold: int) -> Tensor:
        return self.secagg.share_keys(label, ids, keys, threshold)

    @rpc(label="control", senders="control", sealed="control", returns="model")
    def secagg_input(self, label: int, senders: Tensor, sealed: Tensor) -> Tensor:
        if self.secure_value is None:
            raise RunFailed(f"secure aggregation: client {self.secagg.index} has no value to sum")
        return self.secagg.masked_input(label, self.secure_value, senders, sealed)

    @rpc(label="control", survivors="control", returns="control")
    def secagg_consent(self, label: int, survivors: Tensor) -> Tensor:
        return self.secagg.consent(label, survivors)

    @rpc(label="control", signers="control", signatures="control", survived="control", dropped="control",
         returns="control")
    def secagg_reveal(self, label: int, signers: Tensor, signatures: Tensor, survived: Tensor,
                      dropped: Tensor) -> Tensor:
        self.secure_value = None
        return self.secagg.reveal(label, signers, signatures, survived, dropped)


class SecureGradientSumParty(SecureSumParty):
    """``SecureSumParty`` for a sum of gradients: the masked vector travels as kind ``gradient``."""

    @rpc(label="control", senders="control", sealed="control", returns="gradient")
    def secagg_input(self, label: int, senders: Tensor, sealed: Tensor) -> Tensor:
        return super().secagg_input(label, senders, sealed)


def trust_identities(transport: Transport, parties: list[str], privacy: PrivacyConfig | None = None) -> None:
    """Under ``identities: relayed`` (or without ``privacy``), every client's identity key relayed
    once to all (the table each later trusts as authentic); under ``pinned`` nothing: each client
    already holds the roster it trusts."""
    if pinned(privacy):
        return
    table = torch.stack(transport.call_many(parties, "secagg_identity"))
    transport.call_many(parties, "secagg_trust", table=table)


class _Round:
    """The server's view of one secure sum: who is still in, and each step's replies by client id."""

    def __init__(self, transport: Transport, parties: dict[int, str], threshold: int,
                 absent: Callable[[str], Collection[str]] | None):
        self.transport, self.parties, self.threshold, self.absent = transport, parties, threshold, absent

    def step(self, step: str, clients: list[int], method: str, per_id: Callable[[int], dict] | None = None,
             **shared) -> dict[int, Tensor]:
        """``method`` on the ``clients`` not absent from ``step``, again without those whose party
        fails; refuses to go on with fewer than the threshold."""
        gone = set(self.absent(step)) if self.absent is not None else set()
        ids = [i for i in clients if self.parties[i] not in gone]
        while True:
            self.enough(ids, step)
            try:
                replies = self.transport.call_many([self.parties[i] for i in ids], method,
                                                   per_target=[per_id(i) for i in ids] if per_id else None, **shared)
            except PartyFailure as failure:
                ids = [i for i in ids if self.parties[i] not in failure.parties]
                continue
            return dict(zip(ids, replies))

    def enough(self, ids: list[int], step: str) -> None:
        if len(ids) < self.threshold:
            raise RunFailed(f"secure aggregation: {len(ids)} of {len(self.parties)} clients left at the {step} "
                            f"step, fewer than the threshold {self.threshold}; the round stops with nothing "
                            f"revealed")


def secure_sum(transport: Transport, parties: list[str], ids: list[int], label: int, threshold: int,
               absent: Callable[[str], Collection[str]] | None = None) -> tuple[Tensor, list[int]]:
    """The decoded (float64) sum of the ``secure_value`` of the clients ``ids`` (party ``parties[k]``
    holds client ``ids[k]``) that stay to the end, and those clients' ids; ``label`` a round index
    never used before; ``absent(step)``: the parties that do not answer ``step``."""
    r = _Round(transport, dict(zip(ids, parties)), threshold, absent)
    ids = sorted(ids)
    keys = r.step("advertise", ids, "secagg_advertise", label=label)
    u1 = list(keys)
    sealed = r.step("share", u1, "secagg_share", label=label, ids=torch.tensor(u1),
                    keys=torch.stack([keys[i] for i in u1]), threshold=threshold)
    u2 = list(sealed)
    row = {i: {j: k for k, j in enumerate(j for j in u1 if j != i)} for i in u2}  # i's row for j

    def routed(j: int) -> dict:
        return {"senders": torch.tensor(u2), "sealed": torch.stack([sealed[i][row[i][j]] for i in u2 if i != j])}

    masked = r.step("input", u2, "secagg_input", per_id=routed, label=label)
    u3 = list(masked)
    signed = r.step("consent", u3, "secagg_consent", label=label, survivors=torch.tensor(u3))
    signers = list(signed)
    dropped = [j for j in u2 if j not in masked]
    shares = r.step("reveal", signers, "secagg_reveal", label=label, signers=torch.tensor(signers),
                    signatures=torch.stack([signed[i] for i in signers]), survived=torch.tensor(u3),
                    dropped=torch.tensor(dropped, dtype=torch.int64))
    revealers = list(shares)[:threshold]
    c_public = {i: as_bytes(keys[i][:32]) for i in u1}
    total = unmask(ring_sum(torch.stack([masked[i] for i in u3])), label, revealers,
                   [shares[i] for i in revealers], u3, dropped, c_public)
    return decode(total), u3
