"""Identity keys pinned outside the server, and the threshold against a server with colluding clients.

The attack: a server that relays the identity table puts its own key in client 0's row, then signs
round keys as client 0, and the other clients seal their shares for "client 0" to the server. Pinned
clients refuse the substituted table (and the forged keys); with ``identities: relayed`` the same
attack goes through and the server opens a share meant for client 0, so the tests can fail.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from fedgl.cli import main
from fedgl.config import build_config
from fedgl.config.identity import ADDED_KEYS, config_hash, flat_config, resumable_change
from fedgl.deployment import write_shards
from fedgl.errors import ConfigError, RunFailed
from fedgl.privacy import bonawitz, shamir
from fedgl.privacy.bonawitz import as_bytes, keys_message
from fedgl.privacy.identity import Identity, Roster, read_identity
from fedgl.privacy.masks import KeyPair, derive
from fedgl.protocols.aggregation import check_secure_round
from fedgl.runner import Run

from support.configs import tiny
from support.stored import files_holding

LABEL = 99  # a round index no run below uses


def secure(tmp_path: Path, name: str, sa: dict | bool = True, **top) -> Run:
    """A tiny secure FedAvg federation of 3 clients, set up (keys in place) and not trained."""
    return Run(build_config(tiny("fedavg-secure", privacy={"secure_aggregation": sa}, **top)), tmp_path / name)


def identities(job: Run) -> dict[str, bytes]:
    """Every client's private identity key, read from the live parties of this process."""
    return {name: state["secagg"].identity.private for name, state in job.transport.snapshot().items()}


def relayed_rows(job: Run) -> list[dict]:
    return [r for r in job.transport.ledger.rows() if r["method"] in ("secagg_identity", "secagg_trust")]


def impersonate(job: Run, whole_table: bool = False) -> bytes:
    """The server's attack on client 0: relay a table with its own key in client 0's row (or a table
    of its own keys, re-signing every client's round keys), sign round keys as client 0 and open the
    share client 1 seals for client 0. Returns the opened share; raises where a client refuses."""
    names, transport = job.protocol.clients, job.transport
    forged = {j: Identity.generate() for j in (range(len(names)) if whole_table else [0])}
    table = torch.stack(transport.call_many(names, "secagg_identity"))
    for j, identity in forged.items():
        table[j] = torch.frombuffer(bytearray(identity.public()), dtype=torch.uint8)
    transport.call_many(names, "secagg_trust", table=table)
    keys = torch.stack(transport.call_many(names, "secagg_advertise", label=LABEL))
    server_c, server_s = KeyPair.generate(), KeyPair.generate()
    keys[0, :64] = torch.frombuffer(bytearray(server_c.public() + server_s.public()), dtype=torch.uint8)
    for j, identity in forged.items():  # the round keys as the forged table says client j signed them
        c_pub, s_pub = as_bytes(keys[j, :32]), as_bytes(keys[j, 32:64])
        keys[j, 64:] = torch.frombuffer(bytearray(identity.sign(keys_message(LABEL, j, c_pub, s_pub))),
                                        dtype=torch.uint8)
    sealed = transport.call_many(names[1:], "secagg_share", label=LABEL, ids=torch.tensor([0, 1, 2]), keys=keys,
                                 threshold=2)
    row = as_bytes(sealed[0][0])  # client 1's shares sealed for "client 0"
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    key = derive(server_s.shared(as_bytes(keys[1, 32:64])), b"fedgl secagg share key", LABEL)
    return ChaCha20Poly1305(key).decrypt(row[:bonawitz.NONCE], row[bonawitz.NONCE:], bonawitz._ids([LABEL, 1, 0]))


# ---- key substitution --------------------------------------------------------------------------------
@pytest.mark.parametrize("whole_table", [False, True])
def test_a_substituted_identity_table_is_refused_when_pinned_and_opens_shares_when_relayed(tmp_path, whole_table):
    pinned = secure(tmp_path, "pinned")
    assert relayed_rows(pinned) == []  # pinned: the server relays no table at all
    with pytest.raises(RunFailed, match=r"^secure aggregation: client [0-9] refuses: the identity table the server "
                                        r"relayed differs from its pinned roster \(client 0's key substituted\)$"):
        impersonate(pinned, whole_table)
    relayed = secure(tmp_path, "relayed", {"identities": "relayed"})
    assert {r["method"] for r in relayed_rows(relayed)} == {"secagg_identity", "secagg_trust"}
    opened = impersonate(relayed, whole_table)  # trust on first use: the server now reads client 1's shares
    assert len(opened) == 2 * shamir.SHARE_BYTES


