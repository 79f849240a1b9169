"""nFedGNN's users as the shared start plus one offset each (``user_state: offset``, the per_label default): the
same training as every user keeping its support rows, at ``N x D`` floats instead of ``nnz x D``."""

from __future__ import annotations

import pytest
import torch
from test_nfedgnn import setup_protocol, split_config, toy_graph

from fedgl.bench.core import as_saved
from fedgl.comm import LocalTransport
from fedgl.config import build_config
from fedgl.errors import ConfigError
from fedgl.protocols.node_level.nfedgnn import NFedGNN


def signed_binary_graph(n: int = 40):
    """The toy graph with features in {-1, 0, 1}: the values where both forms step alike to the last bit."""
    data = toy_graph(n=n)
    data.x = torch.sign(data.x) * torch.where(torch.rand(data.x.shape, generator=torch.Generator().manual_seed(1))
                                              < 0.3, -1.0, 1.0)
    return data


def latents_after(data, rounds: int, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """Every user's latent after ``rounds`` rounds, and the gradients the server sent in the last one."""
    protocol, transport = setup_protocol(NFedGNN, data, **options)
    protocol.cfg.train.rounds = max(rounds, 1)
    for r in range(1, rounds + 1):
        transport.set_round(r)
        protocol.train_round(r)
    return transport._parties["users"].infer(), protocol.latents


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_the_offset_form_trains_as_the_support_rows_do(fraction):
    """With one shared start, Adam and decoupled decay every support row of a user takes the same step (turned
    around where the feature is negative), so the offset form follows the rows round for round, with full and
    with partial participation (users at different step counts)."""
    data = signed_binary_graph()
    offset, _ = latents_after(data, 12, user_state="offset", user_fraction=fraction, user_lr=0.05)
    rows, _ = latents_after(data, 12, user_state="rows", user_fraction=fraction, user_lr=0.05)
    moved, _ = latents_after(data, 0, user_state="rows")
    assert (rows - moved).abs().max() > 0.05  # the users did move
    torch.testing.assert_close(offset, rows, rtol=1e-4, atol=1e-5)


def test_with_other_feature_values_the_forms_differ_only_through_adams_eps():
    data = toy_graph()  # values in (0, 1): a row's eps is eps / x_ij
    offset, _ = latents_after(data, 8, user_state="offset")
    rows, _ = latents_after(data, 8, user_state="rows")
    torch.testing.assert_close(offset, rows, rtol=1e-3, atol=1e-4)


def test_the_offset_form_holds_n_times_d_floats_not_nnz_times_d():
    data = toy_graph(n=200)
    data.x = (torch.rand(200, 400, generator=torch.Generator().manual_seed(0)) < 0.5).float()  # ~200 words a user
    sizes = {}
    for state in ("offset", "rows"):
        protocol, transport = setup_protocol(NFedGNN, data, user_state=state)
        sizes[state] = transport._parties["users"].state_nbytes()
    features = int(data.x.count_nonzero()) * (8 + 8 + 4)  # row, col, value
    width = protocol.shape.latent_dim
    assert sizes["offset"] - features == 200 * (4 * width + 2) * 4 + 200 * 8  # base, offset, 2 moments; mass, shrink
    assert sizes["rows"] - features > 100 * (sizes["offset"] - features)  # about 200 words a user: 3 x 200 / 4


def test_the_default_is_offset_where_it_holds_and_rows_elsewhere():
    def state(**protocol) -> str:
        return build_config({"protocol": {"name": "nfedgnn", **protocol}}).protocol["user_state"]
    assert state() == "offset"
    assert state(regulariser="raw") == state(user_dropout=0.2) == state(user_init="independent") == "rows"
    assert state(user_weight_decay="coupled") == "rows"


@pytest.mark.parametrize("unfit", [{"user_dropout": 0.2}, {"user_init": "independent"},
                                   {"user_weight_decay": "coupled"}])
def test_offset_refuses_what_would_move_rows_apart_in_one_line(unfit):
    with pytest.raises(ConfigError, match=r"user_state offset needs .*set user_state: rows$"):
        build_config({"protocol": {"name": "nfedgnn", "user_state": "offset", **unfit}})


def test_offset_with_sgd_is_refused_at_setup():
    cfg = split_config("nfedgnn", 3)
    cfg["train"]["optimizer"] = "sgd"
    protocol = NFedGNN(build_config(cfg), LocalTransport())
    with pytest.raises(ConfigError, match="user_state offset needs train.optimizer adam"):
        protocol.setup(toy_graph())


def test_per_label_runs_saved_before_the_offset_form_are_read_as_rows_and_not_reused():
    saved = as_saved({"protocol": {"name": "nfedgnn"}})
    assert saved["protocol"]["user_state"] == "rows"
    assert build_config(saved).protocol["user_state"] == "rows" != build_config(
        {"protocol": {"name": "nfedgnn"}}).protocol["user_state"]
