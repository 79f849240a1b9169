"""Deployment: every party loads only its own shard, where it runs.

``fedgl partition`` (``write_shards``) runs a protocol's partitioning once, where the data is, and
writes into one folder:

- ``<party>.pt`` per party: exactly what the party is made with (its shard and its settings);
- ``server.pt``: the server's own state after set-up (e.g. the node -> owner map it routes by);
- ``evaluator.pt``: the ground truth of the scoring harness, which sits outside every party;
- ``manifest.json``: public facts (protocol, config hash, feature and class counts, party names,
  classes, files and their SHA-256);
- with secure aggregation's pinned identities, ``<party>/identity.key`` (the client's private key,
  readable by its owner only, in its own folder, never in a shard file) and ``roster.json`` (every
  client's public key; the same roster is inside each client's file, which is what the client pins).

A run with ``backend.shards`` set loads no dataset in the driver: the protocol builds its modules from
the manifest's public facts (``Protocol.build``) and loads the server's state; each party host loads its
own file on the node it is pinned to (``backend.parties.<name>``); scoring runs where
``evaluator.pt`` is. All files hold tensors and plain data only (``party_state``); each is read once,
checked against the manifest's SHA-256 and loaded from the bytes checked, with
``torch.load(weights_only=True)`` (``comm/shard_file.py``).
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import torch
from torch_geometric.data import Data

from .comm import Transport
from .comm.party import Party
from .comm.party_state import TAG, first_line, own_class, plain, restore
from .comm.shard_file import EVALUATOR_PARTY, read_shard_file
from .config import RunConfig
from .errors import ConfigError
from .evaluation import check_scored
from .files import write_atomically
from .privacy.identity import KEY_FILE, Identity, Roster
from .protocols import protocol_class

FORMAT = "fedgl-shards-1"
MANIFEST, SERVER, EVALUATOR, ROSTER = "manifest.json", "server.pt", "evaluator.pt", "roster.json"
PROTOCOL_OWN = ("cfg", "opts", "transport", "device")  # what a protocol object gets from its config


class ShardWriter(Transport):
    """A transport that makes no parties: it keeps what each would be made with, to write to disk."""

    backend = "partition"

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[str, type[Party], dict[str, Any]]] = []

    def _create(self, name: str, cls: type[Party], kwargs: dict[str, Any]) -> None:
        self.made.append((name, cls, kwargs))

    def _execute(self, calls):
        raise ConfigError("this protocol talks to its parties while it sets up; its shards cannot be written ahead")


def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _save(path: Path, value: Any) -> str:
    """Write ``value`` to ``path``; returns the SHA-256 of the bytes written."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    data = buffer.getvalue()
    write_atomically(path, lambda fh: fh.write(data), private=True)  # a party's data: its owner's alone
    return hashlib.sha256(data).hexdigest()


def public_facts(data: Data) -> dict[str, int]:
    """What the server may know of the dataset before anything is exchanged."""
    return {"num_nodes": int(data.num_nodes), "num_features": int(data.num_features),
            "num_classes": int(data.num_classes)}


def server_state(protocol: Any) -> dict[str, Any]:
    """The server's attributes after set-up, as tensors and plain data (the transport stays out)."""
    return plain({k: v for k, v in vars(protocol).items() if k not in PROTOCOL_OWN}, skip=(Transport,))


def write_shards(cfg: RunConfig, out: Path, data: Data | None = None) -> dict[str, Any]:
    """Partition as a run of ``cfg`` would and write the shard folder ``out``; returns the manifest."""
    from .config.candidates import candidates
    from .config.identity import config_hash
    from .data import load_data

    if protocol_class(cfg.protocol_name).scenario == "central":
        raise ConfigError(f"protocol {cfg.protocol_name} has no parties: there is nothing to partition")
    if cfg.privacy.dp is not None and cfg.privacy.dp.replayable_noise:
        raise ConfigError("privacy.dp.replayable_noise is a test switch (noise anyone with the config regenerates): "
                          "shards for parties that keep their data are not written with it")
    torch.manual_seed(cfg.seed)  # as a run does before it loads the data and sets up
    data = data if data is not None else load_data(cfg)
    check_scored(data)  # the evaluator's file would be refused where it is loaded, after training began
    cfg = cfg.model_copy(update={"device": "cpu"})  # shards are written on the CPU: no GPU needed here
    writer = ShardWriter()
    protocol = protocol_class(cfg.protocol_name)(cfg, writer)
    protocol.setup(data)
    rng = torch.get_rng_state()  # the driver's RNG as set-up leaves it, which a deployed server resumes from
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"the shard folder {out} cannot be written: {err.strerror or err}") from None
    parties, rosters = [], []
    for name, cls, kwargs in writer.made:
        kwargs, entry = _own_identity(out, name, kwargs), {}
        if "roster" in kwargs:
            rosters.append(kwargs["roster"])
            entry = {"identity": f"{name}/{KEY_FILE}"}
        digest = _save(out / f"{name}.pt", plain({"class": class_path(cls), "kwargs": kwargs}, configs=True))
        parties.append({"name": name, "class": class_path(cls), "file": f"{name}.pt", "sha256": digest, **entry})
    state = server_state(protocol)
    facts = public_facts(data)
    _check_buildable(cfg, facts, state)
    server = {"attributes": state, "rng": rng}
    truth = {"x": data.x, "y": data.y, "edge_index": data.edge_index, "num_classes": facts["num_classes"],
             **{f"{s}_mask": getattr(data, f"{s}_mask") for s in ("train", "val", "test")}}
    manifest = {
        "format": FORMAT,
        "protocol": cfg.protocol_name,
        "dataset": cfg.dataset.name.lower(),
        "config_hash": config_hash(cfg),
        **({"candidate_hashes": hashes} if (hashes := [config_hash(c) for _, c in candidates(cfg)]) else {}),
        **facts,
        "parties": parties,
        "server": {"file": SERVER, "sha256": _save(out / SERVER, server)},
        "evaluator": {"file": EVALUATOR, "sha256": _save(out / EVALUATOR, truth)},
        **({"roster": _write_roster(out, rosters[0])} if rosters else {}),
    }
    write_atomically(out / MANIFEST, lambda fh: fh.write(json.dumps(manifest, indent=1).encode()))
    return manifest


