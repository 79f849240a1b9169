"""The torch metrics the runner scores every round equal scikit-learn's definitions."""

from __future__ import annotations

import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score, roc_auc_score

from fedgl.metrics import classification_metrics


@pytest.mark.parametrize("seed", range(4))
def test_metrics_equal_scikit_learn_with_ties_and_missing_classes(seed):
    g = torch.Generator().manual_seed(seed)
    n, c = 400, 6
    logits = (torch.randn(n, c, generator=g) * 2).round()  # rounded: many tied probabilities
    y = torch.randint(0, c - 1, (n,), generator=g)  # the last class never occurs in y
    ours = classification_metrics(logits, y, c)
    prob = logits.softmax(-1)
    present = sorted(set(y.tolist()))  # macro one-vs-rest AUC: the mean of each present class's binary AUC
    assert ours["accuracy"] == pytest.approx(accuracy_score(y, logits.argmax(-1)))
    assert ours["macro_f1"] == pytest.approx(f1_score(y, logits.argmax(-1), average="macro"))
    per_class = [roc_auc_score((y == k).int(), prob[:, k]) for k in present]
    assert ours["auc"] == pytest.approx(sum(per_class) / len(per_class))


def test_metrics_of_an_empty_split_are_nan():
    out = classification_metrics(torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), 3)
    assert all(value != value for value in out.values())
