"""``fedgl report``: the table a person reads, the comparison plot and the HTML page, rendered in Chromium."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess

import matplotlib.image
import numpy as np
import pytest

from fedgl.cli import main
from fedgl.results import round_unit

TINY = ["--dataset", "synthetic", "--set", "dataset.options.num_nodes=200", "--clients", "3", "--rounds", "3",
        "--quiet"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs that differ in what they send: FedAvg on 3 clients and the centralized reference."""
    root = tmp_path_factory.mktemp("runs")
    assert main(["run", *TINY, "--out", str(root / "fedavg")]) == 0
    assert main(["run", *TINY, "--protocol", "centralized", "--out", str(root / "central")]) == 0
    return [root / "fedavg", root / "central"]


def test_axis_label_says_what_a_round_is():
    assert round_unit({"name": "fedavg"}) == "round"
    assert round_unit({"name": "swift", "I": 10}) == "iteration"
    assert round_unit({"name": "glasu", "batches": 16}) == "training round (16 GLASU rounds each)"


def test_piped_table_is_whole_with_readable_sizes(runs, capsys):
    assert main(["report", *map(str, runs)]) == 0
    printed = capsys.readouterr().out
    sent = json.loads((runs[0] / "summary.json").read_text())["bytes_total"]
    assert f"{sent / 1e3:.1f} KB" in printed and str(sent) not in printed and "…" not in printed
    assert "round at" in printed and "centralized" in printed


def test_html_report_renders_with_its_plots_in_chromium(runs, tmp_path):
    page = tmp_path / "report.html"
    assert main(["report", *map(str, runs), "--html", str(page)]) == 0
    text = page.read_text()
    assert text.count("<tr>") == 1 + 2 + 1 + 2  # header and a row per run, in both tables
    png = base64.b64decode(text.split("data:image/png;base64,")[1].split('"')[0])
    assert png.startswith(b"\x89PNG")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed")
    shot = tmp_path / "report.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,900",
                    page.as_uri()], check=True, capture_output=True, timeout=120)
    if os.environ.get("FEDGL_TEST_ARTIFACTS"):
        shutil.copy(shot, os.environ["FEDGL_TEST_ARTIFACTS"])
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 1
    # Saturated colour comes only from the plotted curves, not from the page's text or table shading.
    saturation = pixels.max(axis=-1) - pixels.min(axis=-1)
    assert (saturation > 0.4).sum() > 500
