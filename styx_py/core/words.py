"""Numbers in sentences a person reads: ``1 worker``, ``2 workers``."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``plural`` when adding an s is wrong)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {plural or noun + 's'}"
