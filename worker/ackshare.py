"""Ack-share completion: knowing when an unknown call graph has finished.

The root of a transaction holds share 1. An invocation that makes ``k`` asynchronous calls keeps one
part for itself and gives each callee one of ``k + 1`` equal parts; a synchronous call halves the
caller's current share. Every invocation acks the share it kept to the root when it ends. The root
knows the transaction has finished when the acked shares sum to exactly 1. Shares are exact
fractions: floats would need a tolerance and could declare a transaction finished too early.

Keeping a part for the caller (rather than handing all of it to the callees as in the paper's
figure) means every invocation reports its outcome to the root, which the fallback phase's parallel
re-invocation from the call-graph cache relies on.
"""

from __future__ import annotations

from fractions import Fraction

ONE = Fraction(1)
_INT64 = 2**63

WireInt = int | str
"""A share's numerator or denominator on the wire: an int, or its decimal string beyond 64 bits
(msgpack integers stop there; a deep chain of synchronous calls halves the share 64 times)."""


def to_wire(share: Fraction) -> tuple[WireInt, WireInt]:
    n, d = share.numerator, share.denominator
    return (n if n < _INT64 else str(n)), (d if d < _INT64 else str(d))


def from_wire(n: WireInt, d: WireInt) -> Fraction:
    if type(n) is int and type(d) is int:
        return Fraction(n, d)
    return Fraction(int(n), int(d))


def split_async(share: Fraction, k: int) -> Fraction:
    """Part each of ``k`` asynchronous callees (and the caller) receives."""
    assert k >= 0
    return share / (k + 1)


def split_sync(share: Fraction) -> tuple[Fraction, Fraction]:
    """(kept by the caller, given to the synchronous callee)."""
    half = share / 2
    return share - half, half


class ShareCollector:
    """Sums the shares acked to one root."""

    __slots__ = ("total",)

    def __init__(self) -> None:
        self.total = Fraction(0)

    def add(self, share: Fraction) -> bool:
        """Record an ack; True when the transaction's call graph is complete."""
        self.total += share
        assert self.total <= ONE, f"ack shares exceed 1: {self.total}"
        return self.total == ONE
