"""Reads of committed state outside transactions: :meth:`ClientState.scan` and :meth:`~ClientState.read`.

They go to the coordinator's admin port (the client's ``coordinator``, authenticated with its cluster
secret), not through Kafka: each is answered from the workers' memory as of one committed epoch, with
no transaction and no pause of the epochs (:mod:`styx_py.io.stateread`). A scan's pages all read the
same epoch; an ``as_of_epoch`` within the workers' window (``state_window_epochs``) reads that epoch,
an older one raises :class:`~styx_py.core.errors.EpochOutOfWindow` (``styx sql --as-of-epoch`` reads
those from the snapshots). For a value serializable with running transactions, call a function.

Without ``as_of_epoch``, a read is of the newest committed epoch and never of one older than the newest
reply this client has handed to a caller (:attr:`ClientState.newest_epoch`): replies leave before
their epoch is over, and the coordinator holds such a read until that epoch is (read-your-writes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from styx_client.sdk.core import ClientCore
from styx_py.core.errors import ConfigError
from styx_py.core.partitioning import Key
from styx_py.io import stateread
from styx_py.io.stateread import StatePage

__all__ = ["ClientState", "StatePage"]


class ClientState:
    """The state-reading side of :class:`~styx_client.sdk.StyxClient` (which sets ``_admin``)."""

    _admin: tuple[str | None, str | None]  # the coordinator's address and the cluster secret
    _core: ClientCore

    @property
    def newest_epoch(self) -> int:
        """The epoch of the newest reply this client has handed to a caller (-1: none yet): reads
        without ``as_of_epoch`` read it or a newer one."""
        return self._core.table.newest_epoch

    def _reads(self) -> stateread.ReadSource:
        address, secret = self._admin
        if address is None:
            raise ConfigError("reading state needs the coordinator: use StyxClient.connect or coordinator=")
        return stateread.admin_reads(address, secret=secret)

    async def read(self, operator: str, key: Key, *, as_of_epoch: int | None = None) -> tuple[int, Any]:
        """One entity's stored value as of ``as_of_epoch`` (default: the newest committed epoch), as
        ``(epoch, value)``; value None when the entity does not exist at that epoch."""
        reads, seen = self._reads(), self.newest_epoch
        epoch, _found, value = await stateread.read_value(reads, operator, key, as_of_epoch, seen)
        return epoch, value

    def scan_pages(self, operator: str, **bounds: Any) -> AsyncIterator[StatePage]:
        """The pages of a scan, all as of one epoch: :func:`styx_py.io.stateread.scan` and its keywords
        (``prefix``, ``start``, ``after``, ``end``, ``limit``, ``page_size``, ``as_of_epoch``, ``cursor``,
        ``rows_per_s``, ``min_epoch``: by default :attr:`newest_epoch`)."""
        bounds.setdefault("min_epoch", self.newest_epoch)
        return stateread.scan(self._reads(), operator, **bounds)

    async def scan(
        self,
        operator: str,
        *,
        prefix: str | None = None,
        start: Key | None = None,
        after: Key | None = None,
        end: Key | None = None,
        limit: int | None = None,
        as_of_epoch: int | None = None,
        rows_per_s: float | None = None,
    ) -> tuple[int, list[tuple[Key, Any]]]:
        """Every committed entity of ``operator`` in key order (ints before strs) with ``prefix`` (str
        keys), from ``start`` (inclusive) or ``after`` (exclusive) to ``end`` (exclusive), at most
        ``limit``: ``(epoch, [(key, value), …])``, all as of that one epoch across every partition.
        ``rows_per_s`` paces it (a background scan: :func:`styx_py.io.stateread.scan`)."""
        epoch = -1
        rows: list[tuple[Key, Any]] = []
        bounds = {"prefix": prefix, "start": start, "after": after, "end": end, "limit": limit}
        async for page in self.scan_pages(operator, as_of_epoch=as_of_epoch, rows_per_s=rows_per_s, **bounds):
            epoch = page.epoch
            rows.extend(page.rows)
        return epoch, rows
