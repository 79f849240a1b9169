"""The command line: bad input is one line on stderr and exit code 2; good input writes a results folder."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml

from fedgl.cli import main
from support.runs import compare_runs

TINY = ["--dataset", "synthetic", "--set", "dataset.options.num_nodes=300", "--rounds", "3", "--quiet"]


def fails_with(capsys, argv: list[str], *needles: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, f"expected one line, got:\n{err}"
    for needle in needles:
        assert needle in err, err
    return err


def test_unknown_dataset(capsys, tmp_path):
    fails_with(capsys, ["run", "--dataset", "imagenet", "--out", str(tmp_path)], "imagenet", "cora")


def test_unknown_protocol(capsys, tmp_path):
    fails_with(capsys, ["run", "--protocol", "fedprox", "--out", str(tmp_path)], "fedprox", "fedavg")


def test_out_of_range_setting(capsys, tmp_path):
    fails_with(capsys, ["run", "--set", "train.lr=-1", "--out", str(tmp_path)], "train.lr", "-1")
    fails_with(capsys, ["run", "--set", "protocol.client_fraction=2", "--out", str(tmp_path)], "client_fraction")


def test_unknown_key(capsys, tmp_path):
    fails_with(capsys, ["run", "--set", "train.learning_rate=0.1", "--out", str(tmp_path)], "train.learning_rate")


def test_malformed_yaml(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  rounds: [1, 2\n  lr: 0.1\n")
    fails_with(capsys, ["run", str(bad)], "malformed YAML", "bad.yaml", "line")
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    fails_with(capsys, ["run", str(scalar)], "mapping")
    twice = tmp_path / "twice.yaml"
    twice.write_text("dataset: {name: synthetic}\ntrain:\n  rounds: 2\n  rounds: 3\n")
    fails_with(capsys, ["run", str(twice)], "twice.yaml", "line 4", "'rounds' is given twice")


def test_missing_config_file(capsys, tmp_path):
    fails_with(capsys, ["run", str(tmp_path / "nope.yaml")], "not found")


def test_logging_curves_draws_the_plot_at_the_end_of_the_run(tmp_path):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--rounds", "2", "--set", "logging=[curves]", "--out", str(out), "--quiet"]) == 0
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_more_clients_than_nodes(capsys, tmp_path):
    fails_with(capsys, ["run", *TINY, "--clients", "500", "--out", str(tmp_path)], "500")


def test_missing_data_root_files(capsys, tmp_path):
    empty = tmp_path / "empty-root"
    empty.mkdir()
    fails_with(capsys, ["run", "--dataset", "cora", "--data-root", str(empty), "--out", str(tmp_path / "o")],
               "cora", str(empty))


def test_run_writes_results_folder(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--clients", "3", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"results: {out}" in printed
    summary = json.loads((out / "summary.json").read_text())
    for key in ("protocol", "dataset", "backend", "seed", "rounds", "best_val_accuracy", "test_accuracy",
                "bytes_total", "bytes_by_kind", "sim_time_s", "wall_time_s", "target_val_accuracy",
                "round_at_target", "bytes_at_target"):
        assert key in summary
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3]
    for key in ("train_loss", "val_accuracy", "test_accuracy", "bytes_total", "sim_time_s"):
        assert key in rows[0]
    assert (out / "config.yaml").exists() and not (out / "curves.png").exists()  # drawn only when asked for
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").read_text().count("fedavg") == 1


def test_console_script_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fedgl.cli", "run", "--set", "train.rounds=0"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 2 and "train.rounds" in proc.stderr


def test_datasets_list_names_the_root(capsys, data_root):
    assert main(["datasets", "list", "--data-root", str(data_root)]) == 0
    out = capsys.readouterr().out
    assert str(data_root) in out and "cora" in out.lower()


@pytest.mark.parametrize("argv", [["bench", "--list"], ["bench"]])
def test_bench_lists_tasks(capsys, argv):
    assert main(argv) == 0
    assert "foundation-cora" in capsys.readouterr().out


def test_bench_runs_chosen_variants_and_reuses_finished_runs(capsys, tmp_path, data_root):
    argv = ["bench", "foundation-cora", "--quick", "--only", "metis", "--out", str(tmp_path),
            "--set", "train.rounds=2"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "fedavg-metis10 seed 0" in first and "(reused)" not in first
    assert "| centralized" not in (tmp_path / "table.md").read_text()
    assert main(argv) == 0
    assert "fedavg-metis10 seed 0 (reused)" in capsys.readouterr().out
    assert main(argv + ["--set", "train.lr=0.02"]) == 0  # another config: run again
    assert "(reused)" not in capsys.readouterr().out
    assert main(argv + ["--rerun"]) == 0
    assert "(reused)" not in capsys.readouterr().out
    runs = json.loads((tmp_path / "results.json").read_text())
    assert [r["variant"] for r in runs] == ["fedavg-metis10"]


def test_bench_only_matching_nothing_names_the_variants(capsys, tmp_path):
    fails_with(capsys, ["bench", "foundation-cora", "--only", "fedprox", "--out", str(tmp_path)],
               "fedprox", "fedavg-metis10")


def test_bench_table_says_how_many_runs_a_mean_covers():
    from fedgl.bench.core import BenchTask, Variant, render_markdown

    task = BenchTask(name="t", description="", base={}, variants=[Variant("a")], columns=["gb_at_target"])
    partial = {"mean": 1.5, "std": 0.0, "paper": None, "runs": 1, "of": 3}
    full = partial | {"runs": 3}
    assert "1.5 ± 0 (1 of 3 runs)" in render_markdown(task, [{"variant": "a", "gb_at_target": partial}], 3)
    assert "runs)" not in render_markdown(task, [{"variant": "a", "gb_at_target": full}], 3)


# ---- results folders, checkpoints and other inputs an operator gets wrong ---------------------------------
def test_binary_config_file(capsys, tmp_path):
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    fails_with(capsys, ["run", str(binary)], "model.bin", "not a text")


def test_seed_out_of_range(capsys, tmp_path):
    fails_with(capsys, ["run", *TINY, "--seed", str(2**63), "--out", str(tmp_path)], "seed")


def test_out_is_a_file_or_unwritable(capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    fails_with(capsys, ["run", *TINY, "--out", str(afile)], "is a file")
    fails_with(capsys, ["run", *TINY, "--out", "/proc/fedgl-run"], "cannot be written")


def test_finished_run_is_not_overwritten(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--out", str(out)]) == 0
    assert (out / "finished").exists() and json.loads((out / "summary.json").read_text())["finished"] is True
    fails_with(capsys, ["run", *TINY, "--out", str(out)], "finished run", "--overwrite")
    assert main(["run", *TINY, "--out", str(out), "--overwrite"]) == 0


def test_resume_needs_out_and_a_checkpoint(capsys, tmp_path):
    fails_with(capsys, ["run", *TINY, "--resume"], "--resume needs --out")
    fails_with(capsys, ["run", *TINY, "--resume", "--out", str(tmp_path / "empty")], "no checkpoint")


def test_default_folders_are_unique(tmp_path):
    from fedgl.config import build_config
    from fedgl.runner import default_out_dir

    cfg = build_config({})
    folders = {default_out_dir(cfg, tmp_path) for _ in range(3)}
    assert len(folders) == 3 and all(f.is_dir() for f in folders)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign"])
def test_damaged_checkpoint_is_one_line(capsys, tmp_path, damage):
    import torch

    out = tmp_path / "run"
    assert main(["run", *TINY, "--set", "checkpoint_every=1", "--out", str(out)]) == 0
    checkpoint = out / "checkpoint.pt"
    if damage == "garbage":
        checkpoint.write_bytes(b"\x00not a checkpoint" * 10)
    elif damage == "truncated":
        checkpoint.write_bytes(checkpoint.read_bytes()[:200])
    else:
        torch.save({"weights": torch.zeros(3)}, checkpoint)
    fails_with(capsys, ["run", *TINY, "--set", "checkpoint_every=1", "--out", str(out), "--resume"],
               "cannot resume", "checkpoint")


def test_resume_with_another_config_names_the_keys(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--set", "checkpoint_every=1", "--out", str(out)]) == 0
    fails_with(capsys, ["run", *TINY, "--set", "checkpoint_every=1", "--set", "train.lr=0.05", "--out", str(out),
                        "--resume", "--rounds", "4"], "different config", "train.lr")
    assert main(["run", *TINY, "--set", "checkpoint_every=1", "--rounds", "5", "--out", str(out),
                 "--resume"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]


def test_report_on_corrupt_metrics(capsys, tmp_path):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--out", str(out)]) == 0
    (out / "metrics.jsonl").write_text('{"round": 1}\n{"round": 2, "val_acc\n')
    fails_with(capsys, ["report", str(out)], "metrics.jsonl", "corrupt")


def test_unreachable_ray_address_fails_fast(capsys, tmp_path):
    start = time.perf_counter()
    fails_with(capsys, ["run", *TINY, "--backend", "ray", "--set", "backend.address=127.0.0.1:1",
                        "--set", "backend.connect_timeout_s=5", "--out", str(tmp_path)], "cannot reach Ray")
    assert time.perf_counter() - start < 10


def test_a_ray_address_where_no_gcs_answers_fails_within_the_timeout(capsys, tmp_path):
    """A port where something else listens (here a web server, e.g. Ray's dashboard port): Ray would retry it
    for minutes; the run fails within backend.connect_timeout_s."""
    import threading
    from http.server import HTTPServer, SimpleHTTPRequestHandler

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # the test reads stderr: the server writes nothing there
            pass

    pytest.importorskip("ray")
    server = HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        start = time.perf_counter()
        address = f"backend.address=127.0.0.1:{server.server_port}"
        fails_with(capsys, ["run", *TINY, "--backend", "ray", "--set", address,
                            "--set", "backend.connect_timeout_s=3", "--out", str(tmp_path)],
                   "cannot reach Ray", "no Ray GCS answered within 3 s")
        assert time.perf_counter() - start < 10
    finally:
        server.shutdown()


def test_interrupt_checkpoints_the_last_round_and_resumes_exactly(tmp_path):
    """Ctrl-C during a run stops after the round in progress, checkpoints it, writes an unfinished
    summary and prints how to resume; the resumed run equals an uninterrupted one."""
    import os
    import signal

    from fedgl.config import build_config
    from fedgl.runner import Run

    cfg = build_config({"dataset": {"options": {"num_nodes": 300}}, "train": {"rounds": 6},
                        "network": {"compute": "ignore"}})
    straight = Run(cfg, tmp_path / "a").execute(progress=False)
    job = Run(cfg, tmp_path / "b")
    calls = {"n": 0}
    inner = job.protocol.train_round

    def train_round(r):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return inner(r)

    job.protocol.train_round = train_round
    with pytest.raises(KeyboardInterrupt):
        job.execute(progress=False)
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["finished"] is False and summary["rounds"] == 3
    assert not (tmp_path / "b" / "finished").exists()
    resumed = Run(cfg, tmp_path / "b")
    assert resumed.resume() and resumed.start_round == 4
    compare_runs(straight, resumed.execute(progress=False))
    resumed_summary = json.loads((tmp_path / "b" / "summary.json").read_text())  # wall covers rounds 1-6
    assert resumed_summary["wall_time_s"] > summary["wall_time_s"]
    assert resumed_summary["wall_ms_per_round"] == pytest.approx(1e3 * resumed_summary["wall_time_s"] / 6)


def test_wall_time_leaves_out_tearing_the_parties_down(tmp_path):
    """Stopping the parties (Ray's shutdown takes a second or more) is not part of a run's wall time
    nor of its milliseconds per round."""
    from fedgl.config import build_config
    from fedgl.runner import Run

    job = Run(build_config({"dataset": {"options": {"num_nodes": 300}}, "train": {"rounds": 2}}), tmp_path)
    close = job.transport.close
    job.transport.close = lambda: (time.sleep(1.0), close())
    result = job.execute(progress=False)
    assert result.summary["wall_time_s"] - result.metrics[-1]["wall_time_s"] < 0.5


def test_datasets_check_of_an_unknown_name(capsys):
    fails_with(capsys, ["datasets", "check", "imagenet"], "imagenet", "cora")


def test_bench_does_not_reuse_an_unfinished_run(tmp_path):
    from fedgl.bench.core import finished_summary
    from fedgl.config import build_config
    from fedgl.runner import Run

    cfg = build_config({"dataset": {"options": {"num_nodes": 300}}, "train": {"rounds": 2}})
    Run(cfg, tmp_path).execute(progress=False)
    assert finished_summary(tmp_path, cfg)["rounds"] == 2
    (tmp_path / "finished").unlink()
    summary = json.loads((tmp_path / "summary.json").read_text())
    (tmp_path / "summary.json").write_text(json.dumps(summary | {"finished": False}))
    assert finished_summary(tmp_path, cfg) is None


def test_progress_lines_when_output_is_not_a_terminal(tmp_path, capsys):
    """Piped output (CI, nohup, | cat) gets plain progress lines with an ETA while the run goes;
    --json prints only the summary."""
    proc = subprocess.run([sys.executable, "-m", "fedgl.cli", "run", "--dataset", "synthetic", "--set",
                           "dataset.options.num_nodes=300", "--rounds", "40", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, check=True)
    lines = [line for line in proc.stdout.splitlines() if "round " in line and "/40" in line]
    assert len(lines) == 20 and all("eta" in line and "B  elapsed" in line for line in lines), proc.stdout
    assert main(["run", *TINY, "--json", "--out", str(tmp_path / "j")]) == 0
    assert json.loads(capsys.readouterr().out)["rounds"] == 3


def test_bench_reuses_a_run_made_before_an_option_existed(tmp_path):
    """A run's saved config lacks options added since (they take their defaults): still the same run."""
    import yaml

    from fedgl.bench.core import finished_summary
    from fedgl.config import build_config
    from fedgl.runner import Run

    cfg = build_config({"dataset": {"options": {"num_nodes": 300}}, "train": {"rounds": 2}})
    Run(cfg, tmp_path).execute(progress=False)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del saved["backend"]["on_client_failure"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    assert finished_summary(tmp_path, cfg)["rounds"] == 2
    other = build_config({"dataset": {"options": {"num_nodes": 300}}, "train": {"rounds": 2, "lr": 0.05}})
    assert finished_summary(tmp_path, other) is None


def test_bench_does_not_reuse_a_run_made_before_an_option_that_changed_its_behaviour(tmp_path):
    """FedAAS's sync counter arrived with a new default: a run saved without it synced by the authors'
    code's counter, so it is reused only for ``sync_counter: round``."""
    import yaml

    from fedgl.bench.core import finished_summary
    from fedgl.config import build_config
    from fedgl.runner import Run

    def cfg(counter):
        return build_config({"dataset": {"options": {"num_nodes": 120, "num_features": 8}},
                             "partition": {"num_clients": 2, "method": "random"},
                             "protocol": {"name": "fedaas", "widths": [8, 8], "batches": 2, "interval_loss": "train",
                                          "sync_counter": counter},
                             "train": {"rounds": 1}, "network": {"compute": "ignore"}})

    Run(cfg("round"), tmp_path).execute(progress=False)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del saved["protocol"]["sync_counter"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    assert finished_summary(tmp_path, cfg("round"))["rounds"] == 1
    assert finished_summary(tmp_path, cfg("global")) is None


def test_settings_that_would_train_on_nothing_or_silently_do_nothing(capsys, tmp_path):
    """Each is refused before training, naming the key: an infinite value (training would be NaN),
    a split leaving no validation nodes (every score NaN), a stop without a target, LLCG ending
    before its first average, FedGNN-PNS's decay that could never act, a thread count torch would
    crash on, and a model section FedAAS would ignore."""
    out = ["--out", str(tmp_path)]
    fails_with(capsys, ["run", *TINY, *out, "--set", "train.lr=.inf"], "train.lr", "finite")
    fails_with(capsys, ["run", *TINY, *out, "--set", "dataset.split=ratio:0.9,0,0.1"], "fractions > 0")
    fails_with(capsys, ["run", "--dataset", "synthetic", "--set", "dataset.options.num_nodes=12", "--set",
                        "dataset.options.avg_degree=2", "--clients", "2", "--quiet", *out],
               "no validation nodes", "dataset.split")
    fails_with(capsys, ["run", *TINY, *out, "--set", "eval.stop_at_target=true"], "target_val_accuracy")
    fails_with(capsys, ["run", *TINY, *out, "--protocol", "llcg", "--set", "model.name=sage"],
               "protocol.local_steps", "train.rounds")
    fails_with(capsys, ["run", *TINY, *out, "--protocol", "fedgnn-pns", "--set", "model.name=sage", "--set",
                        "protocol.min_interval=50"], "invalid config: protocol: min_interval (50)")
    fails_with(capsys, ["run", *TINY, *out, "--set", "threads=100000"], "threads")
    fails_with(capsys, ["run", *TINY, *out, "--protocol", "fedaas", "--set", "partition.client_nodes=train",
                        "--set", "model.name=bogus"], "remove model.name")
    fails_with(capsys, ["run", *TINY, *out, "--protocol", "fedaas", "--set", "partition.client_nodes=train",
                        "--set", "protocol.policy_choices=[-3, 0]"], "protocol.policy_choices")


@pytest.mark.parametrize("key", ["train.rounds", "train.lr", "threads", "protocol.local_epochs",
                                 "privacy.dp.noise_multiplier"])
def test_a_boolean_is_not_a_number(capsys, tmp_path, key):
    """``rounds: true`` would otherwise run 1 round and ``lr: yes`` train at 1.0."""
    tiny = [arg for arg in TINY if arg not in ("--rounds", "3")]  # --rounds and --set train.rounds would disagree
    fails_with(capsys, ["run", *tiny, "--out", str(tmp_path), "--set", f"{key}=true"], key, "expected a number")


def test_a_gpu_out_of_memory_is_one_line(capsys, tmp_path, monkeypatch):
    """torch's GPU allocator raises its own error type, with the size in its own words."""
    import torch

    import fedgl.runner

    def full(self, progress=True):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 7.79 GiB total)")
    monkeypatch.setattr(fedgl.runner.Run, "execute", full)
    assert main(["run", *TINY, "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == ("fedgl: run failed: out of memory on the GPU (2.1 GB at once); "
                                               "a smaller model, batch or graph needs less")


def test_a_gpu_out_of_memory_in_a_ray_host_is_one_line(capsys, tmp_path, monkeypatch):
    """Ray hands the driver the host's error wrapped in a class of its own; it is still recognised."""
    ray = pytest.importorskip("ray")
    import torch

    import fedgl.runner

    cause = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0)")
    wrapped = ray.exceptions.RayTaskError("run", f"Traceback ...\ntorch.OutOfMemoryError: {cause}", cause)

    def full(self, progress=True):
        raise wrapped.as_instanceof_cause()
    monkeypatch.setattr(fedgl.runner.Run, "execute", full)
    assert main(["run", *TINY, "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == ("fedgl: run failed: out of memory on the GPU (21.0 MB at once); "
                                               "a smaller model, batch or graph needs less")


def test_settings_a_run_never_reads_are_noted(capsys, tmp_path):
    """Running another protocol from the same settings is normal: a note, not an error, and only for
    values changed from their defaults."""
    assert main(["run", *TINY, "--out", str(tmp_path / "a"), "--protocol", "centralized", "--clients", "3",
                 "--set", "partition.method=metis", "--set", "backend.actors=2", "--set", "backend.max_retries=5"]) == 0
    err = capsys.readouterr().err
    assert "note: backend.max_retries (5) is not read: only on_client_failure: retry reads it, not stop" in err
    assert "note: partition.num_clients (3) is not read: centralized trains one party" in err
    assert "note: backend.actors (2) is not read: it is Ray's" in err
    assert "partition.method" not in err  # the default value
    assert main(["run", *TINY, "--out", str(tmp_path / "b"), "--set", "partition.alpha=0.1"]) == 0
    assert "partition.alpha (0.1) is not read: only the dirichlet methods read it, not metis" in capsys.readouterr().err
    assert main(["run", *TINY, "--out", str(tmp_path / "c"), "--set", "partition.method=dirichlet",
                 "--set", "partition.alpha=0.1", "--set", "partition.edge_keep=0.5"]) == 0
    assert capsys.readouterr().err.strip() == ("fedgl: note: partition.edge_keep (0.5) is not read: it shapes "
                                               "vertical partitions, and fedavg splits nodes")


def test_another_protocol_from_the_same_yaml_keeps_the_options_it_has(capsys, tmp_path):
    """``--protocol`` naming another protocol than the config's keeps the options both have and leaves
    out (noted) those only the config's protocol has, instead of refusing them; ``--set`` still applies."""
    config = tmp_path / "fedavg.yaml"
    config.write_text("protocol:\n  name: fedavg\n  local_epochs: 2\n  client_fraction: 1.0\n")
    assert main(["run", str(config), *TINY, "--out", str(tmp_path / "a"), "--protocol", "centralized",
                 "--set", "protocol.batch_size=64"]) == 0
    assert "centralized does not have are left out: client_fraction" in capsys.readouterr().err
    assert yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())["protocol"] == {
        "name": "centralized", "local_epochs": 2, "batch_size": 64}
    assert main(["run", str(config), *TINY, "--out", str(tmp_path / "b"), "--protocol", "fedavg"]) == 0
    assert "left out" not in capsys.readouterr().err


def test_another_protocol_notes_training_values_its_paper_does_not_use(capsys, tmp_path):
    """A config's own ``train.lr`` stays when ``--protocol`` switches to nFedGNN (paper: 0.1), noted;
    without one, or with ``--set``, nothing is noted and the run says which value it used."""
    config = tmp_path / "fedavg.yaml"
    config.write_text("protocol:\n  name: fedavg\ntrain:\n  lr: 0.01\n")
    assert main(["run", str(config), *TINY, "--out", str(tmp_path / "a"), "--protocol", "nfedgnn"]) == 0
    assert (f"note: nfedgnn trains with train.lr = 0.01 from {config}; its paper's value is 0.1 (remove it from "
            f"{config} or --set train.lr=0.1)") in capsys.readouterr().err
    for setting in (["--set", "train.lr=0.05"], ["--set", "train={lr: 0.05, rounds: 3}"],  # TINY's --rounds 3
                    ["--set", "model.name=gat", "--set", "model.options.heads=8"]):  # GAT's paper value is 0.01
        assert main(["run", str(config), *TINY, "--out", str(tmp_path / "b"), "--overwrite", "--protocol", "nfedgnn",
                     *setting]) == 0
        assert "its paper's" not in capsys.readouterr().err
    config.write_text("protocol:\n  name: nfedgnn\ntrain:\n  lr: 0.01\n")  # no switch: the file's own choice
    assert main(["run", str(config), *TINY, "--out", str(tmp_path / "b"), "--overwrite", "--protocol", "nfedgnn"]) == 0
    assert "its paper's" not in capsys.readouterr().err
    config.write_text("protocol:\n  name: fedavg\n")
    assert main(["run", str(config), *TINY, "--out", str(tmp_path / "c"), "--protocol", "nfedgnn"]) == 0
    assert "its paper's" not in capsys.readouterr().err
    assert yaml.safe_load((tmp_path / "c" / "config.yaml").read_text())["train"]["lr"] == 0.1


def test_a_run_refused_while_it_sets_up_leaves_no_folder(capsys, tmp_path):
    new, kept = tmp_path / "new", tmp_path / "kept"
    kept.mkdir()
    for out in (new, kept):
        fails_with(capsys, ["run", *TINY, "--out", str(out), "--protocol", "llcg", "--set", "model.name=sage"],
                   "protocol.local_steps")
    assert not new.exists() and kept.is_dir()  # a folder the user made stays
    fails_with(capsys, ["run", *TINY, "--out", str(new), "--protocol", "llcg", "--set", "model.name=sage", "--set",
                        "privacy.record_messages=true"], "protocol.local_steps")  # its messages/ folder is empty
    fails_with(capsys, ["run", *TINY, "--out", str(new), "--resume"], "holds no checkpoint")
    assert not new.exists()


def test_backend_parties_must_name_parties_of_the_run(capsys, tmp_path):
    fails_with(capsys, ["run", *TINY, "--out", str(tmp_path), "--set", "backend.parties={nobody: {node: x}}"],
               "no party nobody", "group0")


def test_resume_cannot_go_back_before_the_checkpoint(capsys, tmp_path):
    assert main(["run", *TINY, "--out", str(tmp_path), "--set", "checkpoint_every=1"]) == 0
    fails_with(capsys, ["run", *TINY, "--out", str(tmp_path), "--set", "checkpoint_every=1", "--resume",
                        "--rounds", "1"], "round 3", "train.rounds = 1")


def test_report_and_partition_name_bad_folders(capsys, tmp_path):
    run_dir, afile = tmp_path / "run", tmp_path / "afile"
    afile.write_text("")
    assert main(["run", *TINY, "--out", str(run_dir)]) == 0
    capsys.readouterr()
    half = tmp_path / "half"
    half.mkdir()
    (half / "summary.json").write_text((run_dir / "summary.json").read_text())
    fails_with(capsys, ["report", str(half)], "no metrics.jsonl")
    (half / "summary.json").write_text("[1, 2]")
    fails_with(capsys, ["report", str(half)], "not a JSON object")
    fails_with(capsys, ["report", str(run_dir), "--out", str(afile)], "--out", "is a file")
    fails_with(capsys, ["report", str(run_dir), "--html", str(tmp_path)], "--html", "is a folder")
    fails_with(capsys, ["partition", "--out", str(afile / "shards")], "cannot be written")
    fails_with(capsys, ["run", str(tmp_path)], "is a folder, not a config file")


def test_bench_refuses_bad_seeds_and_reads_set_values_as_run_does(capsys, tmp_path):
    fails_with(capsys, ["bench", "foundation-cora", "--seeds", "0", "--out", str(tmp_path)], "--seeds")
    fails_with(capsys, ["bench", "foundation-cora", "--quick", "--set", "train.rounds=[1,", "--out", str(tmp_path)],
               "train.rounds")


def test_a_model_too_large_to_allocate_is_one_line(capsys, tmp_path):
    """256 TB of weights, more than a 64-bit processor's user address space (128 TB with 48-bit
    addresses): torch's allocator refuses at once, whatever the machine's memory."""
    out = tmp_path / "run"
    assert main(["run", *TINY, "--out", str(out), "--set", "model.hidden=1000000000000"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedgl: run failed: out of memory"), err
    assert not out.exists()  # the folder it made for the run is gone again
    assert main(["partition", "--set", "protocol.name=nfedgnn", "--set", "model.hidden=1000000000000",
                 "--out", str(out)]) == 1
    assert capsys.readouterr().err.startswith("fedgl: partition failed: out of memory")


def test_a_target_on_test_accuracy_stops_the_run_at_the_first_round_reaching_it(capsys, tmp_path):
    """eval.target_test_accuracy (GLASU's Table 4 states its target so): the run stops at the first
    evaluated round whose test accuracy reaches it, and the summary names that round; setting both
    targets is refused in one line."""
    full = tmp_path / "full"
    assert main(["run", *TINY, "--rounds", "8", "--out", str(full)]) == 0
    rows = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    target = sorted(r["test_accuracy"] for r in rows)[len(rows) // 2]  # reached, but not at round 1 alone
    first = next(r["round"] for r in rows if r["test_accuracy"] >= target)
    stopped = tmp_path / "stopped"
    assert main(["run", *TINY, "--rounds", "8", "--out", str(stopped), "--set", f"eval.target_test_accuracy={target}",
                 "--set", "eval.stop_at_target=true"]) == 0
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["rounds"] == summary["round_at_target"] == first
    assert summary["target_test_accuracy"] == target and summary["target_val_accuracy"] is None
    capsys.readouterr()
    fails_with(capsys, ["run", *TINY, "--out", str(tmp_path / "both"), "--set", "eval.target_test_accuracy=0.5",
                        "--set", "eval.target_val_accuracy=0.5"], "not both")
