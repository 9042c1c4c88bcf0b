"""Consistent reads of committed state, the client side (the SDK, the gateway and ``styx state``).

One :class:`~styx_py.core.wire.ReadState` to the coordinator's admin port, authenticated like every
admin request, gives one page as of one epoch (:mod:`styx_py.core.wire.reads`). :func:`scan` follows
the pages of a scan: every page after the first asks at the first page's epoch, so the whole scan is one
cut of the state across every partition however long it takes; a page's :attr:`StatePage.cursor`
carries that epoch and the page's last key, for a client that resumes later (the gateway's
``?cursor=``). Each page visits every partition of the operator (each asked for about its share of
the page, :func:`styx_coordinator.reads.share`); pages go over kept connections.

Errors: :class:`~styx_py.core.errors.EpochOutOfWindow` for an epoch older than the workers keep (a
cursor kept too long, an ``as_of_epoch`` too old, or one from before a recovery),
:class:`~styx_py.core.errors.Unavailable` when the cluster cannot answer now (retried
:data:`READ_RETRIES` times first), :class:`~styx_py.core.errors.StateReadRefused` otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from styx_py.core.errors import EpochOutOfWindow, StateReadRefused, Unavailable
from styx_py.core.limits import READ_PAGE
from styx_py.core.partitioning import Key
from styx_py.core.wire import UNDECODABLE, AdminReply, ReadState
from styx_py.io.admin import AdminConnections

__all__ = [
    "READ_RETRIES",
    "ReadSource",
    "StatePage",
    "admin_reads",
    "from_cursor",
    "read_page",
    "read_value",
    "scan",
    "to_cursor",
]

READ_RETRIES = 5  # an ``unavailable`` answer is retried this often, 0.05 s doubling to 0.8 s apart
ReadSource = Callable[[ReadState], Awaitable[AdminReply]]
"""Sends one read and returns the coordinator's answer (the admin port; injectable for tests)."""

_cursor = msgspec.msgpack.Encoder()
_cursor_decoder = msgspec.msgpack.Decoder(tuple[int, str | int])


@dataclass(frozen=True, slots=True)
class StatePage:
    """One page of a read: ``rows`` as ``(key, value)`` in key order, as of ``epoch``."""

    epoch: int
    rows: list[tuple[Key, Any]]
    next: Key | None  # the page's last key when more may follow: the next page starts after it

    @property
    def cursor(self) -> str | None:
        """Where the next page starts (this page's epoch and last key), or None at the end."""
        return None if self.next is None else to_cursor(self.epoch, self.next)


def to_cursor(epoch: int, after: Key) -> str:
    return base64.urlsafe_b64encode(_cursor.encode((epoch, after))).decode().rstrip("=")


def from_cursor(cursor: str) -> tuple[int, Key]:
    """The epoch and the key a :attr:`StatePage.cursor` names (ValueError if it is not one)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return _cursor_decoder.decode(raw)
    except (binascii.Error, *UNDECODABLE) as exc:
        raise ValueError(f"not a state cursor: {cursor!r}") from exc


def admin_reads(address: str, *, secret: str | None = None, timeout_s: float = 10.0) -> ReadSource:
    """The default :data:`ReadSource`: the coordinator at ``address``, over kept connections (a scan's
    pages share one; :class:`~styx_py.io.admin.AdminConnections`)."""
    return AdminConnections(address, timeout_s=timeout_s, secret=secret)


async def read_page(source: ReadSource, msg: ReadState) -> StatePage:
    """One page; raises as the module docstring says."""
    for attempt in range(READ_RETRIES + 1):
        reply = await source(msg)
        if reply.ok:
            body = reply.body
            rows = list(zip(body["keys"], body["values"], strict=True))  # values decoded with the reply
            return StatePage(int(body["epoch"]), rows, body["next"])
        code = str(reply.body.get("code", ""))
        if code != "unavailable":
            oldest, latest = int(reply.body.get("oldest", -1)), int(reply.body.get("latest", -1))
            kind = EpochOutOfWindow if code == "out-of-window" else StateReadRefused
            hint = "; older epochs: styx sql --as-of-epoch" if code == "out-of-window" else ""
            raise kind(f"{reply.error}{hint}", code, oldest, latest)
        if attempt < READ_RETRIES:
            await asyncio.sleep(min(0.05 * 2**attempt, 0.8))
    raise Unavailable(f"the cluster cannot serve state reads now: {reply.error}")


async def read_value(
    source: ReadSource, operator: str, key: Key, as_of_epoch: int | None = None, min_epoch: int = -1
) -> tuple[int, bool, Any]:
    """One entity's stored value as of an epoch (None: the newest committed one, and at least
    ``min_epoch``): ``(epoch, found, value)``; ``found`` False when it does not exist then (value None)."""
    epoch = -1 if as_of_epoch is None else as_of_epoch
    page = await read_page(source, ReadState(operator, limit=1, epoch=epoch, key=key, min_epoch=min_epoch))
    if page.rows:
        return page.epoch, True, page.rows[0][1]
    return page.epoch, False, None


async def scan(
    source: ReadSource,
    operator: str,
    *,
    prefix: str | None = None,
    start: Key | None = None,
    after: Key | None = None,
    end: Key | None = None,
    limit: int | None = None,
    page_size: int = READ_PAGE,
    as_of_epoch: int | None = None,
    cursor: str | None = None,
    rows_per_s: float | None = None,
    min_epoch: int = -1,
) -> AsyncIterator[StatePage]:
    """The pages of a scan of ``operator`` in key order, all as of one epoch (``as_of_epoch``, else
    the newest committed one when the first page is read, once that is at least ``min_epoch``: the
    epoch of a reply whose writes the scan must see), ``limit`` rows in all (None: every row).
    ``cursor`` (a page's :attr:`StatePage.cursor`) resumes a scan at its epoch and key. ``page_size``
    rows a page (1..:data:`~styx_py.core.limits.MAX_READ_PAGE`): larger pages cost the cluster less
    CPU a row, and hold its event loops longer each (:data:`~styx_py.core.limits.READ_PAGE`).

    ``rows_per_s`` paces a background scan: the next page is asked for only once the rows so far fit
    that rate, so the scan's work on the cluster's cores is spread over time instead of taken at once
    (a scan beside latency-sensitive traffic; the epoch must stay within the workers' window,
    ``state_window_epochs``, for the whole scan)."""
    if rows_per_s is not None and not rows_per_s > 0:
        raise ValueError(f"rows_per_s must be > 0, got {rows_per_s!r}")
    epoch = -1 if as_of_epoch is None else as_of_epoch
    if cursor is not None:
        epoch, after = from_cursor(cursor)
        start = None
    left = limit
    loop = asyncio.get_running_loop()
    started, read = loop.time(), 0
    while left is None or left > 0:
        size = page_size if left is None else min(page_size, left)
        msg = ReadState(operator, start, after, end, prefix, size, epoch, min_epoch=min_epoch)
        page = await read_page(source, msg)
        epoch = page.epoch
        if left is not None:
            left -= len(page.rows)
        yield page
        if page.next is None:
            return
        start, after = None, page.next
        read += len(page.rows)
        if rows_per_s is not None and (wait := started + read / rows_per_s - loop.time()) > 0:
            await asyncio.sleep(wait)
