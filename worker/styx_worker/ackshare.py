"""Ack-share completion: knowing when an unknown call graph has finished.

The root of a transaction holds share 1. An invocation that makes ``k`` asynchronous calls keeps one
part for itself and gives each callee one of ``k + 1`` equal parts; a synchronous call halves the
caller's current share. Every invocation acks the share it kept to the root when it ends. The root
knows the transaction has finished when the acked shares sum to exactly 1. Shares are exact
rationals: floats would need a tolerance and could declare a transaction finished too early.

Keeping a part for the caller (rather than handing all of it to the callees as in the paper's
figure) means every invocation reports its outcome to the root, which the fallback phase's parallel
re-invocation from the call-graph cache relies on.

**Representation, and why it is exact.** A :data:`Share` is a pair of Python integers ``(n, d)``
standing for the rational n/d, with ``0 < n <= d``; the splits keep it in lowest terms, so it is
the same pair ``fractions.Fraction(n, d)`` would hold and the wire carries the same two numbers as
before. Python integers are unbounded, so every operation below is exact integer arithmetic:

- :func:`split_async`: n/d ÷ (k+1) = n / (d·(k+1)), reduced by gcd(n, k+1) (d and n are already
  coprime, so no other factor can be shared);
- :func:`split_sync`: n/d ÷ 2 = (n/2)/d when n is even, else n/(2d) (already reduced), and the
  caller keeps the other half, which is the same number;
- :func:`scaled`: m parts of n/d = (n·m)/d, reduced by gcd(m, d).

:class:`ShareCollector` keeps the running sum as an unreduced pair ``num/den`` whose ``den`` is the
least common multiple of the denominators added so far. Adding n/d with ``den' = lcm(den, d)`` gives
``num·(den'/den) + n·(den'/d)`` over ``den'``; both quotients are integers because ``den'`` is a
multiple of ``den`` and of ``d``, so the pair represents the exact sum after every ack (the invariant
num/den = Σ acked shares holds by induction from 0/1). The sum equals 1 exactly when ``num == den``
(``den > 0``), and exceeds 1 exactly when ``num > den``: no reduction is needed for either test.
This holds for any acked values, whatever the call tree (any fan-out, any depth, the serial phase's
multiples of a part, the cached re-invocations' kept shares), because nothing is rounded: unlike a
fixed power-of-two denominator it does not assume splits by powers of two. Measured (a 2-worker
YCSB-T run, py-spy): ``Fraction`` construction and addition were ~10 % of a worker's busy time; the
pairs and integer gcd/lcm cost a few instructions each.
"""

from __future__ import annotations

from math import gcd

Share = tuple[int, int]
"""The rational n/d as ``(n, d)``, in lowest terms, ``0 < n <= d`` (0/1 only for a placeholder)."""

ONE: Share = (1, 1)
ZERO: Share = (0, 1)
_INT64 = 2**63

WireInt = int | str
"""A share's numerator or denominator on the wire: an int, or its decimal string beyond 64 bits
(msgpack integers stop there; a deep chain of synchronous calls halves the share 64 times)."""


def to_wire(share: Share) -> tuple[WireInt, WireInt]:
    n, d = share
    return (n if n < _INT64 else str(n)), (d if d < _INT64 else str(d))


def from_wire(n: WireInt, d: WireInt) -> Share:
    if type(n) is int and type(d) is int:
        return n, d
    return int(n), int(d)


def split_async(share: Share, k: int) -> Share:
    """Part each of ``k`` asynchronous callees (and the caller) receives."""
    assert k >= 0
    if k == 0:
        return share
    n, d = share
    parts = k + 1
    if n == 1:
        return 1, d * parts
    g = gcd(n, parts)
    return n // g, d * (parts // g)


def split_sync(share: Share) -> tuple[Share, Share]:
    """(kept by the caller, given to the synchronous callee): two halves."""
    n, d = share
    half = (n >> 1, d) if n & 1 == 0 else (n, d << 1)
    return half, half


def scaled(share: Share, m: int) -> Share:
    """``m`` parts of ``share`` (m ≥ 1)."""
    assert m >= 1
    n, d = share
    g = gcd(m, d)
    return n * (m // g), d // g


class ShareCollector:
    """Sums the shares acked to one root, exactly (see the module docstring)."""

    __slots__ = ("den", "num")

    def __init__(self) -> None:
        self.num = 0
        self.den = 1

    def add(self, share: Share) -> bool:
        """Record an ack; True when the transaction's call graph is complete."""
        n, d = share
        den = self.den
        if d == den:
            self.num += n
        elif den % d == 0:
            self.num += n * (den // d)
        else:
            lcm = den // gcd(den, d) * d
            self.num = self.num * (lcm // den) + n * (lcm // d)
            self.den = lcm
        assert self.num <= self.den, f"ack shares exceed 1: {self.num}/{self.den}"
        return self.num == self.den

    @property
    def total(self) -> Share:
        """The sum so far, in lowest terms."""
        g = gcd(self.num, self.den)
        return self.num // g, self.den // g
