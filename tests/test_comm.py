"""The transport, ledger and clock: measured bytes, kinds, isolation, backends."""

from __future__ import annotations

import pytest
import torch

from fedgl.comm import LocalTransport, NetworkModel, Party, Rows, make_transport, rpc
from fedgl.comm.payload import nbytes
from fedgl.errors import ConfigError
from fedgl.files import load_tensors


class Echo(Party):
    def __init__(self, name: str, seed: int, width: int):
        super().__init__(name, seed)
        self.weight = torch.randn(width)  # drawn under the party's own seed
        self.kept = None

    @rpc(state="model", returns={"state": "model", "noise": "embedding", "steps": "control"})
    def train(self, state, steps):
        self.kept = state
        return {"state": state + self.weight, "noise": torch.randn(4), "steps": steps}

    @rpc(grad="gradient", returns="control")
    def mutate(self, grad):
        grad.add_(1.0)
        return 0

    @rpc(users="index", returns=Rows("embedding"))
    def rows(self, users):
        return torch.ones(len(users), 3, dtype=torch.float64)

    @rpc(returns="control")
    def wait(self, seconds):
        """Elapsed time without CPU work: what a party sees when others share its cores."""
        import time

        time.sleep(seconds)
        return 0

    def private(self):
        return self.weight


def spawn(transport, n=3, width=5):
    return transport.spawn(Echo, [dict(name=f"c{i}", seed=i, width=width) for i in range(n)])


def test_payload_sizes_are_element_size_times_count():
    assert nbytes(torch.zeros(10, 3)) == 120
    assert nbytes(torch.zeros(7, dtype=torch.long)) == 56
    assert nbytes(torch.zeros(4, dtype=torch.float16)) == 8
    assert nbytes({"a": torch.zeros(2), "b": [torch.zeros(3, dtype=torch.int32), 5]}) == 8 + 12 + 8
    sparse = torch.eye(4).to_sparse()
    assert nbytes(sparse) == 2 * 4 * 8 + 4 * 4  # COO indices + values
    with pytest.raises(TypeError):
        nbytes(object())


def test_ledger_records_each_message_under_its_kind():
    t = LocalTransport()
    names = spawn(t)
    t.set_round(3)
    state = torch.zeros(5)
    t.call_many(names, "train", state=state, steps=2)
    ledger = t.ledger
    assert ledger.total(kind="model") == 3 * (20 + 20)  # one model down and one up per client
    assert ledger.total(kind="embedding") == 3 * 16
    assert ledger.total(kind="control") == 3 * (8 + 8)
    assert ledger.by_round() == {3: 3 * (40 + 16 + 16)}
    assert ledger.by_direction() == {"down": 3 * 28, "up": 3 * 44}
    assert ledger.by_party()["c1"] == {"up": 44, "down": 28}
    assert ledger.messages(kind="model") == 6


def test_ledger_running_sums_equal_a_scan_of_its_entries_also_after_a_reload():
    t = LocalTransport()
    names = spawn(t)
    for r in (1, 2, 4):
        t.set_round(r)
        t.call_many(names[: r], "train", state=torch.zeros(5), steps=r)
        with t.evaluation():
            t.call(names[0], "train", state=torch.zeros(5), steps=0)
    reloaded = type(t.ledger)()
    reloaded.load_state_dict(t.ledger.state_dict())
    for ledger in (t.ledger, reloaded):
        entries = ledger.rows()
        training = [e for e in entries if e["kind"] != "eval"]
        assert ledger.total() == sum(e["bytes"] for e in training) == 6 * 72  # 1 + 2 + 3 calls of 28 bytes down, 44 up
        assert ledger.total(include_eval=True) == sum(e["bytes"] for e in entries)
        assert ledger.round_bytes(2) == sum(e["bytes"] for e in training if e["round"] == 2) == 2 * 72
        assert ledger.round_bytes(3) == 0
        assert ledger.by_round() == {r: sum(e["bytes"] for e in training if e["round"] == r) for r in (1, 2, 4)}
        assert ledger.by_kind(include_eval=False) == {k: sum(e["bytes"] for e in training if e["kind"] == k)
                                                      for k in ("control", "embedding", "model")}
        assert ledger.by_kind()["eval"] == sum(e["bytes"] for e in entries if e["kind"] == "eval") == 3 * 72


def test_local_transport_copies_payloads_like_a_wire():
    t = LocalTransport()
    name = spawn(t, n=1)[0]
    grad = torch.zeros(3)
    t.call(name, "mutate", grad=grad)
    assert torch.equal(grad, torch.zeros(3)), "the client mutated the server's tensor"
    w = torch.ones(5, requires_grad=True)
    out = t.call(name, "train", state=w * 2, steps=1)
    assert out["state"].grad_fn is None, "an autograd graph crossed the boundary"


