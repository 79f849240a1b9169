"""Ray locked down: a local instance listens on loopback only, and a Ray that does not enforce token
authentication is refused unless the config opts out."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace

import pytest

from fedgl.comm.ray_cluster import enforces_token, init_ray, protect_token_file
from fedgl.errors import ConfigError


def listening(pids: list[int]) -> list[dict]:
    """Every TCP socket listening, and every UDP socket bound, in the processes ``pids``, read from the OS."""
    import psutil

    out = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            name, connections = process.name(), process.net_connections(kind="inet")
        except psutil.Error:  # a worker that exited meanwhile
            continue
        for c in connections:
            if c.laddr and (c.status == psutil.CONN_LISTEN or c.type == socket.SOCK_DGRAM):
                out.append({"pid": pid, "process": name, "ip": c.laddr.ip, "port": c.laddr.port})
    return out


def loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


DRIVER = """
import json, sys
import psutil
sys.path.insert(0, {tests!r})
from test_ray_security import listening
from fedgl.config import build_config
from fedgl.runner import Run

cfg = build_config({{"dataset": {{"options": {{"num_nodes": 120}}}}, "partition": {{"num_clients": 2}},
                    "protocol": {{"name": "fedavg", "group_size": 1}}, "train": {{"rounds": 1}},
                    "backend": {{"name": "ray", "actors": 1}}}})
job = Run(cfg, {out!r})
ray = job.transport._ray
me = psutil.Process()
seen = listening([me.pid] + [p.pid for p in me.children(recursive=True)])
print(json.dumps({{"sockets": seen, "gcs": ray.get_runtime_context().gcs_address}}))
job.execute(progress=False)
"""


@pytest.mark.ray
@pytest.mark.slow  # starts a Ray instance of its own: tens of seconds
def test_a_local_run_opens_listeners_on_loopback_only(tmp_path):
    """A run on a Ray it starts itself: every socket the driver and Ray's processes listen on (GCS,
    raylet, object manager, agents, metrics, workers and party hosts) is on loopback."""
    pytest.importorskip("psutil")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    code = DRIVER.format(tests=str(Path(__file__).parent), out=str(tmp_path / "run"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    processes = {s["process"] for s in report["sockets"]}
    assert {"gcs_server", "raylet"} <= processes and len(report["sockets"]) >= 6, report
    assert [s for s in report["sockets"] if not loopback(s["ip"])] == []
    assert loopback(report["gcs"].rpartition(":")[0].strip("[]"))
    assert (tmp_path / "run" / "summary.json").exists()
    token = Path(env.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    assert not token.exists() or token.stat().st_mode & 0o077 == 0  # Ray writes it readable by all


def test_the_token_file_is_narrowed_to_its_owner(tmp_path):
    """Ray writes its token file readable by every local user; a run makes it owner-only (and a token
    given in RAY_AUTH_TOKEN, with no file, is no error)."""
    token = tmp_path / "auth_token"
    token.write_text("secret")
    token.chmod(0o644)
    protect_token_file(str(token))
    assert token.stat().st_mode & 0o777 == 0o600
    protect_token_file(str(tmp_path / "absent"))


def test_the_socket_reader_sees_a_listener_on_every_interface():
    """The reader the test above relies on reports what is not on loopback."""
    pytest.importorskip("psutil")
    with socket.socket() as open_socket:
        open_socket.bind(("0.0.0.0", 0))
        open_socket.listen()
        mine = [s for s in listening([os.getpid()]) if s["port"] == open_socket.getsockname()[1]]
    assert mine and not loopback(mine[0]["ip"])


@pytest.fixture
def gcs_without_auth():
    """A stand-in GCS that answers without asking for a token, as a Ray with RAY_AUTH_MODE=disabled does."""
    grpc = pytest.importorskip("grpc")
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    class Open(gcs_service_pb2_grpc.NodeInfoGcsServiceServicer):
        def GetClusterId(self, request, context):
            return gcs_service_pb2.GetClusterIdReply()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    gcs_service_pb2_grpc.add_NodeInfoGcsServiceServicer_to_server(Open(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def fake_ray(gcs: str) -> SimpleNamespace:
    """What ``connect`` uses of Ray, joined to ``gcs``."""
    state = SimpleNamespace(up=False)
    return SimpleNamespace(state=state, is_initialized=lambda: state.up,
                           init=lambda **kwargs: setattr(state, "up", True),
                           shutdown=lambda: setattr(state, "up", False),
                           get_runtime_context=lambda: SimpleNamespace(gcs_address=gcs))


def test_joining_a_ray_without_token_authentication_is_refused_unless_opted_out(gcs_without_auth):
    ray = fake_ray(gcs_without_auth)
    with pytest.raises(ConfigError) as refused:
        init_ray(ray, gcs_without_auth, 5.0, "token")
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and "does not enforce token authentication" in message
    assert "RAY_AUTH_MODE=token" in message and "backend.ray_auth: none" in message
    assert not ray.state.up  # the connection it made is closed again
    assert init_ray(ray, gcs_without_auth, 5.0, "none") and ray.state.up


def test_a_local_instance_is_not_started_with_token_authentication_turned_off(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray = fake_ray("unused")
    with pytest.raises(ConfigError, match="RAY_AUTH_MODE=disabled turns Ray's token authentication off"):
        init_ray(ray, None, 5.0, "token")
    assert not ray.state.up


@pytest.mark.ray
def test_the_ray_the_tests_use_enforces_token_authentication(ray_session):
    """The check passes on a Ray with token authentication: its GCS refuses a call without the token."""
    assert enforces_token(ray_session.get_runtime_context().gcs_address, 10.0)
