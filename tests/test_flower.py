"""The Flower backend without processes: every payload the protocols send survives the trip through
Flower records exactly (types, bits, layouts, broadcast views) and never as a pickle; a party answers
only its @rpc methods; TLS is on unless explicitly waived. The Simulation Engine test is slow."""

from __future__ import annotations

import json
import time
from collections import OrderedDict

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the Flower backend needs flwr (pip install 'fedgl[flower]')")

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict  # noqa: E402

from fedgl.comm.flower_codec import STYPE, decode, encode  # noqa: E402
from fedgl.comm.flower_party import serve  # noqa: E402
from fedgl.comm.flower_setup import main as setup_main  # noqa: E402
from fedgl.config import build_config  # noqa: E402
from fedgl.deployment import write_shards  # noqa: E402
from fedgl.errors import ConfigError  # noqa: E402
from fedgl.flower_relay import NOT_MADE, REFUSED, relay  # noqa: E402
from fedgl.search import run  # noqa: E402

BASE = {"dataset": {"options": {"num_nodes": 150}}, "partition": {"num_clients": 3}, "train": {"rounds": 1},
        "network": {"compute": "ignore"}}
PROTOCOLS = {  # every protocol with parties
    "fedavg": {"protocol": {"name": "fedavg", "group_size": 1}},
    "fedavg-group": {"protocol": {"name": "fedavg"}},  # Rows("model") with broadcast rows
    "fedavg-secure": {"protocol": {"name": "fedavg", "group_size": 1}, "privacy": {"secure_aggregation": True}},
    "glasu": {"protocol": {"name": "glasu", "batches": 2}},
    "nfedgnn": {"protocol": {"name": "nfedgnn", "lam": 1.0}},
    "nfedgnn-auto": {"protocol": {"name": "nfedgnn", "lam_grid": [0.0, 3.0]}},  # a search: a whole run per lam
    "cnfgnn": {"protocol": {"name": "cnfgnn"}},
    "swift": {"protocol": {"name": "swift", "K": 2}},
    "fedgnn-pns": {"protocol": {"name": "fedgnn-pns"}},
    "llcg": {"protocol": {"name": "llcg", "local_steps": 1}, "model": {"name": "sage"}},
    "fedaas": {"protocol": {"name": "fedaas", "interval_loss": "train", "batches": 2}},
}


def same(a, b) -> None:
    """Equal in type, structure, dtype, layout, shape, broadcast strides and every bit."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.layout, a.shape) == (b.dtype, b.layout, b.shape)
        if a.layout == torch.strided:
            assert [s == 0 for s in a.stride()] == [s == 0 for s in b.stride()]
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        else:
            same(a.to_dense(), b.to_dense())
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    elif isinstance(a, float) and a != a:
        assert b != b
    else:
        assert a == b


def only_fedgl_records(content: RecordDict) -> None:
    """A message holds an ArrayRecord of raw fedgl arrays and a ConfigRecord of plain values: no pickle."""
    assert set(content.keys()) == {"fedgl.arrays", "fedgl.meta"}
    assert isinstance(content["fedgl.arrays"], ArrayRecord) and isinstance(content["fedgl.meta"], ConfigRecord)
    assert all(isinstance(a, Array) and a.stype == STYPE for a in content["fedgl.arrays"].values())
    assert all(type(v) in (str, int, float, bool) for v in content["fedgl.meta"].values())


def test_every_kind_of_value_round_trips():
    x = torch.randn(4, 3)
    payload = {"dense": x, "view": x[:1].expand(5, 3), "t": x.t(), "coo": torch.eye(3).to_sparse(),
               "uncoalesced": torch.sparse_coo_tensor(torch.tensor([[1, 0]]), torch.ones(2), (3,)),
               "csr": torch.eye(3).to_sparse_csr(), "empty": torch.empty(0, 2), "scalar": torch.tensor(2.5),
               "half": torch.ones(2, dtype=torch.bfloat16), "mask": torch.tensor([True, False]),
               "ids": torch.arange(3), "np": np.arange(3.0), "npscalar": np.float32(1.5), 7: "int key",
               "items": [1, 2.5, True, None, "s", (float("nan"), float("-inf"), -0.0)], "ordered": OrderedDict(a=x),
               "bytes": b"\x00\xff", "nothing": b""}
    content = encode(payload, note="meta")
    only_fedgl_records(content)
    back, meta = decode(content)
    same(payload, back)
    assert meta == {"note": "meta"}
    with pytest.raises(TypeError, match="cannot send a set"):
        encode({"bad": {1, 2}})


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_what_each_protocol_sends_round_trips(protocol, tmp_path):
    """Every payload of a short in-process run, both ways, through Flower records and back."""
    from fedgl.comm import transport

    seen = []
    original = transport.Transport._observe

    def keep(self, src, dst, method, payload):
        seen.append(payload)
        original(self, src, dst, method, payload)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transport.Transport, "_observe", keep)
        run(build_config({**BASE, **PROTOCOLS[protocol]}), tmp_path / "run")
    assert seen
    for payload in seen:
        content = encode(payload)
        only_fedgl_records(content)
        same(payload, decode(content)[0])


def test_a_message_that_is_not_fedgl_is_refused():
    with pytest.raises(ConfigError, match="not a fedgl payload"):
        decode(RecordDict({"fedgl.arrays": ArrayRecord({}), "fedgl.meta": ConfigRecord({"tree": '{"T": "exec"}'})}))
    bad = Array(dtype="float32", shape=(1,), stype="numpy.ndarray", data=b"\x00" * 4)
    with pytest.raises(ConfigError, match="not a fedgl tensor"):
        decode(RecordDict({"fedgl.arrays": ArrayRecord({"0": bad}),
                           "fedgl.meta": ConfigRecord({"tree": '{"T": "dense", "a": "0"}'})}))


def _ask(context: Context, action: str, payload=None, **meta) -> Message:
    """Message ``query.<action>`` as it reaches the node, and the party's reply (through its host)."""
    from flwr.app import Metadata
    from flwr.app.message import make_message

    metadata = Metadata(run_id=1, message_id="m", src_node_id=0, dst_node_id=1, reply_to_message_id="",
                        group_id="", created_at=time.time(), ttl=60.0, message_type=f"query.{action}")
    return relay(make_message(metadata=metadata, content=encode(payload, **meta)), context)


