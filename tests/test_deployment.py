"""Deployment: `fedgl partition` writes one file per party, each party loads only its own, and the
driver holds the manifest and the server's state. In process and on a two-node Ray cluster on
loopback, a deployed run equals the run that loads everything in one process."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedgl.cli import main
from fedgl.comm.shard_file import load_party
from fedgl.config import build_config
from fedgl.deployment import MANIFEST, write_shards
from fedgl.errors import ConfigError
from fedgl.search import run

BASE = {"dataset": {"options": {"num_nodes": 150}}, "partition": {"num_clients": 3}, "train": {"rounds": 2},
        "network": {"compute": "ignore"}}
PROTOCOLS = {  # every protocol with parties
    "fedavg": {"protocol": {"name": "fedavg", "group_size": 1}},
    "glasu": {"protocol": {"name": "glasu", "batches": 4}},
    "nfedgnn": {"protocol": {"name": "nfedgnn", "lam": 1.0}},
    "cnfgnn": {"protocol": {"name": "cnfgnn"}},
    "swift": {"protocol": {"name": "swift", "K": 2}},
    "fedgnn-pns": {"protocol": {"name": "fedgnn-pns"}},
    "llcg": {"protocol": {"name": "llcg", "local_steps": 1}, "model": {"name": "sage"}},
    "fedaas": {"protocol": {"name": "fedaas", "interval_loss": "train", "batches": 4}},
}
TIMES = ("wall_time_s",)


def settings(protocol: str, **backend) -> dict:
    return {**BASE, **PROTOCOLS[protocol], "backend": backend} if backend else {**BASE, **PROTOCOLS[protocol]}


def same_run(a: Path, b: Path) -> None:
    """Metrics (all but wall time) and ledger rows equal."""
    rows = [[{k: v for k, v in json.loads(line).items() if k not in TIMES} for line in open(p / "metrics.jsonl")]
            for p in (a, b)]
    assert rows[0] == rows[1]
    assert (a / "ledger.jsonl").read_text() == (b / "ledger.jsonl").read_text()


def forbid_dataset(monkeypatch) -> None:
    """From here on, loading the dataset fails the test: a deployed driver must never do it."""
    import fedgl.runner

    monkeypatch.setattr(fedgl.runner, "load_data", lambda *a, **k: pytest.fail("the driver loaded the dataset"))


@pytest.mark.parametrize("protocol", ["nfedgnn", "swift"])
def test_shards_written_without_a_gpu_run_deployed_on_one(protocol, tmp_path, monkeypatch):
    """``fedgl partition`` of a ``device: cuda`` config needs no GPU; the deployed run on the device
    (the stand-in accelerator) equals the in-process CPU run."""
    from support.fake_device import fake_accelerator

    plain_cfg = build_config(settings(protocol))
    run(plain_cfg, tmp_path / "plain")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    write_shards(build_config({**settings(protocol), "device": "cuda"}), tmp_path / "shards")
    forbid_dataset(monkeypatch)
    with fake_accelerator(monkeypatch):
        run(build_config({**settings(protocol, shards=str(tmp_path / "shards")), "device": "cuda"}),
            tmp_path / "deployed")
    same_run(tmp_path / "plain", tmp_path / "deployed")


def test_partition_command_and_one_line_errors(tmp_path, capsys, monkeypatch):
    shards = tmp_path / "shards"
    assert main(["partition", "--set", "partition.num_clients=3", "--set", "protocol.group_size=1",
                 "--out", str(shards)]) == 0
    assert "3 party shards" in capsys.readouterr().out
    assert main(["partition", "--set", "protocol.name=centralized", "--out", str(tmp_path / "c")]) == 2
    assert "no parties" in capsys.readouterr().err
    forbid_dataset(monkeypatch)
    # another config: refused, naming the folder
    assert main(["run", "--set", "partition.num_clients=4", "--set", f"backend.shards={shards}", "--quiet",
                 "--out", str(tmp_path / "r1")]) == 2
    assert "partitioned with another config" in capsys.readouterr().err
    # a party file that would run code when loaded: refused with one line, the marker never written
    marker = tmp_path / "pwned"

    class Hostile:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    # a misspelt party name: refused before any party reads its file (it would stay unpinned)
    assert main(["run", "--set", "partition.num_clients=3", "--set", "protocol.group_size=1", "--quiet",
                 "--set", f"backend.shards={shards}", "--set", "backend.parties.clinet1.node=org_b",
                 "--out", str(tmp_path / "r0")]) == 2
    err = capsys.readouterr().err
    assert "no party clinet1" in err and "client0, client1, client2, evaluator" in err
    torch.save({"class": "x", "kwargs": Hostile()}, shards / "client1.pt")
    code = main(["run", "--set", "partition.num_clients=3", "--set", "protocol.group_size=1", "--quiet",
                 "--set", f"backend.shards={shards}", "--out", str(tmp_path / "r2")])
    err = capsys.readouterr().err  # the manifest's hash catches the swap before anything is read
    assert code == 2 and "client1.pt" in err and "SHA-256" in err and len(err.strip().splitlines()) == 1
    hostile = hashlib.sha256((shards / "client1.pt").read_bytes()).hexdigest()
    with pytest.raises(ConfigError, match="holds objects other than tensors"):  # a manifest swapped too: unpickling
        load_party(shards / "client1.pt", "fedgl.protocols.fedavg.client:FedAvgClient", hostile)  # still refuses code
    assert not marker.exists()
    assert main(["run", "--set", f"backend.shards={tmp_path / 'nowhere'}", "--quiet",
                 "--out", str(tmp_path / "r3")]) == 2
    assert "fedgl partition" in capsys.readouterr().err


@pytest.mark.parametrize("file", ["evaluator.pt", "server.pt"])
def test_a_tampered_evaluator_or_server_file_is_refused_with_one_line(file, tmp_path, capsys, monkeypatch):
    """Tensors and plain data still, but not what was partitioned (labels flipped, a state changed):
    the manifest's SHA-256 refuses the file before it is loaded."""
    shards = tmp_path / "shards"
    write_shards(build_config(settings("fedavg")), shards)
    saved = torch.load(shards / file, weights_only=True)
    if file == "evaluator.pt":
        saved["y"] = (saved["y"] + 1) % saved["num_classes"]
    else:
        saved["rng"] = torch.zeros_like(saved["rng"])
    torch.save(saved, shards / file)
    forbid_dataset(monkeypatch)
    code = main(["run", "--set", "partition.num_clients=3", "--set", "protocol.group_size=1", "--quiet",
                 "--set", "dataset.options.num_nodes=150", "--set", "train.rounds=2",
                 "--set", "network.compute=ignore", "--set", f"backend.shards={shards}", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and str(shards / file) in err and "SHA-256" in err, err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_a_party_file_from_another_party_class_is_refused(tmp_path):
    manifest = write_shards(build_config(settings("fedavg")), tmp_path / "shards")
    party = manifest["parties"][0]
    with pytest.raises(ConfigError, match="the manifest says"):
        load_party(tmp_path / "shards" / party["file"], "fedgl.protocols.glasu.client:GlasuClient", party["sha256"])


# ---- a two-node Ray cluster on loopback ----------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """`ray start --head` and a second `ray start` node on this machine, with token authentication;
    each node carries a custom resource (node_a, node_b) that parties are pinned by."""
    pytest.importorskip("ray")
    if shutil.which("ray") is None:
        pytest.skip("the ray command is not installed")
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16), RAY_USAGE_STATS_ENABLED="0")
    port = _free_port()
    common = ["--block", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats"]
    procs = [subprocess.Popen(["ray", "start", "--head", f"--port={port}", "--include-dashboard=false",
                               '--resources={"node_a": 1}', *common], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the Ray head did not start")
                time.sleep(0.5)
        procs.append(subprocess.Popen(["ray", "start", f"--address=127.0.0.1:{port}", '--resources={"node_b": 1}',
                                       *common], env=env, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield f"127.0.0.1:{port}", env
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(2)
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        current = Path("/tmp/ray/ray_current_cluster")  # where `ray start` tells later ray.init() to connect
        if current.exists() and current.read_text().strip().endswith(f":{port}"):
            current.unlink()


def private_fingerprints(shards: Path) -> set[str]:
    """Every party's features (whole and row by row) and labels, from its own shard file."""
    from support.deploy_driver import fingerprints

    out: set[str] = set()
    for party in json.loads((shards / MANIFEST).read_text())["parties"]:
        _, kwargs = load_party(shards / party["file"], party["class"], party["sha256"])

        def walk(value) -> None:
            if isinstance(value, dict):
                for key, v in value.items():
                    if key in ("x", "y", "user_x") and isinstance(v, torch.Tensor):
                        dense = v.to_dense() if v.layout != torch.strided else v
                        keep = dense[dense.abs().sum(1) > 0] if dense.dim() == 2 else dense  # zero rows are no secret
                        out.update(fingerprints(keep))
                        out.add(hashlib.sha256(dense.contiguous().numpy().tobytes()).hexdigest())
                    else:
                        walk(v)
            elif isinstance(value, (list, tuple)):
                for v in value:
                    walk(v)
            elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.Tensor)):
                walk(vars(value))

        walk(kwargs)
    return out


