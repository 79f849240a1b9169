"""nFedGNN's defaults (``regulariser: per_label``): lambda weighs the penalty against the cross-entropy alike
on every graph (``lam: auto`` picks it on validation, tests/test_search.py), the users start from one shared weight and step at their own lr, the server's lr falls on a
cosine, and ``fedgl run --protocol nfedgnn --dataset D`` with nothing else set learns. ``regulariser: raw`` keeps
the paper's method."""

from __future__ import annotations

import pytest
import torch
from test_nfedgnn import setup_protocol, toy_graph

from fedgl.config import build_config
from fedgl.protocols.node_level.nfedgnn import LAM, LAM_GRID, LATENT, USER_LR, NFedGNN, cosine_lr, label_reach
from fedgl.models.split_node import prepare_server_graph


def penalty_gradient(labels: int, **options) -> torch.Tensor:
    """The penalty's part of the gradient on every user's latent, with the first ``labels`` nodes labelled."""
    data = toy_graph(n=60)
    data.train_mask = torch.zeros(60, dtype=torch.bool)
    data.train_mask[:labels] = True
    grads = []
    for lam in (10.0, 0.0):
        protocol, transport = setup_protocol(NFedGNN, data, lam=lam, **options)
        grads.append(protocol.server_step(transport._parties["users"].embed(), None)[1])
    return grads[0] - grads[1]


def options(**protocol) -> dict:
    return build_config({"protocol": {"name": "nfedgnn", **protocol}}).protocol


def user_side(opts: dict) -> tuple:
    return opts["user_init"], opts["normalize_features"], opts["user_lr"], opts["lr_schedule"]


def test_the_default_is_the_per_label_penalty_chosen_on_validation_with_the_librarys_users():
    opts = options()
    assert (opts["regulariser"], opts["lam"], opts["lam_grid"]) == ("per_label", "auto", LAM_GRID)
    assert LAM in LAM_GRID and options(regulariser="raw")["lam"] == LAM  # the paper's form: one run
    assert user_side(opts) == ("shared", False, USER_LR, "cosine")


def test_per_label_users_send_a_wide_latent_unless_the_width_is_set():
    """The users no label reaches are read from their start alone, so the per-label form widens it (CiteSeer:
    docs/nfedgnn.md); the paper's form and CNFGNN keep the shared width, and a set width is kept."""
    def hidden(protocol: dict, model: dict | None = None) -> int:
        return build_config({"protocol": protocol, "model": model or {}}).model.hidden
    assert hidden({"name": "nfedgnn"}) == LATENT == 256
    assert hidden({"name": "nfedgnn", "regulariser": "raw"}) == hidden({"name": "cnfgnn"}) == 64
    assert hidden({"name": "nfedgnn"}, {"hidden": 32}) == 32


def test_raw_keeps_the_papers_users_and_set_values_win():
    """The paper's method (committed tasks pin ``regulariser: raw``) computes as before: independent starts,
    normalised features, users at train.lr, a constant lr; a value the config sets is kept with either form."""
    assert user_side(options(regulariser="raw")) == ("independent", True, None, "constant")
    assert user_side(options(user_init="independent", user_lr=0.1)) == ("independent", False, 0.1, "cosine")
    assert user_side(options(regulariser="raw", normalize_features=False, lr_schedule="cosine")) == (
        "independent", False, None, "cosine")


def server_lrs(rounds: int, **options) -> list[float]:
    """The server's lr in each of ``rounds`` rounds on the toy graph."""
    protocol, transport = setup_protocol(NFedGNN, toy_graph(), **options)
    protocol.cfg.train.rounds = rounds
    lrs = []
    for r in range(1, rounds + 1):
        transport.set_round(r)
        protocol.train_round(r)
        lrs.append(protocol.server_optimizer.param_groups[0]["lr"])
    return lrs


def test_the_servers_lr_falls_on_a_cosine_by_default_and_stays_with_raw():
    """By default the server steps at train.lr in round 1, half of it midway and near 0 in the last round, so
    the late rounds refine the model instead of swinging it (PubMed at a constant 0.1: docs/nfedgnn.md);
    the paper's method keeps train.lr throughout."""
    lrs = server_lrs(10)
    base = setup_protocol(NFedGNN, toy_graph())[0].cfg.train.lr
    assert lrs[0] == base and lrs[5] == pytest.approx(base / 2) and lrs[-1] < base / 30
    assert all(a > b for a, b in zip(lrs, lrs[1:]))
    assert lrs == pytest.approx([cosine_lr(base, r, 10) for r in range(1, 11)])
    assert set(server_lrs(4, regulariser="raw")) == {base}


