"""The cross-client step's fast paths against the plain computations they replace, on small inputs.

``Assembly`` (one block per layer, laid out by recipient) against adding each target's vectors in
owner order onto a zero row, with a target that could receive a vector but got none and the owners
in two batches; ``pick_sums`` on sparse rows against the same rows made dense; a layer projecting only
the sparse rows it picks against projecting them all. Each comparison is to the bit.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from fedgl.config import ModelConfig
from fedgl.errors import RunFailed
from fedgl.models import make_model
from fedgl.models.graph import feature_dropout, select_rows
from fedgl.models.split_horizontal import block_layer, neigh, source_scale, update
from fedgl.protocols.horizontal.partial_sums import pick_sums
from fedgl.protocols.horizontal.routing import Assembly, Router

NAMES = ["c0", "c1", "c2"]


def routed() -> tuple[Router, dict]:
    """One trainer (c0) whose targets (at c0 and c1) picked nodes held by all three clients."""
    owner = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2])
    router = Router(owner, torch.tensor([0, 1, 0, 1, 2, 0, 1, 2]), NAMES)
    picks = {"c0": {"c0": {"targets": torch.tensor([0, 0, 1, 1, 1, 2, 2]), "ids": torch.tensor([2, 5, 3, 4, 6, 2, 7])},
                    "c1": {"targets": torch.tensor([0, 0, 1, 2]), "ids": torch.tensor([5, 6, 7, 0])}}}
    return router, picks


def replies(route, fewest: int, withheld: set[int]) -> dict[str, dict]:
    """Each owner's reply: a vector per pair with at least ``fewest`` picks, except the pairs ``withheld``."""
    size = torch.bincount(route.pick_pair, minlength=route.target_of_pair.numel())
    size[size < fewest] = 0
    size[list(withheld)] = 0
    out, first = {}, 0
    for i, n in enumerate(route.pair_counts.tolist()):
        if n:
            mine = size[first:first + n]
            vectors = torch.randn(int((mine > 0).sum()), 5, generator=torch.Generator().manual_seed(i))
            out[NAMES[i]] = {"sums": {"c0": vectors}, "counts": {"c0": mine.clone()}}
        first += n
    return out


def reference(route, answers: dict) -> tuple[Tensor, Tensor]:
    """Every target's sum (owner by owner onto a zero row) and count, in target order."""
    targets = int(route.target_counts.sum())
    total, count, first = torch.zeros(targets, 5), torch.zeros(targets, dtype=torch.long), 0
    for i, n in enumerate(route.pair_counts.tolist()):
        if n:
            tgt, size = route.target_of_pair[first:first + n], answers[NAMES[i]]["counts"]["c0"]
            count.index_add_(0, tgt, size)
            for row, vector in zip(tgt[size > 0].tolist(), answers[NAMES[i]]["sums"]["c0"]):
                total[row] += vector
        first += n
    return total, count



@pytest.mark.parametrize("withheld", [set(), {0}])
def test_assembly_in_batches_is_the_sum_over_owners_to_the_bit(withheld):
    router, picks = routed()
    _, routes = router.route(picks)
    route = routes["c0"]
    answers = replies(route, 1, withheld)
    assembly = Assembly(routes, NAMES, 1)
    for batch in (["c0", "c1"], ["c2"]):  # the owners in two batches, in owner order
        assembly.add({c: answers[c] for c in batch if c in answers})
    remote, counts = assembly.result()
    total, count = reference(route, answers)
    split = route.target_counts.tolist()
    for c, cnt, rows in zip(NAMES, count.split(split), total.split(split)):
        if cnt.numel():
            assert torch.equal(counts[c]["c0"], cnt)
            assert torch.equal(remote[c]["c0"], rows[cnt > 0])
    assert withheld or all(r["c0"]._base is not None for r in remote.values())  # slices when none is missing
    assert not withheld or any(bool((c["c0"] == 0).any()) for c in counts.values())  # a target got nothing


def test_assembly_refuses_a_vector_for_a_pair_below_the_threshold():
    router, picks = routed()
    _, routes = router.route(picks)
    answers = replies(routes["c0"], 1, set())  # every pair sent, also those of one pick
    with pytest.raises(RunFailed, match="too few picks"):
        Assembly(routes, NAMES, 2).add(answers)


def sparse_rows(n: int, width: int) -> Tensor:
    """Sparse rows of unequal values (one row all zero), after dropout, as an owner holds them."""
    x = torch.randn(n, width, generator=torch.Generator().manual_seed(1))
    x = x * (torch.rand(n, width, generator=torch.Generator().manual_seed(2)) < 0.3)
    x[3] = 0
    torch.manual_seed(4)
    return feature_dropout(x.to_sparse_csr(), 0.5, True)


@pytest.mark.parametrize("fewest,every,scaled", [(2, False, True), (2, False, False), (1, True, True)])
def test_sparse_pick_sums_equal_the_dense_rows_to_the_bit(fewest, every, scaled):
    h = sparse_rows(12, 40)
    src = torch.tensor([0, 3, 3, 5, 1, 7, 7, 9, 11, 2, 3, 4])
    pair = torch.tensor([0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 5, 5])
    scale = (torch.arange(12.0)[src] + 1).rsqrt().unsqueeze(1) if scaled else None
    sums, size = pick_sums(h, src, scale, pair, fewest, every)
    dense_sums, dense_size = pick_sums(h.to_dense(), src, scale, pair, fewest, every)
    assert torch.equal(size, dense_size) and torch.equal(sums, dense_sums)
    assert fewest == 1 or int((size == 0).sum()) >= 1  # pair 1 sums one non-zero row: withheld


@pytest.mark.parametrize("name", ["sage", "gcn"])
def test_a_layer_projecting_its_picked_sparse_rows_is_the_layer_projecting_all(name):
    torch.manual_seed(0)
    model = make_model(ModelConfig(name=name, hidden=8, dropout=0.0), 40, 3)
    h = sparse_rows(12, 40)
    src, dst = torch.tensor([4, 6, 6, 9, 0]), torch.tensor([0, 0, 1, 2, 3])
    degree = torch.arange(12.0) + 2
    fast = block_layer(model, 0, h, 4, src, dst, degree=degree)
    projected = neigh(model, 0, h)  # every row projected, then the picked ones summed
    if name == "gcn":
        projected = projected * source_scale(model, degree)
    total = torch.zeros(4, projected.size(1)).index_add(0, dst, projected[src])
    count = torch.bincount(dst, minlength=4).float()
    slow = update(model, 0, select_rows(h, torch.arange(4)), total, count, degree[:4] if name == "gcn" else None)
    assert torch.equal(fast, slow)