def test_only_rpc_methods_are_callable():
    t = LocalTransport()
    name = spawn(t, n=1)[0]
    with pytest.raises(AttributeError, match="not a remotely callable"):
        t.call(name, "private")


def test_party_randomness_is_its_own():
    """A party's draws depend on its seed only, not on other parties or the driver's RNG."""
    a, b = LocalTransport(), LocalTransport()
    na, nb = spawn(a, n=3), spawn(b, n=3)
    torch.manual_seed(123)
    ra = a.call_many(na, "train", state=torch.zeros(5), steps=1)
    torch.manual_seed(999)
    rb = b.call_many(list(reversed(nb)), "train", state=torch.zeros(5), steps=1)[::-1]
    for x, y in zip(ra, rb):
        assert torch.equal(x["state"], y["state"]) and torch.equal(x["noise"], y["noise"])
    assert not torch.equal(ra[0]["noise"], ra[1]["noise"])


def test_a_batched_phase_sends_the_messages_of_one_call():
    """``call_batches`` builds each batch's arguments only after the last batch was folded, and
    sends the messages, gets the results and makes the ledger and clock of one ``call_many``."""
    net = NetworkModel(bandwidth_mbps=8.0, latency_ms=10.0, compute="ignore")
    one, batched = LocalTransport(net), LocalTransport(net)
    names, _ = spawn(one), spawn(batched)
    state = {n: torch.full((5,), float(i)) for i, n in enumerate(names)}
    expected = one.call_many(names, "train", per_target=[{"state": state[n]} for n in names], steps=2)
    events, got = [], []

    def arguments(name):
        events.append(("built", name))
        return {"state": state[name]}

    def fold(batch):
        events.append(("folded", [name for name, _ in batch]))
        got.extend(result for _, result in batch)

    batched.call_batches([names[:1], names[1:]], "train", arguments, fold, steps=2)
    assert events == [("built", "c0"), ("folded", ["c0"]), ("built", "c1"), ("built", "c2"), ("folded", ["c1", "c2"])]
    for x, y in zip(got, expected):
        assert torch.equal(x["state"], y["state"]) and torch.equal(x["noise"], y["noise"])
    assert batched.ledger.rows() == one.ledger.rows()
    assert batched.clock.now == one.clock.now > 0  # one phase: the slowest party, not a sum over batches


def test_user_group_rows_are_accounted_per_user():
    t = LocalTransport()
    name = spawn(t, n=1)[0]
    users = torch.tensor([0, 4, 9])
    t.call(name, "rows", users=users)
    per_user = t.ledger.member_bytes(name, "up")
    assert per_user[users].tolist() == [24, 24, 24]
    assert int(per_user.sum()) == t.ledger.total(kind="embedding") == 72
    assert t.ledger.member_bytes(name, "down") is None  # index arg is not a Rows payload


def test_evaluation_traffic_is_separate_and_free():
    t = LocalTransport(NetworkModel(compute="ignore"))
    names = spawn(t)
    with t.evaluation():
        t.call_many(names, "train", state=torch.zeros(5), steps=1)
    assert t.ledger.total() == 0
    assert t.ledger.total(kind="eval", include_eval=True) == 3 * 72
    assert t.clock.now == 0.0


def test_clock_charges_latency_and_bandwidth_of_the_slowest_party():
    net = NetworkModel(bandwidth_mbps=8.0, latency_ms=10.0, compute="ignore")  # 1 byte per microsecond
    t = LocalTransport(net)
    names = spawn(t, n=2)
    t.call_many(names, "train", state=torch.zeros(5), steps=1)
    down, up = 28, 44
    expected = (0.010 + down * 1e-6) + (0.010 + up * 1e-6)
    assert t.clock.now == pytest.approx(expected)
    with t.parallel():
        t.call(names[0], "train", state=torch.zeros(5), steps=1)
        t.call(names[1], "train", state=torch.zeros(5), steps=1)
    assert t.clock.now == pytest.approx(2 * expected)  # side by side, not one after the other


@pytest.mark.parametrize("compute, charged", [("cpu", False), ("measured", True), ("ignore", False)])
def test_compute_on_the_clock_is_cpu_time_by_default(compute, charged):
    """Time a party spends waiting for a core (here: sleeping) is not compute: the default clock
    charges CPU seconds, so a loaded machine does not stretch simulated time."""
    t = LocalTransport(NetworkModel(compute=compute, latency_ms=0.0))
    names = spawn(t, n=1)
    t.call(names[0], "wait", seconds=0.2)
    assert (t.clock.now >= 0.2) is charged, t.clock.now
    assert t.compute_s[names[0]] < 0.05  # per-party compute is CPU seconds too