def test_runs_saved_before_the_schedule_count_as_constant_and_are_not_reused():
    """A run folder from before ``lr_schedule`` existed trained at a constant lr; the bench reads it so."""
    from fedgl.bench.core import as_saved

    assert build_config(as_saved({"protocol": {"name": "nfedgnn"}})).protocol["lr_schedule"] == "constant"


def test_users_step_at_user_lr_and_the_server_at_train_lr():
    for state in ("offset", "rows"):
        protocol, transport = setup_protocol(NFedGNN, toy_graph(), user_state=state)
        users = transport._parties["users"]
        assert (users.offset.optimizer if state == "offset" else users.optimizer).lr == USER_LR
    assert protocol.server_optimizer.param_groups[0]["lr"] == protocol.cfg.train.lr != USER_LR


def test_a_users_features_do_not_steer_its_latent():
    """Why sparse labels fall short: user i's weight gets the outer product ``x_i g_i``, so its latent ``x_i W_i``
    moves along the server's gradient ``g_i`` whatever its features are (Adam's first step: by ``user_lr`` times
    the sum of its features, per coordinate). Users with different features that receive the same gradient move
    the same way; only their starting latents carry their features."""
    data = toy_graph()
    protocol, transport = setup_protocol(NFedGNN, data, normalize_features=True)
    users = transport._parties["users"]
    before = users.embed()
    grad = torch.randn(1, before.size(1)).expand_as(before).contiguous()
    users.update(grad=grad)
    moved = users.embed() - before
    has_features = data.x.sum(1) > 0
    assert has_features.sum() > 30 and (data.x[has_features] > 0).sum(1).unique().numel() > 1
    expected = -USER_LR * grad.sign()  # normalised features sum to 1
    torch.testing.assert_close(moved[has_features], expected[has_features], rtol=1e-3, atol=1e-6)


def test_per_label_penalty_weighs_on_users_as_the_cross_entropy_does():
    """The cross-entropy is a mean over the labels, so its pull on a labelled user's latent is 1 / labels of the loss;
    per_label gives the penalty the same dependence (a third as many labels: three times the pull), where the raw
    form, a mean over edges, ignores how many users are labelled and so outweighs the labels on graphs with many."""
    few, many = penalty_gradient(5), penalty_gradient(15)
    assert few.abs().max() > 0
    torch.testing.assert_close(few, 3 * many, rtol=1e-4, atol=1e-7)
    raw_few, raw_many = penalty_gradient(5, regulariser="raw"), penalty_gradient(15, regulariser="raw")
    torch.testing.assert_close(raw_few, raw_many, rtol=1e-4, atol=1e-7)


def disjoint_copies(data, copies: int):
    """``copies`` disjoint copies of ``data``'s graph: more users, labels and edges in the same proportions."""
    n = data.num_nodes
    edges = torch.cat([data.edge_index + k * n for k in range(copies)], 1)
    repeat = {key: data[key].repeat(copies, *([1] * (data[key].dim() - 1)))
              for key in ("x", "y", "train_mask", "val_mask", "test_mask")}
    return type(data)(edge_index=edges, num_classes=data.num_classes, **repeat)


