"""Bad input from outside the config: damaged dataset files, an unusable cache folder, a full disk and
checkpoints that would run code. Each is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import errno
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml

from fedgl.cli import main

TINY = ["--dataset", "synthetic", "--set", "dataset.options.num_nodes=300", "--rounds", "3", "--quiet"]


def fails_with(capsys, argv: list[str], *needles: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, f"expected one line, got:\n{err}"
    for needle in needles:
        assert needle in err, err
    return err


@pytest.fixture
def cora_copy(data_root, tmp_path) -> Path:
    """A private data root holding Cora's raw files (a new root: nothing cached for it yet)."""
    root = tmp_path / "root"
    shutil.copytree(data_root / "planetoid" / "Cora" / "raw", root / "planetoid" / "Cora" / "raw")
    return root


def run_cora(root: Path, out: Path) -> list[str]:
    return ["run", "--dataset", "cora", "--data-root", str(root), "--rounds", "1", "--quiet", "--out", str(out)]


def test_truncated_raw_file_is_named(capsys, cora_copy, tmp_path):
    damaged = cora_copy / "planetoid" / "Cora" / "raw" / "ind.cora.allx"
    with open(damaged, "r+b") as fh:
        fh.truncate(damaged.stat().st_size // 2)
    err = fails_with(capsys, run_cora(cora_copy, tmp_path / "out"), str(damaged), "delete it and download it again")
    assert "processed" not in err  # rebuilding processed files would not help


def test_garbage_raw_file_is_named(capsys, cora_copy, tmp_path):
    damaged = cora_copy / "planetoid" / "Cora" / "raw" / "ind.cora.graph"
    damaged.write_bytes(b"<html>not found</html>")
    fails_with(capsys, run_cora(cora_copy, tmp_path / "out"), str(damaged), "damaged")


def test_unwritable_cache_names_fedgl_cache(capsys, cora_copy, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("a file, not a folder")
    monkeypatch.setenv("FEDGL_CACHE", str(tmp_path / "file" / "cache"))
    fails_with(capsys, run_cora(cora_copy, tmp_path / "out"), "FEDGL_CACHE", str(tmp_path / "file" / "cache"))


def test_full_disk_while_processing_names_fedgl_cache(capsys, cora_copy, tmp_path, monkeypatch):
    from torch_geometric.io import fs

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fs, "torch_save", full)
    fails_with(capsys, run_cora(cora_copy, tmp_path / "out"), "FEDGL_CACHE", os.strerror(errno.ENOSPC))


class RunsCode:
    """What a hostile checkpoint holds: unpickling it calls ``os.mkdir(marker)``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def test_checkpoint_that_would_run_code_is_refused(capsys, tmp_path):
    out, marker = tmp_path / "run", tmp_path / "code-ran"
    assert main(["run", *TINY, "--set", "checkpoint_every=1", "--out", str(out)]) == 0
    [party, *_] = sorted((out / "parties-3").glob("*.pt"))
    for target, needle in ((out / "checkpoint.pt", "holds objects other than tensors"),
                           (party, "holds objects other than tensors")):
        good = target.read_bytes()
        torch.save({"format": "fedgl-checkpoint-2", "payload": RunsCode(marker)}, target)
        torch.load(target, weights_only=False)  # the file does run code when unpickled
        assert marker.is_dir()
        marker.rmdir()
        fails_with(capsys, ["run", *TINY, "--set", "checkpoint_every=1", "--out", str(out), "--resume"],
                   str(target), needle)
        assert not marker.exists()
        target.write_bytes(good)
    assert main(["run", *TINY, "--set", "checkpoint_every=1", "--out", str(out), "--resume"]) == 0


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign", "missing"])
def test_damaged_party_checkpoint_is_one_line(capsys, tmp_path, damage):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--set", "checkpoint_every=1", "--out", str(out)]) == 0
    [party, *_] = sorted((out / "parties-3").glob("*.pt"))
    if damage == "garbage":
        party.write_bytes(b"\x00not a checkpoint" * 10)
    elif damage == "truncated":
        party.write_bytes(party.read_bytes()[:200])
    elif damage == "foreign":  # tensors and plain data, but not this party's state
        torch.save({"weights": torch.zeros(3)}, party)
    else:
        party.unlink()
    fails_with(capsys, ["run", *TINY, "--set", "checkpoint_every=1", "--out", str(out), "--resume"],
               "cannot resume", str(party))


# Where results go: a file in the way of a folder, a folder in the way of a file (review A1, A2, A6, A7).


def test_a_file_where_the_default_results_folder_goes(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").write_text("x")
    fails_with(capsys, ["run", *TINY], "results is a file, not a folder; pass --out")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "results").write_text("x")
    fails_with(capsys, ["bench", "foundation-cora", "--quick"], "benchmarks/results is a file", "pass --out")


@pytest.mark.parametrize("plan", [[], ["--plan"]])
def test_bench_out_is_a_file_or_under_one(capsys, tmp_path, plan):
    (tmp_path / "afile").write_text("x")
    for out, needle in (("afile", "is a file, not a folder"), ("afile/x", f"{tmp_path / 'afile'} is a file")):
        fails_with(capsys, ["bench", "foundation-cora", "--quick", "--out", str(tmp_path / out), *plan],
                   f"--out {tmp_path / out}", needle)


def test_keys_new_out_is_a_file_or_under_one(capsys, tmp_path):
    (tmp_path / "afile").write_text("x")
    fails_with(capsys, ["keys", "new", "--out", str(tmp_path / "afile")], "is a file, not a folder")
    fails_with(capsys, ["keys", "new", "--out", str(tmp_path / "afile" / "sub")], f"{tmp_path / 'afile'} is a file")


def test_keys_roster_out_that_cannot_be_a_file(capsys, tmp_path):
    keys = []
    for name in ("k1", "k2"):
        assert main(["keys", "new", "--out", str(tmp_path / name)]) == 0
        keys.append(str(tmp_path / name / "identity.pub"))
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    capsys.readouterr()
    for out, needle in (("adir", "is a folder, not a file"), ("nodir/roster.txt", "does not exist"),
                        ("afile/roster.txt", "is a file, not a folder")):
        fails_with(capsys, ["keys", "roster", *keys, "--out", str(tmp_path / out)], f"--out {tmp_path / out}", needle)
    assert not [p.name for p in tmp_path.rglob(".*.tmp")]  # no stray temporary file left behind


# Damaged files in folders fedgl reads back (review A3, A4, A5).


@pytest.fixture
def bench_folder(data_root, tmp_path, capsys) -> tuple[Path, list[str]]:
    """A bench folder holding one finished run, and the command that made it."""
    argv = ["bench", "foundation-cora", "--quick", "--only", "centralized", "--set", "train.rounds=1",
            "--out", str(tmp_path / "b")]
    assert main(argv) == 0
    capsys.readouterr()
    return tmp_path / "b", argv


@pytest.mark.parametrize("name, text, needle", [
    ("summary.json", "{trunc", "summary.json is corrupt: not JSON"),
    ("summary.json", "null", "summary.json is corrupt: not a JSON object"),
    ("config.yaml", "x: [", "config.yaml is corrupt: not YAML"),
    ("config.yaml", "- 1", "config.yaml is corrupt: not a mapping"),
])
def test_bench_damaged_run_folder(capsys, bench_folder, name, text, needle):
    folder, argv = bench_folder
    (folder / "runs" / "centralized-seed0" / name).write_text(text)
    fails_with(capsys, [*argv, "--plan"], needle, "--rerun")
    assert main([*argv, "--rerun"]) == 0  # the way out it names


@pytest.mark.parametrize("text, held", [("null", "null"), ('"str"', "a string"), ('{"a": 1}', "an object")])
def test_bench_extend_with_results_json_of_another_shape(capsys, tmp_path, text, held):
    (tmp_path / "results.json").write_text(text)
    fails_with(capsys, ["bench", "foundation-cora", "--quick", "--out", str(tmp_path), "--extend", "--plan"],
               "results.json is not a list of runs", held)


@pytest.mark.parametrize("text, needle", [("{trunc", "not YAML"), ("[1]", "not a mapping")])
def test_report_on_damaged_config(capsys, tmp_path, text, needle):
    out = tmp_path / "run"
    assert main(["run", *TINY, "--out", str(out)]) == 0
    (out / "config.yaml").write_text(text)
    fails_with(capsys, ["report", str(out)], "config.yaml is corrupt", needle)


# Settings that ran and gave a wrong result without a word (review B1, B2, B4, B5).


def test_run_flags_take_their_text_as_given(capsys, tmp_path):
    """--data-root is a path, not YAML: `` #`` is no comment, ``: `` no mapping, a date no date."""
    for root in ("d #old", "my: data", "2024-01-01"):
        out = tmp_path / f"run{len(root)}"
        assert main(["run", *TINY, "--rounds", "1", "--data-root", root, "--out", str(out)]) == 0
        assert yaml.safe_load((out / "config.yaml").read_text())["dataset"]["data_root"] == root
    fails_with(capsys, ["run", *TINY, "--dataset", "yes", "--out", str(tmp_path / "y")], "unknown dataset 'yes'")


def test_a_split_without_training_nodes(capsys, tmp_path):
    split = ["--set", "dataset.split=random", "--set", "dataset.options.train_per_class=0",
             "--set", "dataset.options.num_val=50", "--set", "dataset.options.num_test=50"]
    fails_with(capsys, ["run", *TINY, *split, "--out", str(tmp_path / "a")], "leaves no training nodes",
               "dataset.options.train_per_class")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("flags, assignment, needle", [
    (["--rounds", "1"], "train.rounds=2", "--rounds 1 and --set train.rounds=2 disagree"),
    (["--protocol", "fedavg"], "protocol.name=centralized", "--protocol fedavg and --set protocol.name=centralized"),
    (["--seed", "3"], "seed=4", "--seed 3 and --set seed=4 disagree"),
    (["--rounds", "2"], "train={rounds: 1}", "--rounds 2 and --set train={rounds: 1} disagree"),
    (["--protocol", "centralized"], "protocol={lr: 0.1}", "replaces the whole protocol section"),
])
def test_a_flag_and_a_set_that_disagree(capsys, tmp_path, flags, assignment, needle):
    fails_with(capsys, ["run", *TINY, *flags, "--set", assignment, "--out", str(tmp_path)], needle)


def test_a_flag_and_a_set_that_agree(tmp_path):
    assert main(["run", *TINY, "--rounds", "1", "--set", "train.rounds=1", "--protocol", "FedAvg",
                 "--set", "protocol.name=fedavg", "--out", str(tmp_path)]) == 0


def test_bench_refuses_a_seed_it_would_overwrite(capsys, tmp_path):
    fails_with(capsys, ["bench", "foundation-cora", "--quick", "--plan", "--set", "seed=5", "--out", str(tmp_path)],
               "seed=5", "--seeds")


# Keys taking several kinds of value: the kinds in words, not pydantic's branch names (review D2, D3).


@pytest.mark.parametrize("argv, needle", [
    (["--set", "privacy.secure_aggregation=tru"],
     "privacy.secure_aggregation: expected a mapping of settings, true or false (got 'tru')"),
    (["--protocol", "fedaas", "--set", "protocol.interval=adaptiv"],
     "protocol.interval: expected an integer, 'adaptive' or 'never' (got 'adaptiv')"),
    (["--protocol", "nfedgnn", "--set", "protocol.lam=aut"], "protocol.lam: expected a number or 'auto' (got 'aut')"),
    (["--protocol", "glasu", "--set", "protocol.fanout=abc"],
     "protocol.fanout: expected an integer or a list of integers (got 'abc')"),
    (["--protocol", "glasu", "--set", "protocol.fanout=[1,x]"], "protocol.fanout.1: Input should be a valid integer"),
    (["--set", "privacy.secure_aggregation={threshold: x}"], "privacy.secure_aggregation.threshold: Input should be"),
    (["--set", "train.roundz=3"], "train.roundz: unknown key (got 3)"),
    (["--set", ".rounds=1"], "override '.rounds=1' has an empty part in its key"),
])
def test_a_key_of_several_kinds_names_them(capsys, tmp_path, argv, needle):
    err = fails_with(capsys, ["run", "--quiet", *argv, "--out", str(tmp_path)], needle)
    assert "function-after" not in err and ".int:" not in err and ".float:" not in err


def test_metrics_frame_without_pandas_is_one_line(monkeypatch):
    """pandas is not a dependency: asking for a DataFrame without it names what to install."""
    from fedgl.errors import ConfigError
    from fedgl.runner import RunResult

    monkeypatch.setitem(sys.modules, "pandas", None)  # as if it were not installed
    result = RunResult(Path("."), {}, [{"round": 1}])
    with pytest.raises(ConfigError, match="needs pandas"):
        result.metrics_frame()


# Settings a run never reads because of another setting (review B3, B6): one note each, naming why.


@pytest.mark.parametrize("config, notes", [
    ({"dataset": {"split": "default", "options": {"train_per_class": 60}}},
     ["dataset.options.train_per_class (60) is not read: only split random reads it, not default"]),
    ({"dataset": {"split": "full", "options": {"num_test": 10}}},
     ["dataset.options.num_test (10) is not read: only split random reads it, not full"]),
    ({"dataset": {"split": "random", "options": {"train_per_class": 60}}}, []),
    ({"protocol": {"name": "glasu", "lr_decay": 0.5}},
     ["protocol.lr_decay (0.5) is not read: lr_decay_every is unset, so the learning rate never decays"]),
    ({"protocol": {"name": "glasu", "lr_decay": 0.5, "lr_decay_every": 2}}, []),
    ({"protocol": {"name": "glasu", "sampling": "full", "fanout": 7}},
     ["protocol.fanout (7) is not read: sampling full takes every neighbour"]),
    ({"protocol": {"name": "fedaas", "interval": "never", "tau0": 3, "tau_min": 1}},
     ["protocol.tau0 (3) is not read: only interval adaptive reads it, not never",
      "protocol.tau_min (1) is not read: only interval adaptive reads it, not never"]),
    ({"protocol": {"name": "fedaas", "policy_choices": [3, 4], "similarity_temperature": 5}},
     ["protocol.policy_choices ([3, 4]) is not read: only fanout_policy learned reads it, not fixed",
      "protocol.similarity_temperature (5.0) is not read: only personalize similarity reads it, not none"]),
    ({"protocol": {"name": "fedgraph-recon", "policy_choices": [3, 4]}}, []),  # its preset learns fan-outs
    ({"protocol": {"name": "llcg", "server_steps": 0, "server_lr": 0.5, "server_fanouts": [3, 3]}},
     ["protocol.server_fanouts ([3, 3]) is not read: server_steps is 0, so the server never corrects",
      "protocol.server_lr (0.5) is not read: server_steps is 0, so the server never corrects"]),
    ({"protocol": {"name": "nfedgnn", "lam": 1, "lam_grid": [5, 6]}},
     ["protocol.lam_grid ([5.0, 6.0]) is not read: only lam: auto reads it, not lam 1.0"]),
    ({"protocol": {"name": "nfedgnn", "lam_grid": [5, 6]}}, []),
    ({"backend": {"ray_auth": "none", "on_client_failure": "skip"}},
     ["backend.ray_auth (none) is not read: it is Ray's, and the backend is local",
      "backend.on_client_failure (skip) is not read: a local party is never lost (only Ray and Flower lose parties)"]),
    ({"backend": {"on_client_failure": "retry", "max_retries": 5}, "checkpoint_every": 1},
     ["backend.on_client_failure (retry) is not read: a local party is never lost (only Ray and Flower lose parties)",
      "backend.max_retries (5) is not read: a local party is never lost, so never retried"]),
    ({"backend": {"on_client_failure": "retry", "max_retries": 5}}, []),  # refused in one line by the run instead
    ({"protocol": {"name": "glasu"}, "backend": {"on_client_failure": "skip"}}, []),  # likewise: glasu cannot skip
])
def test_a_setting_another_one_makes_unread_is_noted(config, notes):
    from fedgl.config import build_config
    from fedgl.session import unread_settings

    assert unread_settings(build_config(config)) == notes


def test_split_sizes_the_split_never_reads_are_noted(capsys, tmp_path):
    assert main(["run", *TINY, "--rounds", "1", "--set", "dataset.options.num_val=7", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().err.strip() == ("fedgl: note: dataset.options.num_val (7) is not read: only split "
                                               "random reads it, not default")


@pytest.mark.parametrize("split", ["default", "random", "full"])
def test_negative_split_sizes_are_refused_whatever_the_split(capsys, tmp_path, split):
    fails_with(capsys, ["run", *TINY, "--set", f"dataset.split={split}", "--set", "dataset.options.train_per_class=-1",
                        "--out", str(tmp_path / "a")],
               "dataset.options: train_per_class must be a non-negative integer, got -1")
    assert not (tmp_path / "a").exists()


def test_load_dataset_refuses_negative_split_sizes_whatever_the_split():
    from fedgl.data import load_dataset
    from fedgl.errors import DataError

    with pytest.raises(DataError, match="num_test must be a non-negative integer, got -5"):
        load_dataset("synthetic", num_nodes=100, num_test=-5)
