"""A result a party hands over (``@rpc(handover=True)``, written into ``payload.outbox`` storage) crosses
the in-process transport without a copy, and the parties stay isolated: the sender never writes into a
message its receiver still holds, and what the receiver writes into a message reaches nothing of the
sender's (CNFGNN's gigabyte model uploads take this path)."""

from __future__ import annotations

import torch

from fedgl.comm import LocalTransport, Party, Rows, rpc
from fedgl.comm.payload import outbox
from fedgl.config import build_config
from fedgl.runner import Run


class Sender(Party):
    def __init__(self, name: str, seed: int):
        super().__init__(name, seed)
        self.weight = torch.arange(6.0)
        self.box = outbox()

    @rpc(returns=Rows("model"), handover=True)
    def send(self) -> torch.Tensor:
        out = self.box(12, torch.float32).view(2, 6)
        out.copy_(self.weight.expand(2, 6))
        return out


def sender() -> LocalTransport:
    transport = LocalTransport()
    transport.spawn(Sender, [{"name": "s", "seed": 0}])
    return transport


def test_a_handed_over_result_is_not_copied_and_its_storage_is_reused_once_dropped():
    transport = sender()
    first = transport.call("s", "send")
    where = first.data_ptr()
    del first
    assert transport.call("s", "send").data_ptr() == where  # the same storage, neither copied nor made afresh
    assert transport.ledger.total(kind="model") == 2 * 12 * 4  # measured as sent, both times


def test_the_sender_never_writes_into_a_message_its_receiver_still_holds():
    transport = sender()
    kept = transport.call("s", "send")
    view = kept[1:]
    del kept
    second = transport.call("s", "send")
    assert second.data_ptr() != view.data_ptr()
    second.fill_(-1.0)
    assert torch.equal(view, torch.arange(6.0).unsqueeze(0))


def test_what_the_receiver_writes_into_a_message_reaches_nothing_of_the_senders():
    transport = sender()
    got = transport.call("s", "send")
    got.fill_(float("nan"))
    del got
    again = transport.call("s", "send")
    assert torch.equal(again, torch.arange(6.0).expand(2, 6))
    assert torch.equal(transport.snapshot()["s"]["weight"], torch.arange(6.0))


def test_cnfgnn_uploads_survive_a_receiver_that_keeps_or_overwrites_them(tmp_path):
    cfg = build_config({"seed": 3, "threads": 1, "partition": {"num_clients": 4, "method": "random"},
                        "dataset": {"name": "synthetic", "options": {"num_nodes": 120, "num_features": 16}},
                        "model": {"name": "gcn", "hidden": 4}, "protocol": {"name": "cnfgnn", "message_mb": 0.02},
                        "train": {"rounds": 1}, "network": {"compute": "ignore"}})
    job = Run(cfg, tmp_path)
    transport, users = job.transport, job.protocol.users
    chunk = job.protocol.model_chunks()[0]
    kept = transport.call(users, "upload", users=chunk)
    expected = kept.clone()
    again = transport.call(users, "upload", users=chunk)  # while the first is held: other storage
    assert again.data_ptr() != kept.data_ptr() and torch.equal(kept, expected) and torch.equal(again, expected)
    kept.fill_(float("nan"))
    again.fill_(float("nan"))
    where = again.data_ptr()  # the storage the users keep for their next upload
    del kept, again
    last = transport.call(users, "upload", users=chunk)
    assert last.data_ptr() == where and torch.equal(last, expected)