def test_pinned_clients_take_their_roster_repeated_and_refuse_keys_signed_by_another(tmp_path):
    job = secure(tmp_path, "pinned")
    names, transport = job.protocol.clients, job.transport
    roster = torch.stack(transport.call_many(names, "secagg_identity"))
    transport.call_many(names, "secagg_trust", table=roster)  # the roster itself: nothing changes
    server_id, pair = Identity.generate(), KeyPair.generate()
    keys = torch.stack(transport.call_many(names, "secagg_advertise", label=LABEL))
    keys[0] = torch.frombuffer(bytearray(pair.public() * 2 + server_id.sign(
        keys_message(LABEL, 0, pair.public(), pair.public()))), dtype=torch.uint8)
    with pytest.raises(RunFailed, match="client 1 refuses: client 0's round keys do not carry its signature"):
        transport.call_many(names[1:2], "secagg_share", label=LABEL, ids=torch.tensor([0, 1, 2]), keys=keys,
                            threshold=2)


# ---- deployment: keys in the parties' own folders ------------------------------------------------------
def test_partition_writes_each_identity_owner_only_into_its_own_folder(tmp_path):
    cfg = build_config(tiny("fedavg-secure"))
    manifest = write_shards(cfg, tmp_path / "shards")
    shards = tmp_path / "shards"
    roster = json.loads((shards / "roster.json").read_text())["keys"]
    assert manifest["roster"]["sha256"] == hashlib.sha256((shards / "roster.json").read_bytes()).hexdigest()
    for i, party in enumerate(manifest["parties"]):
        key_file = shards / party["identity"]
        assert key_file.parent == shards / party["name"] and key_file.stat().st_mode & 0o777 == 0o600
        assert key_file.parent.stat().st_mode & 0o777 == 0o700
        identity = read_identity(key_file)
        assert identity.public().hex() == roster[i]
        others = [p for p in shards.rglob("*") if p.is_file() and p != key_file]
        assert [p for p in others if identity.private in p.read_bytes()
                or key_file.read_bytes() in p.read_bytes()] == []  # not in any shard, manifest or other folder
    key_file.chmod(0o644)
    with pytest.raises(ConfigError, match=r"identity key .*client2/identity.key is readable by others"):
        read_identity(key_file)


