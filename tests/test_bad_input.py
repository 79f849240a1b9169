"""Bad input from outside the config: damaged dataset files, an unusable cache folder, a full disk and
checkpoints that would run code. Each is one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
import torch

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
