"""Swift's per-request mask keys stay in their party: a checkpoint of a secure run holds none of them."""

from __future__ import annotations

from pathlib import Path

from fedgl.config import build_config
from fedgl.privacy import secure_aggregation as sa
from fedgl.protocols.horizontal.plan import OwnerPlan
from fedgl.runner import Run
from support.configs import tiny


def files_holding(folder: Path, secrets: list[bytes]) -> list[str]:
    """The files of ``folder`` holding any of ``secrets``, raw or as torch.save's pickle (protocol 2)
    writes a bytes value: its latin-1 text, UTF-8 encoded, where a byte above 127 takes two."""
    forms = [form for secret in secrets for form in (secret, secret.decode("latin1").encode("utf-8"))]
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                  and any(form in p.read_bytes() for form in forms))


def checkpointed_swift(folder, monkeypatch) -> list[bytes]:
    """A one-round secure Swift run (a cross-client round: K of the clients cross, the others serve),
    checkpointed; the private half of every request key pair it made."""
    made: list[bytes] = []
    create = sa.RequestMasking.create.__func__

    def recorded(cls, scheme=None):
        masking = create(cls, scheme)
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
