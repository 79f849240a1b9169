"""A Flower federation on loopback for tests and the overhead benchmark: a SuperLink with TLS and
SuperNode authentication, the keys of three organisations registered, and their SuperNodes started
and killed as separate process groups (``fedgl.comm.flower_setup`` commands, as docs/deployment.md
shows them). An audit hook loaded into every process logs the ``.pt`` files it opens and any class an
unpickler looks up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fedgl.comm.flower_setup import certificates, flwr_home, node_key

SRC = Path(__file__).parents[2] / "src"
# sitecustomize.py of every process of the federation (on its PYTHONPATH)
AUDIT = '''
import os, sys
_log = os.environ.get("FEDGL_AUDIT_LOG")
if _log:
    _out = open(_log, "a", buffering=1)
    _busy = []
    def _hook(event, args):
        if _busy:
            return
        _busy.append(1)
        try:
            if event == "open" and isinstance(args[0], (str, bytes)) and os.fsdecode(args[0]).endswith(".pt"):
                _out.write(f"open {os.getpid()} {os.path.realpath(os.fsdecode(args[0]))}\\n")
            elif event == "pickle.find_class":
                _out.write(f"pickle {os.getpid()} {args[0]}.{args[1]}\\n")
        finally:
            _busy.clear()
    sys.addaudithook(_hook)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setup(*args: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fedgl.comm.flower_setup", *args], env=env,
                            start_new_session=True, stdout=kw.pop("stdout", subprocess.DEVNULL),
                            stderr=subprocess.STDOUT, **kw)


class Federation:
    """A SuperLink and the SuperNodes of up to three organisations (org0..org2, keys registered)."""

    def __init__(self, root: Path):
        self.root = root
        (root / "hooks").mkdir(parents=True)
        (root / "hooks" / "sitecustomize.py").write_text(AUDIT)
        self.certs = certificates(root / "certs", ["127.0.0.1"])
        self.port = free_port()
        self.home = flwr_home(root / "flwr", f"127.0.0.1:{self.port}", self.certs["ca.crt"])
        self.nodes: dict[str, subprocess.Popen] = {}
        self.link = _setup("superlink", str(root / "certs"), "--port", str(self.port),
                           env=self.env("superlink"), stdout=open(root / "superlink.log", "w"))
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the SuperLink did not start"
                time.sleep(0.5)
        for org in ("org0", "org1", "org2"):
            node_key(root / "keys", org)
            done = subprocess.run([sys.executable, "-m", "fedgl.comm.flower_setup", "register",
                                   str(root / "keys" / f"{org}.pub"), "--flwr-home", str(self.home)],
                                  env=self.env("cli"), capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stdout + done.stderr

    def env(self, who: str) -> dict:
        home = self.root / "homes" / who
        home.mkdir(parents=True, exist_ok=True)
        return dict(os.environ, PYTHONPATH=f"{self.root / 'hooks'}{os.pathsep}{SRC}", FLWR_HOME=str(home),
                    FEDGL_AUDIT_LOG=str(self.root / f"audit-{who}.log"), OMP_NUM_THREADS="1")

    def start_node(self, org: str, party: str, shard: Path, *extra: str) -> subprocess.Popen:
        proc = _setup("supernode", "--party", party, "--shard", str(shard), "--key", str(self.root / "keys" / org),
                      *extra,
                      "--ca", str(self.certs["ca.crt"]), "--superlink", f"127.0.0.1:{self.port}",
                      "--port", str(free_port()), "--state", str(self.root / "state" / org),
                      env=self.env(org), stdout=open(self.root / f"{org}.log", "a"))
        self.nodes[org] = proc
        return proc

    def kill(self, org: str) -> None:
        """A crash: the SuperNode, its host and its ClientApps end at once (the SuperLink notices when
        the node's heartbeats lapse)."""
        proc = self.nodes.pop(org)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def stop(self, org: str) -> None:
        """An orderly stop (SIGTERM to the supernode command): the node leaves the federation at once."""
        self.nodes[org].terminate()
        try:
            self.nodes[org].wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        self.kill(org)  # whatever is left of its process group

    def submit(self, config: Path, out: Path, *extra: str, wait: bool = True):
        proc = _setup("submit", str(config), "--out", str(out), "--flwr-home", str(self.home),
                      "--work", str(self.root / "work"), *extra, env=self.env("cli"),
                      stdout=open(self.root / "submit.log", "a"))
        if wait:
            proc.wait(timeout=1800)
        return proc

    def opened(self, who: str) -> set[str]:
        path = self.root / f"audit-{who}.log"
        return {line.split(" ", 2)[2].strip() for line in (path.read_text().splitlines() if path.exists() else [])
                if line.startswith("open ")}

    def unpickled(self) -> list[str]:
        return [line for path in self.root.glob("audit-*.log") for line in path.read_text().splitlines()
                if line.startswith("pickle ")]

    def close(self) -> None:
        for org in list(self.nodes):
            self.stop(org)
        os.killpg(self.link.pid, signal.SIGKILL)
        self.link.wait()