CLUSTER_RUNS = {  # the protocols the deployment must-show names; parties split over the two nodes
    "fedavg": ({"partition": {"num_clients": 4}}, {"client0": "node_a", "client1": "node_a", "client2": "node_b",
                                                     "client3": "node_b", "evaluator": "node_a"}),
    "glasu": ({}, {"client0": "node_a", "client1": "node_b", "client2": "node_b", "evaluator": "node_b"}),
    "nfedgnn": ({}, {"users": "node_b", "evaluator": "node_a"}),
    "swift": ({"partition": {"num_clients": 4}}, {"client0": "node_a", "client1": "node_b", "client2": "node_a",
                                                    "client3": "node_b", "evaluator": "node_b"}),
    "fedaas": ({"partition": {"num_clients": 4}}, {"client0": "node_a", "client1": "node_b", "client2": "node_a",
                                                     "client3": "node_b", "evaluator": "node_a"}),
    "cnfgnn": ({}, {"users": "node_a", "evaluator": "node_b"}),
}


@pytest.fixture(scope="module")
def cluster_runs(cluster, tmp_path_factory) -> dict[str, tuple[dict, set[str], Path]]:
    """Every CLUSTER_RUNS protocol deployed on the cluster, plus FedAvg run by a driver that loads
    the dataset itself ("fedavg-undeployed"), all from one driver process: per run, the driver's
    report, the parties' private fingerprints and the run's folder (with the in-process run beside)."""
    address, env = cluster
    root = tmp_path_factory.mktemp("cluster")
    jobs, out = [], {}
    for label, protocol, deployed in [(p, p, True) for p in CLUSTER_RUNS] + [("fedavg-undeployed", "fedavg", False)]:
        extra, pins = CLUSTER_RUNS[protocol]
        base = {**settings(protocol), **{k: {**settings(protocol).get(k, {}), **v} for k, v in extra.items()}}
        folder = root / label
        write_shards(build_config(base), folder / "shards")
        overrides = [f"{key}={json.dumps(value)}" for key, value in _flat(base).items()]
        overrides += ["backend.name=ray", f"backend.address={address}", "backend.actors=1"]
        overrides += [f"backend.parties.{name}.node={node}" for name, node in pins.items()]
        if deployed:
            overrides.append(f"backend.shards={folder / 'shards'}")
            run(build_config(base), folder / "plain")
        jobs.append({"report": str(folder / "report.json"), "run_dir": str(folder / "deployed"),
                     "overrides": overrides})
        out[label] = folder
    spec = root / "spec.json"
    spec.write_text(json.dumps(jobs))
    driver = Path(__file__).parent / "support" / "deploy_driver.py"
    done = subprocess.run([sys.executable, str(driver), str(spec)], capture_output=True, text=True, timeout=600,
                          env={**env, "PYTHONPATH": os.pathsep.join(
                              [str(Path(__file__).parents[1]), *filter(None, [env.get("PYTHONPATH")])])})
    assert done.returncode == 0, done.stderr[-3000:]
    return {label: (json.loads((folder / "report.json").read_text()), private_fingerprints(folder / "shards"), folder)
            for label, folder in out.items()}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("protocol", CLUSTER_RUNS)
def test_on_a_two_node_cluster_no_party_data_leaves_its_node(protocol, cluster_runs):
    seen, private, folder = cluster_runs[protocol]
    pins = CLUSTER_RUNS[protocol][1]
    assert seen["placement"] == {name: [node] for name, node in pins.items() if name != "evaluator"}
    leaked = set(seen["sent"]) & private
    assert not leaked, f"{len(leaked)} private tensors or rows left the driver"
    assert "run" in seen["methods"] and "add_from_file" in seen["methods"] and "add" not in seen["methods"]
    same_run(folder / "plain", folder / "deployed")


@pytest.mark.ray
@pytest.mark.slow
def test_the_monitor_catches_a_driver_that_ships_the_data(cluster_runs):
    """The same watch over a run that loads the dataset in the driver: it sees the parties' rows."""
    seen, private, _ = cluster_runs["fedavg-undeployed"]
    assert "add" in seen["methods"] and len(set(seen["sent"]) & private) > 100


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out
