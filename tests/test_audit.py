"""`fedgl audit`: the message recorder, and the attacks checked against the ground truth on runs
where they must find something (LLCG's rows and labels, single-row sums, Swift's routed sums) and
where they must not."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from fedgl.cli import main
from fedgl.config import build_config
from fedgl.data import load_dataset
from fedgl.errors import ConfigError
from fedgl.privacy import record
from fedgl.audit import audit_run, ground_truth
from fedgl.privacy.attacks import RoutedSums, calls, contributing_members, least_squares_rows
from fedgl.privacy.record import MessageRecorder, read_messages
from fedgl.runner import Run
from fedgl.search import run

FEATURES = 16
GCN = {"name": "gcn"}
SYNTHETIC = {"name": "synthetic", "options": {"num_nodes": 400, "num_features": FEATURES, "avg_degree": 10}}


def config(protocol: dict, rounds: int = 2, model: dict | None = None, partition: dict | None = None,
           privacy: dict | None = None, dataset: dict | None = None) -> dict:
    """A small recorded run; hidden width = feature width, so hidden rows are compared with raw rows too
    (FedAAS builds its model from its protocol section and takes no model section)."""
    return {
        "dataset": dataset or SYNTHETIC,
        **({} if protocol["name"] == "fedaas" else
           {"model": {"name": "sage", "hidden": FEATURES, "layers": 2, "dropout": 0.5, **(model or {})}}),
        "partition": {"num_clients": 4, "method": "metis", **(partition or {})},
        "protocol": protocol,
        "train": {"rounds": rounds, "lr": 0.01},
        "eval": {"every": rounds},
        "network": {"compute": "ignore"},
        "privacy": {"record_messages": True, **(privacy or {})},
    }


def audited(cfg: dict, folder) -> dict:
    Run(build_config(cfg), folder).execute(progress=False)
    return audit_run(folder)["attacks"]


# ---- the recorder -----------------------------------------------------------------------------------
def test_recorder_round_trips_payloads_in_order_and_appends_on_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "CHUNK_BYTES", 64)  # a chunk per message or two
    sent = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    payloads = [
        {"state": {"w": sent, "b": torch.ones(2)}, "mode": "cross", "layer": 1, "skip": None},
        [torch.tensor([1, 2, 3]), (np.arange(4), 2.5), b"\x01\x02", True],
        torch.eye(3).to_sparse(),
    ]
    rec = MessageRecorder(tmp_path / "messages")
    for i, payload in enumerate(payloads):
        rec(1 + i // 2, "server" if i % 2 == 0 else f"client{i}", "client0" if i % 2 == 0 else "server", "m", payload,
            False)
    rec(2, "server", "client0", "predict", {"h": torch.ones(3)}, True)  # evaluation: not recorded
    sent += 100  # a parameter updated in place after it was sent
    rec.close()
    MessageRecorder(tmp_path / "messages")(3, "server", "client1", "again", {"x": torch.zeros(1)}, False)
    resumed = MessageRecorder(tmp_path / "messages")
    resumed(3, "server", "client1", "again", {"x": torch.zeros(1)}, False)
    resumed.close()

    got = list(read_messages(tmp_path / "messages"))
    assert [(m.round, m.sender, m.receiver, m.method) for m in got] == [
        (1, "server", "client0", "m"), (1, "client1", "server", "m"), (2, "server", "client0", "m"),
        (3, "server", "client1", "again")]  # the unclosed second recorder wrote nothing
    # round 1 filled a chunk (64 bytes), round 2 started the next, the resumed run its own session
    assert [f.name for f in record.message_files(tmp_path / "messages")] == [
        "part-000-00000.pt", "part-000-00001.pt", "part-001-00000.pt"]
    first, second, third, fourth = got
    assert torch.equal(first.tensors[("state", "w")], torch.arange(12.0).reshape(3, 4))
    assert torch.equal(first.under("state")[("b",)], torch.ones(2))
    assert first.values == {("mode",): "cross", ("layer",): 1}
    assert torch.equal(second.tensors[(0,)], torch.tensor([1, 2, 3]))
    assert torch.equal(second.tensors[(1, 0)], torch.arange(4))
    assert torch.equal(second.tensors[(2,)], torch.tensor([1, 2], dtype=torch.uint8))
    assert second.values == {(1, 1): 2.5, (3,): True}
    assert torch.equal(third.tensors[()].to_dense(), torch.eye(3))
    assert fourth.session == 1


def test_a_resumed_run_appends_its_messages(tmp_path):
    cfg = config({"name": "fedavg"}, rounds=2, model=GCN)
    Run(build_config(cfg | {"checkpoint_every": 1}), tmp_path).execute(progress=False)
    first = [(m.round, m.sender, m.receiver, m.method) for m in read_messages(tmp_path / "messages")]
    cfg["train"]["rounds"] = 3
    run(build_config(cfg | {"checkpoint_every": 1}), tmp_path, resume=True)
    again = list(read_messages(tmp_path / "messages"))
    assert [(m.round, m.sender, m.receiver, m.method) for m in again][:len(first)] == first
    assert {m.round for m in again[len(first):]} == {3} and {m.session for m in again[len(first):]} == {1}


def test_a_record_holding_code_is_refused(tmp_path):
    folder = tmp_path / "messages"
    folder.mkdir()
    torch.save({"format": record.FORMAT, "messages": [pickle.loads]}, folder / "part-000-00000.pt")
    with pytest.raises(ConfigError, match="objects other than tensors"):
        list(read_messages(folder))


# ---- raw rows and labels ------------------------------------------------------------------------------
NOTHING_SENT_RAW = {  # name: (protocol, model, partition)
    "fedavg": ({"name": "fedavg"}, GCN, None),
    "glasu": ({"name": "glasu", "batches": 1}, GCN, {"method": "random"}),
    "nfedgnn": ({"name": "nfedgnn", "lam": 1.0}, GCN, None),
    "cnfgnn": ({"name": "cnfgnn"}, GCN, None),
    "swift": ({"name": "swift", "I": 1, "K": 2, "fanouts": [3, 3]}, None, None),
    "fedaas": ({"name": "fedaas", "widths": [FEATURES, FEATURES], "fanouts": [4, 4], "batches": 4,
                "interval_loss": "train"}, None, None),
}


@pytest.mark.parametrize("name", list(NOTHING_SENT_RAW))
def test_raw_row_match_finds_nothing_where_rows_never_leave(tmp_path, name):
    protocol, model, partition = NOTHING_SENT_RAW[name]
    attacks = audited(config(protocol, model=model, partition=partition), tmp_path)
    raw = attacks["raw_row_match"]
    assert raw["attacked"] > 0 and raw["recovered"] == 0, raw["notes"]
    assert attacks["labels"]["recovered"] == 0 and not attacks["labels"]["details"]
    assert json.loads((tmp_path / "audit.json").read_text())["flagged"] == []


def test_llcg_rows_and_training_labels_reach_the_server_and_nowhere_else(tmp_path):
    attacks = audited(config({"name": "llcg", "local_steps": 2}, rounds=2), tmp_path)
    raw, labels = attacks["raw_row_match"], attacks["labels"]
    assert raw["recovered"] > 0 and "by design" in raw["notes"] and "by design" in labels["notes"]
    assert {(f["sender"] != "server", f["receiver"], f["method"]) for f in raw["details"]["flows"]} == \
        {(True, "server", "rows")}
    data = load_dataset("synthetic", num_nodes=400, num_features=FEATURES, avg_degree=10)
    assert labels["recovered"] > 0
    assert labels["details"]["splits"] == {"train": labels["recovered"], "val": 0, "test": 0}
    assert labels["recovered"] <= int(data.train_mask.sum())
    assert {(f["receiver"], f["method"]) for f in labels["details"]["flows"]} == {("server", "rows")}


# ---- single-row sums ---------------------------------------------------------------------------------
@pytest.mark.parametrize("min_aggregate", [1, 2])
def test_single_row_sums_leave_only_when_min_aggregate_allows_them(tmp_path, min_aggregate):
    attacks = audited(config({"name": "fedgnn-g", "fanouts": [3, 3], "min_aggregate": min_aggregate},
                             model={"dropout": 0.0}), tmp_path)
    membership = attacks["membership"]
    assert membership["attacked"] > 0
    if min_aggregate == 1:
        assert membership["details"]["input_count_one"] > 0
        assert attacks["raw_row_match"]["recovered"] > 0  # a one-row sum is the row itself
    else:
        assert membership["recovered"] == 0 and attacks["raw_row_match"]["recovered"] == 0
    flagged = {f["attack"] for f in json.loads((tmp_path / "audit.json").read_text())["flagged"]}
    # without dropout the sums also solve for rows (reconstruction), whatever min_aggregate
    assert flagged - {"reconstruction"} == ({"membership", "raw_row_match"} if min_aggregate == 1 else set())


def test_a_sum_whose_other_members_dropped_out_holds_one_row():
    x = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 1.0]])
    pick_sum, pick_node = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 2])
    sums = torch.tensor([[2.0, 0.0, 0.0],  # row 1 dropped out entirely: only row 0 is in it
                         [2.0, 2.0, 2.0]])  # both rows contribute
    assert contributing_members(pick_sum, pick_node, sums, x).tolist() == [1, 2]


# ---- least-squares reconstruction -------------------------------------------------------------------
def test_least_squares_recovers_exactly_the_determined_rows():
    x = torch.randn(5, 3, dtype=torch.float64)
    members = [[0, 1], [1, 2], [0, 2], [3, 4]]  # rows 0-2 are determined, 3 and 4 only by their sum
    pick_sum = torch.tensor([s for s, m in enumerate(members) for _ in m])
    pick_node = torch.tensor([v for m in members for v in m])
    sums = torch.zeros(4, 3, dtype=torch.float64).index_add_(0, pick_sum, x[pick_node])
    nodes, estimate, determined = least_squares_rows(pick_sum, pick_node, sums)
    assert nodes.tolist() == [0, 1, 2, 3, 4] and determined.tolist() == [True, True, True, False, False]
    assert torch.allclose(estimate[:3], x[:3])
    assert not torch.allclose(estimate[3:], x[3:])


def test_the_server_recovers_rows_from_a_plain_swift_run(tmp_path):
    cfg = config({"name": "swift", "I": 1, "K": 2, "fanouts": [3, 3]}, rounds=6, model={"dropout": 0.0},
                 partition={"method": "random"})
    rec = audited(cfg, tmp_path)["reconstruction"]
    assert rec["attacked"] > 100 and rec["fraction"] > 0.5, rec
    # independently of the audit's own check: the rows it counts equal the raw rows
    data = load_dataset("synthetic", num_nodes=400, num_features=FEATURES, avg_degree=10)
    truth = ground_truth(build_config(cfg), data)
    routed = RoutedSums()
    for down, msg in calls(read_messages(tmp_path / "messages")):
        if down is None:
            routed.request(msg)
        elif msg.method == "propagate":
            routed.add(down, msg, truth.nodes)
    nodes, estimate, _ = least_squares_rows(*routed.first_layer())
    exact = (estimate - data.x[nodes].double()).abs().amax(1) < 1e-4
    assert int(exact.sum()) == rec["recovered"]


def test_secure_aggregation_leaves_the_server_nothing_to_solve(tmp_path):
    cfg = config({"name": "swift", "I": 1, "K": 2, "fanouts": [3, 3]}, rounds=6, model={"dropout": 0.0},
                 partition={"method": "random"}, privacy={"secure_aggregation": True})
    Run(build_config(cfg), tmp_path).execute(progress=False)  # supported: a refusal fails here
    attacks = audit_run(tmp_path)["attacks"]
    rec = attacks["reconstruction"]
    assert rec["attacked"] > 100  # the server still routes the picks, so it knows each sum's members
    assert rec["recovered"] <= 0.01 * rec["attacked"]
    assert attacks["raw_row_match"]["recovered"] == 0


@pytest.mark.usefixtures("data_root")
def test_cora_sums_are_solved_against_the_real_features(tmp_path):
    cfg = config({"name": "fedgnn-g", "batch_size": 64}, rounds=2, model={"dropout": 0.0, "hidden": 16},
                 partition={"method": "random", "num_clients": 5}, dataset={"name": "cora"})
    attacks = audited(cfg, tmp_path)
    assert attacks["raw_row_match"]["attacked"] == 2708 and attacks["raw_row_match"]["recovered"] == 0
    assert attacks["reconstruction"]["recovered"] > 0


# ---- the command --------------------------------------------------------------------------------------
def test_audit_command_prints_one_line_for_a_run_without_messages(tmp_path, capsys):
    cfg = config({"name": "fedavg"}, rounds=1, model={"name": "gcn"})
    cfg["privacy"] = {}
    Run(build_config(cfg), tmp_path / "plain").execute(progress=False)
    capsys.readouterr()
    assert main(["audit", str(tmp_path / "plain")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no recorded messages" in err and "record_messages" in err and len(err.splitlines()) == 1
    assert main(["audit", str(tmp_path / "missing")]) == 2


def test_audit_command_writes_the_report(tmp_path, capsys):
    Run(build_config(config({"name": "llcg", "local_steps": 1}, rounds=1)), tmp_path).execute(progress=False)
    capsys.readouterr()
    assert main(["audit", str(tmp_path), "--json", "--data-root", str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "audit.json").read_text())
    assert set(printed["attacks"]) == {"raw_row_match", "reconstruction", "membership", "masking", "labels",
                                       "noise_replay"}
    assert printed["flagged"] == []  # LLCG's rows and labels go to the server by design
    assert main(["audit", str(tmp_path)]) == 0
    assert "raw_row_match" in capsys.readouterr().out
