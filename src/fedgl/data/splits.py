"""Train/validation/test node splits.

Every random split draws from a local ``torch.Generator`` seeded by the caller, so the same
seed always gives the same masks and the global RNG is left alone. Class-stratified splits
rank the nodes of each class in a random order and cut each class at the requested
fractions, which needs no loop over nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedgl.errors import DataError

DEFAULT_RATIOS = (0.6, 0.2, 0.2)
"""Stratified fractions used by ``split="default"`` when a dataset ships no split."""

FIXED_SPLIT_NAMES = ("public", "geom-gcn")
SPLIT_FORMS = ("'default', 'public' or 'public:i' (chameleon/squirrel also 'geom-gcn:i'), "
               "'random', 'full', 'ratio:train,val,test' or 'ratio-floor:train,val,test'")

Masks = tuple[Tensor, Tensor, Tensor]


@dataclass(frozen=True)
class SplitRequest:
    """A parsed ``split=`` string."""

    kind: str
    fixed_name: str = ""
    index: int = 0
    ratios: tuple[float, float, float] = DEFAULT_RATIOS
    floor: bool = False


def _bad_split(split: object, reason: str = "") -> DataError:
    return DataError(f"bad split {split!r}{reason}; allowed: {SPLIT_FORMS}")


def parse_split(split: str) -> SplitRequest:
    """Parse ``split`` without touching any data, so bad strings fail before loading."""
    if not isinstance(split, str):
        raise _bad_split(split)
    text = split.strip().lower()
    if text in ("default", "random", "full"):
        return SplitRequest(text)
    head, _, tail = text.partition(":")
    if head in FIXED_SPLIT_NAMES:
        if not tail:
            return SplitRequest("fixed", head)
        if not tail.isdigit():
            raise _bad_split(split, " (the split index must be a non-negative integer)")
        return SplitRequest("fixed", head, int(tail))
    if head in ("ratio", "ratio-floor"):
        try:
            ratios = tuple(float(part) for part in tail.split(","))
        except ValueError:
            ratios = ()
        if len(ratios) != 3 or min(ratios) <= 0 or sum(ratios) > 1 + 1e-9:
            raise _bad_split(split, " (ratio needs three fractions > 0, train, validation and test, "
                                    "with sum <= 1)")
        return SplitRequest("ratio", ratios=ratios, floor=head == "ratio-floor")
    raise _bad_split(split)


def _class_ranks(y: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """A uniformly random rank of every node within its class, and the class sizes."""
    num_nodes = y.numel()
    perm = torch.randperm(num_nodes, generator=generator)
    order = perm[torch.argsort(y[perm], stable=True)]
    counts = torch.bincount(y, minlength=int(y.max()) + 1)
    starts = torch.cumsum(counts, 0) - counts
    ranks = torch.empty(num_nodes, dtype=torch.long)
    ranks[order] = torch.arange(num_nodes) - starts[y[order]]
    return ranks, counts


def stratified_split(y: Tensor, ratios: tuple[float, float, float],
                     generator: torch.Generator, floor: bool = False) -> Masks:
    """Cut each class at the cumulative ``ratios``, rounded per class to the nearest node, or
    truncated (``floor``: what ``int(n * ratio)`` per class gives)."""
    ranks, counts = _class_ranks(y, generator)
    cumulative = torch.cumsum(torch.tensor(ratios, dtype=torch.float64), 0)
    cut = torch.floor if floor else torch.round
    bounds = cut(cumulative * counts.unsqueeze(1)).long()
    bounds = torch.minimum(bounds, counts.unsqueeze(1))[y]
    train = ranks < bounds[:, 0]
    val = (ranks >= bounds[:, 0]) & (ranks < bounds[:, 1])
    test = (ranks >= bounds[:, 1]) & (ranks < bounds[:, 2])
    return train, val, test


SPLIT_SIZES = ("train_per_class", "num_val", "num_test")  # the options only split: random reads


def check_split_sizes(**sizes: Any) -> None:
    """Refuse split sizes that are not counts, whatever the split (only ``random`` reads them)."""
    for label, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise DataError(f"{label} must be a non-negative integer, got {value!r}")


def per_class_split(y: Tensor, train_per_class: int, num_val: int, num_test: int,
                    generator: torch.Generator) -> Masks:
    """PyG-style random split: ``train_per_class`` nodes per class, then val/test at random."""
    check_split_sizes(train_per_class=train_per_class, num_val=num_val, num_test=num_test)
    ranks, _ = _class_ranks(y, generator)
    train = ranks < train_per_class
    rest = (~train).nonzero().view(-1)
    if rest.numel() < num_val + num_test:
        raise DataError(f"random split needs num_val + num_test = {num_val + num_test} nodes "
                        f"outside the training set, but only {rest.numel()} remain")
    rest = rest[torch.randperm(rest.numel(), generator=generator)]
    val = torch.zeros_like(train)
    test = torch.zeros_like(train)
    val[rest[:num_val]] = True
    test[rest[num_val:num_val + num_test]] = True
    return train, val, test


def _fixed(request: SplitRequest, fixed: Masks | None, fixed_name: str | None,
           dataset: str) -> Masks:
    if fixed is None:
        raise DataError(f"dataset {dataset!r} ships no fixed split; use 'default', 'random', "
                        "'full' or 'ratio:train,val,test'")
    if request.fixed_name not in ("public", fixed_name):
        names = " or ".join(repr(n) for n in dict.fromkeys(("public", fixed_name)))
        raise DataError(f"dataset {dataset!r} has no {request.fixed_name!r} split; use {names}")
    count = fixed[0].size(1)
    if request.index >= count:
        raise DataError(f"dataset {dataset!r} has {count} fixed split(s); index "
                        f"{request.index} is out of range 0..{count - 1}")
    return tuple(mask[:, request.index].clone() for mask in fixed)


def split_masks(y: Tensor, request: SplitRequest, *, seed: int, dataset: str,
                fixed: Masks | None = None, fixed_name: str | None = None,
                train_per_class: int = 20, num_val: int = 500, num_test: int = 1000) -> Masks:
    """Boolean ``[N]`` train/val/test masks for ``request``.

    ``fixed`` holds a dataset's shipped splits as ``[N, K]`` masks (``None`` if it has none);
    ``"default"`` is the first shipped split, or a stratified 60/20/20 split without one, and
    ``"full"`` keeps the default val/test sets and trains on every other node.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise DataError(f"seed must be an integer, got {seed!r}")
    generator = torch.Generator().manual_seed(seed)
    if request.kind == "fixed":
        return _fixed(request, fixed, fixed_name, dataset)
    if request.kind == "random":
        return per_class_split(y, train_per_class, num_val, num_test, generator)
    if request.kind == "ratio":
        return stratified_split(y, request.ratios, generator, request.floor)
    if fixed is None:
        default = stratified_split(y, DEFAULT_RATIOS, generator)
    else:
        default = _fixed(SplitRequest("fixed", "public"), fixed, fixed_name, dataset)
    if request.kind == "full":
        _, val, test = default
        return ~(val | test), val, test
    return default
