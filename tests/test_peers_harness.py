"""The OpenFGL comparison harness (benchmarks/peers_openfgl.py) finds OpenFGL's source where it is told,
and without it says so in one line instead of failing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import peers_openfgl  # noqa: E402


def test_without_openfgl_the_harness_says_so_in_one_line(tmp_path):
    missing = tmp_path / "no-openfgl"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "peers_openfgl.py"), "--openfgl", str(missing)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.splitlines() == [f"skipped: no OpenFGL source at {missing} (set FEDGL_OPENFGL or --openfgl to "
                                        "its folder)"]


def test_openfgl_is_found_from_the_option_then_the_environment(tmp_path, monkeypatch):
    source = tmp_path / "openfgl-src"
    (source / "openfgl" / "flcore").mkdir(parents=True)
    (source / "openfgl" / "flcore" / "trainer.py").write_text("")
    monkeypatch.setenv("FEDGL_OPENFGL", str(tmp_path / "elsewhere"))
    assert peers_openfgl.openfgl_path() is None  # the variable names a folder without OpenFGL
    assert peers_openfgl.openfgl_path(str(source)) == source
    monkeypatch.setenv("FEDGL_OPENFGL", str(source))
    assert peers_openfgl.openfgl_path() == source


def test_openfgl_reads_cora_from_a_root_in_its_own_layout(tmp_path, monkeypatch):
    raw = tmp_path / "datasets" / "planetoid" / "Cora" / "raw"
    raw.mkdir(parents=True)
    (raw / "ind.cora.x").write_bytes(b"x")
    monkeypatch.setenv("FEDGL_DATA_ROOT", str(tmp_path / "datasets"))
    root = peers_openfgl.openfgl_root(tmp_path / "openfgl")
    assert (root / "global" / "subgraph_fl" / "Cora" / "raw" / "ind.cora.x").read_bytes() == b"x"
    monkeypatch.setenv("FEDGL_DATA_ROOT", str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError, match="Cora's raw files are not at"):
        peers_openfgl.openfgl_root(tmp_path / "other")