def _own_identity(out: Path, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A client's dealt private key written to its own folder ``<name>/identity.key`` (owner-only)
    instead of its shard file, which names the file (read beside the shard where the party is made).
    With a federation's roster nothing is dealt: the organisation puts its own key there."""
    if "roster" not in kwargs:
        return kwargs
    if kwargs.get("identity") is not None:
        Identity(kwargs["identity"]).write(out / name, replace=True)
    return {**kwargs, "identity": KEY_FILE}


def _write_roster(out: Path, table: torch.Tensor) -> dict[str, str]:
    """``roster.json``, the public roster every client's shard pins, and its manifest entry."""
    data = Roster.from_table(table).write(out / ROSTER)
    return {"file": ROSTER, "sha256": hashlib.sha256(data).hexdigest()}


def _check_buildable(cfg: RunConfig, facts: dict[str, int], state: dict[str, Any]) -> None:
    """Every module or optimiser of the server must come from ``Protocol.build``: the deployed server
    loads their state into what build makes, as nothing in a shard file can make one."""
    template = protocol_class(cfg.protocol_name)(cfg, ShardWriter())
    template.build(facts["num_features"], facts["num_classes"])
    missing = [k for k, v in state.items()
               if isinstance(v, dict) and v.get(TAG) == "state_dict" and getattr(template, k, None) is None]
    if missing:
        raise RuntimeError(f"{type(template).__name__}.build does not make {', '.join(missing)}")


def read_manifest(folder: Path, cfg: RunConfig) -> dict[str, Any]:
    """The shard folder's manifest, which must come from this config (up to where and how it runs)."""
    from .config.identity import config_hashes

    path = folder / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"backend.shards: {folder} has no {MANIFEST}; write it with `fedgl partition`") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"backend.shards: {path} is not a readable manifest ({type(err).__name__})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not all(
            isinstance(f, dict) and {"file", "sha256"} <= set(f)
            for f in [manifest.get("server"), manifest.get("evaluator"), *manifest.get("parties", [])]):
        raise ConfigError(f"backend.shards: {path} is not a fedgl shard manifest")  # every file needs its digest
    made_for = {manifest["config_hash"], *manifest.get("candidate_hashes", [])}  # a search's: each of its runs
    if not made_for & config_hashes(cfg):
        raise ConfigError(f"backend.shards: {folder} was partitioned with another config "
                          f"(protocol {manifest['protocol']} on {manifest['dataset']}); partition again with this one")
    return manifest


def shard_path(cfg: RunConfig, name: str, file: str) -> str:
    """Where party ``name`` reads its file on its own node (``backend.parties.<name>.data``)."""
    placement = cfg.backend.parties.get(name)
    if placement is not None and placement.data:
        return placement.data
    return str(Path(cfg.backend.shards or ".").resolve() / file)


def deploy(cfg: RunConfig, transport: Transport) -> tuple[Any, Any]:
    """The server (a protocol with its state loaded) and the scoring harness of a run over
    ``backend.shards``; every party is made from its own file where it lives."""
    folder = Path(cfg.backend.shards or "")
    manifest = read_manifest(folder, cfg)
    check_placements(cfg.backend.parties, [party["name"] for party in manifest["parties"]])
    protocol = protocol_class(cfg.protocol_name)(cfg, transport)
    protocol.build(manifest["num_features"], manifest["num_classes"])
    server = read_shard_file(folder / manifest["server"]["file"], "server state", manifest["server"]["sha256"])
    try:
        for key, value in server["attributes"].items():
            setattr(protocol, key, restore(getattr(protocol, key, None), value))
        protocol.place()
        torch.set_rng_state(server["rng"])
    except (RuntimeError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"backend.shards: {folder / SERVER} does not fit {cfg.protocol_name} "
                          f"({first_line(err)})") from None
    for party in manifest["parties"]:
        transport.spawn_from_file(party["name"], own_class(party["class"]), party["class"],
                                  shard_path(cfg, party["name"], party["file"]), party["sha256"])
    evaluator = transport.evaluator_from_file(shard_path(cfg, EVALUATOR_PARTY, manifest["evaluator"]["file"]),
                                              manifest["evaluator"]["sha256"])
    return protocol, evaluator


def check_placements(placements: dict[str, Any], parties: list[str]) -> None:
    """``backend.parties`` may name only the run's parties and the scoring harness: a misspelt name
    would silently leave its party unpinned."""
    unknown = sorted(set(placements) - set(parties) - {EVALUATOR_PARTY})
    if unknown:
        raise ConfigError(f"backend.parties: this run has no party {', '.join(unknown)}; it has "
                          f"{', '.join([*parties, EVALUATOR_PARTY])}")
