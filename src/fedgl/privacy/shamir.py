"""Shamir t-of-n secret sharing over the prime field GF(2^521 - 1), with Python integers.

A 32-byte secret is a field element; ``share`` draws the t - 1 other coefficients of a random
polynomial with ``secrets`` and evaluates it at x = 1..n (client id + 1), all secrets of one client
at once; any t shares give the secret back by Lagrange interpolation at 0 (``reconstruct``), fewer
give nothing. The Lagrange weights depend only on which clients answered, so they are computed
once and applied to every client's shares.
"""

from __future__ import annotations

import secrets

PRIME = 2**521 - 1  # a Mersenne prime: every 32-byte secret is a field element
SHARE_BYTES = 66  # ceil(521 / 8)


def share(values: list[bytes], xs: list[int], threshold: int) -> list[list[int]]:
    """``out[k][i]``: the share at ``xs[k]`` of ``values[i]`` (each a polynomial of degree threshold - 1)."""
    polys = [[int.from_bytes(v, "big")] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)] for v in values]
    out = []
    for x in xs:
        row = []
        for coefficients in polys:
            y = 0
            for c in reversed(coefficients):  # Horner
                y = (y * x + c) % PRIME
            row.append(y)
        out.append(row)
    return out


def lagrange_at_zero(xs: list[int]) -> list[int]:
    """The weights that turn shares at ``xs`` into the value at 0."""
    weights = []
    for k, xk in enumerate(xs):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != k:
                num = num * xm % PRIME
                den = den * (xm - xk) % PRIME
        weights.append(num * pow(den, -1, PRIME) % PRIME)
    return weights


def reconstruct(xs: list[int], shares: list[list[int]], size: int = 32) -> list[bytes]:
    """The secrets behind ``shares[k][i]`` (share of secret i at ``xs[k]``), as ``size``-byte strings."""
    weights = lagrange_at_zero(xs)
    count = len(shares[0]) if shares else 0
    values = [sum(w * row[i] for w, row in zip(weights, shares)) % PRIME for i in range(count)]
    return [v.to_bytes(SHARE_BYTES, "big")[-size:] for v in values]  # fewer than t shares: noise


def to_bytes(value: int) -> bytes:
    return value.to_bytes(SHARE_BYTES, "big")


def from_bytes(raw: bytes) -> int:
    return int.from_bytes(raw, "big")
