"""The performance suite's pieces (benchmarks/perf.py, perf_harness.py, perf_references.py) on small
inputs, and what start-up imports."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def perf():
    sys.path.insert(0, str(BENCHMARKS))  # perf.py imports its harness and references beside it
    spec = importlib.util.spec_from_file_location("perf", BENCHMARKS / "perf.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in ("perf", "perf_harness", "perf_references", "peers_openfgl"):
            sys.modules.pop(name, None)


def test_import_fedgl_cli_loads_no_plotting_ray_or_sklearn():
    code = ("import sys, fedgl.cli; print(' '.join(m for m in ('matplotlib', 'ray', 'sklearn', 'rich', 'fedgl.bench') "
            "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []


def test_a_run_imports_no_plotting_until_it_draws():
    code = ("import sys, fedgl.runner; print(' '.join(m for m in ('matplotlib', 'ray', 'sklearn', 'rich') "
            "if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []


@pytest.mark.slow
def test_a_fedavg_run_never_loads_torch_dynamo_yet_torch_geometric_can(tmp_path):
    """torch_geometric is imported with ``torch._dynamo`` deferred (``fedgl.lean_imports``): a FedAvg
    run never loads it, and torch_geometric's own use of it still works once asked for."""
    config = {"dataset": {"options": {"num_nodes": 200}}, "train": {"rounds": 2}}
    code = (
        "import sys, fedgl\n"
        f"fedgl.run({config!r}, out_dir={str(tmp_path)!r})\n"
        "print('torch._dynamo.eval_frame' in sys.modules)\n"
        "import torch, torch_geometric\n"
        "compiled = torch.compile(torch.nn.Linear(2, 2))\n"
        "print(torch_geometric.is_torch_instance(compiled, torch.nn.Linear),\n"
        "      'torch._dynamo.eval_frame' in sys.modules)\n"
    )
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert lines[:2] == ["False", "True True"]


def test_targets_pass_and_fail(perf):
    assert perf.Measure("g", "a", 1.3, "x", "<= 1.3").passed is True
    assert perf.Measure("g", "a", 1.31, "x", "<= 1.3").passed is False
    assert perf.Measure("g", "a", 4.0, "s", "< 4").passed is False
    assert perf.Measure("g", "a", 2.0, "s").passed is None
    assert perf.failed("g", "a", "s", "<= 1", ValueError("boom")).row() == {
        "group": "g", "name": "a", "value": None, "unit": "s", "target": "<= 1",
        "note": "not measured: ValueError: boom", "pass": False}


def test_sampled_blocks_hold_only_edges_of_the_graph(perf):
    edge_index = torch.tensor([[1, 2, 3, 4, 0, 0, 5], [0, 0, 0, 0, 1, 2, 1]])
    rowptr, col = perf.references.csr_of(edge_index, 6)
    nodes, blocks = perf.references.sample_blocks(rowptr, col, torch.tensor([0, 1]), [3, 2], torch.Generator().manual_seed(0))
    assert nodes[:2].tolist() == [0, 1] and nodes.unique().numel() == nodes.numel()
    edges = set(zip(*edge_index.tolist()))
    top = blocks[-1]  # output layer: at most 2 neighbours per batch node
    (src, dst), (num_src, num_dst) = top
    assert num_dst == 2 and torch.bincount(dst, minlength=2).tolist() == [2, 2]
    below = blocks[0][1][0]
    assert {(int(nodes[s]), int(nodes[d])) for s, d in zip(*blocks[0][0].tolist())} <= edges
    assert {(int(nodes[s]), int(nodes[d])) for s, d in zip(src.tolist(), dst.tolist())} <= edges
    assert below == nodes.numel() and num_src <= below


def test_overhead_measure_runs_and_writes_well_formed_results(perf, tmp_path):
    torch.manual_seed(0)
    measures = perf.overhead(True, dataset="synthetic", protocols=("centralized", "nfedgnn"))
    assert [m.name for m in measures] == ["centralized", "nfedgnn"]
    for m in measures:
        assert m.value is not None and m.value > 0, m.note
        assert "ms per round against" in m.note
    result = {"machine": perf.machine(), "quick": True, "peers_cited": perf.PEERS,
              "measures": [m.row() for m in measures]}
    json_path, md_path = perf.write(result, tmp_path)
    written = json.loads(json_path.read_text())
    assert set(written["machine"]) >= {"date", "cpu", "cores", "load_average", "torch"}
    assert written["machine"]["torch"] == torch.__version__
    for row in written["measures"]:
        assert set(row) == {"group", "name", "value", "unit", "target", "note", "pass"}
        assert row["pass"] == (row["value"] <= 1.3)
    table = md_path.read_text().splitlines()
    assert table[2].startswith("| group | measure |") and len(table) == 4 + len(measures)