def test_penalty_and_cross_entropy_keep_their_balance_whatever_the_graph_size():
    """The same graph three times over (three times the users, labels and edges): the cross-entropy's pull on
    each user falls to a third (a mean over three times the labels), and the per_label penalty's with it, so
    lambda weighs the two alike on a graph of any size."""
    def pulls(data):
        grads = []
        for lam in (10.0, 0.0):
            protocol, transport = setup_protocol(NFedGNN, data, lam=lam)
            grads.append(protocol.server_step(transport._parties["users"].embed(), None)[1])
        return grads[0] - grads[1], grads[1]  # the penalty's part, the cross-entropy's

    (penalty_one, ce_one), (penalty_three, ce_three) = pulls(toy_graph(n=30)), pulls(disjoint_copies(toy_graph(n=30), 3))
    assert ce_one.abs().max() > 0 and penalty_one.abs().max() > 0
    torch.testing.assert_close(3 * ce_three[:30], ce_one, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(3 * penalty_three[:30], penalty_one, rtol=1e-4, atol=1e-7)


def test_label_reach_counts_the_users_within_the_models_hops_of_a_label():
    """A path 0-1-...-9 labelled at node 0: a two-layer model's cross-entropy reaches users 0, 1 and 2."""
    path = torch.arange(9)
    edges = torch.cat([torch.stack([path, path + 1]), torch.stack([path + 1, path])], 1)
    graph = prepare_server_graph(edges, 10)
    assert label_reach(graph, torch.tensor([0]), 2) == pytest.approx(0.3)
    assert label_reach(graph, torch.tensor([0, 9]), 1) == pytest.approx(0.4)


def test_a_third_of_citeseers_users_share_no_component_with_a_label(data_root):
    """Why CiteSeer falls short where PubMed does not (docs/nfedgnn.md, "Sparse labels"): about a third of
    CiteSeer's users lie in connected components holding no training label, so neither the cross-entropy nor the
    penalty ever brings them a label; the server reads them from their start ``x_i W0`` alone (PubMed has no
    such users: each is within ten hops of a label)."""
    from fedgl.data import load_dataset

    data = load_dataset("citeseer", str(data_root))
    graph = prepare_server_graph(data.edge_index, data.num_nodes)
    labelled = data.train_mask.nonzero().squeeze(1)
    assert label_reach(graph, labelled, hops=2) < 0.34  # the two aggregations' reach
    assert 0.30 <= 1 - label_reach(graph, labelled, hops=60) <= 0.33  # no path to a label at any length


def test_raw_penalty_keeps_the_papers_lambda():
    """``regulariser: raw`` is Eq. 6-7 as written: lam multiplies the penalty unchanged (the bench tasks'
    reproductions use it with the paper's per-dataset lambda)."""
    protocol, _ = setup_protocol(NFedGNN, toy_graph(), lam=300.0, regulariser="raw")
    assert protocol.lam == 300.0
    protocol, _ = setup_protocol(NFedGNN, toy_graph(), lam=300.0)
    assert protocol.lam == pytest.approx(300.0 * 40 / 10)


@pytest.mark.slow
def test_defaults_reach_ninety_percent_of_the_centralized_gcn_on_pubmed_and_settle(tmp_path, data_root):
    """PubMed's labels reach 14 % of its users: at the library's defaults (lambda chosen on validation) nFedGNN
    still reaches 90 % of the centralized GCN's test accuracy (seed 0; at lambda 1, the earlier default, it fell
    short), and with the server's lr on a cosine its accuracy at round 100 stays within 3 points of the
    best-validation round's (at a constant 0.1 it fell by 14 points)."""
    from fedgl import api

    runs = {m: api.run({"dataset": {"name": "pubmed", "data_root": str(data_root)}, "protocol": {"name": m}},
                       out_dir=tmp_path / m).summary for m in ("centralized", "nfedgnn")}
    assert runs["nfedgnn"]["test_accuracy"] >= 0.9 * runs["centralized"]["test_accuracy"]
    assert runs["nfedgnn"]["final_test_accuracy"] >= runs["nfedgnn"]["test_accuracy"] - 0.03


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["citeseer", "cs"])
def test_defaults_reach_ninety_percent_of_the_centralized_gcn(dataset, tmp_path, data_root):
    """At the library's defaults nFedGNN reaches 90 % of the centralized GCN's test accuracy (seed 0) on CiteSeer,
    whose users outside every label's component are read from their start alone (81 % with the earlier 64-value
    latent), and on Coauthor CS, where the paper's raw penalty at Cora's lambda 300 stays near chance
    (``nfedgnn-defaults`` in docs/nfedgnn.md)."""
    from fedgl import api

    accuracy = {m: api.run({"dataset": {"name": dataset, "data_root": str(data_root)}, "protocol": {"name": m}},
                           out_dir=tmp_path / m).summary["test_accuracy"] for m in ("centralized", "nfedgnn")}
    assert accuracy["nfedgnn"] >= 0.9 * accuracy["centralized"]
