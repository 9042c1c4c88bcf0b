"""Stable key → partition hashing.

Never the builtin ``hash()``: it is salted per process for str/bytes, so two workers (or a worker
and its replay after a crash) would disagree about where a key lives.
"""

from __future__ import annotations

from zlib import crc32

Key = str | int


def key_bytes(key: Key) -> bytes:
    """Canonical bytes of a key; ``int`` and ``str`` never collide (distinct prefixes)."""
    if isinstance(key, str):
        return b"s" + key.encode()
    if isinstance(key, int) and not isinstance(key, bool):
        return b"i" + str(key).encode()
    raise TypeError(f"entity keys must be str or int, got {type(key).__name__}")


_STR_PREFIX = crc32(b"s")  # a str key's CRC continues from its prefix's: no concatenated copy


def partition_of(key: Key, partitions: int) -> int:
    """The partition that owns ``key`` among ``partitions`` (stable across processes and runs): the
    CRC-32 of :func:`key_bytes`."""
    if type(key) is str:
        return crc32(key.encode(), _STR_PREFIX) % partitions
    return crc32(key_bytes(key)) % partitions
