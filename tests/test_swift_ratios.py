"""ratios.md of the swift-* tasks: each variant against FedGNN-G run in the same setting."""

from fedgl.bench.swift import _reference

LABELS = ["Swift-FedGNN metis hidden 256", "FedGNN-G metis hidden 256", "Swift-FedGNN metis hidden 16",
          "FedGNN-G metis hidden 16", "M=80 Swift-FedGNN K=10", "M=80 FedGNN-G", "M=100 FedGNN-G"]


def test_each_variant_is_compared_with_fedgnn_g_in_its_own_setting():
    assert _reference("Swift-FedGNN metis hidden 16", LABELS) == "FedGNN-G metis hidden 16"
    assert _reference("Swift-FedGNN metis hidden 256", LABELS) == "FedGNN-G metis hidden 256"
    assert _reference("M=80 Swift-FedGNN K=10", LABELS) == "M=80 FedGNN-G"
    assert _reference("FedGNN-G metis hidden 16", LABELS) == "FedGNN-G metis hidden 16"


def test_a_task_of_plain_labels_compares_with_plain_fedgnn_g_and_a_setting_without_it_with_none():
    assert _reference("Swift-FedGNN", ["Swift-FedGNN", "FedGNN-G", "LLCG"]) == "FedGNN-G"
    assert _reference("K=10 I=5", ["K=10 I=5", "K=10 I=10"]) is None
