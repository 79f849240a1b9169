"""A toy secure-sum client and the one-line check of an error, shared by the secure-aggregation tests."""

from __future__ import annotations

import torch

from fedgl.comm import Party, rpc
from fedgl.errors import PartyFailure
from fedgl.privacy.bonawitz import SecAggClient
from fedgl.protocols.aggregation import SecureSumParty


class Toy(SecureSumParty, Party):
    """A client holding one private fixed-point vector."""

    def __init__(self, name: str, seed: int, index: int, value: torch.Tensor, fail_at: str = ""):
        super().__init__(name, seed)
        self.secagg = SecAggClient.create(index)
        self.secure_value = value
        self.fail_at = fail_at

    @rpc(label="control", ids="control", keys="control", threshold="control", returns="control")
    def secagg_share(self, label, ids, keys, threshold):
        if self.fail_at == "share":  # its process dies during this step
            raise PartyFailure([self.name])
        return super().secagg_share(label, ids, keys, threshold)


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text