def test_reading_a_dataset_imports_only_its_own_torch_geometric_module(data_root):
    """``torch_geometric.datasets`` is imported as a package whose submodules load on their own: reading
    Cora runs planetoid.py, neither the other dataset modules nor pandas (0.3 s, 80 MiB); asking the
    package itself for a class, or for all its names, still loads all of it."""
    code = (
        "import sys\n"
        "from fedgl.data import load_dataset\n"
        f"print(load_dataset('cora', root={str(data_root)!r}).num_nodes)\n"
        "print('pandas' in sys.modules, 'torch_geometric.datasets.karate' in sys.modules)\n"
        "names = {}\n"
        "exec('from torch_geometric.datasets import *', names)\n"
        "print('Reddit' in names, 'pandas' in sys.modules)\n"
        "import torch_geometric\n"
        "print(torch_geometric.datasets.KarateClub()[0].num_nodes)\n"
    )
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert lines[:4] == ["2708", "False False", "True True", "34"]


@pytest.mark.slow
def test_a_device_pass_runs_both_sides_on_the_device(perf, monkeypatch):
    """``--device cuda``: the fedgl runs and the plain PyG references compute on the device (here the
    stand-in accelerator, which refuses any operand left on the CPU): the overhead group's full-batch
    references and one mini-batch reference step."""
    from fedgl import device as devices
    from support.fake_device import fake_accelerator

    with fake_accelerator(monkeypatch) as device:
        place = perf.Place.of("cuda")
        assert place.config({"name": "fedavg"}, "cora", {})["device"] == "cuda"
        measures = perf.overhead(True, place, dataset="synthetic",
                                 protocols=("centralized", "fedavg", "glasu", "nfedgnn"))
        assert [m.name for m in measures] == ["centralized", "fedavg", "glasu", "nfedgnn"]
        assert all(m.value is not None for m in measures), [m.note for m in measures]
        data = perf.load("synthetic", num_nodes=300, num_features=16, num_classes=3)
        train = [data.train_mask.nonzero().flatten()]
        with devices.working_on(device):
            reference = perf.references.MiniBatchReference(devices.move(data, device), "sage", [16, 8, 3],
                                                           devices.move(train, device), 32, [4, 3])
            place.finished(lambda: reference.step(0))()
        assert all(p.device == device for p in reference.model.parameters())
        assert data.x.device.type == "cpu"  # the runs' copy stays where the runs read it
    assert perf.CPU.device.type == "cpu"  # the pass's device was passed along, not set for the module


def test_a_device_this_machine_lacks_is_refused_in_one_line(perf, capsys, tmp_path):
    for wanted, message in (("cuda:7" if torch.cuda.is_available() else "cuda", "device: cuda"),
                            ("gpu", "expected cpu, cuda or cuda:N")):
        with pytest.raises(SystemExit) as exit_:
            perf.main(["--device", wanted, "--out", str(tmp_path)])
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not any(tmp_path.iterdir())
    assert perf.stem("cpu") == "perf" and perf.stem("cuda:1") == "perf-cuda"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_overhead_measure_runs_on_a_gpu(perf):
    measures = perf.overhead(True, perf.Place.of("cuda"), dataset="synthetic", large="synthetic")
    assert len(measures) == 7 and all(m.value is not None for m in measures), [m.note for m in measures]


def test_the_peer_group_splits_rays_gap_into_a_fixed_and_a_per_round_cost(perf, monkeypatch):
    """Whole-process times stand in for the runs: Ray's fixed cost is the 1-round runs' difference, and
    its cost a round what the 100-round runs add beyond them, over 99 rounds."""
    seconds = {("local", "100"): 4.0, ("local", "1"): 2.0, ("ray", "100"): 12.0, ("ray", "1"): 8.0}

    def fake(argv, env=None):
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps({"wall_ms_per_round": 20.0}))
        return seconds[(argv[argv.index("--backend") + 1], argv[argv.index("--rounds") + 1])], 300.0, ""

    monkeypatch.setattr(perf, "timed_process", fake)
    monkeypatch.setattr(importlib.import_module("peers_openfgl"), "openfgl_path", lambda: None)
    found = {m.name: m.value for m in perf.peers(True)}
    assert found["fedavg cora: whole run on Ray / in-process"] == pytest.approx(3.0)
    assert found["fedavg cora: Ray's fixed cost over in-process (whole 1-round runs)"] == pytest.approx(6.0)
    assert found["fedavg cora: one round on Ray over one in-process"] == pytest.approx(1000 * 2 / 99)


def test_fedgnn_gs_floor_reads_the_iterations_embedding_bytes_from_the_ledger(perf):
    run = perf.FedglRun({"dataset": {"name": "synthetic", "options": {"num_nodes": 400}},
                         "partition": {"num_clients": 4, "method": "random"}, "threads": 1,
                         "protocol": {"name": "fedgnn-g", "batch_size": 32, "fanouts": [5, 5]},
                         "model": {"name": "sage", "hidden": 8}})
    try:
        run.step()
        run.step()
        rows = [r for r in run.job.transport.ledger.rows() if r["round"] == 2]
        up, down = perf.round_bytes(run, "embedding")
        assert up == sum(r["bytes"] for r in rows if r["kind"] == "embedding" and r["direction"] == "up") > 0
        assert down == sum(r["bytes"] for r in rows if r["kind"] == "embedding" and r["direction"] == "down") > 0
        assert sum(perf.round_bytes(run)) > up + down  # every kind but eval: the model and gradients too
    finally:
        run.close()
    assert perf.references.dense_sums_floor(up, down, 32, 8) > 0
