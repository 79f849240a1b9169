"""FedAvg on Cora from Python: train, read the results, then repeat the run from its saved config.

    FEDGL_DATA_ROOT=/path/to/datasets python examples/api_fedavg_cora.py [ROUNDS]

Each run writes its own folder under results/ (printed at the end).
"""

import sys

import fedgl

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 50
config = fedgl.load_config({
    "dataset": {"name": "cora"},
    "partition": {"method": "metis", "num_clients": 10},
    "protocol": {"name": "fedavg", "local_epochs": 3},
    "train": {"rounds": rounds},
})

first = fedgl.run(config)
summary = first.summary
print(f"best validation accuracy {summary['best_val_accuracy']:.4f} at round {summary['best_round']} "
      f"(test accuracy there {summary['test_accuracy']:.4f})")
for kind, sent in sorted(summary["bytes_by_kind"].items()):
    print(f"  {kind:>8}: {sent:>12,} bytes")

# The folder's config.yaml is the resolved config: running it again repeats the run.
again = fedgl.run(first.config_path)
for key in ("best_round", "best_val_accuracy", "test_accuracy", "bytes_total", "bytes_by_kind"):
    assert again.summary[key] == summary[key], key
assert [row["val_accuracy"] for row in again.metrics] == [row["val_accuracy"] for row in first.metrics]
print(f"repeated from {first.config_path}: same result ({first.out_dir}, {again.out_dir})")
