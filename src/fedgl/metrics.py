"""Classification metrics computed in torch.

Evaluation runs every round, so these are vectorised torch versions of accuracy, macro-F1 and
one-vs-rest ROC AUC (the scikit-learn definitions, checked against scikit-learn in the tests) that
cost microseconds rather than milliseconds.
"""

from __future__ import annotations

import torch


def accuracy(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float((pred == y).float().mean()) if y.numel() else float("nan")


def macro_f1(pred: torch.Tensor, y: torch.Tensor, num_classes: int) -> float:
    """Mean F1 over the classes present in ``y`` or ``pred`` (scikit-learn's macro average)."""
    tp = torch.bincount(y[pred == y], minlength=num_classes).float()
    pred_count = torch.bincount(pred, minlength=num_classes).float()
    true_count = torch.bincount(y, minlength=num_classes).float()
    present = (pred_count + true_count) > 0
    f1 = 2 * tp / (pred_count + true_count).clamp(min=1)
    return float(f1[present].mean()) if present.any() else float("nan")


def auc_ovr(prob: torch.Tensor, y: torch.Tensor) -> float:
    """Macro one-vs-rest ROC AUC over the classes present in ``y`` (ties get average ranks)."""
    n, c = prob.shape
    if n == 0:
        return float("nan")
    order = prob.argsort(dim=0)
    sorted_scores = prob.gather(0, order)
    # Average ranks for ties: rank of each element = mean of the positions sharing its value.
    ranks = torch.empty_like(prob, dtype=torch.float64)
    positions = torch.arange(1, n + 1, dtype=torch.float64).unsqueeze(1).expand(n, c)
    new_group = torch.ones_like(sorted_scores, dtype=torch.bool)
    new_group[1:] = sorted_scores[1:] != sorted_scores[:-1]
    group_id = new_group.long().cumsum(0) - 1 + torch.arange(c) * n
    flat = group_id.flatten()
    sums = torch.zeros(n * c, dtype=torch.float64).index_add_(0, flat, positions.flatten())
    counts = torch.zeros(n * c, dtype=torch.float64).index_add_(0, flat, torch.ones(n * c, dtype=torch.float64))
    ranks.scatter_(0, order, (sums / counts.clamp(min=1))[group_id])
    positive = torch.nn.functional.one_hot(y, c).bool()
    n_pos = positive.sum(0).double()
    n_neg = n - n_pos
    valid = (n_pos > 0) & (n_neg > 0)
    rank_sum = (ranks * positive).sum(0)
    auc = (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg).clamp(min=1)
    return float(auc[valid].mean()) if valid.any() else float("nan")


def classification_metrics(logits: torch.Tensor, y: torch.Tensor, num_classes: int) -> dict[str, float]:
    pred = logits.argmax(-1)
    prob = logits.float().softmax(-1)
    return {
        "accuracy": accuracy(pred, y),
        "macro_f1": macro_f1(pred, y, num_classes),
        "auc": auc_ovr(prob, y),
    }
