"""Setting up a Flower federation for fedgl: certificates, node keys, the commands each organisation
runs, and the app bundle a run is submitted as.

``python -m fedgl.comm.flower_setup`` with one subcommand per step (docs/deployment.md):

- ``certs FOLDER --host H``: a certificate authority and the SuperLink's TLS certificate for host H;
- ``node-key FOLDER NAME``: a SuperNode's key pair (NIST P-384, OpenSSH format, as Flower reads it);
- ``superlink FOLDER``: start the SuperLink with TLS and SuperNode authentication;
- ``register PUBLIC_KEY --flwr-home H``: register a SuperNode's public key with the SuperLink;
- ``supernode --party P --shard FILE --key KEY --ca CA``: start an organisation's SuperNode and, beside
  it, the party host that keeps its party between messages (``flower_party``);
- ``submit CONFIG --out DIR --flwr-home H``: submit a fedgl run (``flwr run`` of fedgl's app bundle).

Without TLS every message would cross in the clear: ``--insecure`` is refused unless
``--i-accept-no-tls`` is given too. Private keys are written readable by their owner only.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import ConfigError

APP = "fedgl_app"  # the folder ``flwr run`` bundles: fedgl's ServerApp and ClientApp and their run config
NO_TLS = "--i-accept-no-tls"


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def certificates(folder: Path, hosts: Sequence[str], days: int = 365) -> dict[str, Path]:
    """A CA (``ca.crt``, ``ca.key``) and the SuperLink's certificate for ``hosts`` signed by it
    (``server.pem``, ``server.key``); every key from the OS's random source."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedgl federation CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(ca_key, hashes.SHA384()))
    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=days))
              .add_extension(x509.SubjectAlternativeName(names), critical=False).sign(ca_key, hashes.SHA384()))
    pem, raw = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    paths = {name: folder / name for name in ("ca.crt", "ca.key", "server.pem", "server.key")}
    folder.mkdir(parents=True, exist_ok=True)
    paths["ca.crt"].write_bytes(ca.public_bytes(pem))
    paths["server.pem"].write_bytes(server.public_bytes(pem))
    for name, secret in (("ca.key", ca_key), ("server.key", key)):
        _write_private(paths[name], secret.private_bytes(pem, raw, serialization.NoEncryption()))
    return paths


def node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's key pair: ``<name>`` (private, OpenSSH) and ``<name>.pub`` (what is registered)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    _write_private(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH) + b"\n")
    return private, public


def _tls(args: argparse.Namespace, flags: list[str]) -> list[str]:
    if args.insecure and not args.i_accept_no_tls:
        raise ConfigError(f"--insecure sends every message in the clear; give {NO_TLS} too if that is meant")
    return ["--insecure"] if args.insecure else flags


def superlink_command(args: argparse.Namespace) -> list[str]:
    certs = Path(args.certs)
    tls = ["--ssl-ca-certfile", str(certs / "ca.crt"), "--ssl-certfile", str(certs / "server.pem"),
           "--ssl-keyfile", str(certs / "server.key")]
    return ["flower-superlink", *_tls(args, tls), "--enable-supernode-auth", "--host", args.host,
            "--port", str(args.port), "--disable-runtime-dependency-installation",
            *(["--database", args.database] if args.database else [])]


def _state(args: argparse.Namespace) -> Path:
    """The party's state folder: ``--state``, else one in the user's own state home (not a shared
    temporary folder another user could make first); ``flower_party`` makes it owner-only."""
    home = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return Path(args.state or home / "fedgl-flower" / args.party).resolve()


def start_host(party: str, shard: Path, state: Path, env: dict[str, str] | None = None
               ) -> tuple[subprocess.Popen, Path]:
    """Start the party host of ``party`` (``flower_party``): its process and its socket in ``state``."""
    socket = state / "party.sock"
    socket.unlink(missing_ok=True)
    command = [sys.executable, "-m", "fedgl.comm.flower_party", "--party", party, "--shard", str(shard.resolve()),
               "--state", str(state), "--socket", str(socket)]
    return subprocess.Popen(command, env=env), socket


def wait_host(host: subprocess.Popen, socket: Path, party: str) -> None:
    """Wait until the host listens: a SuperNode takes messages only once its host answers them."""
    while not socket.exists():
        if host.poll() is not None:
            raise ConfigError(f"the party host of {party} stopped (exit code {host.returncode})")
        time.sleep(0.2)


def stop(*procs: subprocess.Popen | None) -> None:
    for proc in procs:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait()


@contextmanager
def party_hosts(shards: Path, parties: list[dict], state: Path) -> Iterator[list[str]]:
    """One party host per manifest entry of ``parties`` on this machine; their sockets, in order."""
    started: list[tuple[subprocess.Popen, Path, str]] = []
    try:
        for party in parties:
            started.append((*start_host(party["name"], shards / party["file"], state / party["name"]), party["name"]))
        for host, socket, name in started:
            wait_host(host, socket, name)
        yield [str(socket) for _, socket, _ in started]
    finally:
        stop(*(host for host, _, _ in started))


def supernode_command(args: argparse.Namespace) -> list[str]:
    state = _state(args)
    config = (f'fedgl-party="{args.party}" fedgl-shard="{Path(args.shard).resolve()}" fedgl-state="{state}" '
              f'fedgl-host="{state / "party.sock"}"')
    return ["flower-supernode", *_tls(args, ["--root-certificates", str(args.ca)]), "--superlink", args.superlink,
            "--auth-supernode-private-key", str(args.key), "--node-config", config, "--port", str(args.port)]


