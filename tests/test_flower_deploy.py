"""A Flower federation on loopback: a SuperLink with TLS and SuperNode authentication and one
SuperNode per organisation, each a separate process holding one party's shard. Runs of FedAvg, GLASU,
nFedGNN, Swift-FedGNN and FedAvg with secure aggregation equal the in-process runs; every SuperNode's
processes open only their own shard file and nothing is unpickled anywhere (both seen by an audit hook
inside each process); an unregistered key is refused; a SuperNode killed in round 3 is handled as
on_client_failure says (stop, then resume from the checkpoint on the same federation; retry; skip);
SIGTERM to the supernode command leaves no SuperNode or party host behind. Each run takes minutes on
a loaded 2-core machine: Flower starts a process per message and an idle SuperNode polls every 3 s."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("flwr", reason="the Flower backend needs flwr (pip install 'fedgl[flower]')")

from fedgl.comm.flower_setup import certificates, node_key  # noqa: E402
from fedgl.config import build_config  # noqa: E402
from fedgl.deployment import write_shards  # noqa: E402
from fedgl.search import run  # noqa: E402
from tests.support.flower_federation import Federation, free_port  # noqa: E402

pytestmark = pytest.mark.slow
BASE = {"dataset": {"options": {"num_nodes": 150}}, "partition": {"num_clients": 3}, "train": {"rounds": 2},
        "network": {"compute": "ignore"}}
PROTOCOLS = {
    "fedavg": {"protocol": {"name": "fedavg", "group_size": 1}},
    "glasu": {"protocol": {"name": "glasu", "batches": 2}},
    "nfedgnn": {"protocol": {"name": "nfedgnn", "lam": 1.0}},
    "swift": {"protocol": {"name": "swift", "K": 2}},
    "fedavg-secure": {"protocol": {"name": "fedavg", "group_size": 1}, "privacy": {"secure_aggregation": True}},
}


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    fed = Federation(tmp_path_factory.mktemp("flower"))
    yield fed
    fed.close()


def prepared(fed: Federation, name: str, settings: dict) -> tuple[Path, dict]:
    """The shard folder and YAML config of a run, and the in-process run beside them."""
    folder = fed.root / name
    manifest = write_shards(build_config(settings), folder / "shards")
    run(build_config(settings), folder / "plain")
    (folder / "config.yaml").write_text(yaml.safe_dump({**settings, "backend": {
        **settings.get("backend", {}), "shards": str(folder / "shards")}}))
    return folder, manifest


def same_run(a: Path, b: Path) -> None:
    rows = [[{k: v for k, v in json.loads(line).items() if k != "wall_time_s"} for line in open(p / "metrics.jsonl")]
            for p in (a, b)]
    assert rows[0] == rows[1]
    assert (a / "ledger.jsonl").read_text() == (b / "ledger.jsonl").read_text()


def start_parties(fed: Federation, folder: Path, manifest: dict) -> dict[str, str]:
    """One SuperNode per party, organisation i hosting party i; party -> organisation."""
    orgs = {}
    for i, party in enumerate(manifest["parties"]):
        orgs[party["name"]] = f"org{i}"
        fed.start_node(f"org{i}", party["name"], folder / "shards" / party["file"])
    return orgs


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_run_on_the_federation_equals_the_in_process_run(protocol, federation):
    fed = federation
    folder, manifest = prepared(fed, protocol, {**BASE, **PROTOCOLS[protocol]})
    for org in ("org0", "org1", "org2"):
        (fed.root / f"audit-{org}.log").unlink(missing_ok=True)
    orgs = start_parties(fed, folder, manifest)
    try:
        assert fed.submit(folder / "config.yaml", folder / "flower").returncode == 0
    finally:
        for org in orgs.values():
            fed.stop(org)
    same_run(folder / "plain", folder / "flower")
    shards = {party["name"]: str((folder / "shards" / party["file"]).resolve()) for party in manifest["parties"]}
    for name, org in orgs.items():
        mine = {path for path in fed.opened(org) if path.startswith(str(folder.resolve()))}
        assert mine == {shards[name]}, f"{org} opened {mine}"
    assert not set(shards.values()) & fed.opened("superlink")  # the server never opens a party's shard
    assert not fed.unpickled()


def test_a_supernode_with_an_unregistered_key_is_refused(federation):
    fed = federation
    node_key(fed.root / "keys", "stranger")
    proc = fed.start_node("stranger", "client0", fed.root / "none.pt", "--rejoin-timeout", "0")
    try:
        assert proc.wait(timeout=300) != 0
    finally:
        fed.nodes.pop("stranger", None)
    assert "Failed to activate SuperNode" in (fed.root / "stranger.log").read_text()


FAULT = {**BASE, **PROTOCOLS["fedavg"], "train": {"rounds": 3}, "checkpoint_every": 1}


@pytest.mark.parametrize("policy", ["stop", "retry", "skip"])
def test_a_supernode_killed_in_round_3(policy, federation):
    fed = federation
    folder, manifest = prepared(fed, f"fault-{policy}", {**FAULT, "backend": {"on_client_failure": policy}})
    orgs = start_parties(fed, folder, manifest)
    out = folder / "flower"
    try:
        submitted = fed.submit(folder / "config.yaml", out, "--reply-timeout", "60", wait=False)
        deadline = time.monotonic() + 1200
        # round 2's checkpoint is committed once round 1's party folder is gone: round 3 is under way
        while not (out / "checkpoint.pt").exists() or (out / "parties-1").exists():
            assert time.monotonic() < deadline and submitted.poll() is None, "rounds 1-2 did not finish"
            time.sleep(0.2)
        fed.kill("org1")
        if policy == "retry":  # the organisation starts its SuperNode again; the party is made anew there
            fed.start_node("org1", "client1", folder / "shards" / "client1.pt")
        submitted.wait(timeout=1800)
        summary = json.loads((out / "summary.json").read_text())
        if policy == "stop":
            assert summary["finished"] is False and summary["rounds"] == 2
            fed.start_node("org1", "client1", folder / "shards" / "client1.pt")
            assert fed.submit(folder / "config.yaml", out, "--resume").returncode == 0
        if policy == "skip":
            assert [lost["party"] for lost in summary["lost_parties"]] == ["client1"]
            assert summary["lost_parties"][0]["round"] >= 3
            assert summary["rounds"] == 3
        else:  # from the last checkpoint, the run equals an uninterrupted one
            if policy == "retry":
                assert summary["retries"] == 1 and summary["finished"]
            same_run(folder / "plain", out)
    finally:
        for org in set(orgs.values()) & set(fed.nodes):
            fed.stop(org)


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds ``text``."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_sigterm_to_the_supernode_command_stops_its_party_host_and_supernode(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    certs = certificates(tmp_path / "certs", ["127.0.0.1"])
    key, _ = node_key(tmp_path / "keys", "org")
    state = tmp_path / "state"
    host, node = f"--socket\0{state / 'party.sock'}", f'fedgl-state="{state}"'  # in their command lines
    command = [sys.executable, "-m", "fedgl.comm.flower_setup", "supernode", "--party", "client0", "--shard",
               str(tmp_path / "client0.pt"), "--key", str(key), "--ca", str(certs["ca.crt"]),
               "--superlink", f"127.0.0.1:{free_port()}", "--port", str(free_port()), "--state", str(state)]
    wrapper = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (processes_naming(host) and processes_naming(node)):
        assert time.monotonic() < deadline and wrapper.poll() is None, "the host and SuperNode did not start"
        time.sleep(0.2)
    os.kill(wrapper.pid, signal.SIGTERM)
    assert wrapper.wait(timeout=60) != 0
    time.sleep(1.0)
    assert processes_naming(host) == []  # the party host is gone
    assert processes_naming(node) == []  # and so is the SuperNode
