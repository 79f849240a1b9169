"""Every registered protocol at its defaults: ``fedgl run --protocol P --dataset D`` with nothing else set.

What a user gets who names only a protocol and a dataset: test accuracy, the last round's training loss
and the bytes the run sent, for each protocol of ``fedgl.config.registry`` on four datasets. The datasets
are the three Planetoid citation graphs, whose splits label 20 nodes a class (the sparse-label case), and
Amazon Computers (60 % labelled, dense edges), so a default that only suits one regime shows. One seed:
the task checks defaults, it does not compare methods.
"""

from __future__ import annotations

from ..config.registry import REGISTRY
from .core import BenchTask, Variant

DATASETS = ("cora", "citeseer", "pubmed", "computers")
COLUMNS = ["test_accuracy", "final_test_accuracy", "final_train_loss", "bytes_total", "wall_ms_per_round"]


def _task(name: str, description: str, variants: list[Variant]) -> BenchTask:
    """A task of runs at the defaults: one seed, nothing set but what the variants name."""
    return BenchTask(name=name, description=description, base={}, variants=variants, columns=COLUMNS, seeds=1,
                     quick={"train.rounds": 2}, source="not in a paper: the library's defaults")


def defaults_task() -> BenchTask:
    return _task("defaults", "Every registered protocol at its defaults (nothing set but protocol and dataset) on "
                 "Cora, CiteSeer, PubMed and Amazon Computers: test accuracy at the best-validation round and at "
                 "the last, the last round's training loss and the bytes sent.",
                 [Variant(f"{dataset} {protocol}", {"dataset.name": dataset, "protocol.name": protocol})
                  for dataset in DATASETS for protocol in REGISTRY])


def fedaas_nodes_task() -> BenchTask:
    """Why FedAAS's clients hold every node but the test nodes at its defaults: the same runs with the
    authors' code's training nodes only, on the graphs that label 20 nodes a class."""
    return _task("defaults-fedaas-nodes", "FedAAS at its defaults on Cora, CiteSeer and PubMed with the clients "
                 "holding every node but the test nodes (non-test: the default, the paper's text) or the training "
                 "nodes only (train: the authors' code, which the paper benches keep).",
                 [Variant(f"{dataset} fedaas {nodes}", {"dataset.name": dataset, "protocol.name": "fedaas",
                                                        "partition.client_nodes": nodes})
                  for dataset in DATASETS[:3] for nodes in ("train", "non-test")])


TASKS = {task.name: task for task in (defaults_task(), fedaas_nodes_task())}