def flwr_home(folder: Path, address: str, ca: Path | None) -> Path:
    """A Flower configuration naming this federation's SuperLink (``flwr`` reads it from ``FLWR_HOME``)."""
    folder.mkdir(parents=True, exist_ok=True)
    tls = f'root-certificates = "{Path(ca).resolve()}"' if ca else "insecure = true"
    (folder / "config.toml").write_text(f'[superlink]\ndefault = "fedgl"\n\n[superlink.fedgl]\n'
                                        f'address = "{address}"\n{tls}\n')
    return folder


def bundle(folder: Path) -> Path:
    """The app folder ``flwr run`` submits: fedgl's ServerApp and ClientApp and their run config."""
    from importlib.metadata import version

    app = folder / APP
    app.mkdir(parents=True, exist_ok=True)
    (app / "pyproject.toml").write_text(f'''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{APP.replace("_", "-")}"
version = "{version('fedgl')}"
description = "A fedgl run on a Flower federation"
license = "MIT"
dependencies = []

[tool.flwr.app]
publisher = "fedgl"

[tool.flwr.app.components]
serverapp = "fedgl.flower_app:server_app"
clientapp = "fedgl.flower_app:client_app"

[tool.flwr.app.config]
config = ""
out = ""
resume = false
overwrite = false
reply-timeout = 0.0
connect-timeout = 300.0
''')
    return app


def submit_command(args: argparse.Namespace) -> list[str]:
    app = bundle(Path(args.work))
    run_config = (f'config="{Path(args.config).resolve()}" out="{Path(args.out).resolve()}" '
                  f'resume={str(args.resume).lower()} overwrite={str(args.overwrite).lower()} '
                  f'reply-timeout={float(args.reply_timeout)}')
    return ["flwr", "run", str(app), "fedgl", "--run-config", run_config, "--stream"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fedgl.comm.flower_setup")
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("certs")
    p.add_argument("folder")
    p.add_argument("--host", action="append", default=None)
    p = sub.add_parser("node-key")
    p.add_argument("folder")
    p.add_argument("name")
    for step in ("superlink", "supernode"):
        p = sub.add_parser(step)
        p.add_argument("--insecure", action="store_true")
        p.add_argument(NO_TLS, action="store_true")
        p.add_argument("--port", type=int, default=9093 if step == "superlink" else 9094)
    p = sub.choices["superlink"]
    p.add_argument("certs")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--database", default=None)
    p = sub.choices["supernode"]
    for flag in ("--party", "--shard", "--key", "--ca", "--superlink"):
        p.add_argument(flag, required=flag != "--ca")
    p.add_argument("--state", default=None)
    p.add_argument("--rejoin-timeout", type=float, default=120.0,
                   help="seconds after the start to keep starting the SuperNode again when it fails (after a "
                        "crash the SuperLink refuses the same key for up to a minute)")
    p = sub.add_parser("register")
    p.add_argument("public_key")
    p.add_argument("--flwr-home", required=True)
    p = sub.add_parser("federation")
    p.add_argument("flwr_home")
    p.add_argument("--superlink", required=True)
    p.add_argument("--ca", default=None)
    p = sub.add_parser("submit")
    p.add_argument("config")
    for flag in ("--out", "--flwr-home", "--work"):
        p.add_argument(flag, required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--reply-timeout", type=float, default=0.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.step == "certs":
            print("\n".join(str(p) for p in certificates(Path(args.folder), args.host or ["127.0.0.1", "localhost"])
                            .values()))
            return 0
        if args.step == "node-key":
            print("\n".join(str(p) for p in node_key(Path(args.folder), args.name)))
            return 0
        if args.step == "federation":
            print(flwr_home(Path(args.flwr_home), args.superlink, args.ca))
            return 0
        if args.step == "register":
            command = ["flwr", "supernode", "register", args.public_key, "fedgl"]
        else:
            command = {"superlink": superlink_command, "supernode": supernode_command,
                       "submit": submit_command}[args.step](args)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if shutil.which(command[0]) is None:
        print(f"error: {command[0]} is not installed: pip install 'fedgl[flower]'", file=sys.stderr)
        return 2
    env = dict(os.environ, **({"FLWR_HOME": str(Path(args.flwr_home).resolve())} if "flwr_home" in args else {}))
    if args.step != "supernode":
        return subprocess.call(command, env=env)
    return supernode(args, command, env)


def supernode(args: argparse.Namespace, command: list[str], env: dict[str, str]) -> int:
    """The SuperNode and, beside it, its party host; stopping this process (SIGTERM too) stops both."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    host, socket = start_host(args.party, Path(args.shard), _state(args), env)  # the party lives here
    node = None
    try:
        wait_host(host, socket, args.party)
        deadline = time.monotonic() + args.rejoin_timeout
        while True:
            node = subprocess.Popen(command, env=env)
            code = node.wait()
            if code == 0 or time.monotonic() > deadline:
                return code
            # Refused at the start (Flower's exit code says no more): most often the SuperLink still
            # counts this key's crashed SuperNode online, until its heartbeats lapse (60 s). Ask again.
            time.sleep(5.0)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        stop(node, host)


if __name__ == "__main__":
    sys.exit(main())
