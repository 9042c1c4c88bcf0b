"""Blob storage as the engine sees it: a small port and the object layout of snapshots.

Real implementation: :class:`styx_py.io.s3.MinioBlobStore` (MinIO / SeaweedFS); in-memory one for the
simulation: :class:`styx_py.testing.memory.MemoryBlobStore`.
"""

from __future__ import annotations

import builtins
from typing import Protocol


class BlobStore(Protocol):
    async def put(self, key: str, data: bytes) -> None: ...

    async def get(self, key: str) -> bytes | None: ...

    async def list(self, prefix: str) -> builtins.list[str]: ...

    async def delete(self, keys: builtins.list[str]) -> None: ...


def delta_key(partition: int, epoch: int) -> str:
    # Zero-padded so names also sort numerically; readers still parse the number (never rely on it).
    return f"snapshots/p{partition:05d}/{epoch:012d}.delta"


def base_key(partition: int, epoch: int) -> str:
    """A compacted partition: its whole state as of ``epoch`` (deltas merged)."""
    return f"snapshots/p{partition:05d}/{epoch:012d}.base"


def manifest_key(epoch: int) -> str:
    return f"manifests/{epoch:012d}.manifest"


def epoch_of(key: str) -> int:
    return int(key.rsplit("/", 1)[1].split(".", 1)[0])
