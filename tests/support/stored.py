"""Looking for secrets in written files: raw, as hex text, and in the form torch.save's pickle gives a
bytes value."""

from __future__ import annotations

from pathlib import Path


def forms(secret: bytes) -> tuple[bytes, bytes, bytes]:
    """``secret`` raw, as hex text, and as torch.save's pickle (protocol 2) writes a bytes value: its
    latin-1 text, UTF-8 encoded, where a byte above 127 takes two (so a search for the raw bytes alone
    misses it)."""
    return secret, secret.hex().encode(), secret.decode("latin1").encode("utf-8")


def files_holding(folder: Path, secrets: list[bytes]) -> list[str]:
    """The files under ``folder`` that hold any of ``secrets`` in either form."""
    wanted = [form for secret in secrets for form in forms(secret)]
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                  and any(form in p.read_bytes() for form in wanted))
