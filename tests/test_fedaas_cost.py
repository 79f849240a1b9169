"""Fig. 4's cost table: bytes and simulated time until the target, and the savings computed run by run."""

import json

import pytest

pytest.importorskip("matplotlib")

from fedgl.bench.fedaas import write_cost


def _run(folder, name, seed, rows):
    run = folder / "runs" / f"{name}-{seed}"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"variant": name, "seed": seed, "folder": str(run)}


def _row(round_, accuracy, embedding, total, sim):
    return {"round": round_, "test_accuracy": accuracy, "bytes_embedding": embedding, "bytes_total": total,
            "sim_time_s": sim, "test_macro_f1": 0.0, "test_loss": 1.0}


def test_the_first_round_at_the_target_gives_bytes_and_simulated_time(tmp_path):
    runs = [_run(tmp_path, "FedAAS", 0, [_row(1, 0.5, 1e6, 4e6, 2.0), _row(2, 0.81, 2e6, 8e6, 3.0)]),
            _run(tmp_path, "FedCross", 0, [_row(1, 0.6, 4e6, 8e6, 3.0), _row(2, 0.79, 8e6, 16e6, 5.0),
                                          _row(3, 0.85, 10e6, 20e6, 6.0)]),
            _run(tmp_path, "FedPNS", 0, [_row(1, 0.1, 1e6, 1e6, 1.0)])]
    (tmp_path / "results.json").write_text(json.dumps(runs))
    write_cost(tmp_path)
    rows = {r["variant"]: r for r in json.loads((tmp_path / "to_target.json").read_text())}
    assert rows["FedAAS"] == {"variant": "FedAAS", "seed": 0, "round": 2, "embedding_mb": 2.0,
                             "total_mb": 8.0, "sim_s": 3.0}
    assert rows["FedCross"]["round"] == 3 and rows["FedPNS"]["round"] is None
    savings = (tmp_path / "savings.md").read_text()
    # 1 - 2/10, 1 - 8/20, 1 - 3/6 in %; FedPNS never reached the target, so it has no row
    assert "| FedAAS | FedCross | 1 | 80.00 | 60.00 | 50.00 | 94.88 |" in savings
    assert "FedPNS |" not in savings
