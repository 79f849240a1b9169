"""GLASU's sampled inference (the authors' evaluation, ``protocol.inference: sampled``) and the
standalone-causes bench tasks, which change the bench's standalone one factor at a time."""

from __future__ import annotations

import pytest
import torch

from fedgl.comm import NetworkModel, make_transport
from fedgl.config import build_config
from fedgl.data import load_dataset
from fedgl.errors import ConfigError
from fedgl.protocols.glasu.options import GlasuOptions
from fedgl.protocols.glasu.server import Glasu

SYNTHETIC = {"name": "synthetic", "options": {"num_nodes": 300, "num_features": 24, "num_classes": 3}}


def standalone(protocol: dict, num_clients: int = 3) -> Glasu:
    cfg = build_config({
        "dataset": SYNTHETIC,
        "partition": {"num_clients": num_clients},
        "model": {"name": "gcn", "hidden": 16, "layers": 2, "dropout": 0.0},
        "protocol": {"name": "glasu", "K": 0, "Q": 1, "S": 32, "batches": 2, **protocol},
        "network": {"compute": "ignore"},
    })
    data = load_dataset(cfg.dataset.name, None, seed=cfg.seed, **cfg.dataset.options)
    protocol = Glasu(cfg, make_transport("local", NetworkModel(compute="ignore")))
    protocol.setup(data)
    protocol.train_round(1)
    return protocol


def test_defaults_stay_full_inference_and_every_client_trained():
    options = GlasuOptions(name="glasu")
    assert (options.inference, options.train_clients) == ("full", "all")


@pytest.mark.parametrize("scorer", [0, 2])
def test_training_only_the_scoring_client_gives_the_same_scores(scorer):
    """Each client draws from its own random stream, so leaving the unscored standalone clients
    untrained changes nothing in the scored client's predictions; they send and compute nothing."""
    every = standalone({"eval_client": scorer})
    alone = standalone({"eval_client": scorer, "train_clients": "scoring"})
    with every.transport.evaluation(), alone.transport.evaluation():
        assert torch.equal(every.predict(None), alone.predict(None))
    trained = [alone.transport._parties[f"client{m}"].rounds_done > 0 for m in range(3)]
    assert trained == [m == scorer for m in range(3)]


def test_sampled_inference_scores_every_node_through_sampled_neighbourhoods():
    """Full inference repeats exactly; sampled inference draws new neighbourhoods each time (fan-out 1
    node-wise on a graph whose nodes have several neighbours), so two scorings differ, and it still
    gives one row of logits per node."""
    options = {"sampling": "nodewise", "fanout": 1, "adjacency": "induced"}
    full = standalone(options)
    with full.transport.evaluation():
        assert torch.equal(full.predict(None), full.predict(None))
    sampled = standalone({**options, "inference": "sampled"})
    with sampled.transport.evaluation():
        first, second = sampled.predict(None), sampled.predict(None)
    assert first.shape == (300, 3) and torch.isfinite(first).all()
    assert not torch.allclose(first, second)


@pytest.mark.parametrize("protocol,num_clients", [({"K": 1}, 3), ({"K": 2}, 2)])
def test_sampled_inference_needs_clients_that_never_aggregate(protocol, num_clients):
    for option in ({"inference": "sampled"}, {"train_clients": "scoring"}):
        with pytest.raises(ConfigError, match="clients that never aggregate"):
            standalone({**protocol, **option}, num_clients)


def test_standalone_causes_change_one_factor_at_a_time():
    """Every cause variant differs from its M's StAl. row in exactly its factor (sampled inference
    comes on top of node-wise sampling), and StAl. is glasu-table5's standalone row."""
    from fedgl.bench.glasu import TASKS

    nodewise = {"protocol.sampling", "protocol.fanout", "protocol.adjacency"}
    factor = {"client 2": {"protocol.eval_client"}, "contiguous blocks": {"partition.method"}, "nodewise": nodewise,
              "nodewise, sampled inference": nodewise | {"protocol.inference"},
              "60% edges": {"partition.edge_keep"}}
    table5 = {v.label: v.overrides for v in TASKS["glasu-table5"].variants}
    for name, dataset in (("glasu-standalone-causes", "citeseer"), ("glasu-standalone-pubmed", "pubmed")):
        variants = {v.label: v.overrides for v in TASKS[name].variants}
        for label, overrides in variants.items():
            M, cause = label.split(" ", 1)
            base = variants[f"{M} StAl."]
            changed = {key for key in {*base, *overrides} if base.get(key) != overrides.get(key)}
            if cause == "StAl.":
                same = {key: value for key, value in overrides.items() if key != "protocol.train_clients"}
                assert same == table5[f"{dataset} StAl. {M}"], label
            elif not cause.startswith("authors' script"):
                assert changed == factor[cause], label
