"""A setting left to ``auto`` (nFedGNN's ``lam``) is chosen on validation among whole runs, one per candidate:
the chosen candidate is the run that a config naming its value makes, every candidate's bytes are counted, and
finished candidates are reused when an interrupted search runs again."""

from __future__ import annotations

import json

import pytest

from fedgl.cli import main
from fedgl.config import build_config
from fedgl.errors import ConfigError
from fedgl.results import FINISHED, LEDGER, read_jsonl
from fedgl.runner import Run
from fedgl.search import Search, run

GRID = [0.0, 3.0]  # no penalty against a strong one: their validation accuracies differ on the toy graph


def config(**protocol) -> dict:
    return {"dataset": {"name": "synthetic", "options": {"num_nodes": 200}}, "train": {"rounds": 4},
            "network": {"compute": "ignore"}, "protocol": {"name": "nfedgnn", "lam_grid": GRID, **protocol}}


def test_the_search_keeps_the_best_candidate_and_counts_every_candidates_bytes(tmp_path):
    searched = run(build_config(config()), tmp_path / "auto")
    alone = [run(build_config(config(lam=lam)), tmp_path / f"lam{lam}") for lam in GRID]
    s = searched.summary
    vals = [r.summary["best_val_accuracy"] for r in alone]
    best = max(range(len(GRID)), key=lambda i: (vals[i], -i))
    assert s["chosen"] == {"protocol.lam": GRID[best]}
    assert [row["best_val_accuracy"] for row in s["search"]] == vals
    # the chosen candidate is the run a config naming its lam makes, to the bit
    for key in ("test_accuracy", "best_round", "final_test_accuracy", "final_train_loss"):
        assert s[key] == alone[best].summary[key]
    # every candidate's messages were sent: the ledger holds them all, and the totals are their sums
    assert s["bytes_total"] == sum(r.summary["bytes_total"] for r in alone)
    ledger = read_jsonl(searched.out_dir / LEDGER)
    assert sum(row["bytes"] for row in ledger if row["kind"] != "eval") == s["bytes_total"]
    assert {row["candidate"] for row in ledger} == {"lam=0", "lam=3"}
    assert s["bytes_by_kind"] == {k: sum(r.summary["bytes_by_kind"][k] for r in alone)
                                  for k in alone[0].summary["bytes_by_kind"]}
    other = sum(r.summary["bytes_total"] for i, r in enumerate(alone) if i != best)
    assert searched.metrics[-1]["bytes_total"] == alone[best].metrics[-1]["bytes_total"] + other


def test_an_interrupted_search_reuses_its_finished_candidates(tmp_path):
    cfg = build_config(config())
    first = run(cfg, tmp_path)
    kept, lost = (tmp_path / "search" / name for name in ("lam=0", "lam=3"))
    stamp = (kept / FINISHED).stat().st_mtime_ns
    (lost / FINISHED).unlink()
    (tmp_path / FINISHED).unlink()
    again = run(cfg, tmp_path)
    assert (kept / FINISHED).stat().st_mtime_ns == stamp  # not trained again
    assert (lost / FINISHED).exists()
    assert again.summary["test_accuracy"] == first.summary["test_accuracy"]


def test_overwrite_trains_the_candidates_again(tmp_path, capsys):
    args = ["run", "--protocol", "nfedgnn", "--dataset", "synthetic", "--set", "dataset.options.num_nodes=200",
            "--rounds", "2", "--set", "protocol.lam_grid=[0.0, 3.0]", "--out", str(tmp_path), "--json"]
    assert main(args) == 0
    stamp = (tmp_path / "search" / "lam=0" / FINISHED).stat().st_mtime_ns
    assert main(args + ["--overwrite"]) == 0
    assert (tmp_path / "search" / "lam=0" / FINISHED).stat().st_mtime_ns != stamp
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["chosen"]["protocol.lam"] in GRID


def test_a_search_is_refused_where_it_would_mislead():
    """Under DP every candidate spends the budget again; a single ``Run`` cannot train lam: auto."""
    dp = {"privacy": {"dp": {"noise_multiplier": 1.0, "max_norm": 1.0}}}
    with pytest.raises(ConfigError, match="privacy budget"):
        Search(build_config(config() | dp))
    with pytest.raises(ConfigError, match="chosen among whole runs"):
        Run(build_config(config()))
    with pytest.raises(ConfigError, match="lam_grid"):
        build_config(config(lam_grid=[1.0, -2.0]))
    with pytest.raises(ConfigError, match="lam_grid"):
        build_config(config(lam_grid=[]))