def host(folder, party: str, shard: str, run_id: int = 1) -> Context:
    """A party host serving ``party`` in a thread, and the context of its SuperNode's ClientApp."""
    import threading

    socket = folder / "party.sock"
    threading.Thread(target=serve, args=(str(socket), party, shard, str(folder)), daemon=True).start()
    while not socket.exists():
        time.sleep(0.01)
    return Context(run_id=run_id, node_id=1, node_config={"fedgl-host": str(socket)}, state=RecordDict(),
                   run_config={})


def test_a_party_answers_only_its_rpc_methods(tmp_path):
    manifest = write_shards(build_config({**BASE, **PROTOCOLS["fedavg"]}), tmp_path / "shards")
    party = manifest["parties"][0]
    context = host(tmp_path / "node", party["name"], str(tmp_path / "shards" / party["file"]))
    unmade = _ask(context, "train", {"state": {}})  # as to a SuperNode started again mid-run: a lost party
    assert unmade.has_error() and unmade.error.code == NOT_MADE
    assert not _ask(context, "_fedgl_spawn", **{"class": party["class"], "sha256": party["sha256"],
                                                "device": "cpu"}).has_error()
    assert decode(_ask(context, "_fedgl_hello").content)[0] == party["name"]
    for method in ("save", "load", "dispatch", "_fedgl_exec"):  # a Party's own methods are not callable
        reply = _ask(context, method, {"path": str(tmp_path / "stolen.pt")})
        assert reply.has_error() and reply.error.code == REFUSED, method
    assert "not a remotely callable" in _ask(context, "save", {"path": "x"}).error.reason
    assert not (tmp_path / "stolen.pt").exists()
    forged = _ask(context, "_fedgl_spawn", **{"class": "fedgl.protocols.glasu:GlasuClient",
                                               "sha256": party["sha256"], "device": "cpu"})
    assert forged.has_error() and "the manifest says" in forged.error.reason


def test_a_party_trains_holds_and_rolls_back_on_its_node(tmp_path):
    """Two train calls from one held state give the same reply: the state file was rolled back."""
    from fedgl.comm.shard_file import load_party

    manifest = write_shards(build_config({**BASE, **PROTOCOLS["fedavg"]}), tmp_path / "shards")
    party = manifest["parties"][0]
    shard = tmp_path / "shards" / party["file"]
    context = host(tmp_path / "node", party["name"], str(shard), run_id=2)
    _ask(context, "_fedgl_spawn", **{"class": party["class"], "sha256": party["sha256"], "device": "cpu"})
    cls, kwargs = load_party(shard, party["class"], party["sha256"])
    state = cls.create(**kwargs).trainer.get_state()
    _ask(context, "_fedgl_hold")
    first, meta = decode(_ask(context, "train", {"state": state}).content)
    assert meta["cpu"] >= 0 and first["loss"] > 0
    assert decode(_ask(context, "train", {"state": state}).content)[0]["loss"] != first["loss"]  # it moved on
    _ask(context, "_fedgl_roll_back")
    same(decode(_ask(context, "train", {"state": state}).content)[0], first)


