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