def test_unknown_backend_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown backend"):
        make_transport("mpi")


@pytest.mark.slow  # starts Ray or trains on real data for seconds: with the slow tests
@pytest.mark.ray
def test_ray_backend_matches_local(ray_session, tmp_path):
    import sys

    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test classes are not installed
    local, remote = LocalTransport(), make_transport("ray", actors=2)
    try:
        for t in (local, remote):
            names = spawn(t, n=3)
            t.set_round(1)
            t.call_many(names, "train", state=torch.arange(5.0), steps=3)
            t.call(names[2], "rows", users=torch.tensor([1, 2]))
        out_l = local.call_many(["c0", "c1", "c2"], "train", state=torch.ones(5), steps=1)
        out_r = remote.call_many(["c0", "c1", "c2"], "train", state=torch.ones(5), steps=1)
        for a, b in zip(out_l, out_r):
            assert torch.equal(a["state"], b["state"]) and torch.equal(a["noise"], b["noise"])
        assert local.ledger.rows() == remote.ledger.rows()
        assert torch.equal(local.ledger.member_bytes("c2", "up"), remote.ledger.member_bytes("c2", "up"))
        remote.save_parties(tmp_path)  # a party's state is read from its own checkpoint, never fetched
        assert sorted(f.name for f in tmp_path.iterdir()) == ["c0.pt", "c1.pt", "c2.pt"]
        assert torch.equal(load_tensors(tmp_path / "c0.pt", "party")["attrs"]["kept"], torch.ones(5))
    finally:
        remote.close()


def test_a_broadcast_payload_is_copied_once_and_arrives_as_the_same_view():
    """One model expanded to a row per member crosses in-process as one copied row, expanded again on
    arrival; the ledger still counts every row, and the receiver cannot reach the sender's row."""
    received = []

    class Receiver(Party):
        @rpc(state=Rows("model"))
        def take(self, state: torch.Tensor) -> None:
            received.append(state)

    transport = make_transport("local")
    transport.spawn(Receiver, [{"name": "group", "seed": 0}])
    row = torch.arange(6.0)
    transport.call("group", "take", state=row.expand(4, -1))
    [state] = received
    assert torch.equal(state, row.expand(4, -1)) and state.stride() == (0, 1)
    assert state.untyped_storage().data_ptr() != row.untyped_storage().data_ptr()
    assert state.untyped_storage().nbytes() == row.untyped_storage().nbytes()  # one row copied, not four
    assert transport.ledger.total() == 4 * 6 * 4


def test_ray_payload_packing_round_trips_every_tensor_as_its_own_copy():
    pytest.importorskip("ray")
    from fedgl.comm.ray_transport import _Array, pack, unpack

    row = torch.arange(6.0)
    payload = {"state": row.expand(4, -1), "ids": torch.tensor([3, 1]), "flag": torch.tensor(True),
               "half": torch.randn(2, 2).bfloat16(), "sparse": torch.eye(3).to_sparse_csr(),
               "nested": [(torch.ones(2, 3).t(), 1.5, "name")], "none": None}
    packed = pack(payload)
    assert type(packed["state"]) is _Array and packed["state"].array.shape == (1, 6)  # a broadcast travels once
    assert type(packed["half"]) is torch.Tensor and type(packed["sparse"]) is torch.Tensor  # numpy cannot hold them
    back = unpack(packed)
    assert torch.equal(back["state"], payload["state"]) and back["state"].stride() == (0, 1)
    assert back["ids"].dtype == torch.long and back["flag"].dtype == torch.bool and back["flag"].dim() == 0
    assert torch.equal(back["nested"][0][0], payload["nested"][0][0]) and back["nested"][0][1:] == (1.5, "name")
    back["ids"][0] = 7  # the receiver's tensors are its own
    assert payload["ids"][0] == 3


@pytest.mark.ray
@pytest.mark.slow  # starts a Ray instance of its own: tens of seconds
def test_a_local_ray_instance_gives_workers_a_fixed_hash_seed_and_leaves_the_driver_as_it_was():
    pytest.importorskip("ray")
    import os
    import subprocess
    import sys

    code = (
        "import os, ray\n"
        "from fedgl.comm.ray_transport import RayTransport\n"
        "os.environ.pop('PYTHONHASHSEED', None)\n"
        "transport = RayTransport()\n"
        "seed = ray.get(ray.remote(lambda: os.environ.get('PYTHONHASHSEED')).options(num_cpus=0).remote())\n"
        "print(seed, os.environ.get('PYTHONHASHSEED'))\n"
        "transport.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONHASHSEED")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "None"]