class LoopGrid:
    """What a SuperLink routes, in this process: each node's messages go to its ClientApp handler."""

    def __init__(self, contexts: dict[int, Context]):
        self.contexts, self.replies = contexts, {}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages) -> list[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = message.object_id  # as the SuperLink stamps it
            self.replies[message.object_id] = relay(message, self.contexts[message.metadata.dst_node_id])
            ids.append(message.object_id)
        return ids

    def pull_messages(self, ids) -> list[Message]:
        return [self.replies.pop(i) for i in ids if i in self.replies]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_run_through_flower_messages_equals_the_in_process_run(protocol, tmp_path, monkeypatch):
    """Every protocol through FlowerTransport, the codec and each party's host (one per node), with
    the SuperLink's routing done here: metrics and ledger equal the in-process run's."""
    from flwr.supercore.task_identity import TaskIdentity

    from fedgl.comm.flower_transport import serving

    for key, value in (("_run_id", 7), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, key, value)
    settings = {**BASE, **PROTOCOLS[protocol], "train": {"rounds": 2}}
    manifest = write_shards(build_config(settings), tmp_path / "shards")
    run(build_config(settings), tmp_path / "plain")
    contexts = {100 + i: host(tmp_path / f"n{i}", party["name"], str(tmp_path / "shards" / party["file"]), run_id=7)
                for i, party in enumerate(manifest["parties"])}
    with serving(LoopGrid(contexts)):
        run(build_config({**settings, "backend": {"name": "flower", "shards": str(tmp_path / "shards")}}),
            tmp_path / "flower")
    rows = [[{k: v for k, v in json.loads(line).items() if k != "wall_time_s"} for line in open(p / "metrics.jsonl")]
            for p in (tmp_path / "plain", tmp_path / "flower")]
    assert rows[0] == rows[1]
    assert (tmp_path / "plain" / "ledger.jsonl").read_text() == (tmp_path / "flower" / "ledger.jsonl").read_text()


def test_tls_is_on_unless_waived_by_name(tmp_path, capsys):
    assert setup_main(["certs", str(tmp_path / "certs")]) == 0
    assert setup_main(["node-key", str(tmp_path / "keys"), "org1"]) == 0
    assert (tmp_path / "keys" / "org1").stat().st_mode & 0o077 == 0  # private key readable by its owner only
    assert (tmp_path / "keys" / "org1.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    assert setup_main(["superlink", str(tmp_path / "certs"), "--insecure"]) == 2
    assert "--i-accept-no-tls" in capsys.readouterr().err
    from fedgl.comm.flower_setup import _parser, superlink_command, supernode_command

    args = _parser().parse_args(["superlink", str(tmp_path / "certs")])
    command = superlink_command(args)
    assert "--enable-supernode-auth" in command and "--ssl-certfile" in command and "--insecure" not in command
    args = _parser().parse_args(["supernode", "--party", "c", "--shard", "s", "--key", "k", "--ca", "ca",
                                 "--superlink", "127.0.0.1:1", "--insecure", "--i-accept-no-tls"])
    assert "--insecure" in supernode_command(args)


def test_the_flower_backend_outside_a_server_app_says_how_to_submit(tmp_path, capsys):
    from fedgl.cli import main as cli

    write_shards(build_config({**BASE, **PROTOCOLS["fedavg"]}), tmp_path / "shards")
    backend = {"name": "flower", "shards": str(tmp_path / "shards")}
    cfg = build_config({**BASE, **PROTOCOLS["fedavg"], "backend": backend})
    with pytest.raises(ConfigError, match="flower_setup submit"):
        run(cfg, tmp_path / "run")
    assert cli(["run", "--backend", "flower", "--set", f"backend.shards={tmp_path / 'shards'}",
                "--out", str(tmp_path / "cli")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "flower_setup submit" in err  # `--backend flower` is taken, then one line


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["fedavg", "glasu", "nfedgnn", "nfedgnn-auto"])
def test_the_simulation_engine_runs_the_same_apps(protocol, tmp_path):
    """Flower's Simulation Engine, one SuperNode (and party host) per party: metrics and ledger as in
    process, for the protocols whose parties keep a live forward pass too, and every message the
    server sends or receives holds only fedgl's records."""
    from fedgl.comm.flower_transport import FlowerTransport
    from fedgl.flower_app import simulate

    cfg = {**BASE, **PROTOCOLS[protocol], "train": {"rounds": 2}}
    write_shards(build_config(cfg), tmp_path / "shards")
    run(build_config(cfg), tmp_path / "plain")
    contents = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FlowerTransport, "_watch", lambda self, message: contents.append(message))
        simulate({**cfg, "backend": {"shards": str(tmp_path / "shards")}}, str(tmp_path / "flower"))
    assert len(contents) > 10
    for message in contents:
        assert not message.has_error()
        only_fedgl_records(message.content)
    rows = [[{k: v for k, v in json.loads(line).items() if k != "wall_time_s"} for line in open(p / "metrics.jsonl")]
            for p in (tmp_path / "plain", tmp_path / "flower")]
    assert rows[0] == rows[1]
    assert (tmp_path / "plain" / "ledger.jsonl").read_text() == (tmp_path / "flower" / "ledger.jsonl").read_text()


def test_the_client_app_flower_starts_per_message_imports_no_torch():
    """Flower starts a ClientApp process for every message: fedgl's must stay small."""
    import subprocess
    import sys

    code = "import sys, fedgl.flower_app; sys.exit('torch' in sys.modules or 'fedgl.comm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