def test_a_swapped_identity_file_is_refused_in_one_line(tmp_path, capsys):
    write_shards(build_config(tiny("fedavg-secure")), tmp_path / "shards")
    key = tmp_path / "shards" / "client0" / "identity.key"
    key.unlink()
    shutil.copy2(tmp_path / "shards" / "client1" / "identity.key", key)
    settings = tiny("fedavg-secure", backend={"shards": str(tmp_path / "shards")})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(settings))
    code = main(["run", str(tmp_path / "run.yaml"), "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "client 0's identity key is not the roster's key for client 0" in err


def test_a_resumed_deployed_run_keeps_its_identities_relays_nothing_and_writes_no_key(tmp_path):
    settings = tiny("fedavg-secure", backend={"shards": str(tmp_path / "shards")})
    write_shards(build_config(tiny("fedavg-secure")), tmp_path / "shards")
    on_disk = {f"client{i}": read_identity(tmp_path / "shards" / f"client{i}" / "identity.key").private
               for i in range(3)}
    first = Run(build_config({**settings, "train": {"rounds": 1}, "checkpoint_every": 1}), tmp_path / "run")
    first.execute(progress=False)
    second = Run(build_config({**settings, "checkpoint_every": 1}), tmp_path / "run")
    assert second.resume()
    second.execute(progress=False)
    assert identities(first) == identities(second) == on_disk  # pinned from its file: the same after a resume
    assert relayed_rows(first) == relayed_rows(second) == []
    assert any((tmp_path / "run").glob("parties-*/client0.pt"))
    assert files_holding(tmp_path / "run", list(on_disk.values())) == []


def test_a_simulated_run_with_checkpoints_writes_no_identity_key(tmp_path):
    job = secure(tmp_path, "run", checkpoint_every=1)
    job.execute(progress=False)
    keys = list(identities(job).values())
    assert len(set(keys)) == 3 and relayed_rows(job) == []
    assert any((tmp_path / "run").glob("parties-*/client0.pt"))
    assert files_holding(tmp_path / "run", keys) == []


def test_an_organisation_brings_its_own_key_and_the_federation_its_roster(tmp_path, capsys):
    shards = tmp_path / "shards"
    for i in range(3):  # each organisation, on its own node, beside where its shard will be
        assert main(["keys", "new", "--out", str(shards / f"client{i}")]) == 0
    assert main(["keys", "roster", *(str(shards / f"client{i}" / "identity.pub") for i in range(3)),
                 "--out", str(tmp_path / "roster.json")]) == 0
    own = {f"client{i}": read_identity(shards / f"client{i}" / "identity.key").private for i in range(3)}
    settings = tiny("fedavg-secure", privacy={"secure_aggregation": {"roster": str(tmp_path / "roster.json")}})
    write_shards(build_config(settings), shards)
    assert {f"client{i}": read_identity(shards / f"client{i}" / "identity.key").private for i in range(3)} == own
    assert (shards / "roster.json").read_bytes() == (tmp_path / "roster.json").read_bytes()
    job = Run(build_config({**settings, "backend": {"shards": str(shards)}}), tmp_path / "run")
    assert identities(job) == own
    assert job.execute(progress=False).summary["finished"]
    assert main(["keys", "new", "--out", str(shards / "client0")]) == 2  # a key is never overwritten
    assert "exists" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"identity key .*client1/identity.key cannot be read .*fedgl keys new"):
        (shards / "client1" / "identity.key").unlink()
        Run(build_config({**settings, "backend": {"shards": str(shards)}}), tmp_path / "again")
    with pytest.raises(ConfigError, match="has 3 keys; this federation has 4 clients"):
        write_shards(build_config({**settings, "partition": {"num_clients": 4}}), tmp_path / "four")
    with pytest.raises(ConfigError, match="a run in one process holds none of the organisations' keys"):
        Run(build_config(settings), tmp_path / "simulated")


# ---- collusion ----------------------------------------------------------------------------------------
def privacy(sa: dict):
    return build_config({"dataset": {"name": "synthetic"}, "protocol": {"name": "fedavg"},
                         "privacy": {"secure_aggregation": sa}}).privacy


@pytest.mark.parametrize("n, c, refused, accepted", [(10, 0, 5, 6), (10, 3, 6, 7), (10, 4, 7, 8), (10, 9, 9, 10),
                                                     (3, 1, 2, 3)])
def test_the_threshold_must_exceed_half_of_the_clients_plus_the_colluding_ones(n, c, refused, accepted):
    assert privacy({"collusion": c}).secure_threshold(n) == accepted  # the default: the smallest valid one
    check_secure_round(privacy({"collusion": c}), n, "fedavg")
    check_secure_round(privacy({"collusion": c, "threshold": accepted}), n, "fedavg")
    with pytest.raises(ConfigError, match=rf"^fedavg: .* got threshold {refused} for {n} clients with collusion {c} "):
        check_secure_round(privacy({"collusion": c, "threshold": refused}), n, "fedavg")


def test_as_many_colluders_as_clients_is_refused():
    with pytest.raises(ConfigError, match="got threshold 11 for 10 clients with collusion 10"):
        check_secure_round(privacy({"collusion": 10}), 10, "fedavg")
    with pytest.raises(ConfigError, match="collusion: Input should be greater than or equal to 0"):
        privacy({"collusion": -1})


def test_a_client_refuses_a_threshold_its_collusion_setting_rules_out(tmp_path):
    """The server asks clients made with collusion 1 for a 2-of-3 sum: each refuses on its own."""
    job = secure(tmp_path, "run", {"collusion": 1})
    names, transport = job.protocol.clients, job.transport
    keys = torch.stack(transport.call_many(names, "secagg_advertise", label=LABEL))
    with pytest.raises(RunFailed, match=r"refuses: a threshold of 2 for 3 clients \(it must exceed half of them "
                                        r"plus the 1 that may collude"):
        transport.call_many(names, "secagg_share", label=LABEL, ids=torch.tensor([0, 1, 2]), keys=keys, threshold=2)
    transport.call_many(names, "secagg_share", label=LABEL, ids=torch.tensor([0, 1, 2]), keys=keys, threshold=3)


# ---- settings -----------------------------------------------------------------------------------------
def test_the_new_settings_keep_existing_config_hashes_where_they_compute_the_same():
    """A secure config with the relayed table (what older runs did) hashes as before the keys existed; at
    the pinned default it does not, since its ledger no longer has the relay (so bench reuses no old run)."""
    def hashes(sa):
        cfg = build_config({"dataset": {"name": "synthetic"}, "protocol": {"name": "fedavg"},
                            "privacy": {"secure_aggregation": sa}})
        older = {k: v for k, v in flat_config(cfg).items() if k not in ADDED_KEYS and not resumable_change(k)}
        return config_hash(cfg), hashlib.sha256(json.dumps(older, sort_keys=True).encode()).hexdigest()[:16]

    for sa in ({"threshold": 5, "identities": "relayed"}, {"identities": "relayed"}):
        now, before = hashes(sa)
        assert now == before
    now, before = hashes({"threshold": 5})
    assert now != before
    base = {"dataset": {"name": "synthetic"}, "protocol": {"name": "fedavg"}}
    hashes = {config_hash(build_config({**base, "privacy": {"secure_aggregation": sa}}))
              for sa in ({}, {"collusion": 1}, {"identities": "relayed"}, {"roster": "r.json"})}
    assert len(hashes) == 4
    with pytest.raises(ConfigError, match="roster is pinned by its clients: it needs identities: pinned"):
        privacy({"roster": "r.json", "identities": "relayed"})


def test_roster_round_trip_and_check():
    ids = [Identity.generate() for _ in range(3)]
    roster = Roster.of(ids)
    assert Roster.from_table(roster.table()) == roster
    roster.check_own(1, ids[1])
    with pytest.raises(ConfigError, match="client 1's identity key is not the roster's key for client 1"):
        roster.check_own(1, ids[2])
    with pytest.raises(RunFailed, match=r"client 2 refuses: .* \(its size substituted\)"):
        roster.check_relayed(2, torch.cat([roster.table(), roster.table()[:1]]))  # one row too many
    with pytest.raises(RunFailed, match=r"client 0 refuses: .* \(client 2's key substituted\)"):
        roster.check_relayed(0, roster.table()[:2])
