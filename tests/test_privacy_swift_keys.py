"""Swift's per-request mask keys stay in their party: a checkpoint of a secure run holds none of them."""

from __future__ import annotations

from fedgl.config import build_config
from fedgl.privacy import secure_aggregation as sa
from fedgl.protocols.horizontal.plan import OwnerPlan
from fedgl.runner import Run
from support.configs import tiny
from support.stored import files_holding


def checkpointed_swift(folder, monkeypatch) -> list[bytes]:
    """A one-round secure Swift run (a cross-client round: K of the clients cross, the others serve),
    checkpointed; the private half of every request key pair it made."""
    made: list[bytes] = []
    create = sa.RequestMasking.create.__func__

    def recorded(cls):
        masking = create(cls)
        made.append(masking.keys.private)
        return masking

    monkeypatch.setattr(sa.RequestMasking, "create", classmethod(recorded))
    cfg = tiny("swift", privacy={"secure_aggregation": True}, checkpoint_every=1, train={"rounds": 1})
    Run(build_config(cfg), folder).execute(progress=False)
    return made


def test_a_checkpoint_of_a_secure_swift_run_holds_no_request_key(tmp_path, monkeypatch):
    made = checkpointed_swift(tmp_path / "run", monkeypatch)
    assert len(made) >= 3 and any((tmp_path / "run").glob("parties-*/client*.pt"))
    assert files_holding(tmp_path / "run", made) == []
    # the check can fail: without the declaration the keys of requests a client served stay in its file
    monkeypatch.setattr(OwnerPlan, "secret_state", frozenset())
    leaked = checkpointed_swift(tmp_path / "open", monkeypatch)
    assert files_holding(tmp_path / "open", leaked) != []
