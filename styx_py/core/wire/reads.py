"""Consistent reads of committed state outside transactions: one epoch's cut across every partition.

A client (the SDK, the gateway, ``styx state``) sends :class:`ReadState` to the coordinator's admin port;
the coordinator picks the epoch (the newest one every worker finished, or the one asked for), asks the
owner of each partition it covers (:class:`ReadAt`), each answers from its memory as of that epoch
(:class:`ReadRows`, see :mod:`styx_worker.window`), and the coordinator merges them into one page: an
:class:`~styx_py.core.wire.admin.AdminReply` whose body is ``{"epoch": E, "keys": [key, …], "values":
[value, …], "next": key | None}``: the page's keys in key order and their values one to one, each the
entity's stored msgpack inline (the client's one decode of the reply decodes them all, and two lists
leave its garbage collector nothing per row to visit); ``next``: the last key of the page when more may
follow, the next page asks ``after`` it at the same epoch. A refused read's body names its ``code``
(:data:`READ_CODES`).
"""

from __future__ import annotations

import msgspec

from styx_py.core.scan import ScanRange
from styx_py.core.wire.codes import Key, Msg

__all__ = ["READ_CODES", "PartRows", "ReadAt", "ReadRows", "ReadState", "array_header"]

READ_CODES = {
    "out-of-window": "the epoch is older than the workers keep in memory (or than their last restart)",
    "not-committed": "the epoch is newer than the newest committed one",
    "unavailable": "a worker is recovering, or the partitions moved meanwhile: retry",
    "unknown-operator": "no such operator is deployed",
    "bad-request": "the bounds or the limit are not valid",
}
"""Why a read is refused (the ``code`` of a refused read's body)."""


class ReadState(Msg, tag="read-state"):
    """Admin → coordinator: the committed entries of ``operator`` in a range, as of one epoch.

    ``key`` set: that entity alone (its partition is the only one asked). ``epoch`` -1: the newest
    epoch every worker finished, once that is at least ``min_epoch`` (the epoch of a reply the client
    has seen: its read then sees that transaction's writes)."""

    operator: str
    start: Key | None = None
    after: Key | None = None
    end: Key | None = None
    prefix: str | None = None
    limit: int = 100
    epoch: int = -1
    key: Key | None = None
    min_epoch: int = -1


class ReadAt(Msg, tag="read-at"):
    """Coordinator → a worker: the entries in ``range`` of these ``partitions`` as of ``epoch``, at most
    ``rows`` per partition."""

    read: int
    gen: int
    epoch: int
    range: ScanRange
    rows: int
    partitions: list[int]


class PartRows(msgspec.Struct, array_like=True, frozen=True):
    """One partition's answer: its live entries in the range as of the epoch, in key order, as
    ``keys`` and ``values`` (a msgpack array of their stored values, the stored bytes as they are:
    :meth:`of` joins them, so a worker builds no object per row); ``more``: it had more than it sent
    (the rows end at its last key)."""

    partition: int
    keys: list[Key]
    values: msgspec.Raw
    more: bool

    @classmethod
    def of(cls, partition: int, keys: list[Key], values: list[bytes], more: bool) -> PartRows:
        """``keys`` with their stored ``values`` (msgpack each), one to one."""
        assert len(keys) == len(values), (len(keys), len(values))
        return cls(partition, keys, msgspec.Raw(array_header(len(values)) + b"".join(values)), more)

    def values_list(self) -> list[msgspec.Raw]:
        """The values one to one with :attr:`keys`, each a view of its stored bytes."""
        values = _raw_values.decode(self.values)
        assert len(values) == len(self.keys), (len(values), len(self.keys))
        return values


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items (the items' encodings follow it)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


_raw_values = msgspec.msgpack.Decoder(list[msgspec.Raw])


class ReadRows(Msg, tag="read-rows"):
    """Worker → coordinator: its partitions' answers to read ``read``, or why it cannot answer
    (``code`` one of :data:`READ_CODES`, ``oldest`` the oldest epoch it can read)."""

    read: int
    node_id: str
    parts: list[PartRows]
    code: str = ""
    error: str = ""
    oldest: int = -1
